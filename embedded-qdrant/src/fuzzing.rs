//! Entry points of the fuzz targets for embedded-qdrant's request decoding (`tests/fuzz`;
//! the proxy's are in `proxy::fuzzing`): arbitrary bytes through the decoding a request
//! meets before the store, with the invariant each caller relies on checked here. Hidden
//! from the docs: not an API. Every seed and kept crash is replayed by the unit test below.

use prost::Message;
use qdrant_client::qdrant as pb;

use crate::grpc::filters as grpc_filter;
use crate::grpc::points_in;
use crate::rest::decode_body;

/// A gRPC UpsertPoints message as the Points service decodes and converts it. Invariants:
/// no panic; converted points are as many as sent, in order, each single dense vector as
/// long as it came; and a request refused is refused as INVALID_ARGUMENT (a client error),
/// never as an internal one. Its update filter goes through the filter conversion too.
pub fn grpc_upsert(data: &[u8]) {
    let Ok(req) = pb::UpsertPoints::decode(data) else {
        return;
    };
    if let Some(filter) = &req.update_filter {
        filter_verdict(filter);
    }
    let lengths: Vec<Option<usize>> = req
        .points
        .iter()
        .map(
            |p| match p.vectors.as_ref().and_then(|v| v.vectors_options.as_ref()) {
                Some(pb::vectors::VectorsOptions::Vector(v)) => match &v.vector {
                    Some(pb::vector::Vector::Dense(d)) => Some(d.data.len()),
                    Some(_) => None,
                    // The deprecated flat field, which clients before 1.13 send.
                    #[allow(deprecated)]
                    None => Some(v.data.len()),
                },
                _ => None,
            },
        )
        .collect();
    match points_in(req.points) {
        Ok(points) => {
            assert_eq!(points.len(), lengths.len(), "points lost or added");
            for (point, sent) in points.iter().zip(lengths) {
                if let (qdrant_edge::VectorStructPersisted::Single(v), Some(n)) =
                    (&point.vector, sent)
                {
                    assert_eq!(v.len(), n, "a vector changed length");
                }
            }
        }
        Err(status) => assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}"),
    }
}

/// A gRPC Filter as every filtered call converts it for the engine. Invariant: converted,
/// or refused as INVALID_ARGUMENT or UNIMPLEMENTED (a condition embedded-qdrant lacks).
pub fn grpc_filter(data: &[u8]) {
    if let Ok(filter) = pb::Filter::decode(data) {
        filter_verdict(&filter);
    }
}

fn filter_verdict(filter: &pb::Filter) {
    if let Err(status) = grpc_filter::to_engine(filter) {
        assert!(
            matches!(
                status.code(),
                tonic::Code::InvalidArgument | tonic::Code::Unimplemented
            ),
            "{status}"
        );
    }
}

/// A REST request body, as its handler parses it: the first byte picks the body (create,
/// upsert, search, query, count, retrieve, scroll, update collection, aliases, delete
/// payload), the rest is the body. Invariant: parsed, or answered 400, never a panic.
pub fn rest_body(data: &[u8]) {
    let [kind, body @ ..] = data else {
        return;
    };
    if let Err(status) = decode_body(*kind, body) {
        assert_eq!(status, http::StatusCode::BAD_REQUEST);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kept_seed_and_crash_passes() {
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/seeds");
        type Target = fn(&[u8]);
        let targets: [(&str, Target); 3] = [
            ("grpc_upsert", grpc_upsert),
            ("grpc_filter", grpc_filter),
            ("rest_body", rest_body),
        ];
        for (target, run) in targets {
            let dir = seeds.join(target);
            let mut n = 0;
            for entry in
                std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            {
                run(&std::fs::read(entry.expect("entry").path()).expect("seed"));
                n += 1;
            }
            assert!(n > 0, "no seeds for {target}");
        }
    }
}
