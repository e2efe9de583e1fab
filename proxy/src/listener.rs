//! A bound listener: its socket and the options accepted connections inherit, its accept
//! loop, and each connection from accept through the handshake to HTTP or TCP forwarding
//! and close. What a listener is (its plan, its TLS, its nodes) is made by `server.rs`;
//! what happens to a request is `http/`'s and `tcp.rs`'s.

use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus::IntGauge;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{ClientProtocol, Limits};
use crate::http::{ClientStream, HttpForwarder, NextBytes};
use crate::liveness::{Activity, CountingIo, QuietLimits};
use crate::metrics::ListenerMetrics;
use crate::switch::SwitchableListener;
use crate::tls::{self, ListenerTls, Offload};
use crate::trust::TrustedProxies;
use crate::upstream::UpstreamPool;

/// Pending connections the kernel queues per listener. A new-connection-per-request
/// benchmark opens connections in bursts; a short queue turns bursts into SYN retries
/// (a one-second stall) instead of waiting connections.
const LISTEN_BACKLOG: u32 = 4096;
/// TCP keep-alive probes: one every 10 s after `limits.tcp_keepalive` of silence, and the
/// connection is dropped after 3 unanswered ones.
const TCP_KEEPALIVE_PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
const TCP_KEEPALIVE_PROBES: u32 = 3;

/// What the connection task needs to know about its listener.
pub(crate) struct ListenerCtx {
    /// What it handshakes with (switchable), and the listener's name.
    pub tls: Arc<SwitchableListener>,
    /// Where handshakes sign.
    pub offload: Offload,
    /// Limits and timeouts.
    pub limits: Limits,
    /// Its metrics (the default certificate's labels).
    pub metrics: ListenerMetrics,
    /// http or tcp forwarding.
    pub mode: Mode,
    /// Its upstream nodes.
    pub upstreams: Arc<UpstreamPool>,
    /// The active checks of `upstreams`.
    pub health_check: crate::upstream::HealthCheckPlan,
    /// Where a PROXY protocol header is read from (`None`: the listener takes none).
    pub proxy_protocol: Option<TrustedProxies>,
    /// The listener's own connection limit, if it has one (kept across reloads that do
    /// not change it, so connections already open still count).
    pub connection_slots: Option<Arc<Semaphore>>,
    /// Open connections per client address, where the listener caps them.
    pub client_connections: Option<Arc<crate::rate_limit::ClientConnections>>,
}

/// What a listener does with a decrypted stream.
pub(crate) enum Mode {
    /// Serve HTTP and forward each request.
    Http(Arc<HttpForwarder>),
    /// Splice bytes to a node, once the client has opened its connection as `ClientProtocol`
    /// says.
    Tcp(ClientProtocol),
}

/// Listener `name`'s listening socket, with the options every accepted connection
/// inherits: the one an upgrade handed over for it where there is one (so no connection is
/// refused while processes change), else bound afresh. Recorded for a later handover.
pub(crate) fn bind(name: &str, addr: SocketAddr, limits: &Limits) -> std::io::Result<TcpListener> {
    let listener = match crate::upgrade::take_inherited(name, addr) {
        Some(inherited) => {
            set_connection_options(&inherited, limits)?;
            inherited.set_nonblocking(true)?;
            TcpListener::from_std(inherited)?
        }
        None => bind_afresh(addr, limits)?,
    };
    crate::upgrade::record(name, &listener);
    Ok(listener)
}

fn bind_afresh(addr: SocketAddr, limits: &Limits) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // Lets a restarted proxy bind while old connections sit in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    set_connection_options(&socket, limits)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// TCP_NODELAY, so small responses (gRPC acks, JSON results) do not wait for Nagle, and
/// SO_KEEPALIVE, so the kernel finds a peer that vanished (power loss, a NAT that forgot
/// the connection) even between requests, when no deadline of ours runs. Set on the
/// listening socket, Linux copies both to every accepted connection for free.
fn set_connection_options(socket: &impl std::os::fd::AsFd, limits: &Limits) -> std::io::Result<()> {
    let socket = socket2::SockRef::from(socket);
    socket.set_tcp_nodelay(true)?;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(limits.tcp_keepalive)
        .with_interval(TCP_KEEPALIVE_PROBE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_PROBES);
    socket.set_tcp_keepalive(&keepalive)
}

/// Accepts until `stop` (the listener removed by a reload, or the drain after SIGTERM),
/// one task per connection, within the process-wide `limit`. Each connection takes the
/// listener's context in effect when it was accepted: a reload swaps `ctx` for new
/// connections while the ones already running keep theirs. Connections drain on `drain`.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    ctx: Arc<ArcSwap<ListenerCtx>>,
    limit: Arc<Semaphore>,
    tracker: TaskTracker,
    stop: CancellationToken,
    drain: CancellationToken,
) {
    loop {
        // Take a slot before accepting: at the limit, new connections wait in the kernel's
        // queue instead of being accepted and starved.
        let permit = tokio::select! {
            p = limit.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = stop.cancelled() => return,
        };
        // Then the listener's own slot, if it has a limit of its own.
        let slots = ctx.load().connection_slots.clone();
        let listener_permit = match slots {
            Some(slots) => tokio::select! {
                p = slots.acquire_owned() => p.ok(),
                _ = stop.cancelled() => return,
            },
            None => None,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    tracing::warn!(listener = %ctx.load().tls.labels.name, error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => return,
        };
        tracker.spawn(handle_connection(
            ctx.load_full(),
            stream,
            peer,
            (permit, listener_permit),
            drain.clone(),
        ));
    }
}

/// Decrements the active-connections gauge however the connection task ends.
struct ActiveGuard(IntGauge);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

async fn handle_connection(
    ctx: Arc<ListenerCtx>,
    mut stream: TcpStream,
    mut peer: SocketAddr,
    _permits: (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>),
    shutdown: CancellationToken,
) {
    let m = &ctx.metrics;
    m.accepted.inc();
    m.active.inc();
    let _active = ActiveGuard(m.active.clone());
    // Linux hands the listener's TCP_NODELAY and keep-alive settings to every accepted
    // socket (see `bind`); elsewhere they are set here, five system calls per connection.
    #[cfg(not(target_os = "linux"))]
    let _ = set_connection_options(&stream, &ctx.limits);
    let activity = Activity::new(matches!(ctx.mode, Mode::Tcp(_)));
    let started = Instant::now();
    // The PROXY header and the handshake share one deadline: a balancer's header comes
    // with the client's first bytes.
    let deadline = tokio::time::Instant::now() + ctx.limits.handshake_timeout;
    if let Some(trusted) = &ctx.proxy_protocol {
        match client_behind_balancer(&ctx, &mut stream, peer, trusted, deadline).await {
            Some(client) => peer = client,
            None => return,
        }
    }
    // The client's cap is checked once its address is known (a balancer's PROXY header
    // names it), before the handshake spends anything on it.
    let Ok(_client_slot) = client_slot(&ctx, peer) else {
        return;
    };
    // PostgreSQL's clients ask for TLS before they start it (or cancel a query in clear).
    let mut direct_postgres_tls = false;
    if let Mode::Tcp(ClientProtocol::Postgres) = ctx.mode {
        match Box::pin(postgres_opening(&ctx, &mut stream, peer, deadline)).await {
            Some(direct) => direct_postgres_tls = direct,
            None => return,
        }
    }
    let io = CountingIo::new(stream, m.received.clone(), m.sent.clone(), activity.clone());

    // Read once: a switch while this handshake runs does not affect it.
    let current = ctx.tls.current();
    // The handshake's and the forwarding's state machines are boxed, so the task itself
    // (allocated for every connection at accept) holds only what an idle connection needs:
    // inline, they made the task 11 KiB, most of an idle connection's memory.
    let Some(tls_stream) = Box::pin(handshake(&ctx, &current, io, peer, deadline)).await else {
        return;
    };
    let (version, resumed, h2) = tls::describe(&tls_stream);
    let m = current.metrics_for(tls_stream.get_ref().1.server_name());
    m.handshake_ok(version, resumed, started.elapsed());
    let (suite, group) = tls::negotiated(&tls_stream);
    m.negotiated(version, suite, group);

    match &ctx.mode {
        Mode::Http(forwarder) => {
            let mut tls_stream = tls_stream;
            if !h2 {
                match tls_stream
                    .next_bytes(&activity, forwarder.quiet_limits(), &shutdown)
                    .await
                {
                    NextBytes::Arrived => {}
                    NextBytes::Quiet(why) => {
                        m.connection_closed(why.label());
                        return;
                    }
                    NextBytes::Draining => return,
                }
            }
            if let Err(e) = Box::pin(forwarder.serve(
                tls_stream,
                h2,
                peer,
                crate::http::TlsFacts {
                    version,
                    resumed,
                    provider: current.provider().as_str(),
                },
                activity,
                shutdown,
            ))
            .await
            {
                if !is_benign_close(&e) {
                    m.connection_error("http");
                    // hyper's own message is only the kind ("http2 error"); the cause (a
                    // keep-alive PING the client never answered, a protocol error) is in
                    // its sources.
                    crate::peer_warn!(listener = %ctx.tls.labels.name, %peer, error = %crate::error_chain(&e), "connection error");
                }
            }
        }
        Mode::Tcp(_) => {
            Box::pin(splice_connection(
                &ctx,
                tls_stream,
                direct_postgres_tls,
                activity,
                started,
                peer,
            ))
            .await
        }
    }
}

/// A tcp listener's connection after its handshake: PostgreSQL's ALPN rule for direct TLS,
/// then the splice to a node until it ends, counted by how it ended.
async fn splice_connection(
    ctx: &ListenerCtx,
    tls_stream: Box<TlsStream<CountingIo<TcpStream>>>,
    direct_postgres_tls: bool,
    activity: Arc<Activity>,
    started: Instant,
    peer: SocketAddr,
) {
    let m = &ctx.metrics;
    if direct_postgres_tls && tls_stream.get_ref().1.alpn_protocol() != Some(crate::postgres::ALPN)
    {
        // As PostgreSQL does: direct TLS that did not name PostgreSQL may be another
        // protocol's client, talked into connecting here.
        m.postgres_opening("direct_tls_without_alpn");
        m.connection_error("postgres_opening");
        crate::peer_warn!(listener = %ctx.tls.labels.name, %peer, "direct TLS without ALPN \"postgresql\" refused");
        return;
    }
    // The server has nothing to say first in tcp mode: see `acknowledge_finished`.
    acknowledge_finished(tls_stream.get_ref().0.get_ref());
    let spliced = crate::tcp::splice(
        tls_stream,
        &ctx.upstreams,
        ctx.limits.upstream_connect_timeout,
        activity,
        ctx.limits.idle_timeout,
        ctx.limits.max_connection_age.map(|age| (started, age)),
    )
    .await;
    match spliced {
        Ok(crate::tcp::SpliceEnd::Closed) => {}
        Ok(crate::tcp::SpliceEnd::Idle) => m.connection_closed("idle"),
        Ok(crate::tcp::SpliceEnd::MaxAge) => m.connection_closed("max_age"),
        Err(e @ crate::tcp::SpliceError::Connect { .. }) => {
            m.upstream_error("connect");
            m.connection_error("upstream_connect");
            crate::peer_warn!(listener = %ctx.tls.labels.name, %peer, error = %e, "connection error");
        }
        Err(crate::tcp::SpliceError::Copy(e)) => {
            if !matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            ) {
                m.connection_error("io");
                crate::peer_warn!(listener = %ctx.tls.labels.name, %peer, error = %e, "connection error");
            }
        }
    }
}

/// The client's TLS handshake under `deadline` (shared with a PROXY header). The stream
/// comes out boxed: held inline (1.2 KiB), every place it passes through in the connection
/// task (this result, the binding, the wait for the first request) would be a slot of its
/// own, each resident for the connection's life. `None` when the handshake failed or timed
/// out (counted and logged here).
async fn handshake(
    ctx: &ListenerCtx,
    current: &ListenerTls,
    io: CountingIo<TcpStream>,
    peer: SocketAddr,
    deadline: tokio::time::Instant,
) -> Option<Box<TlsStream<CountingIo<TcpStream>>>> {
    let accept = tls::accept(
        io,
        |server_name| current.config_for(server_name),
        &ctx.offload,
        current.qat_signing(),
    );
    // Until the ClientHello names a server, failures count against the default certificate.
    let m = &current.metrics;
    match tokio::time::timeout_at(deadline, accept).await {
        Ok(Ok(stream)) => Some(Box::new(stream)),
        Ok(Err(e)) => {
            m.handshake_failed_because(e.reason());
            m.connection_error("handshake");
            crate::peer_warn!(listener = %ctx.tls.labels.name, %peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            m.handshake_failed_because("timeout");
            deadline_passed(ctx, m, peer, "TLS handshake");
            None
        }
    }
}

/// The client's slot under the listener's `max_connections_per_client`: `Err` when it has
/// that many open already (counted and logged here), `Ok(None)` without a cap.
fn client_slot(
    ctx: &ListenerCtx,
    peer: SocketAddr,
) -> Result<Option<crate::rate_limit::ClientSlot>, ()> {
    let Some(table) = &ctx.client_connections else {
        return Ok(None);
    };
    match table.enter(peer.ip()) {
        Some(slot) => Ok(Some(slot)),
        None => {
            ctx.metrics.connection_error("client_connection_limit");
            crate::peer_warn!(listener = %ctx.tls.labels.name, %peer, "connection refused: the client has max_connections_per_client open");
            Err(())
        }
    }
}

/// A PostgreSQL client's opening read and answered by `deadline` (shared with the
/// handshake): `Some(direct)` when the TLS handshake follows (`direct`: without an
/// SSLRequest), `None` when the connection goes no further (a cancel request passed on, a
/// refusal counted and logged).
async fn postgres_opening(
    ctx: &ListenerCtx,
    stream: &mut TcpStream,
    peer: SocketAddr,
    deadline: tokio::time::Instant,
) -> Option<bool> {
    let m = &ctx.metrics;
    let opened = tokio::time::timeout_at(
        deadline,
        Box::pin(crate::postgres::open(stream, || {
            m.postgres_opening("gssenc_refused")
        })),
    )
    .await;
    match opened {
        Ok(Ok(opening)) => {
            m.postgres_opening(opening.label());
            match opening {
                crate::postgres::Opening::Tls { direct } => Some(direct),
                crate::postgres::Opening::Cancel(packet) => {
                    crate::postgres::pass_on_cancel(
                        packet,
                        &ctx.upstreams,
                        ctx.limits.upstream_connect_timeout,
                    )
                    .await;
                    None
                }
            }
        }
        Ok(Err(e)) => {
            m.postgres_opening(e.label());
            m.connection_error("postgres_opening");
            crate::peer_warn!(listener = %ctx.tls.labels.name, %peer, error = %e, "PostgreSQL connection refused");
            None
        }
        Err(_) => {
            deadline_passed(ctx, m, peer, "PostgreSQL opening");
            None
        }
    }
}

/// The client a trusted balancer's PROXY header names, read by `deadline`; `None` when the
/// connection is refused (counted and logged here).
async fn client_behind_balancer(
    ctx: &ListenerCtx,
    stream: &mut TcpStream,
    peer: SocketAddr,
    trusted: &TrustedProxies,
    deadline: tokio::time::Instant,
) -> Option<SocketAddr> {
    let m = &ctx.metrics;
    // Boxed like the handshake: its peek buffer must not grow every connection's task,
    // PROXY protocol or not.
    let header = tokio::time::timeout_at(
        deadline,
        Box::pin(crate::proxy_protocol::read_header(stream, peer, trusted)),
    )
    .await;
    match header {
        Ok(Ok(client)) => Some(client),
        Ok(Err(e)) => {
            m.connection_error(e.label());
            crate::peer_warn!(listener = %ctx.tls.labels.name, %peer, error = %e, "connection refused");
            None
        }
        Err(_) => {
            deadline_passed(ctx, m, peer, "PROXY protocol header");
            None
        }
    }
}

/// Counts and logs a connection whose PROXY header or handshake (`what`) did not arrive by
/// the handshake deadline.
fn deadline_passed(ctx: &ListenerCtx, m: &ListenerMetrics, peer: SocketAddr, what: &str) {
    m.connection_error("handshake_timeout");
    crate::peer_warn!(
        listener = %ctx.tls.labels.name,
        %peer,
        timeout = ?ctx.limits.handshake_timeout,
        "{what} timed out"
    );
}

/// The client stream of an HTTP listener: TLS over the counted socket, boxed (see
/// `handshake`).
impl ClientStream for Box<TlsStream<CountingIo<TcpStream>>> {
    fn all_sent(&self) -> bool {
        !self.get_ref().1.wants_write()
    }

    /// Waits for an HTTP/1.1 client's next bytes, at most the quiet limit that applies (the
    /// first-request timeout, then the idle timeout). Until they come the connection holds
    /// no HTTP state: hyper allocates its 8 KiB read buffer as soon as it is polled, which
    /// was a third of an idle connection's memory (nginx too allocates its buffers only
    /// when data arrives).
    async fn next_bytes(
        &mut self,
        activity: &Activity,
        limits: &QuietLimits,
        shutdown: &CancellationToken,
    ) -> NextBytes {
        let (io, conn) = self.get_mut();
        // The request may have come with the client's Finished and already sit in rustls,
        // or in the socket's read-ahead.
        if io.has_buffered() {
            return NextBytes::Arrived;
        }
        match conn.process_new_packets() {
            Ok(state) if state.plaintext_bytes_to_read() == 0 && !state.peer_has_closed() => {}
            // Data, a close or an error: hyper's first read sees it.
            _ => return NextBytes::Arrived,
        }
        let tcp = io.get_ref();
        // Usually the request is already in the socket: one peek says so without the round
        // trip through the reactor that waiting for readiness would cost.
        let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        match socket2::SockRef::from(tcp).peek(&mut probe) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            // Data, end of stream or an error: hyper's first read sees it.
            _ => return NextBytes::Arrived,
        }
        // Nothing yet: a new client may be waiting for the ACK of its Finished.
        if activity.requests_started() == 0 {
            acknowledge_finished(tcp);
        }
        tokio::select! {
            _ = tcp.readable() => NextBytes::Arrived,
            why = activity.wait_quiet(limits) => NextBytes::Quiet(why),
            _ = shutdown.cancelled() => NextBytes::Draining,
        }
    }
}

/// Sends the ACK of the client's Finished now. A client that keeps Nagle on holds its first
/// request until that ACK arrives; HTTP/2 answers the handshake with SETTINGS, which carries
/// it, but HTTP/1.1 and tcp mode have nothing to send (and no session tickets when
/// resumption is off), so the kernel would hold it for its delayed-ACK timer: the first
/// response came 41 ms after the handshake. Done only when the request is not already
/// there, so most clients never see the extra packet; `loadgen bench` showed no difference
/// in CPU per connection with it (waiting a millisecond first instead left Nagle clients at
/// 2.3 ms).
fn acknowledge_finished(tcp: &TcpStream) {
    let _ = socket2::SockRef::from(tcp).set_tcp_quickack(true);
}

/// A client that goes away between requests is normal, not an error worth a log line.
fn is_benign_close(e: &hyper::Error) -> bool {
    if e.is_incomplete_message() || e.is_canceled() {
        return false;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            );
        }
        source = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepted connections get TCP_NODELAY and the keep-alive settings from the
    /// listening socket (on Linux by inheritance, elsewhere per connection).
    #[tokio::test]
    async fn accepted_sockets_have_nodelay_and_keepalive() {
        let limits = Limits {
            tcp_keepalive: std::time::Duration::from_secs(45),
            ..Limits::default()
        };
        let listener = bind("test", "127.0.0.1:0".parse().unwrap(), &limits).unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        #[cfg(not(target_os = "linux"))]
        set_connection_options(&accepted, &limits).unwrap();
        let s = socket2::SockRef::from(&accepted);
        assert!(s.tcp_nodelay().unwrap());
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), limits.tcp_keepalive);
        assert_eq!(
            s.tcp_keepalive_interval().unwrap(),
            TCP_KEEPALIVE_PROBE_INTERVAL
        );
        assert_eq!(s.tcp_keepalive_retries().unwrap(), TCP_KEEPALIVE_PROBES);
    }
}
