//! PostgreSQL's way of opening a TLS connection, for tcp listeners with
//! `protocol = "postgres"`: what a libpq client sends before (or instead of) its
//! ClientHello, answered the way PostgreSQL's own server answers it, so that psql, psycopg
//! and every libpq client reach the database through the proxy with `sslmode=verify-full`.
//! After the handshake the connection is spliced as any tcp listener's (`tcp.rs`).
//!
//! The openings (PostgreSQL's protocol documentation, "Message Flow" and "SSL Session
//! Encryption"), each 8 bytes `length:int32, code:int32` unless said otherwise:
//! - **SSLRequest** (code 80877103): answered `S`; the client's ClientHello follows.
//! - **Direct TLS** (`sslnegotiation=direct`, libpq 17+): a TLS record comes first. Like
//!   PostgreSQL, the proxy then requires ALPN `postgresql`, so a TLS client of another
//!   protocol cannot be talked into speaking to the database.
//! - **GSSENCRequest** (80877104): answered `N` (the proxy has no Kerberos identity); libpq
//!   then asks for TLS on the same connection.
//! - **CancelRequest** (80877102, 16 bytes: the backend's pid and secret key): libpq before
//!   17, and libpq 17+'s legacy `PQcancel`, send it in clear on a new connection, whatever
//!   `sslmode` says; PostgreSQL accepts it so, without authentication. The proxy passes it on
//!   to every node (it cannot know which holds the backend; a node without it ignores the
//!   key). Refusing it would leave every such client unable to cancel a query; passing it on
//!   gives the network the same view of the key PostgreSQL's own server does, and the key
//!   only cancels (it reads and writes nothing). libpq 17+'s `PQcancelCreate` sends it
//!   inside TLS: that connection is spliced like any other.
//! - **A plaintext StartupMessage** (protocol 3.x): answered with PostgreSQL's
//!   ErrorResponse, SQLSTATE 28000 "TLS required by the proxy", which psql prints as its
//!   FATAL line; the connection then closes.
//!
//! SCRAM channel binding (`channel_binding=require`) cannot pass a terminator: the database
//! sees the proxy's plaintext connection and offers no `SCRAM-SHA-256-PLUS`, so libpq refuses
//! to authenticate ("channel binding is required, but server did not offer an authentication
//! method that supports channel binding"). docs/proxy.md says so.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::upstream::UpstreamPool;

/// The ALPN protocol of PostgreSQL over TLS.
pub(crate) const ALPN: &[u8] = b"postgresql";

const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;
/// A CancelRequest's length: the 8-byte head, the backend's pid and its secret key.
const CANCEL_REQUEST_LEN: usize = 16;
/// PostgreSQL's own bound on a startup packet (`MAX_STARTUP_PACKET_LENGTH`).
const MAX_STARTUP_PACKET: u32 = 10_000;
/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// How a client opened its connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Opening {
    /// The TLS handshake follows: after an SSLRequest answered `S`, or at once (`direct`).
    Tls {
        /// TLS without an SSLRequest: ALPN `postgresql` is required after the handshake.
        direct: bool,
    },
    /// A CancelRequest in clear, to pass on as it came.
    Cancel([u8; CANCEL_REQUEST_LEN]),
}

impl Opening {
    /// The metric label (one of `metrics::POSTGRES_OPENINGS`).
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Tls { direct: false } => "ssl_request",
            Self::Tls { direct: true } => "direct_tls",
            Self::Cancel(_) => "cancel_request",
        }
    }
}

/// An opening the proxy does not go on with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    /// A StartupMessage in clear: answered with PostgreSQL's error 28000.
    #[error("plaintext startup refused: the listener requires TLS (answered SQLSTATE 28000)")]
    Plaintext,
    /// Neither PostgreSQL nor TLS.
    #[error("not a PostgreSQL opening: length {length}, code {code}")]
    Unknown {
        /// The first four bytes, as PostgreSQL reads them.
        length: u32,
        /// The next four.
        code: u32,
    },
    /// The socket failed or closed midway.
    #[error("reading the opening failed: {0}")]
    Io(#[from] io::Error),
}

impl Refused {
    /// The `proxy_postgres_openings_total` label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Plaintext => "plaintext_refused",
            Self::Unknown { .. } => "invalid",
            Self::Io(_) => "eof",
        }
    }
}

/// Reads the client's opening from `stream` and answers it as PostgreSQL would, leaving the
/// stream at the client's ClientHello when TLS follows. Reads exactly the opening's bytes
/// (the ClientHello stays in the socket for the handshake, so nothing sent in clear can be
/// taken for part of the encrypted stream). `on_gssenc` is called for each GSSENCRequest
/// refused.
pub(crate) async fn open(
    stream: &mut TcpStream,
    mut on_gssenc: impl FnMut(),
) -> Result<Opening, Refused> {
    // libpq asks for GSS encryption at most once per connection, then for TLS.
    let mut gssenc_refused = false;
    loop {
        let mut first = [0u8; 1];
        if stream.peek(&mut first).await? == 0 {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
        }
        if first[0] == TLS_HANDSHAKE_RECORD {
            return Ok(Opening::Tls { direct: true });
        }
        let mut head = [0u8; 8];
        stream.read_exact(&mut head).await?;
        let length = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        match (length, code) {
            (8, SSL_REQUEST) => {
                stream.write_all(b"S").await?;
                return Ok(Opening::Tls { direct: false });
            }
            (8, GSSENC_REQUEST) if !gssenc_refused => {
                stream.write_all(b"N").await?;
                gssenc_refused = true;
                on_gssenc();
            }
            (16, CANCEL_REQUEST) => {
                let mut packet = [0u8; CANCEL_REQUEST_LEN];
                packet[..8].copy_from_slice(&head);
                stream.read_exact(&mut packet[8..]).await?;
                return Ok(Opening::Cancel(packet));
            }
            (length, code) if code >> 16 == 3 && (8..=MAX_STARTUP_PACKET).contains(&length) => {
                // Read the rest of the packet first: closing with unread bytes makes the
                // kernel send a reset, which can overtake the error on its way.
                let rest = u64::from(length - 8);
                tokio::io::copy(&mut (&mut *stream).take(rest), &mut tokio::io::sink()).await?;
                stream.write_all(&tls_required_error()).await?;
                let _ = stream.shutdown().await;
                return Err(Refused::Plaintext);
            }
            (length, code) => return Err(Refused::Unknown { length, code }),
        }
    }
}

/// PostgreSQL's ErrorResponse for a client that did not ask for TLS: severity FATAL,
/// SQLSTATE 28000 (invalid_authorization_specification, what PostgreSQL itself answers when
/// pg_hba.conf has no entry for a non-TLS connection), the message and a hint.
fn tls_required_error() -> Vec<u8> {
    let fields: [(u8, &str); 5] = [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "28000"),
        (b'M', "TLS required by the proxy"),
        (
            b'H',
            "Connect with sslmode=verify-full and sslrootcert set to the proxy's CA certificate.",
        ),
    ];
    let body_len: usize = fields.iter().map(|(_, v)| 1 + v.len() + 1).sum::<usize>() + 1;
    let mut message = Vec::with_capacity(1 + 4 + body_len);
    message.push(b'E');
    message.extend_from_slice(&((4 + body_len) as u32).to_be_bytes());
    for (code, value) in fields {
        message.push(code);
        message.extend_from_slice(value.as_bytes());
        message.push(0);
    }
    message.push(0);
    message
}

/// Passes a CancelRequest on to every node of `upstreams` (each over a new connection, as
/// PostgreSQL expects it); returns how many took it. The node that holds the backend cancels
/// its query; the others find no such backend and ignore it.
pub(crate) async fn pass_on_cancel(
    packet: [u8; CANCEL_REQUEST_LEN],
    upstreams: &UpstreamPool,
    connect_timeout: Duration,
) -> usize {
    let mut sends = tokio::task::JoinSet::new();
    for node in upstreams.nodes() {
        let authority = node.addr().authority.clone();
        sends.spawn(async move {
            let sent = tokio::time::timeout(connect_timeout, async {
                let mut server = TcpStream::connect(authority.as_str()).await?;
                server.write_all(&packet).await?;
                // PostgreSQL closes the connection once it has read the request; waiting
                // for that keeps the request from being cut by our own close.
                let mut end = [0u8; 1];
                let _ = server.read(&mut end).await;
                io::Result::Ok(())
            })
            .await;
            match sent {
                Ok(Ok(())) => true,
                Ok(Err(e)) => {
                    tracing::warn!(upstream = %authority, error = %e, "passing a PostgreSQL cancel request on failed");
                    false
                }
                Err(_) => {
                    tracing::warn!(upstream = %authority, "passing a PostgreSQL cancel request on timed out");
                    false
                }
            }
        });
    }
    let mut passed = 0;
    while let Some(sent) = sends.join_next().await {
        passed += usize::from(sent.unwrap_or(false));
    }
    passed
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    fn request(code: u32) -> [u8; 8] {
        let mut r = [0u8; 8];
        r[..4].copy_from_slice(&8u32.to_be_bytes());
        r[4..].copy_from_slice(&code.to_be_bytes());
        r
    }

    #[tokio::test]
    async fn gssenc_refused_then_ssl_accepted_with_the_hello_left_in_the_socket() {
        let (mut client, mut server) = pair().await;
        client.write_all(&request(GSSENC_REQUEST)).await.unwrap();
        let mut gss = 0;
        let opened = tokio::spawn(async move {
            let o = open(&mut server, || gss += 1).await.unwrap();
            let mut next = [0u8; 3];
            server.read_exact(&mut next).await.unwrap();
            (o, gss, next)
        });
        let mut answer = [0u8; 1];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"N");
        client.write_all(&request(SSL_REQUEST)).await.unwrap();
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"S");
        client.write_all(&[0x16, 3, 1]).await.unwrap();
        let (opening, gss, next) = opened.await.unwrap();
        assert_eq!(opening, Opening::Tls { direct: false });
        assert_eq!(gss, 1);
        assert_eq!(next, [0x16, 3, 1], "the ClientHello's bytes stay unread");
    }

    #[tokio::test]
    async fn a_second_gssenc_request_is_not_postgres() {
        let (mut client, mut server) = pair().await;
        client.write_all(&request(GSSENC_REQUEST)).await.unwrap();
        client.write_all(&request(GSSENC_REQUEST)).await.unwrap();
        let e = open(&mut server, || {}).await.unwrap_err();
        assert_eq!(e.label(), "invalid");
    }

    #[tokio::test]
    async fn direct_tls_is_seen_without_consuming_it() {
        let (mut client, mut server) = pair().await;
        client.write_all(&[0x16, 3, 1, 0, 5]).await.unwrap();
        assert_eq!(
            open(&mut server, || {}).await.unwrap(),
            Opening::Tls { direct: true }
        );
        let mut hello = [0u8; 5];
        server.read_exact(&mut hello).await.unwrap();
        assert_eq!(hello, [0x16, 3, 1, 0, 5]);
    }

    #[tokio::test]
    async fn a_cancel_request_is_read_whole() {
        let (mut client, mut server) = pair().await;
        let mut cancel = [0u8; 16];
        cancel[..4].copy_from_slice(&16u32.to_be_bytes());
        cancel[4..8].copy_from_slice(&CANCEL_REQUEST.to_be_bytes());
        cancel[8..].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        client.write_all(&cancel).await.unwrap();
        assert_eq!(
            open(&mut server, || {}).await.unwrap(),
            Opening::Cancel(cancel)
        );
    }

    /// A plaintext startup gets PostgreSQL's ErrorResponse: 'E', its length, the fields
    /// (severity, SQLSTATE 28000, message) and the terminator, then end of stream.
    #[tokio::test]
    async fn a_plaintext_startup_gets_error_28000() {
        let (mut client, mut server) = pair().await;
        let params = b"user\0alice\0database\0vectors\0\0";
        let mut startup = Vec::new();
        startup.extend_from_slice(&((8 + params.len()) as u32).to_be_bytes());
        startup.extend_from_slice(&(3u32 << 16).to_be_bytes());
        startup.extend_from_slice(params);
        client.write_all(&startup).await.unwrap();
        let e = open(&mut server, || {}).await.unwrap_err();
        assert!(matches!(e, Refused::Plaintext));
        drop(server);
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer[0], b'E');
        let length = u32::from_be_bytes(answer[1..5].try_into().unwrap()) as usize;
        assert_eq!(length + 1, answer.len());
        let fields: Vec<&[u8]> = answer[5..answer.len() - 2].split(|b| *b == 0).collect();
        assert!(fields.contains(&&b"C28000"[..]), "{fields:?}");
        assert!(fields.contains(&&b"MTLS required by the proxy"[..]));
        assert!(fields.contains(&&b"SFATAL"[..]));
        assert_eq!(answer[answer.len() - 1], 0);
    }

    #[tokio::test]
    async fn http_in_clear_is_not_postgres() {
        let (mut client, mut server) = pair().await;
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert!(matches!(
            open(&mut server, || {}).await.unwrap_err(),
            Refused::Unknown { .. }
        ));
    }
}
