//! L4 mode: decrypt and splice bytes to the upstream. Protocol-agnostic, and the overhead
//! floor against which the HTTP mode's cost is measured.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::io::{Activity, QuietLimits};
use crate::upstream::UpstreamAddr;

/// Copy buffers: 64 KiB moves a TLS record's worth of plaintext (16 KiB) several times per
/// syscall without holding much memory per connection.
const SPLICE_BUFFER: usize = 64 * 1024;

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

/// Connects to `upstream` and copies both ways until either side closes or no bytes have
/// moved for `idle`.
pub async fn splice<IO>(
    mut client: IO,
    upstream: &UpstreamAddr,
    connect_timeout: Duration,
    activity: Arc<Activity>,
    idle: Duration,
) -> Result<(u64, u64), SpliceError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let connect_err = |source| SpliceError::Connect {
        upstream: upstream.to_string(),
        source,
    };
    let mut server = tokio::time::timeout(
        connect_timeout,
        TcpStream::connect(upstream.authority.as_str()),
    )
    .await
    .map_err(|_| connect_err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")))?
    .map_err(connect_err)?;
    server.set_nodelay(true).map_err(SpliceError::Copy)?;
    let quiet = QuietLimits::uniform(idle);
    tokio::select! {
        r = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut server, SPLICE_BUFFER, SPLICE_BUFFER) => {
            r.map_err(SpliceError::Copy)
        }
        _ = activity.wait_quiet(&quiet) => Ok((0, 0)),
    }
}
