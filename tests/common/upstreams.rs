//! In-process upstreams: an HTTP/1.1 + h2c echo server, a tonic gRPC server, a fixed
//! answer, a stand-in for OVMS's embeddings endpoint, and a link to a node that can be cut
//! as a network partition cuts it.

#[allow(unused_imports)]
use super::*;

/// Runs `serve(listener)` on its own thread and runtime until the returned guard drops, so
/// upstreams work from sync and async tests alike.
fn spawn_server<F, Fut>(serve: F) -> (SocketAddr, ServerGuard)
where
    F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let addr = std_listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("tokio listener");
            tokio::select! {
                _ = serve(listener) => {}
                _ = stop_rx => {}
            }
        });
    });
    (addr, ServerGuard(Some(stop_tx)))
}

/// Stops a server started by `spawn_server` when dropped.
pub struct ServerGuard(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for ServerGuard {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// Serves `handler` over HTTP/1.1 and h2c (hyper chooses per connection) on loopback until
/// the guard drops.
fn spawn_http_server<H, Fut>(handler: H) -> (SocketAddr, ServerGuard)
where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    spawn_server(move |listener| async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let handler = handler.clone();
            tokio::task::spawn_local(async move {
                let svc = service_fn(move |req| {
                    let fut = handler(req);
                    async move { Ok::<_, Infallible>(fut.await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}

/// A real HTTP server (HTTP/1.1 and h2c, chosen per connection by hyper) that echoes what
/// it received. Paths:
/// - `/slow/<ms>`: answers after that many milliseconds;
/// - `/status/<code>`: reads the body, then answers with that status;
/// - anything else: 200 with a JSON summary of the request (method, path, selected
///   headers, body length and SHA-256).
pub struct EchoUpstream {
    pub addr: SocketAddr,
    requests: Arc<std::sync::atomic::AtomicU64>,
    _guard: ServerGuard,
}

impl EchoUpstream {
    pub fn start() -> Self {
        let requests = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = requests.clone();
        let (addr, guard) = spawn_http_server(move |req| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move {
                match echo(req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                }
            }
        });
        Self {
            addr,
            requests,
            _guard: guard,
        }
    }

    /// Requests whose head reached the server, whatever became of their bodies.
    pub fn requests(&self) -> u64 {
        self.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

async fn echo(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    if let Some(ms) = path.strip_prefix("/slow/") {
        let ms: u64 = ms.parse().unwrap_or(1000);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(code) = path.strip_prefix("/status/") {
        // The body is read first, as a real upstream reads a request before judging it:
        // answering early would leave how much of it crossed the proxy to the scheduler
        // (the access-log test counts it).
        let _ = req.into_body().collect().await;
        let mut r = Response::new(Full::new(Bytes::from_static(b"as requested")));
        *r.status_mut() = StatusCode::from_u16(code.parse().unwrap_or(500))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return Ok(r);
    }
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let summary_headers = serde_json::json!({
        "host": header("host"),
        "x-forwarded-for": header("x-forwarded-for"),
        "x-forwarded-proto": header("x-forwarded-proto"),
        "forwarded": header("forwarded"),
        "x-real-ip": header("x-real-ip"),
        "authorization": header("authorization"),
        "connection": header("connection"),
        "x-test": header("x-test"),
        "x-request-id": header("x-request-id"),
        "traceparent": header("traceparent"),
        "tracestate": header("tracestate"),
    });
    let method = req.method().to_string();
    let version = format!("{:?}", req.version());
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let summary = serde_json::json!({
        "method": method,
        "path": path,
        "version": version,
        "headers": summary_headers,
        "body_len": body.len(),
        "body_sha256": sha256_hex(&body),
    });
    Ok(Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(summary.to_string())))
        .expect("response"))
}

/// A tonic gRPC server (grpc.health.v1: unary Check, server-streaming Watch) on h2c.
pub struct GrpcUpstream {
    pub addr: SocketAddr,
    _guard: ServerGuard,
}

/// The service name the gRPC upstream reports as SERVING.
pub const GRPC_SERVICE: &str = "vectors.Ingest";

impl GrpcUpstream {
    pub fn start() -> Self {
        let (addr, guard) = spawn_server(|listener| async move {
            let (reporter, service) = tonic_health::server::health_reporter();
            reporter
                .set_service_status(GRPC_SERVICE, tonic_health::ServingStatus::Serving)
                .await;
            // Keep the reporter alive: dropping it ends Watch streams.
            let _keep = reporter;
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        Self {
            addr,
            _guard: guard,
        }
    }
}

/// A stand-in for OpenVINO Model Server's OpenAI-compatible embeddings endpoint
/// (`POST /v3/embeddings`) for the faults a real server cannot be made to show on demand:
/// deterministic `dim`-d unit vectors derived from each input text, in the OpenAI answer
/// shape, and, with [`FakeOvms::stalling_after`], a server that stops answering mid-corpus.
/// The real model's server (tests/embedder/server.py) serves every other test. Counts the
/// calls it served.
pub struct FakeOvms {
    pub addr: SocketAddr,
    pub calls: Arc<std::sync::atomic::AtomicU64>,
    _guard: ServerGuard,
}

impl FakeOvms {
    pub fn start(dim: usize) -> Self {
        Self::stalling_after(dim, u64::MAX)
    }

    /// Answers the first `answered` calls, then accepts calls and never answers them (a
    /// server wedged mid-corpus).
    pub fn stalling_after(dim: usize, answered: u64) -> Self {
        let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = calls.clone();
        let (addr, guard) = spawn_http_server(move |req| {
            let counter = counter.clone();
            async move {
                if counter.load(std::sync::atomic::Ordering::Relaxed) >= answered {
                    std::future::pending::<()>().await;
                }
                fake_embeddings(req, dim, &counter).await
            }
        });
        Self {
            addr,
            calls,
            _guard: guard,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::Relaxed)
    }
}

async fn fake_embeddings(
    req: Request<Incoming>,
    dim: usize,
    calls: &std::sync::atomic::AtomicU64,
) -> Response<Full<Bytes>> {
    let bad = |code: u16, msg: &str| {
        Response::builder()
            .status(code)
            .body(Full::new(Bytes::from(
                serde_json::json!({"error": msg}).to_string(),
            )))
            .expect("response")
    };
    if req.method() != http::Method::POST || req.uri().path() != "/v3/embeddings" {
        return bad(404, "not found");
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return bad(400, "body is not JSON");
    };
    let (Some(model), Some(input)) = (v["model"].as_str(), v["input"].as_array()) else {
        return bad(400, "model and input are required");
    };
    calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let data: Vec<serde_json::Value> = input
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let seed = Sha256::digest(text.as_str().unwrap_or("").as_bytes());
            let seed = u64::from_le_bytes(seed[..8].try_into().expect("8 bytes"));
            let v = unit_vectors(1, dim, seed).remove(0);
            serde_json::json!({"object": "embedding", "index": i, "embedding": v})
        })
        .collect();
    let answer = serde_json::json!({
        "object": "list",
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(answer.to_string())))
        .expect("response")
}

/// Serves one fixed body to every request, after `delay`: a recorded answer standing in for
/// hardware that cannot exist here (a BMC's Redfish API, a power sensor's exporter), or a
/// deliberately slow Qdrant-shaped upstream.
pub struct StaticAnswer {
    pub addr: SocketAddr,
    _guard: ServerGuard,
}

impl StaticAnswer {
    pub fn start(body: Vec<u8>) -> Self {
        Self::serve(body, "application/json", Duration::ZERO)
    }

    /// Reads each request's body, waits `delay`, then answers.
    pub fn start_delayed(body: Vec<u8>, delay: Duration) -> Self {
        Self::serve(body, "application/json", delay)
    }

    /// The same answer as Prometheus text exposition (a stand-in exporter).
    pub fn start_metrics(text: &str) -> Self {
        Self::serve(
            text.as_bytes().to_vec(),
            "text/plain; version=0.0.4",
            Duration::ZERO,
        )
    }

    fn serve(body: Vec<u8>, content_type: &'static str, delay: Duration) -> Self {
        let body = Bytes::from(body);
        let (addr, guard) = spawn_http_server(move |req: Request<Incoming>| {
            let body = body.clone();
            async move {
                let _ = req.into_body().collect().await;
                tokio::time::sleep(delay).await;
                Response::builder()
                    .header("content-type", content_type)
                    .body(Full::new(body))
                    .expect("response")
            }
        });
        Self {
            addr,
            _guard: guard,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A TCP path to `to` that can be cut and mended, as a network partition does. Cut, the
/// connections it carries go silent: held open, nothing passes either way, no FIN or RST
/// (half-open, as a node disconnected from its network leaves them); new connections are
/// closed at once. Mended, new connections pass again; the silenced ones never do (as
/// when the node comes back at another address).
pub struct CuttableLink {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// How many times the link was cut; odd while it is cut.
    cuts: tokio::sync::watch::Sender<u64>,
    _server: ServerGuard,
}

impl CuttableLink {
    /// A link from a new loopback port to `to`.
    pub fn to(to: SocketAddr) -> Self {
        let (cuts, watch) = tokio::sync::watch::channel(0u64);
        let (addr, server) = spawn_server(move |listener| async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                let born = *watch.borrow();
                if born % 2 == 1 {
                    continue; // cut: closed at once
                }
                let mut changed = watch.clone();
                tokio::task::spawn_local(async move {
                    let Ok(mut node) = TcpStream::connect(to).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut node) => return,
                        _ = changed.wait_for(|cuts| *cuts != born) => {}
                    }
                    // Silenced for good: both sockets stay open and unread.
                    std::future::pending::<()>().await;
                    drop((client, node));
                });
            }
        });
        Self {
            addr,
            cuts,
            _server: server,
        }
    }

    /// Silences every connection the link carries and refuses new ones.
    pub fn cut(&self) {
        self.cuts.send_modify(|c| *c += 1 - *c % 2);
    }

    /// Lets new connections through again.
    pub fn mend(&self) {
        self.cuts.send_modify(|c| *c += *c % 2);
    }
}
