//! Active health checks: every `interval`, one probe per upstream node; after
//! `unhealthy_threshold` failed probes in a row the node takes no requests, after
//! `healthy_threshold` good ones it takes them again. A good probe also readmits a node
//! that a failed connect ejected. Probes are what Qdrant answers without an API key:
//! `GET /readyz` over HTTP/1.1, `grpc.health.v1.Health/Check` over HTTP/2, or a TCP
//! connect; over TLS to `https://` nodes. A failed probe's connection is not used again,
//! and a node taken out moves its connection epoch on, so that the data path's
//! connections made before are not used again either (`http::node_clients`).

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::{HealthCheckConfig, HealthCheckKind};
use super::{Node, UpstreamConnector, UpstreamPool};
use crate::error_chain;

/// The gRPC health service's method (grpc/grpc doc/health-checking.md).
const GRPC_HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
/// A length-prefixed `HealthCheckRequest { service: "" }`: the server as a whole.
const GRPC_HEALTH_REQUEST: &[u8] = &[0, 0, 0, 0, 0];
/// `HealthCheckResponse.status` (field 1, varint) = SERVING.
const GRPC_SERVING: u8 = 1;

type ProbeClient = Client<UpstreamConnector, Full<Bytes>>;

/// Starts one checking task per node of `pool`; they stop with `shutdown`. Nothing is
/// started for `HealthCheckKind::Off` (or `Auto`, which callers resolve first).
pub fn spawn(
    pool: &Arc<UpstreamPool>,
    plan: &super::HealthCheckPlan,
    shutdown: &CancellationToken,
) {
    if matches!(plan.kind, HealthCheckKind::Off | HealthCheckKind::Auto) {
        return;
    }
    let maker = Arc::new(ProbeMaker {
        kind: plan.kind,
        config: plan.settings.clone(),
        tls: pool.tls().cloned(),
    });
    for node in pool.nodes() {
        tokio::spawn(check_node(
            pool.clone(),
            node.clone(),
            maker.clone(),
            shutdown.clone(),
        ));
    }
}

/// Makes a node's probe: its own client (and so its own connection), made anew after a
/// failed probe.
struct ProbeMaker {
    kind: HealthCheckKind,
    config: HealthCheckConfig,
    tls: Option<super::UpstreamTlsPair>,
}

impl ProbeMaker {
    fn make(&self) -> Probe {
        let config = &self.config;
        match self.kind {
            HealthCheckKind::Http | HealthCheckKind::Grpc => {
                let mut tcp = HttpConnector::new();
                tcp.set_nodelay(true);
                tcp.set_connect_timeout(Some(config.timeout));
                let mut builder = Client::builder(TokioExecutor::new());
                builder
                    .pool_timer(TokioTimer::new())
                    .timer(TokioTimer::new());
                // Probes go the way requests go: over TLS to https:// nodes, so a node
                // whose certificate stops verifying is taken out like one that stops
                // answering.
                let tls = self.tls.as_ref();
                let connector = if self.kind == HealthCheckKind::Grpc {
                    builder.http2_only(true);
                    UpstreamConnector::h2(tcp, tls.map(|t| t.h2.clone()), config.timeout)
                } else {
                    UpstreamConnector::http1(tcp, tls.map(|t| t.http1.clone()), config.timeout)
                };
                let client = builder.build(connector);
                if self.kind == HealthCheckKind::Grpc {
                    Probe::Grpc(client)
                } else {
                    Probe::Http(client, config.path.clone())
                }
            }
            // `spawn` starts no checks for Off and Auto.
            HealthCheckKind::Connect | HealthCheckKind::Off | HealthCheckKind::Auto => {
                Probe::Connect
            }
        }
    }
}

enum Probe {
    Http(ProbeClient, String),
    Grpc(ProbeClient),
    Connect,
}

impl Probe {
    /// `Ok` if the node answered as a healthy one does; else what it did instead.
    async fn run(&self, node: &Node) -> Result<(), String> {
        let addr = node.addr();
        let authority = &addr.authority;
        match self {
            Probe::Connect => TcpStream::connect(authority.as_str())
                .await
                .map(drop)
                .map_err(|e| format!("connect: {e}")),
            Probe::Http(client, path) => {
                let req = Request::builder()
                    .method(Method::GET)
                    .uri(uri(addr, path)?)
                    .header(header::HOST, authority.as_str())
                    .body(Full::default())
                    .map_err(|e| e.to_string())?;
                let resp = client.request(req).await.map_err(|e| error_chain(&e))?;
                let status = resp.status();
                // Read to the end so the connection can serve the next probe.
                let _ = resp.into_body().collect().await;
                if status.is_success() {
                    Ok(())
                } else {
                    Err(format!("GET {path} answered {status}"))
                }
            }
            Probe::Grpc(client) => {
                let req = Request::builder()
                    .method(Method::POST)
                    .version(Version::HTTP_2)
                    .uri(uri(addr, GRPC_HEALTH_CHECK)?)
                    .header(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/grpc"),
                    )
                    .header(header::TE, HeaderValue::from_static("trailers"))
                    .body(Full::new(Bytes::from_static(GRPC_HEALTH_REQUEST)))
                    .map_err(|e| e.to_string())?;
                let resp = client.request(req).await.map_err(|e| error_chain(&e))?;
                if resp.status() != StatusCode::OK {
                    return Err(format!("health check answered HTTP {}", resp.status()));
                }
                let (parts, body) = resp.into_parts();
                let collected = body.collect().await.map_err(|e| e.to_string())?;
                // A trailers-only answer carries grpc-status in the headers.
                let grpc_status = collected
                    .trailers()
                    .and_then(|t| t.get("grpc-status"))
                    .or_else(|| parts.headers.get("grpc-status"))
                    .map(|v| v.as_bytes().to_vec());
                if grpc_status.as_deref() != Some(b"0") {
                    return Err(format!(
                        "health check failed: grpc-status {}",
                        grpc_status.map_or("missing".into(), |s| String::from_utf8_lossy(&s)
                            .into_owned())
                    ));
                }
                match grpc_serving_status(&collected.to_bytes()) {
                    Some(GRPC_SERVING) => Ok(()),
                    status => Err(format!(
                        "health check answered status {} instead of SERVING",
                        status.unwrap_or(0)
                    )),
                }
            }
        }
    }
}

fn uri(addr: &super::UpstreamAddr, path: &str) -> Result<Uri, String> {
    Uri::builder()
        .scheme(addr.scheme())
        .authority(addr.authority.clone())
        .path_and_query(path)
        .build()
        .map_err(|e| e.to_string())
}

/// The `status` of a length-prefixed `HealthCheckResponse` (0, UNKNOWN, when absent).
fn grpc_serving_status(message: &[u8]) -> Option<u8> {
    let (prefix, body) = message.split_at_checked(5)?;
    let len = u32::from_be_bytes(prefix[1..5].try_into().ok()?) as usize;
    let body = body.get(..len)?;
    // Field 1, wire type 0 (varint): tag byte 0x08; the status enum fits one byte.
    match body {
        [0x08, status, ..] => Some(*status),
        _ => Some(0),
    }
}

async fn check_node(
    pool: Arc<UpstreamPool>,
    node: Arc<Node>,
    maker: Arc<ProbeMaker>,
    shutdown: CancellationToken,
) {
    let config = &maker.config;
    let mut probe = maker.make();
    let mut ticks = tokio::time::interval(config.interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let (mut passed, mut failed) = (0u32, 0u32);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let outcome = match tokio::time::timeout(config.timeout, probe.run(&node)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!("no answer within {:?}", config.timeout)),
        };
        match outcome {
            Ok(()) => {
                passed = passed.saturating_add(1);
                failed = 0;
                let comes_back = !node.is_healthy() && passed >= config.healthy_threshold;
                if comes_back || pool.is_ejected(&node) {
                    pool.set_healthy(&node, true, "");
                }
            }
            Err(why) => {
                failed = failed.saturating_add(1);
                passed = 0;
                // The next probe gets a connection of its own: a half-open one (the node
                // cut off, then back at the same address) would fail every probe after
                // this, as Envoy's checker closes its connection on a failure.
                probe = maker.make();
                if node.is_healthy() && failed >= config.unhealthy_threshold {
                    pool.set_healthy(&node, false, &why);
                } else {
                    tracing::debug!(upstream = %node.addr(), failed, reason = %why, "upstream health check failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_health_answers_are_read() {
        assert_eq!(grpc_serving_status(&[0, 0, 0, 0, 2, 0x08, 1]), Some(1));
        assert_eq!(grpc_serving_status(&[0, 0, 0, 0, 2, 0x08, 2]), Some(2));
        // Status UNKNOWN is the default and therefore not encoded.
        assert_eq!(grpc_serving_status(&[0, 0, 0, 0, 0]), Some(0));
        assert_eq!(grpc_serving_status(&[0, 0, 0]), None);
        assert_eq!(grpc_serving_status(&[0, 0, 0, 0, 9, 0x08]), None);
    }
}
