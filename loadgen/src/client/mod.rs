//! The workload's client: where the target is, how a connection is opened (TCP, then TLS
//! with the chosen provider), and how one prepared request is sent on it over HTTP/1.1
//! (REST) or HTTP/2 (gRPC), with every failure sorted into a kind.

pub mod http;
pub mod qdrant;
pub mod tls;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpSocket, TcpStream};

/// Which API the workload speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Qdrant REST: JSON over HTTP/1.1.
    Rest,
    /// Qdrant gRPC: protobuf over HTTP/2.
    Grpc,
}

impl Protocol {
    /// As the command line and results write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rest => "rest",
            Self::Grpc => "grpc",
        }
    }
}

/// Where the load goes: `HOST:PORT`, `https://HOST:PORT` or `http://HOST:PORT` (plaintext,
/// for a baseline straight at Qdrant).
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// Port.
    pub port: u16,
    /// Whether the load goes over TLS (`http://`: plaintext).
    pub tls: bool,
}

impl Target {
    /// Parses `--target`; a bare `HOST:PORT` is TLS.
    pub fn parse(s: &str) -> Result<Self> {
        let (tls, rest) = if let Some(r) = s.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = s.strip_prefix("http://") {
            (false, r)
        } else if s.contains("://") {
            bail!("--target {s:?}: only http:// and https:// URLs are understood");
        } else {
            (true, s)
        };
        let rest = rest.trim_end_matches('/');
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| anyhow!("--target {s:?}: expected HOST:PORT or a URL with a port"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| anyhow!("--target {s:?}: {port:?} is not a port number"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if host.is_empty() {
            bail!("--target {s:?}: empty host");
        }
        Ok(Self { host, port, tls })
    }

    /// The protocol a Qdrant port implies: 6334 is gRPC, anything else REST.
    pub fn default_protocol(&self) -> Protocol {
        if self.port == 6334 {
            Protocol::Grpc
        } else {
            Protocol::Rest
        }
    }

    /// The first address the host resolves to.
    pub async fn resolve(&self) -> Result<SocketAddr> {
        tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .with_context(|| format!("resolving {}", self))?
            .next()
            .ok_or_else(|| anyhow!("{} resolves to no address", self))
    }

    /// `host:port`, the host bracketed when it is an IPv6 address.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}",
            if self.tls { "https" } else { "http" },
            self.authority()
        )
    }
}

/// Why a request failed; the result counts each kind separately.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureKind {
    /// The TCP connection could not be made.
    Connect,
    /// The TLS handshake failed.
    Tls,
    /// No answer within `--request-timeout`.
    Timeout,
    /// An HTTP status other than success.
    HttpStatus(u16),
    /// A gRPC status other than OK.
    GrpcStatus(u32),
    /// The connection broke mid-request, or the answer was not HTTP.
    Protocol,
    /// The connection was closing (the server's GOAWAY, or its close after a response)
    /// before the request was written: the server never saw it, so the driver sends it once
    /// more on a new connection, as gRPC's transparent retry and hyper's pooled client do.
    /// Counted only when that one fails too.
    Unsent,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connect => f.write_str("connect"),
            Self::Tls => f.write_str("tls"),
            Self::Timeout => f.write_str("timeout"),
            Self::HttpStatus(s) => write!(f, "http_{s}"),
            Self::GrpcStatus(c) => write!(f, "grpc_{c}"),
            Self::Protocol => f.write_str("protocol"),
            Self::Unsent => f.write_str("unsent"),
        }
    }
}

/// A failure and its first message (kept for the summary).
#[derive(Debug)]
pub struct Failure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// What was said about it.
    pub message: String,
}

impl Failure {
    fn new(kind: FailureKind, message: impl fmt::Display) -> Self {
        Self {
            kind,
            message: message.to_string(),
        }
    }
}

/// What answer acknowledges a request: the check a unit of work asks of [`Conn::send`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// HTTP 200 with Qdrant's `"status":"ok"` in the JSON body (a 200 without it is a
    /// misrouted request or a different server, not an acknowledged write).
    QdrantRest,
    /// HTTP 200, `application/grpc`, and grpc-status 0 in the trailers (or, for a
    /// trailers-only answer, in the headers).
    Grpc,
    /// HTTP 200, whatever the body (a request that writes nothing, such as a tiny GET).
    Status200,
}

impl Answer {
    /// The answer Qdrant gives to an acknowledged request of `protocol`.
    pub fn of(protocol: Protocol) -> Self {
        match protocol {
            Protocol::Rest => Self::QdrantRest,
            Protocol::Grpc => Self::Grpc,
        }
    }

    /// Ok when `parts` and the collected body acknowledge the request.
    fn check(
        self,
        parts: &::http::response::Parts,
        collected: http_body_util::Collected<Bytes>,
    ) -> Result<(), Failure> {
        let snippet =
            |body: &[u8]| String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        match self {
            Self::QdrantRest | Self::Status200 => {
                let body = collected.to_bytes();
                if parts.status != ::http::StatusCode::OK {
                    return Err(Failure::new(
                        FailureKind::HttpStatus(parts.status.as_u16()),
                        format!("HTTP {}: {}", parts.status, snippet(&body)),
                    ));
                }
                if self == Self::QdrantRest && !contains(&body, br#""status":"ok""#) {
                    return Err(Failure::new(
                        FailureKind::Protocol,
                        format!(
                            "HTTP 200 without a Qdrant \"status\":\"ok\" answer: {}",
                            snippet(&body)
                        ),
                    ));
                }
                Ok(())
            }
            Self::Grpc => {
                if parts.status != ::http::StatusCode::OK {
                    return Err(Failure::new(
                        FailureKind::HttpStatus(parts.status.as_u16()),
                        format!("HTTP {} on a gRPC call", parts.status),
                    ));
                }
                let is_grpc = parts
                    .headers
                    .get(::http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("application/grpc"));
                if !is_grpc {
                    return Err(Failure::new(
                        FailureKind::Protocol,
                        "HTTP 200 but not a gRPC answer",
                    ));
                }
                // A trailers-only answer carries grpc-status in the headers.
                let trailers = collected.trailers().cloned();
                grpc_outcome(trailers.as_ref().unwrap_or(&parts.headers))
            }
        }
    }
}

/// Opens connections to the target, the same way every time.
pub struct Connector {
    /// The address connections go to (resolved once).
    pub addr: SocketAddr,
    /// The target as given.
    pub target: Target,
    /// REST or gRPC.
    pub protocol: Protocol,
    /// HTTP/2 (prior knowledge, or as ALPN negotiated it) rather than HTTP/1.1: gRPC's by
    /// default; the bench also sends REST JSON over it.
    http2: bool,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    authority: ::http::uri::Authority,
    /// Sent on every control-plane request too (API key, `--header`).
    pub extra_headers: ::http::HeaderMap,
    /// The TCP congestion control of every connection (Linux `TCP_CONGESTION`), set
    /// before it connects; the host's default when `None`.
    congestion_control: Option<Arc<str>>,
}

/// What a fresh connection cost.
pub struct Opened {
    /// The connection.
    pub conn: Conn,
    /// TCP connect + TLS handshake.
    pub handshake: Duration,
    /// Whether the TLS session was resumed.
    pub resumed: bool,
}

impl Connector {
    /// A connector for `target`: TLS with `tls` (required for a TLS target), verified
    /// against `server_name` or else the target's host.
    pub async fn new(
        target: Target,
        protocol: Protocol,
        tls: Option<Arc<ClientConfig>>,
        server_name: Option<&str>,
    ) -> Result<Self> {
        let addr = target.resolve().await?;
        let tls = match (target.tls, tls) {
            (true, Some(config)) => {
                let name = server_name.unwrap_or(&target.host).to_owned();
                let name = ServerName::try_from(name.clone())
                    .map_err(|e| anyhow!("bad TLS server name {name:?}: {e}"))?;
                Some((tokio_rustls::TlsConnector::from(config), name))
            }
            (true, None) => bail!("TLS target but no TLS configuration"),
            (false, _) => None,
        };
        let authority = target.authority().parse().context("target authority")?;
        Ok(Self {
            addr,
            target,
            protocol,
            http2: protocol == Protocol::Grpc,
            tls,
            authority,
            extra_headers: ::http::HeaderMap::new(),
            congestion_control: None,
        })
    }

    /// The same connector with every connection's TCP congestion control set to `name`
    /// (`None`: the host's default). The bench sets it: on loopback the client's sending
    /// runs partly on the server's CPU (`loadgen bench --client-congestion-control`).
    pub fn with_congestion_control(mut self, name: Option<Arc<str>>) -> Self {
        self.congestion_control = name;
        self
    }

    /// The same connector speaking HTTP/2 (`true`) or HTTP/1.1 whatever the protocol: REST
    /// JSON over h2, as some clients send it.
    pub fn over_http2(mut self, http2: bool) -> Self {
        self.http2 = http2;
        self
    }

    /// The target's authority, for request URIs.
    pub fn authority(&self) -> &::http::uri::Authority {
        &self.authority
    }

    /// Opens a connection: TCP, TLS when the target has it, then the HTTP handshake
    /// (HTTP/1.1 for REST, HTTP/2 for gRPC, unless [`Connector::over_http2`] chose), timed
    /// together.
    pub async fn open(&self) -> Result<Opened, Failure> {
        let start = Instant::now();
        let tcp = self.connect_tcp().await.map_err(|e| {
            Failure::new(FailureKind::Connect, format!("connect {}: {e}", self.addr))
        })?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            Some((connector, name)) => {
                let stream = connector.connect(name.clone(), tcp).await.map_err(|e| {
                    Failure::new(
                        FailureKind::Tls,
                        format!("TLS handshake with {}: {e}", self.target),
                    )
                })?;
                let handshake = start.elapsed();
                let resumed = matches!(
                    stream.get_ref().1.handshake_kind(),
                    Some(rustls::HandshakeKind::Resumed)
                );
                let conn = self.http_handshake(TokioIo::new(stream)).await?;
                Ok(Opened {
                    conn,
                    handshake,
                    resumed,
                })
            }
            None => {
                let handshake = start.elapsed();
                let conn = self.http_handshake(TokioIo::new(tcp)).await?;
                Ok(Opened {
                    conn,
                    handshake,
                    resumed: false,
                })
            }
        }
    }

    async fn connect_tcp(&self) -> std::io::Result<TcpStream> {
        let Some(name) = &self.congestion_control else {
            return TcpStream::connect(self.addr).await;
        };
        let socket = if self.addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        set_congestion_control(&socket, name)?;
        socket.connect(self.addr).await
    }

    async fn http_handshake<IO>(&self, io: IO) -> Result<Conn, Failure>
    where
        IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let proto_err = |e: hyper::Error| Failure::new(FailureKind::Protocol, e);
        if !self.http2 {
            let (sender, conn) = http1::handshake(io).await.map_err(proto_err)?;
            let driver = Some(tokio::spawn(async move {
                let _ = conn.await;
            }));
            Ok(Conn::H1 { sender, driver })
        } else {
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                // Upserts are ~400 KB of protobuf: large windows keep one request from
                // waiting on WINDOW_UPDATE round trips.
                .initial_stream_window_size(4 << 20)
                .initial_connection_window_size(8 << 20)
                .max_frame_size(1 << 20)
                .handshake(io)
                .await
                .map_err(proto_err)?;
            let driver = Some(tokio::spawn(async move {
                let _ = conn.await;
            }));
            Ok(Conn::H2 { sender, driver })
        }
    }
}

/// An open connection, ready for requests. The owner holds the task driving it (dropping
/// the owner closes the connection); HTTP/2 shares hand out driverless clones.
pub enum Conn {
    /// HTTP/1.1 (REST).
    H1 {
        /// Sends requests.
        sender: http1::SendRequest<Full<Bytes>>,
        /// The task driving the connection; `None` in a clone.
        driver: Option<tokio::task::JoinHandle<()>>,
    },
    /// HTTP/2 (gRPC).
    H2 {
        /// Sends requests (streams).
        sender: http2::SendRequest<Full<Bytes>>,
        /// The task driving the connection; `None` in a clone.
        driver: Option<tokio::task::JoinHandle<()>>,
    },
}

impl Drop for Conn {
    fn drop(&mut self) {
        match self {
            Conn::H1 { driver, .. } | Conn::H2 { driver, .. } => {
                if let Some(d) = driver {
                    d.abort();
                }
            }
        }
    }
}

impl Conn {
    /// Another handle on the same HTTP/2 connection (a new stream per request, as a gRPC
    /// channel multiplexes); None for HTTP/1.1, which serves one request at a time.
    pub fn share(&self) -> Option<Conn> {
        match self {
            Conn::H2 { sender, .. } => Some(Conn::H2 {
                sender: sender.clone(),
                driver: None,
            }),
            Conn::H1 { .. } => None,
        }
    }

    /// Sends one request and reads the whole answer; Ok only when `answer` acknowledges it.
    pub async fn send(
        &mut self,
        req: ::http::Request<Full<Bytes>>,
        answer: Answer,
    ) -> Result<(), Failure> {
        let proto_err = |e: hyper::Error| {
            if e.is_timeout() {
                Failure::new(FailureKind::Timeout, e)
            } else {
                Failure::new(FailureKind::Protocol, e)
            }
        };
        // Before the request is written: a closed or closing connection never saw it.
        let unsent = |e: hyper::Error| {
            if e.is_canceled() || e.is_closed() {
                Failure::new(FailureKind::Unsent, e)
            } else {
                proto_err(e)
            }
        };
        let resp = match self {
            Conn::H1 { sender, .. } => {
                sender.ready().await.map_err(unsent)?;
                sender.send_request(req).await.map_err(unsent)?
            }
            Conn::H2 { sender, .. } => {
                sender.ready().await.map_err(unsent)?;
                sender.send_request(req).await.map_err(unsent)?
            }
        };
        let (parts, body) = resp.into_parts();
        let collected = body.collect().await.map_err(proto_err)?;
        answer.check(&parts, collected)
    }

    /// Ends the connection as a client that is done with it does (HTTP/1.1 closes once
    /// idle, HTTP/2 sends GOAWAY, TLS sends close_notify) and waits, at most `limit`, until
    /// it has: the close then happens now, in the caller's time, not whenever the handle
    /// would have been dropped. A connection that does not end in time is aborted.
    pub async fn close(mut self, limit: Duration) {
        let driver = match &mut self {
            Conn::H1 { driver, .. } | Conn::H2 { driver, .. } => driver.take(),
        };
        // Dropping the sender is what tells hyper the client is done.
        drop(self);
        if let Some(mut driver) = driver {
            if tokio::time::timeout(limit, &mut driver).await.is_err() {
                driver.abort();
            }
        }
    }

    /// HTTP/1.1 connections serve one request at a time; this tells the caller whether the
    /// server closed this one (so the policy must reconnect).
    pub fn is_closed(&self) -> bool {
        match self {
            Conn::H1 { sender, .. } => sender.is_closed(),
            Conn::H2 { sender, .. } => sender.is_closed(),
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A gRPC message with its 5-byte frame header: the compressed flag (0), then the length,
/// big-endian.
pub fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(message.len() + 5);
    framed.push(0);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    framed
}

/// grpc-status and grpc-message of an answer's trailers (or of its headers, for a
/// trailers-only answer); None when it carries no status.
pub fn grpc_status(headers: &::http::HeaderMap) -> Option<(u32, String)> {
    let code = headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok())?;
    let msg = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    Some((code, msg))
}

fn grpc_outcome(headers: &::http::HeaderMap) -> Result<(), Failure> {
    match grpc_status(headers) {
        Some((0, _)) => Ok(()),
        Some((c, msg)) => Err(Failure::new(
            FailureKind::GrpcStatus(c),
            format!("grpc-status {c}: {msg}"),
        )),
        None => Err(Failure::new(
            FailureKind::Protocol,
            "gRPC answer without grpc-status",
        )),
    }
}

/// The value of a congestion-control flag that keeps the host's default (part of what a
/// result records, so it lives in [`crate::result`]).
pub use crate::result::HOST_CONGESTION_CONTROL;

/// A congestion-control flag's value, checked before anything starts: `None` for
/// [`HOST_CONGESTION_CONTROL`], else the name once a probe socket took it (the error has the
/// kernel's reason and how to see what it offers).
pub fn congestion_control_choice(arg: &str) -> Result<Option<Arc<str>>> {
    if arg == HOST_CONGESTION_CONTROL {
        return Ok(None);
    }
    let probe = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .context("a probe socket")?;
    set_congestion_control(&probe, arg).map_err(|e| {
        anyhow!(
            "{arg}: the kernel refused it ({e}); `sysctl net.ipv4.tcp_available_congestion_control` \
             lists what it offers, or pass `{HOST_CONGESTION_CONTROL}` to keep the host's default ({})",
            host_congestion_control()
        )
    })?;
    Ok(Some(Arc::from(arg)))
}

/// The host's default TCP congestion control as the kernel reports it, or "unknown".
pub fn host_congestion_control() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Sets a socket's TCP congestion control (Linux `TCP_CONGESTION`): the kernel refuses a
/// name it does not offer, or one outside `net.ipv4.tcp_allowed_congestion_control` for a
/// process without CAP_NET_ADMIN.
#[cfg(target_os = "linux")]
pub fn set_congestion_control(socket: &impl std::os::fd::AsFd, name: &str) -> std::io::Result<()> {
    socket2::SockRef::from(socket).set_tcp_congestion(name.as_bytes())
}

/// Elsewhere there is no per-socket choice to make.
#[cfg(not(target_os = "linux"))]
pub fn set_congestion_control(_socket: &impl std::os::fd::AsFd, name: &str) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!("TCP congestion control {name}: only Linux sets it per socket"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let t = Target::parse("proxy:6334").unwrap();
        assert!(t.tls);
        assert_eq!(t.default_protocol(), Protocol::Grpc);
        let t = Target::parse("http://127.0.0.1:6333/").unwrap();
        assert!(!t.tls);
        assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 6333));
        assert_eq!(t.default_protocol(), Protocol::Rest);
        let t = Target::parse("https://[::1]:8443").unwrap();
        assert_eq!(t.host, "::1");
        assert_eq!(t.authority(), "[::1]:8443");
        assert!(Target::parse("proxy").is_err());
        assert!(Target::parse("ftp://x:1").is_err());
        assert!(Target::parse("x:notaport").is_err());
    }

    /// The congestion control asked for is the one the connection's socket has, and a
    /// name the kernel does not offer fails the connect with the kernel's reason.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn connections_take_the_congestion_control_asked_for() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = Target::parse(&format!("http://{addr}")).unwrap();
        // reno is built into every Linux kernel and allowed to every process.
        let connector = Connector::new(target.clone(), Protocol::Rest, None, None)
            .await
            .unwrap()
            .with_congestion_control(Some(Arc::from("reno")));
        let tcp = connector.connect_tcp().await.unwrap();
        let name = socket2::SockRef::from(&tcp).tcp_congestion().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&name).trim_end_matches('\0'),
            "reno"
        );

        let unknown = Connector::new(target, Protocol::Rest, None, None)
            .await
            .unwrap()
            .with_congestion_control(Some(Arc::from("no-such-algorithm")));
        let err = unknown.connect_tcp().await.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
    }
}
