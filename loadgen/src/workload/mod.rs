//! What a driver sends: [`RequestSource`], one kind of request and the answer that
//! acknowledges it, and its main implementation, UPSERT_100 ([`Workload`]): Qdrant REST
//! JSON and gRPC protobuf bodies, encoded once before the clock starts. A new workload is
//! one more implementation of [`RequestSource`] (the bench's fixed bodies are another).
//!
//! Each body is a template whose point ids sit at known byte offsets in a fixed-width form
//! (17 decimal digits in JSON, a 9-byte varint in protobuf; every id lies in
//! [2^56, 10^17) where both widths hold). A request copies its template into a pooled
//! buffer and patches the ids: a memcpy and 100 small writes, so the load generator
//! measures the proxy rather than its own encoder, and ids never repeat within a run.

mod json;
mod proto;

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Uri};
use http_body_util::Full;

use crate::client::{Answer, Protocol};
use crate::vectors::VectorSet;

/// One kind of request, as the driver sends it: request number `seq`, what it carries, and
/// what answer acknowledges it. The driver owns pacing, connections, timeouts and
/// counting; an implementation owns only what goes on the wire.
pub trait RequestSource: Send + Sync + 'static {
    /// The request numbered `seq` (warm-up included), ready to send.
    fn request(&self, seq: u64) -> Request<Full<Bytes>>;
    /// Its body length in bytes (the MB/s figures add these up).
    fn body_len(&self, seq: u64) -> usize;
    /// Points one acknowledged request writes into the collection (0 for a request that
    /// writes none): what the count check after a run expects to find.
    fn points_per_request(&self) -> u64;
    /// What answer acknowledges a request.
    fn answer(&self) -> Answer;
}

/// Smallest id we hand out: 2^56, the first value whose varint takes 9 bytes.
pub const ID_MIN: u64 = 1 << 56;
/// One past the largest id: 10^17, the first value with 18 decimal digits.
pub const ID_END: u64 = 100_000_000_000_000_000;

/// How many different vector selections the templates cycle through, so consecutive
/// requests do not carry identical vectors (a compressing or deduplicating hop would
/// otherwise flatter the numbers).
pub const TEMPLATE_VARIANTS: usize = 8;

/// The workload's shape.
#[derive(Clone, Debug)]
pub struct UpsertSpec {
    /// REST (JSON) or gRPC (protobuf).
    pub protocol: Protocol,
    /// The collection upserted into.
    pub collection: String,
    /// Points per upsert.
    pub points_per_request: usize,
    /// Whether each upsert asks Qdrant to wait until it is applied.
    pub wait: bool,
    /// Decimals per float in REST JSON; 0 writes the shortest round-trip f32 form.
    pub json_decimals: usize,
}

struct Template {
    bytes: Vec<u8>,
    id_offsets: Vec<usize>,
}

/// All request bodies of a run, ready to send.
pub struct Workload {
    spec: UpsertSpec,
    templates: Vec<Template>,
    uri: Uri,
    content_type: HeaderValue,
    authority: Option<HeaderValue>,
    id_base: u64,
    pool: Arc<Mutex<Vec<Vec<u8>>>>,
    /// On every request besides the protocol's own headers: API key, `--header`.
    pub extra_headers: http::HeaderMap,
}

impl Workload {
    /// Encodes the templates. `id_base` must leave room for every id of the run below
    /// [`ID_END`]. `scheme` and `authority` name the target: HTTP/2 requests carry them in
    /// the URI, HTTP/1.1 requests in the Host header.
    pub fn build(
        spec: UpsertSpec,
        vectors: &VectorSet,
        id_base: u64,
        scheme: &str,
        authority: &str,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            spec.points_per_request > 0,
            "--points-per-request must be at least 1"
        );
        anyhow::ensure!(!vectors.is_empty(), "no vectors to send");
        anyhow::ensure!((ID_MIN..ID_END).contains(&id_base), "id base out of range");
        let mut templates = Vec::with_capacity(TEMPLATE_VARIANTS);
        for variant in 0..TEMPLATE_VARIANTS {
            let rows: Vec<usize> = (0..spec.points_per_request)
                .map(|j| variant * spec.points_per_request + j)
                .collect();
            let (bytes, id_offsets) = match spec.protocol {
                Protocol::Rest => json::upsert(vectors, &rows, spec.json_decimals),
                Protocol::Grpc => proto::upsert(&spec.collection, spec.wait, vectors, &rows),
            };
            templates.push(Template { bytes, id_offsets });
        }
        let uri: Uri = match spec.protocol {
            Protocol::Rest => format!("/collections/{}/points?wait={}", spec.collection, spec.wait),
            Protocol::Grpc => format!("{scheme}://{authority}/qdrant.Points/Upsert"),
        }
        .parse()?;
        let content_type = HeaderValue::from_static(match spec.protocol {
            Protocol::Rest => "application/json",
            Protocol::Grpc => "application/grpc",
        });
        let authority = match spec.protocol {
            Protocol::Rest => Some(HeaderValue::from_str(authority)?),
            Protocol::Grpc => None,
        };
        Ok(Self {
            spec,
            templates,
            uri,
            content_type,
            authority,
            id_base,
            pool: Arc::new(Mutex::new(Vec::new())),
            extra_headers: http::HeaderMap::new(),
        })
    }

    /// The workload's shape.
    pub fn spec(&self) -> &UpsertSpec {
        &self.spec
    }

    /// Exact body bytes of every request (all templates have the same length for a given
    /// vector set only approximately in JSON, so this is the mean, rounded).
    pub fn body_bytes(&self) -> u64 {
        let total: usize = self.templates.iter().map(|t| t.bytes.len()).sum();
        (total / self.templates.len()) as u64
    }

    /// Smallest and largest body of the run (templates differ by a few bytes: the sign of
    /// each JSON coordinate, the width of the payload's chunk number).
    pub fn body_bytes_range(&self) -> (u64, u64) {
        let lens = self.templates.iter().map(|t| t.bytes.len() as u64);
        (lens.clone().min().unwrap_or(0), lens.max().unwrap_or(0))
    }

    /// The body length of request `seq` (the template it is built from).
    pub fn body_len(&self, seq: u64) -> usize {
        self.templates[(seq % self.templates.len() as u64) as usize]
            .bytes
            .len()
    }

    /// The ids request `seq` carries start here.
    pub fn first_id(&self, seq: u64) -> u64 {
        self.id_base + seq * self.spec.points_per_request as u64
    }

    /// The body of request number `seq`, in a pooled buffer that returns to the pool when
    /// hyper is done with it.
    pub fn body(&self, seq: u64) -> Bytes {
        let template = &self.templates[(seq % self.templates.len() as u64) as usize];
        let mut buf = self
            .pool
            .lock()
            .map(|mut p| p.pop())
            .ok()
            .flatten()
            .unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(&template.bytes);
        let first = self.first_id(seq);
        for (j, &off) in template.id_offsets.iter().enumerate() {
            let id = first + j as u64;
            match self.spec.protocol {
                Protocol::Rest => json::patch_id(&mut buf[off..off + json::ID_WIDTH], id),
                Protocol::Grpc => proto::patch_id(&mut buf[off..off + proto::ID_WIDTH], id),
            }
        }
        Bytes::from_owner(Pooled {
            buf,
            pool: self.pool.clone(),
        })
    }

    /// The full request for `seq`.
    pub fn request(&self, seq: u64) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(self.body(seq)));
        *req.uri_mut() = self.uri.clone();
        req.headers_mut()
            .insert(http::header::CONTENT_TYPE, self.content_type.clone());
        // Names and values are reference-counted: no copy of the bytes per request.
        for (name, value) in &self.extra_headers {
            req.headers_mut().append(name.clone(), value.clone());
        }
        match self.spec.protocol {
            Protocol::Rest => {
                *req.method_mut() = Method::PUT;
                if let Some(a) = &self.authority {
                    req.headers_mut().insert(http::header::HOST, a.clone());
                }
            }
            Protocol::Grpc => {
                *req.method_mut() = Method::POST;
                *req.version_mut() = http::Version::HTTP_2;
                req.headers_mut()
                    .insert(http::header::TE, HeaderValue::from_static("trailers"));
            }
        }
        req
    }
}

impl RequestSource for Workload {
    fn request(&self, seq: u64) -> Request<Full<Bytes>> {
        Workload::request(self, seq)
    }

    fn body_len(&self, seq: u64) -> usize {
        Workload::body_len(self, seq)
    }

    fn points_per_request(&self) -> u64 {
        self.spec.points_per_request as u64
    }

    fn answer(&self) -> Answer {
        Answer::of(self.spec.protocol)
    }
}

/// A body buffer on loan to hyper.
struct Pooled {
    buf: Vec<u8>,
    pool: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Ok(mut pool) = self.pool.lock() {
            // Bounded: at most one spare buffer per request in flight is ever useful.
            if pool.len() < 1024 {
                pool.push(std::mem::take(&mut self.buf));
            }
        }
    }
}

/// A run's id base: somewhere in [2^56, 10^17) with room for 2^30 points, varied per run
/// so consecutive runs into one collection do not overwrite each other.
pub fn id_base_for_run(nonce: u64) -> u64 {
    let slots = (ID_END - ID_MIN) >> 30;
    ID_MIN + (nonce % slots) * (1 << 30)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use qdrant_client::qdrant as pb;

    fn spec(protocol: Protocol) -> UpsertSpec {
        UpsertSpec {
            protocol,
            collection: "bench".into(),
            points_per_request: 100,
            wait: true,
            json_decimals: 4,
        }
    }

    #[test]
    fn rest_body_parses_with_distinct_ids_and_about_8kb_per_vector() {
        let vectors = crate::vectors::synthetic(800, 1024, 1);
        let w = Workload::build(
            spec(Protocol::Rest),
            &vectors,
            id_base_for_run(5),
            "https",
            "localhost:6333",
        )
        .unwrap();
        let a: serde_json::Value = serde_json::from_slice(&w.body(0)).unwrap();
        let b: serde_json::Value = serde_json::from_slice(&w.body(1)).unwrap();
        let points = a["points"].as_array().unwrap();
        assert_eq!(points.len(), 100);
        assert_eq!(points[0]["id"].as_u64().unwrap(), w.first_id(0));
        assert_eq!(points[99]["id"].as_u64().unwrap(), w.first_id(0) + 99);
        assert_eq!(b["points"][0]["id"].as_u64().unwrap(), w.first_id(1));
        let v = points[3]["vector"].as_array().unwrap();
        assert_eq!(v.len(), 1024);
        assert!((v[5].as_f64().unwrap() - f64::from(vectors.row(3)[5])).abs() < 1e-4);
        let per_vector = w.body_bytes() as f64 / 100.0;
        assert!(
            (7_000.0..10_000.0).contains(&per_vector),
            "{per_vector} bytes per vector"
        );
    }

    #[test]
    fn grpc_body_decodes_as_upsert_points() {
        let vectors = crate::vectors::synthetic(800, 64, 2);
        let w = Workload::build(
            spec(Protocol::Grpc),
            &vectors,
            id_base_for_run(9),
            "https",
            "x:1",
        )
        .unwrap();
        for seq in [0u64, 1, 12345] {
            let body = w.body(seq);
            assert_eq!(body[0], 0, "uncompressed gRPC frame");
            let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
            assert_eq!(len, body.len() - 5);
            let msg = pb::UpsertPoints::decode(&body[5..]).unwrap();
            assert_eq!(msg.collection_name, "bench");
            assert_eq!(msg.wait, Some(true));
            assert_eq!(msg.points.len(), 100);
            for (j, p) in msg.points.iter().enumerate() {
                let id = match p.id.as_ref().unwrap().point_id_options {
                    Some(pb::point_id::PointIdOptions::Num(n)) => n,
                    ref other => panic!("{other:?}"),
                };
                assert_eq!(id, w.first_id(seq) + j as u64);
            }
            let row = (seq as usize % TEMPLATE_VARIANTS) * 100 + 7;
            let v = match &msg.points[7].vectors.as_ref().unwrap().vectors_options {
                Some(pb::vectors::VectorsOptions::Vector(v)) => v.clone(),
                other => panic!("{other:?}"),
            };
            match v.vector {
                Some(pb::vector::Vector::Dense(d)) => assert_eq!(d.data, vectors.row(row)),
                other => panic!("{other:?}"),
            }
            assert!(msg.points[0].payload.contains_key("source"));
        }
    }

    #[test]
    fn pooled_buffers_are_reused() {
        let vectors = crate::vectors::synthetic(800, 8, 3);
        let w = Workload::build(spec(Protocol::Rest), &vectors, ID_MIN, "https", "h:1").unwrap();
        let first = w.body(0);
        let ptr = first.as_ptr();
        drop(first);
        assert_eq!(
            w.body(8).as_ptr(),
            ptr,
            "the buffer came back from the pool"
        );
    }
}
