//! The plaintext sink every terminator forwards to: HTTP/1.1 and h2c (prior knowledge) on
//! one port. It reads and discards request bodies and answers at once: a small JSON for
//! REST, a gRPC message with `grpc-status: 0` in trailers for gRPC. Its own cost is not
//! measured; it only has to be the same for every terminator and never the bottleneck.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use anyhow::Result;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The REST answer: what Qdrant says to an acknowledged upsert.
const REST_ANSWER: &[u8] =
    br#"{"result":{"operation_id":0,"status":"acknowledged"},"status":"ok","time":0.0001}"#;
/// A gRPC answer: one empty message (flag 0, length 0).
const GRPC_ANSWER: &[u8] = &[0, 0, 0, 0, 0];
/// The tiny GET's answer.
const TINY_ANSWER: &[u8] = b"ok\n";

/// A body of one data frame and optional trailers.
pub struct Reply {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Reply {
    fn new(data: &'static [u8], trailers: Option<HeaderMap>) -> Self {
        Self {
            data: Some(Bytes::from_static(data)),
            trailers,
        }
    }
}

impl Body for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match (&self.data, &self.trailers) {
            (Some(d), None) => http_body::SizeHint::with_exact(d.len() as u64),
            (None, None) => http_body::SizeHint::with_exact(0),
            _ => http_body::SizeHint::default(),
        }
    }
}

async fn answer(req: Request<Incoming>) -> Result<Response<Reply>, Infallible> {
    let grpc = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    let tiny = req.method() == http::Method::GET;
    // Read the whole body (and discard it) before answering, as a database would.
    let mut body = req.into_body();
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            break;
        }
    }
    let resp = if grpc {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        Response::builder()
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .body(Reply::new(GRPC_ANSWER, Some(trailers)))
    } else if tiny {
        Response::builder()
            .header(http::header::CONTENT_TYPE, "text/plain")
            .body(Reply::new(TINY_ANSWER, None))
    } else {
        Response::builder()
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Reply::new(REST_ANSWER, None))
    };
    Ok(resp.expect("static headers are valid"))
}

/// Binds the sink on a loopback port and serves until `stop`.
pub async fn start(stop: CancellationToken) -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => match r { Ok(s) => s, Err(_) => continue },
                _ = stop.cancelled() => return,
            };
            let _ = stream.set_nodelay(true);
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                builder
                    .http2()
                    .initial_stream_window_size(super::H2_WINDOW)
                    .initial_connection_window_size(super::H2_WINDOW * 4)
                    .max_concurrent_streams(1024);
                let conn = builder
                    .serve_connection(TokioIo::new(stream), hyper::service::service_fn(answer));
                tokio::select! {
                    _ = conn => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
    });
    Ok(addr)
}
