//! The plaintext sink every terminator forwards to: HTTP/1.1 and h2c (prior knowledge) on
//! one port. It discards request bodies and answers with a small JSON for REST, a gRPC
//! message with `grpc-status: 0` in trailers for gRPC. By default it reads each body whole
//! before it answers, as Qdrant does (so a terminator's forwarding of the whole body is part
//! of every request); [`SinkMode::EarlyAnswer`] answers at once and drains the body
//! meanwhile. Its own cost is not measured; it only has to be the same for every terminator
//! and never the bottleneck.

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

/// When the sink answers a request with a body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SinkMode {
    /// After reading the whole body, as Qdrant does.
    ReadBody,
    /// At once, draining the body meanwhile (the terminator's answer may then overtake its
    /// own upload).
    EarlyAnswer,
}

/// Reads `body` to its end, discarding it.
async fn drain(mut body: Incoming) {
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            break;
        }
    }
}

async fn answer(req: Request<Incoming>, mode: SinkMode) -> Result<Response<Reply>, Infallible> {
    let grpc = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    let tiny = req.method() == http::Method::GET;
    match mode {
        SinkMode::ReadBody => drain(req.into_body()).await,
        SinkMode::EarlyAnswer => {
            tokio::spawn(drain(req.into_body()));
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
pub async fn start(stop: CancellationToken, mode: SinkMode) -> Result<SocketAddr> {
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
                let conn = builder.serve_connection(
                    TokioIo::new(stream),
                    hyper::service::service_fn(move |req| answer(req, mode)),
                );
                tokio::select! {
                    _ = conn => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Sends the head and the first 10 bytes of a 1,000-byte body, and waits up to `wait`
    /// for the start of an answer.
    async fn answer_to_half_a_body(mode: SinkMode, wait: std::time::Duration) -> Option<String> {
        let stop = CancellationToken::new();
        let addr = start(stop.clone(), mode).await.unwrap();
        let mut io = tokio::net::TcpStream::connect(addr).await.unwrap();
        io.write_all(
            b"POST /collections/c/points HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 1000\r\n\r\n{\"points\":",
        )
        .await
        .unwrap();
        let mut buf = [0u8; 64];
        let got = tokio::time::timeout(wait, io.read(&mut buf)).await;
        stop.cancel();
        match got {
            Ok(Ok(n)) if n > 0 => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn by_default_the_sink_answers_only_after_the_whole_body() {
        let wait = std::time::Duration::from_millis(300);
        assert_eq!(answer_to_half_a_body(SinkMode::ReadBody, wait).await, None);
        let early = answer_to_half_a_body(SinkMode::EarlyAnswer, wait * 10).await;
        assert!(
            early
                .as_deref()
                .is_some_and(|a| a.starts_with("HTTP/1.1 200")),
            "{early:?}"
        );
    }
}
