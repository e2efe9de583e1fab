//! Qdrant REST upsert JSON, written by hand so ids land at known offsets and floats take the
//! width real clients send (about 8 bytes per coordinate with 4 decimals).

use std::io::Write;

use crate::vectors::VectorSet;

pub const ID_WIDTH: usize = 17;

/// `{"points":[{"id":…,"vector":[…],"payload":{…}},…]}` and the offset of each id.
pub fn upsert(vectors: &VectorSet, rows: &[usize], decimals: usize) -> (Vec<u8>, Vec<usize>) {
    let mut out = Vec::with_capacity(rows.len() * (vectors.dim * 9 + 64) + 16);
    let mut offsets = Vec::with_capacity(rows.len());
    out.extend_from_slice(b"{\"points\":[");
    for (j, &row) in rows.iter().enumerate() {
        if j > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"id\":");
        offsets.push(out.len());
        out.extend_from_slice(&[b'0'; ID_WIDTH]);
        out.extend_from_slice(b",\"vector\":[");
        for (k, x) in vectors.row(row).iter().enumerate() {
            if k > 0 {
                out.push(b',');
            }
            write_float(&mut out, *x, decimals);
        }
        out.extend_from_slice(b"],\"payload\":{\"source\":\"loadgen\",\"chunk\":");
        out.extend_from_slice(itoa::Buffer::new().format(row % vectors.len()).as_bytes());
        out.extend_from_slice(b"}}");
    }
    out.extend_from_slice(b"]}");
    (out, offsets)
}

fn write_float(out: &mut Vec<u8>, x: f32, decimals: usize) {
    if !x.is_finite() {
        // JSON has no NaN; a broken embedding must not produce an unparsable body.
        out.push(b'0');
    } else if decimals == 0 {
        out.extend_from_slice(ryu::Buffer::new().format_finite(x).as_bytes());
    } else {
        let _ = write!(out, "{x:.decimals$}");
    }
}

/// Writes `id` as exactly 17 ASCII digits.
pub fn patch_id(dst: &mut [u8], mut id: u64) {
    for d in dst.iter_mut().rev() {
        *d = b'0' + (id % 10) as u8;
        id /= 10;
    }
}
