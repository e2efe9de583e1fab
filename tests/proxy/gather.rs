//! Request bodies sent in small pieces, as h2load and gRPC's C core and Go send them (16 KiB
//! DATA frames), cross the proxy intact, and the pieces it gathers on the way never hold
//! back what the upstream could act on: a gRPC stream whose messages are answered one by
//! one keeps going, a message cut across frames with a pause between them arrives whole.
//! The client is hyper's h2 client over TLS with a body fed piece by piece (each piece one
//! DATA frame); the upstreams are real hyper servers over h2c and HTTP/1.1.

use std::convert::Infallible;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use e2e::*;
use http::{Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

type Piece = Result<Frame<Bytes>, Infallible>;

/// A gRPC message: flag 0, the 4-byte length, the payload.
fn grpc_message(payload: &[u8]) -> Bytes {
    let mut m = BytesMut::with_capacity(5 + payload.len());
    m.extend_from_slice(&[0]);
    m.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    m.extend_from_slice(payload);
    m.freeze()
}

/// A bidirectional-streaming gRPC echo over h2c: every message is answered, with the same
/// payload, as soon as it has arrived whole; `grpc-status: 0` in trailers at the end.
fn start_grpc_echo() -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            // One connection is all the proxy opens for these calls; ends with it.
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let svc = service_fn(|req: Request<Incoming>| async move {
                let (tx, rx) = mpsc::channel::<Piece>(16);
                tokio::spawn(echo_messages(req.into_body(), tx));
                let body = StreamBody::new(ReceiverStream::new(rx));
                Ok::<_, Infallible>(
                    Response::builder()
                        .header("content-type", "application/grpc")
                        .body(body)
                        .expect("response"),
                )
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    });
    (addr, thread)
}

/// Answers each whole message of `body` on `tx`, then the trailers.
async fn echo_messages(mut body: Incoming, tx: mpsc::Sender<Piece>) {
    let mut buf = BytesMut::new();
    while let Some(Ok(frame)) = body.frame().await {
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while buf.len() >= 5 {
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if buf.len() < 5 + len {
                break;
            }
            buf.advance(5);
            let payload = buf.split_to(len);
            if tx
                .send(Ok(Frame::data(grpc_message(&payload))))
                .await
                .is_err()
            {
                return;
            }
        }
    }
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let _ = tx.send(Ok(Frame::trailers(trailers))).await;
}

/// An h2 connection to the proxy's listener, its sender ready.
async fn h2_sender(
    proxy: &ProxyProcess,
) -> hyper::client::conn::http2::SendRequest<StreamBody<ReceiverStream<Piece>>> {
    let cfg = client_config(&ClientOpts {
        alpn: vec![b"h2".to_vec()],
        ..ClientOpts::default()
    });
    let tls = tls_connect(proxy.addr, cfg).await.expect("connect");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    sender
}

/// The next DATA of `body`, within `limit`.
async fn next_data(body: &mut Incoming, limit: Duration) -> Option<Bytes> {
    loop {
        match tokio::time::timeout(limit, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    return Some(data);
                }
            }
            _ => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_messages_are_held_at_most_to_their_end_and_a_stream_of_whole_ones_flows() {
    let (upstream, _thread) = start_grpc_echo();
    let proxy = ProxyProcess::in_front_of(
        &format!("http://{upstream}"),
        &["--upstream-protocol", "h2c"],
    );
    let mut sender = h2_sender(&proxy).await;
    let (tx, rx) = mpsc::channel::<Piece>(4);
    let req = Request::builder()
        .method("POST")
        .uri(format!(
            "https://localhost:{}/echo.Echo/Chat",
            proxy.addr.port()
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(StreamBody::new(ReceiverStream::new(rx)))
        .expect("request");
    let send = |piece: Bytes| {
        let tx = tx.clone();
        async move { tx.send(Ok(Frame::data(piece))).await.expect("body open") }
    };

    // A whole message, then nothing until its answer: had the proxy held it for more, the
    // answer would never come.
    send(grpc_message(b"first")).await;
    let resp = tokio::time::timeout(WAIT, sender.send_request(req))
        .await
        .expect("response head in time")
        .expect("response");
    assert_eq!(resp.status(), 200);
    let mut answers = resp.into_body();
    assert_eq!(
        next_data(&mut answers, WAIT).await.as_deref(),
        Some(&grpc_message(b"first")[..]),
        "a whole message is passed on at once"
    );

    // A 40 KB message cut into three pieces (through its prefix, then mid-payload) with
    // pauses between: its answer comes once it has all arrived, intact.
    let payload: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
    let message = grpc_message(&payload);
    for (i, piece) in [
        message.slice(..3),
        message.slice(3..20_000),
        message.slice(20_000..),
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        send(piece).await;
    }
    let mut echoed = BytesMut::new();
    while echoed.len() < message.len() {
        let data = next_data(&mut answers, WAIT)
            .await
            .expect("the cut message's answer");
        echoed.extend_from_slice(&data);
    }
    assert_eq!(
        &echoed[..],
        &message[..],
        "the message arrived whole and in order"
    );

    // And the stream goes on with whole messages, each answered before the next is sent.
    for n in 0..20u32 {
        let m = grpc_message(&n.to_be_bytes());
        send(m.clone()).await;
        assert_eq!(
            next_data(&mut answers, WAIT).await.as_deref(),
            Some(&m[..]),
            "message {n}"
        );
    }
    drop(tx);
    let trailers = loop {
        match tokio::time::timeout(WAIT, answers.frame()).await {
            Ok(Some(Ok(f))) if f.is_trailers() => break f.into_trailers().expect("trailers"),
            Ok(Some(Ok(_))) => continue,
            other => panic!("no trailers: {other:?}"),
        }
    };
    assert_eq!(
        trailers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"0"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_length_body_sent_in_16_kib_frames_arrives_whole() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &[]);
    let body: Vec<u8> = (0..800_000u32).map(|i| (i * 7 % 253) as u8).collect();
    let body = Bytes::from(body);
    let mut sender = h2_sender(&proxy).await;
    let (tx, rx) = mpsc::channel::<Piece>(64);
    let req = Request::builder()
        .method("PUT")
        .uri(format!(
            "https://localhost:{}/collections/c/points?wait=true",
            proxy.addr.port()
        ))
        .header("content-type", "application/json")
        .header("content-length", body.len().to_string())
        .body(StreamBody::new(ReceiverStream::new(rx)))
        .expect("request");
    let feeder = {
        let body = body.clone();
        tokio::spawn(async move {
            for (i, chunk) in body.chunks(16 * 1024).enumerate() {
                // A pause now and then: the proxy sees the pieces in bursts, as from a
                // socket, and must neither lose nor reorder what it holds between them.
                if i % 7 == 6 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let piece = body.slice_ref(chunk);
                if tx.send(Ok(Frame::data(piece))).await.is_err() {
                    return;
                }
            }
        })
    };
    let resp = tokio::time::timeout(WAIT, sender.send_request(req))
        .await
        .expect("answer in time")
        .expect("answer");
    assert_eq!(resp.status(), 200);
    let summary: serde_json::Value = serde_json::from_slice(
        &resp
            .into_body()
            .collect()
            .await
            .expect("answer body")
            .to_bytes(),
    )
    .expect("echo summary");
    feeder.await.expect("feeder");
    assert_eq!(summary["body_len"], body.len());
    assert_eq!(summary["body_sha256"], sha256_hex(&body));
}
