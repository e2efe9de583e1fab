//! What the bench sends, as [`RequestSource`]s the driver of `loadgen run` sends them: a
//! tiny GET ([`TinyGet`]) and an upload of a fixed body ([`Upload`]: REST JSON over
//! HTTP/1.1 or h2, gRPC over h2), with the bench's TLS clients and a connector per
//! terminator listener. The loops, connection policies, timeouts and counting are the
//! driver's.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Result;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Uri};
use http_body_util::Full;

use crate::client::{Answer, Connector, Protocol, Target};
use crate::workload::{RequestSource, Workload};

/// The server name every terminator's certificate carries.
pub const SERVER_NAME: &str = "localhost";

/// An UPSERT_100 of 1024-d vectors as REST JSON with four decimals, as the new-connection
/// rows send it (~800 KB).
pub const UPSERT_JSON_BYTES: usize = 800 * 1024;
/// The same as the keep-alive rows send it (763 KB).
pub const BULK_JSON_BYTES: usize = 763 * 1024;
/// An UPSERT_100 of 1024-d vectors as gRPC protobuf (~416 KB).
pub const UPSERT_GRPC_BYTES: usize = 416 * 1024;
/// Where REST uploads go: Qdrant's upsert path.
pub const REST_UPSERT_PATH: &str = "/collections/bench/points?wait=true";
/// Where gRPC uploads go: Qdrant's upsert method.
pub const GRPC_UPSERT_PATH: &str = "/qdrant.Points/Upsert";

/// Upload kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bulk {
    /// REST JSON over HTTP/2 (the terminator forwards over HTTP/1.1).
    H2Rest,
    /// REST JSON over HTTP/1.1.
    H1Rest,
    /// gRPC over HTTP/2 (the terminator forwards over h2c).
    Grpc,
}

impl Bulk {
    /// Whether the client speaks HTTP/2.
    pub fn http2(self) -> bool {
        self != Self::H1Rest
    }

    /// The API whose answer acknowledges an upload of this kind.
    pub fn protocol(self) -> Protocol {
        match self {
            Self::Grpc => Protocol::Grpc,
            Self::H1Rest | Self::H2Rest => Protocol::Rest,
        }
    }
}

/// TLS client configurations: the two ALPN offers the rows need, and the baseline's.
#[derive(Clone)]
pub struct Clients {
    /// Offers ALPN http/1.1.
    pub http1: Arc<rustls::ClientConfig>,
    /// Offers ALPN h2.
    pub h2: Arc<rustls::ClientConfig>,
    /// The same client without ALPN, for the in-memory handshake baseline.
    pub in_memory: Arc<rustls::ClientConfig>,
    /// The TCP congestion control of every client socket (`None`: the host's default).
    pub congestion_control: Option<Arc<str>>,
}

impl Clients {
    /// The client that offers what `kind` speaks.
    pub fn for_kind(&self, kind: Bulk) -> &Arc<rustls::ClientConfig> {
        if kind.http2() {
            &self.h2
        } else {
            &self.http1
        }
    }
}

/// A connector to a terminator's listener at `addr` for uploads of `kind` (the tiny GET is
/// an HTTP/1.1 REST request), verifying the certificate for [`SERVER_NAME`].
pub async fn connector(addr: SocketAddr, clients: &Clients, kind: Bulk) -> Result<Arc<Connector>> {
    let target = Target {
        host: addr.ip().to_string(),
        port: addr.port(),
        tls: true,
    };
    let config = clients.for_kind(kind).clone();
    Ok(Arc::new(
        Connector::new(target, kind.protocol(), Some(config), Some(SERVER_NAME))
            .await?
            .over_http2(kind.http2())
            .with_congestion_control(clients.congestion_control.clone()),
    ))
}

/// A plaintext connector straight to a sink, HTTP/2 with prior knowledge: the direct path
/// the latency row is compared with.
pub async fn direct_connector(sink: SocketAddr, clients: &Clients) -> Result<Arc<Connector>> {
    let target = Target {
        host: sink.ip().to_string(),
        port: sink.port(),
        tls: false,
    };
    Ok(Arc::new(
        Connector::new(target, Protocol::Rest, None, None)
            .await?
            .over_http2(true)
            .with_congestion_control(clients.congestion_control.clone()),
    ))
}

/// One upload of a fixed body, as the sink answers it like Qdrant (JSON with
/// `"status":"ok"`, or gRPC status 0).
pub struct Upload {
    kind: Bulk,
    body: Bytes,
    uri: Uri,
    authority: HeaderValue,
    close: bool,
}

impl Upload {
    /// Uploads of `body` as `kind` to `authority`. `close` asks an HTTP/1.1 server to close
    /// after answering (`Connection: close`), as a client that opens a connection per
    /// request says.
    pub fn new(kind: Bulk, body: Bytes, authority: &str, close: bool) -> Result<Self> {
        let path = if kind == Bulk::Grpc {
            GRPC_UPSERT_PATH
        } else {
            REST_UPSERT_PATH
        };
        Ok(Self {
            kind,
            body,
            uri: format!("http://{authority}{path}").parse()?,
            authority: HeaderValue::from_str(authority)?,
            close: close && kind == Bulk::H1Rest,
        })
    }
}

impl RequestSource for Upload {
    fn request(&self, _seq: u64) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(self.body.clone()));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = self.uri.clone();
        let headers = req.headers_mut();
        if self.kind == Bulk::Grpc {
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
        } else {
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        if self.kind == Bulk::H1Rest {
            headers.insert(http::header::HOST, self.authority.clone());
        }
        if self.close {
            headers.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        headers.insert(
            http::header::CONTENT_LENGTH,
            HeaderValue::from(self.body.len()),
        );
        if self.kind.http2() {
            *req.version_mut() = http::Version::HTTP_2;
        }
        req
    }

    fn body_len(&self, _seq: u64) -> usize {
        self.body.len()
    }

    /// The bodies are opaque to the sink: nothing is stored.
    fn points_per_request(&self) -> u64 {
        0
    }

    fn answer(&self) -> Answer {
        Answer::of(self.kind.protocol())
    }
}

/// The tiny request of the new-connection row: a GET over HTTP/1.1 that asks the server
/// to close after its answer of a few bytes.
pub struct TinyGet {
    authority: HeaderValue,
}

impl TinyGet {
    /// The path the sink answers with a few bytes.
    pub const PATH: &'static str = "/tiny";

    /// GETs of [`TinyGet::PATH`] on `authority`.
    pub fn new(authority: &str) -> Result<Self> {
        Ok(Self {
            authority: HeaderValue::from_str(authority)?,
        })
    }
}

impl RequestSource for TinyGet {
    fn request(&self, _seq: u64) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.uri_mut() = Uri::from_static(Self::PATH);
        let headers = req.headers_mut();
        headers.insert(http::header::HOST, self.authority.clone());
        headers.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        req
    }

    fn body_len(&self, _seq: u64) -> usize {
        0
    }

    fn points_per_request(&self) -> u64 {
        0
    }

    fn answer(&self) -> Answer {
        Answer::Status200
    }
}

/// A JSON array of floats of about `size` bytes: a REST upload's body.
pub fn json_body(size: usize) -> Bytes {
    let mut s = String::with_capacity(size + 32);
    s.push_str("{\"points\":[{\"id\":1,\"vector\":[");
    let mut i = 0u32;
    while s.len() + 16 < size {
        // Writing into a String cannot fail.
        let _ = write!(s, "0.{:04},", (i * 7919) % 10_000);
        i += 1;
    }
    s.push_str("0.5]}]}");
    Bytes::from(s)
}

/// A gRPC frame of about `size` bytes (uncompressed, opaque payload).
pub fn grpc_body(size: usize) -> Bytes {
    let payload: Vec<u8> = (0..size - 5).map(|i| (i * 31 % 251) as u8).collect();
    Bytes::from(crate::client::grpc_frame(&payload))
}

/// `localhost:PORT`: the authority of every bench request to `addr`.
pub fn authority(addr: SocketAddr) -> String {
    format!("{SERVER_NAME}:{}", addr.port())
}

/// UPSERT_100 whose point ids recur every `slots` requests: a bench loop of minutes then
/// writes over the same points, as an upsert of an existing point does in Qdrant (the old
/// version deleted, the new one written), rather than growing the database by a few
/// hundred MB a minute.
pub struct RecurringUpserts {
    upserts: Workload,
    slots: u64,
}

impl RecurringUpserts {
    /// `upserts`, its ids recurring after `slots` requests (a multiple of its template
    /// variants keeps each request's vectors as they were).
    pub fn new(upserts: Workload, slots: u64) -> Self {
        Self {
            upserts,
            slots: slots.max(1),
        }
    }
}

impl RequestSource for RecurringUpserts {
    fn request(&self, seq: u64) -> Request<Full<Bytes>> {
        self.upserts.request(seq % self.slots)
    }

    fn body_len(&self, seq: u64) -> usize {
        self.upserts.body_len(seq % self.slots)
    }

    fn points_per_request(&self) -> u64 {
        RequestSource::points_per_request(&self.upserts)
    }

    fn answer(&self) -> Answer {
        RequestSource::answer(&self.upserts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Protocol;
    use crate::workload::{UpsertSpec, ID_MIN};
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn recurring_upserts_write_over_the_same_points_after_their_slots() {
        let vectors = crate::vectors::synthetic(16, 8, 1);
        let spec = UpsertSpec {
            protocol: Protocol::Rest,
            collection: "c".into(),
            points_per_request: 2,
            wait: true,
            json_decimals: 4,
        };
        let upserts = Workload::build(spec, &vectors, ID_MIN, "https", "h:1").unwrap();
        let source = RecurringUpserts::new(upserts, 8);
        let source = &source;
        let body = |seq| async move {
            let req = source.request(seq);
            req.into_body().collect().await.unwrap().to_bytes()
        };
        let ids = |b: Bytes| -> Vec<u64> {
            let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
            v["points"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["id"].as_u64().unwrap())
                .collect()
        };
        assert_eq!(ids(body(0).await), [ID_MIN, ID_MIN + 1]);
        assert_eq!(ids(body(7).await), [ID_MIN + 14, ID_MIN + 15]);
        // Request 8 is request 0 again: the same points, the same vectors.
        assert_eq!(body(8).await, body(0).await);
        assert_eq!(source.body_len(9), source.body_len(1));
    }
}
