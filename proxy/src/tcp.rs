//! L4 mode: decrypt and splice bytes to the upstream. Protocol-agnostic, and the overhead
//! floor against which the HTTP mode's cost is measured.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::liveness::{Activity, QuietLimits};
use crate::upstream::UpstreamPool;

/// Copy buffers: 64 KiB moves a TLS record's worth of plaintext (16 KiB) several times per
/// syscall without holding much memory per connection.
const SPLICE_BUFFER: usize = 64 * 1024;

/// How a spliced connection ended, when neither side failed.
#[derive(Debug, PartialEq, Eq)]
pub enum SpliceEnd {
    /// A side closed.
    Closed,
    /// No bytes moved for the idle timeout.
    Idle,
    /// It reached `limits.max_connection_age`.
    MaxAge,
}

/// Why a spliced connection ended badly.
#[derive(Debug, thiserror::Error)]
pub enum SpliceError {
    /// The upstream could not be reached.
    #[error("connecting to upstream {upstream} failed: {source}")]
    Connect {
        /// Where.
        upstream: String,
        /// Why.
        source: io::Error,
    },
    /// Copying failed midway.
    #[error("splice failed: {0}")]
    Copy(io::Error),
}

/// Connects to a node of `upstreams` (another one if connecting fails: nothing has been
/// sent yet) and copies both ways until either side closes, no bytes have moved for
/// `idle` (zero: no limit), or the connection is `max_age` old (counted from `opened`).
pub async fn splice<IO>(
    mut client: IO,
    upstreams: &UpstreamPool,
    connect_timeout: Duration,
    activity: Arc<Activity>,
    idle: Duration,
    max_age: Option<(tokio::time::Instant, Duration)>,
) -> Result<SpliceEnd, SpliceError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut tried = 0u64;
    let mut last_error = None;
    let (mut server, _lease) = loop {
        let Some(lease) = upstreams.pick(tried) else {
            return Err(last_error.expect("a pool has at least one node"));
        };
        let connected = tokio::time::timeout(
            connect_timeout,
            TcpStream::connect(lease.addr().authority.as_str()),
        )
        .await;
        let (kind, source) = match connected {
            Ok(Ok(server)) => {
                upstreams.connected(&lease);
                break (server, lease);
            }
            Ok(Err(e)) => ("connect", e),
            Err(_) => (
                "connect_timeout",
                io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
            ),
        };
        lease.failed(kind);
        upstreams.connect_failed(&lease);
        tried |= lease.bit();
        if (tried.count_ones() as usize) < upstreams.nodes().len() {
            upstreams.retried();
        }
        last_error = Some(SpliceError::Connect {
            upstream: lease.addr().to_string(),
            source,
        });
    };
    server.set_nodelay(true).map_err(SpliceError::Copy)?;
    let quiet = QuietLimits::uniform(idle);
    let quiet_for_too_long = async {
        if idle.is_zero() {
            std::future::pending().await
        } else {
            activity.wait_quiet(&quiet).await
        }
    };
    // A database session has no request boundary to close at, so the age limit cuts it
    // where it stands: the client sees its connection end, as when the database restarts.
    let aged = async {
        match max_age {
            Some((opened, age)) => tokio::time::sleep_until(opened + age).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut server, SPLICE_BUFFER, SPLICE_BUFFER) => {
            r.map(|_| SpliceEnd::Closed).map_err(SpliceError::Copy)
        }
        _ = quiet_for_too_long => Ok(SpliceEnd::Idle),
        _ = aged => Ok(SpliceEnd::MaxAge),
    }
}
