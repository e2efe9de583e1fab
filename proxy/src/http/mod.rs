//! L7 forwarding: hyper serves the client connection (HTTP/1.1 or HTTP/2 by ALPN), and each
//! request is forwarded over pooled plaintext upstream connections: HTTP/1.1 for REST, h2c
//! with prior knowledge for gRPC. Bodies stream both ways; trailers pass through.
//!
//! This module knows nothing of TLS providers: it is handed a decrypted stream.

mod body;
mod errors;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admin::ListenerMetrics;
use crate::config::{Limits, UpstreamProtocol};
use crate::io::Activity;
use crate::upstream::UpstreamAddr;

pub use body::{CappedBody, RequestBodyError, ResponseBody};
use errors::{error_response, Failure};

/// HTTP/2 flow-control windows. hyper's defaults (64 KiB) make one 800 KB upsert take a
/// dozen round trips of WINDOW_UPDATEs; these let a whole UPSERT_100 fly at once while
/// bounding what a single stream can buffer.
const H2_STREAM_WINDOW: u32 = 4 * 1024 * 1024;
const H2_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
/// Idle upstream connections kept per upstream: one per client connection in flight at a
/// typical benchmark concurrency, so keep-alive upstream reuse is the norm.
const UPSTREAM_POOL_MAX_IDLE: usize = 256;
/// Idle upstream connections are closed after this, well under Qdrant's own keep-alive.
const UPSTREAM_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Oversized HTTP/1.1 bodies up to this size are read and discarded before the 413 so the
/// client sees the answer; larger ones just get the answer and a closed connection.
const LINGER_DRAIN_MAX_BYTES: u64 = 256 * 1024 * 1024;
/// Time allowed for that draining.
const LINGER_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

type UpstreamClient = Client<HttpConnector, CappedBody>;

/// Everything the request path of one listener shares.
pub struct HttpForwarder {
    upstream: UpstreamAddr,
    protocol: UpstreamProtocol,
    http1: UpstreamClient,
    h2c: UpstreamClient,
    limits: Limits,
    metrics: ListenerMetrics,
}

impl HttpForwarder {
    /// Builds the pooled upstream clients for one listener.
    pub fn new(
        upstream: UpstreamAddr,
        protocol: UpstreamProtocol,
        limits: Limits,
        metrics: ListenerMetrics,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(limits.upstream_connect_timeout));
        let http1 = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(UPSTREAM_POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(UPSTREAM_POOL_MAX_IDLE)
            .pool_timer(TokioTimer::new())
            .build(connector.clone());
        let h2c = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .http2_initial_stream_window_size(H2_STREAM_WINDOW)
            .http2_initial_connection_window_size(H2_CONNECTION_WINDOW)
            .pool_idle_timeout(UPSTREAM_POOL_IDLE_TIMEOUT)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(connector);
        Self {
            upstream,
            protocol,
            http1,
            h2c,
            limits,
            metrics,
        }
    }

    /// Serves one decrypted client connection until it closes, goes idle, or `shutdown`
    /// asks it to drain (in-flight requests finish; HTTP/2 gets a GOAWAY).
    pub async fn serve<IO>(
        self: &Arc<Self>,
        io: IO,
        h2: bool,
        peer: SocketAddr,
        activity: Arc<Activity>,
        shutdown: CancellationToken,
    ) -> Result<(), hyper::Error>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let svc = ForwardService {
            forwarder: self.clone(),
            // Computed once per connection, not per request.
            peer_ip: HeaderValue::from_str(&peer.ip().to_string())
                .expect("an IP address is a valid header value"),
            client_protocol: if h2 { "h2" } else { "http1" },
        };
        let io = TokioIo::new(io);
        let limits = &self.limits;
        if h2 {
            let conn = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_concurrent_streams(limits.h2_max_concurrent_streams)
                .max_header_list_size(limits.max_header_bytes as u32)
                .initial_stream_window_size(H2_STREAM_WINDOW)
                .initial_connection_window_size(H2_CONNECTION_WINDOW)
                .serve_connection(io, svc);
            drive(conn, activity, limits.idle_timeout, shutdown).await
        } else {
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(limits.max_header_bytes)
                .serve_connection(io, svc);
            drive(conn, activity, limits.idle_timeout, shutdown).await
        }
    }

    async fn forward(
        &self,
        req: Request<Incoming>,
        peer_ip: &HeaderValue,
        client_protocol: &'static str,
    ) -> Response<ResponseBody> {
        let started = Instant::now();
        let grpc = is_grpc(req.headers());
        let protocol_label = if grpc { "grpc" } else { client_protocol };
        let resp = self.exchange(req, grpc, peer_ip, started).await;
        self.metrics
            .request(protocol_label, resp.status(), started.elapsed());
        resp
    }

    async fn exchange(
        &self,
        req: Request<Incoming>,
        grpc: bool,
        peer_ip: &HeaderValue,
        started: Instant,
    ) -> Response<ResponseBody> {
        let fail = |failure: Failure, msg: &str| {
            error_response(failure, grpc, msg, started.elapsed().as_secs_f64())
        };
        // hyper bounds its read buffer, but a head that arrives in one read can exceed it;
        // this check makes the configured limit exact for HTTP/1.1 and HTTP/2 alike.
        let head_bytes: usize = req
            .headers()
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum();
        if head_bytes > self.limits.max_header_bytes {
            return fail(
                Failure::HeadersTooLarge,
                &format!(
                    "request headers larger than the proxy's limit of {} bytes",
                    self.limits.max_header_bytes
                ),
            );
        }
        let max_body = self.limits.max_request_body_bytes;
        if let Some(len) = content_length(req.headers()).filter(|len| *len > max_body) {
            let resp = fail(
                Failure::RequestTooLarge,
                &format!("request body larger than the proxy's limit of {max_body} bytes"),
            );
            // An HTTP/1.1 client is still writing the body it announced: closing now would
            // reset the connection under it and it would never read the 413. Read and
            // discard a bounded amount first (nginx's lingering close); HTTP/2 cancels the
            // stream instead.
            if req.version() < Version::HTTP_2 && len <= LINGER_DRAIN_MAX_BYTES {
                let mut body = req.into_body();
                let _ = tokio::time::timeout(LINGER_DRAIN_TIMEOUT, async {
                    while let Some(Ok(_)) = body.frame().await {}
                })
                .await;
            }
            return resp;
        }
        let use_h2c = match self.protocol {
            UpstreamProtocol::H2c => true,
            UpstreamProtocol::Http1 => false,
            UpstreamProtocol::Auto => grpc,
        };
        let (mut parts, body) = req.into_parts();
        let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = match Uri::builder()
            .scheme("http")
            .authority(self.upstream.authority.clone())
            .path_and_query(path_and_query)
            .build()
        {
            Ok(uri) => uri,
            Err(e) => {
                return fail(
                    Failure::Internal,
                    &format!("cannot build upstream URI: {e}"),
                )
            }
        };
        let keep_te_trailers = use_h2c && te_is_trailers(&parts.headers);
        strip_hop_by_hop(&mut parts.headers);
        if keep_te_trailers {
            // gRPC servers require "te: trailers" on HTTP/2; it is the one TE value allowed.
            parts
                .headers
                .insert(header::TE, HeaderValue::from_static("trailers"));
        }
        if parts.version == Version::HTTP_2 {
            if let Some(authority) = parts_authority(&parts.headers, &self.upstream) {
                // HTTP/2 carries the host in :authority; an HTTP/1.1 upstream needs Host.
                parts.headers.entry(header::HOST).or_insert(authority);
            }
        }
        append_forwarded_for(&mut parts.headers, peer_ip);
        parts.headers.insert(
            HeaderName::from_static("x-forwarded-proto"),
            HeaderValue::from_static("https"),
        );
        parts.version = if use_h2c {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        let upstream_req = Request::from_parts(parts, CappedBody::new(body, max_body));
        let client = if use_h2c { &self.h2c } else { &self.http1 };

        let result = tokio::time::timeout(
            self.limits.upstream_response_timeout,
            client.request(upstream_req),
        )
        .await;
        match result {
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, ResponseBody::Upstream(body))
            }
            Ok(Err(e)) => {
                let (failure, kind) = classify(&e);
                if let Some(kind) = kind {
                    self.metrics.upstream_error(kind);
                }
                tracing::debug!(error = %error_chain(&e), upstream = %self.upstream, "upstream request failed");
                let msg = match failure {
                    Failure::RequestTooLarge => {
                        format!("request body larger than the proxy's limit of {max_body} bytes")
                    }
                    _ => format!(
                        "upstream {} unavailable: {}",
                        self.upstream,
                        error_chain(&e)
                    ),
                };
                fail(failure, &msg)
            }
            Err(_) => {
                self.metrics.upstream_error("timeout");
                fail(
                    Failure::UpstreamTimeout,
                    &format!(
                        "upstream {} did not answer within {:?}",
                        self.upstream, self.limits.upstream_response_timeout
                    ),
                )
            }
        }
    }
}

/// Runs a hyper connection, asking it to finish gracefully when the proxy drains or when no
/// bytes have moved for `idle` (graceful: a request still in flight completes first).
async fn drive<C>(
    conn: C,
    activity: Arc<Activity>,
    idle: Duration,
    shutdown: CancellationToken,
) -> Result<(), hyper::Error>
where
    C: GracefulConnection<Error = hyper::Error>,
{
    let mut conn = pin!(conn);
    let mut closing = false;
    loop {
        tokio::select! {
            res = conn.as_mut() => return res,
            _ = shutdown.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = activity.wait_idle(idle), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The per-connection hyper service.
#[derive(Clone)]
struct ForwardService {
    forwarder: Arc<HttpForwarder>,
    peer_ip: HeaderValue,
    client_protocol: &'static str,
}

impl hyper::service::Service<Request<Incoming>> for ForwardService {
    type Response = Response<ResponseBody>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            Ok(this
                .forwarder
                .forward(req, &this.peer_ip, this.client_protocol)
                .await)
        })
    }
}

fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

fn te_is_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"))
}

fn parts_authority(headers: &HeaderMap, upstream: &UpstreamAddr) -> Option<HeaderValue> {
    if headers.contains_key(header::HOST) {
        return None;
    }
    HeaderValue::from_str(upstream.authority.as_str()).ok()
}

/// Hop-by-hop headers (RFC 9110 7.6.1) describe one connection and must not be forwarded,
/// nor any header the Connection header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
}

fn append_forwarded_for(headers: &mut HeaderMap, peer_ip: &HeaderValue) {
    let name = HeaderName::from_static("x-forwarded-for");
    let combined = headers.get(&name).and_then(|prev| {
        let mut v = Vec::with_capacity(prev.len() + 2 + peer_ip.len());
        v.extend_from_slice(prev.as_bytes());
        v.extend_from_slice(b", ");
        v.extend_from_slice(peer_ip.as_bytes());
        HeaderValue::from_bytes(&v).ok()
    });
    headers.insert(name, combined.unwrap_or_else(|| peer_ip.clone()));
}

/// Decides the answer and the metric label for a failed upstream exchange.
fn classify(e: &hyper_util::client::legacy::Error) -> (Failure, Option<&'static str>) {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(RequestBodyError::TooLarge) = err.downcast_ref::<RequestBodyError>() {
            return (Failure::RequestTooLarge, None);
        }
        source = err.source();
    }
    if e.is_connect() {
        let timed_out = error_chain(e).contains("timed out") || error_chain(e).contains("timeout");
        if timed_out {
            return (Failure::UpstreamTimeout, Some("connect_timeout"));
        }
        return (Failure::UpstreamUnavailable, Some("connect"));
    }
    (Failure::UpstreamUnavailable, Some("protocol"))
}

/// "outer: inner: innermost", for messages that say what actually happened.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::CONTENT_TYPE));
    }

    #[test]
    fn forwarded_for_appends() {
        let mut h = HeaderMap::new();
        let ip = HeaderValue::from_static("127.0.0.1");
        append_forwarded_for(&mut h, &ip);
        assert_eq!(h["x-forwarded-for"], "127.0.0.1");
        append_forwarded_for(&mut h, &HeaderValue::from_static("10.0.0.9"));
        assert_eq!(h["x-forwarded-for"], "127.0.0.1, 10.0.0.9");
    }
}
