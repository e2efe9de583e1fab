//! The proxy's CPU for one full handshake without sockets, a client or a scheduler in the
//! figure: client and server exchange bytes in memory and only the server's calls are
//! timed. The criterion bench and `loadgen bench` both use it, so "the cost beyond the
//! handshake's cryptography" is always measured against the same baseline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection};

/// Scratch buffers reused across handshakes (one flight each way).
pub type Wire = (Vec<u8>, Vec<u8>);

/// One full handshake over in-memory buffers; returns the time spent in the server's calls
/// and the server's side of the finished connection (what it negotiated). The client must
/// trust the server's certificate for `localhost`.
pub fn server_side_handshake(
    server_config: &Arc<ServerConfig>,
    client_config: &Arc<ClientConfig>,
    (to_server, to_client): &mut Wire,
) -> Result<(Duration, ServerConnection), rustls::Error> {
    let name = ServerName::try_from("localhost").expect("a valid DNS name");
    let mut client = ClientConnection::new(client_config.clone(), name)?;
    let started = Instant::now();
    let mut server = ServerConnection::new(server_config.clone())?;
    let mut in_server = started.elapsed();
    while client.is_handshaking() || server.is_handshaking() {
        to_server.clear();
        while client.wants_write() {
            client
                .write_tls(to_server)
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        }
        let started = Instant::now();
        let mut rd = &to_server[..];
        while !rd.is_empty() {
            server
                .read_tls(&mut rd)
                .map_err(|e| rustls::Error::General(e.to_string()))?;
            server.process_new_packets()?;
        }
        to_client.clear();
        while server.wants_write() {
            server
                .write_tls(to_client)
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        }
        in_server += started.elapsed();
        let mut rd = &to_client[..];
        while !rd.is_empty() {
            client
                .read_tls(&mut rd)
                .map_err(|e| rustls::Error::General(e.to_string()))?;
            client.process_new_packets()?;
        }
    }
    Ok((in_server, server))
}

/// Mean server-side cost of `count` full handshakes after `warmup` unmeasured ones.
pub fn mean_server_handshake(
    server_config: &Arc<ServerConfig>,
    client_config: &Arc<ClientConfig>,
    warmup: usize,
    count: usize,
) -> Result<Duration, rustls::Error> {
    let mut wire: Wire = (Vec::with_capacity(4096), Vec::with_capacity(16 * 1024));
    for _ in 0..warmup {
        server_side_handshake(server_config, client_config, &mut wire)?;
    }
    let mut total = Duration::ZERO;
    for _ in 0..count.max(1) {
        total += server_side_handshake(server_config, client_config, &mut wire)?.0;
    }
    Ok(total / count.max(1) as u32)
}
