//! The vectors file: the embeddings cache, and the input of `--vectors file`.
//!
//! Layout: the line `loadgen-vectors v1`, one JSON header line (`dim`, `count`, `key`,
//! `source`), then `count * dim` little-endian f32. Binary because 100k x 1024-d vectors
//! are 400 MB as floats and several times that as text.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::VectorSet;

const MAGIC: &str = "loadgen-vectors v1";

#[derive(Serialize, Deserialize)]
struct Header {
    dim: usize,
    count: usize,
    /// What produced the vectors (endpoint, model, corpus digest); the cache is reused only
    /// when this matches.
    key: String,
    source: String,
}

/// Writes `set` to `path` with `key` (what it was made from), so a later run with the same
/// key reads it instead of embedding again.
pub fn write_vectors_file(path: &Path, set: &VectorSet, key: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // Write to a temporary name and rename, so an interrupted run never leaves a truncated
    // cache that a rerun would trust.
    let tmp = path.with_extension("partial");
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut out = BufWriter::new(file);
    let header = Header {
        dim: set.dim,
        count: set.len(),
        key: key.to_owned(),
        source: set.source.clone(),
    };
    writeln!(out, "{MAGIC}")?;
    serde_json::to_writer(&mut out, &header)?;
    writeln!(out)?;
    for x in &set.data {
        out.write_all(&x.to_le_bytes())?;
    }
    out.flush()?;
    drop(out);
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// Reads a vectors file; returns the vectors and the key they were cached under.
pub fn read_vectors_file(path: &Path) -> Result<(VectorSet, String)> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("opening vectors file {}", path.display()))?;
    let mut input = BufReader::new(file);
    let mut line = String::new();
    input.read_line(&mut line)?;
    if line.trim_end() != MAGIC {
        bail!(
            "{} is not a loadgen vectors file (first line should be {MAGIC:?})",
            path.display()
        );
    }
    line.clear();
    input.read_line(&mut line)?;
    let header: Header = serde_json::from_str(&line)
        .with_context(|| format!("{}: bad header line", path.display()))?;
    if header.dim == 0 {
        bail!("{}: dim is 0", path.display());
    }
    let mut raw = Vec::with_capacity(header.count * header.dim * 4);
    input.read_to_end(&mut raw)?;
    if raw.len() != header.count * header.dim * 4 {
        bail!(
            "{}: truncated: header says {} x {} floats, file holds {} bytes of data",
            path.display(),
            header.count,
            header.dim,
            raw.len()
        );
    }
    let data = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok((
        VectorSet {
            dim: header.dim,
            data,
            source: format!("file({}; {})", path.display(), header.source),
        },
        header.key,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let dir = std::env::temp_dir().join(format!("lg-vec-{}", std::process::id()));
        let path = dir.join("v.bin");
        let set = crate::vectors::synthetic(5, 16, 1);
        write_vectors_file(&path, &set, "k1").unwrap();
        let (back, key) = read_vectors_file(&path).unwrap();
        assert_eq!(key, "k1");
        assert_eq!(back.data, set.data);
        assert_eq!(back.dim, 16);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let err = read_vectors_file(&path).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
        std::fs::remove_dir_all(dir).ok();
    }
}
