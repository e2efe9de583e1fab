//! `qdrant.UpsertPoints` in protobuf, framed for gRPC, written by hand so each point id is a
//! 9-byte varint at a known offset. The unit tests decode the result with qdrant-client's
//! prost types, so the encoding is checked against the real schema.
//!
//! Fields (qdrant points.proto): UpsertPoints{collection_name=1, wait=2, points=3};
//! PointStruct{id=1, payload=3 (map<string, Value>), vectors=4}; PointId{num=1};
//! Vectors{vector=1}; Vector{dense=101}; DenseVector{data=1, packed};
//! Value{integer_value=3, string_value=4}.

use crate::vectors::VectorSet;

pub const ID_WIDTH: usize = 9;

const LEN: u32 = 2;
const VARINT: u32 = 0;

fn tag(out: &mut Vec<u8>, field: u32, wire: u32) {
    varint(out, u64::from((field << 3) | wire));
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u32, data: &[u8]) {
    tag(out, field, LEN);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

fn map_entry(out: &mut Vec<u8>, field: u32, key: &str, value: &[u8]) {
    let mut entry = Vec::with_capacity(key.len() + value.len() + 4);
    bytes_field(&mut entry, 1, key.as_bytes());
    bytes_field(&mut entry, 2, value);
    bytes_field(out, field, &entry);
}

/// One PointStruct and the offset of its id varint within it.
fn point(vector: &[f32], chunk: usize) -> (Vec<u8>, usize) {
    let mut p = Vec::with_capacity(vector.len() * 4 + 64);
    // id: PointId { num } with a 9-byte varint: tag(1), len 10, tag(1, varint), 9 bytes.
    tag(&mut p, 1, LEN);
    varint(&mut p, 1 + ID_WIDTH as u64);
    tag(&mut p, 1, VARINT);
    let id_offset = p.len();
    p.extend_from_slice(&[0x80; ID_WIDTH - 1]);
    p.push(0x01);
    // payload
    let mut source = Vec::new();
    bytes_field(&mut source, 4, b"loadgen");
    map_entry(&mut p, 3, "source", &source);
    let mut chunk_value = Vec::new();
    tag(&mut chunk_value, 3, VARINT);
    varint(&mut chunk_value, chunk as u64);
    map_entry(&mut p, 3, "chunk", &chunk_value);
    // vectors: Vectors { vector: Vector { dense: DenseVector { data } } }
    let mut floats = Vec::with_capacity(vector.len() * 4);
    for x in vector {
        floats.extend_from_slice(&x.to_le_bytes());
    }
    let mut dense = Vec::with_capacity(floats.len() + 8);
    bytes_field(&mut dense, 1, &floats);
    let mut vec_msg = Vec::with_capacity(dense.len() + 8);
    bytes_field(&mut vec_msg, 101, &dense);
    let mut vectors = Vec::with_capacity(vec_msg.len() + 8);
    bytes_field(&mut vectors, 1, &vec_msg);
    bytes_field(&mut p, 4, &vectors);
    (p, id_offset)
}

/// The gRPC-framed UpsertPoints and the offset of each id.
pub fn upsert(
    collection: &str,
    wait: bool,
    vectors: &VectorSet,
    rows: &[usize],
) -> (Vec<u8>, Vec<usize>) {
    let mut msg = Vec::with_capacity(rows.len() * (vectors.dim * 4 + 80) + 64);
    let mut offsets = Vec::with_capacity(rows.len());
    bytes_field(&mut msg, 1, collection.as_bytes());
    tag(&mut msg, 2, VARINT);
    msg.push(u8::from(wait));
    for &row in rows {
        let (p, id_offset) = point(vectors.row(row), row % vectors.len());
        tag(&mut msg, 3, LEN);
        varint(&mut msg, p.len() as u64);
        offsets.push(msg.len() + id_offset);
        msg.extend_from_slice(&p);
    }
    (
        crate::client::grpc_frame(&msg),
        offsets.into_iter().map(|o| o + 5).collect(),
    )
}

/// Writes `id` (which must lie in [2^56, 2^63)) as exactly 9 varint bytes.
pub fn patch_id(dst: &mut [u8], mut id: u64) {
    debug_assert!((1 << 56..1 << 63).contains(&id));
    for (i, b) in dst.iter_mut().enumerate() {
        let last = i == ID_WIDTH - 1;
        *b = (id & 0x7f) as u8 | if last { 0 } else { 0x80 };
        id >>= 7;
    }
}
