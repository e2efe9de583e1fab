//! Where vectors come from: `synthetic` (seeded, reproducible, unit length), an
//! OpenAI-compatible embeddings endpoint (`embeddings`, as OpenVINO Model Server serves it),
//! or a vectors `file` written by that endpoint's cache.
//!
//! Vectors are made before the timed phase; the driver only ever sees a [`VectorSet`]. The
//! live embedding load ([`LiveEmbedder`]) runs beside the timed phase, as the pipeline's
//! co-located first stage.

mod embeddings;
mod file;

pub use embeddings::{
    chunk_corpus, load_or_embed, EmbeddingsClient, EmbeddingsOptions, LiveEmbedder, LiveOutcome,
    LivePace,
};
pub use file::{read_vectors_file, write_vectors_file};

/// Vectors ready to be encoded into request bodies: `count` rows of `dim` floats.
#[derive(Clone, Debug)]
pub struct VectorSet {
    /// Dimensions per vector.
    pub dim: usize,
    /// Row-major, `dim` floats per vector.
    pub data: Vec<f32>,
    /// Where the vectors came from, for the result file.
    pub source: String,
}

impl VectorSet {
    /// How many vectors.
    pub fn len(&self) -> usize {
        self.data.len().checked_div(self.dim).unwrap_or(0)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Vector `i`, wrapping around: a run may send more points than the set holds.
    pub fn row(&self, i: usize) -> &[f32] {
        let i = i % self.len();
        &self.data[i * self.dim..(i + 1) * self.dim]
    }
}

/// SplitMix64: a tiny, fully specified generator, so the same seed gives the same vectors
/// on every machine and every version of this tool (a general-purpose RNG crate does not
/// promise that across releases).
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator started at `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal, by Box-Muller.
    pub fn next_gaussian(&mut self) -> f64 {
        let u1 = self.next_f64().max(f64::MIN_POSITIVE);
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// `count` unit-length vectors of `dim` dimensions drawn from an isotropic Gaussian: the
/// direction is uniform on the sphere, and the coordinate magnitudes (about 1/sqrt(dim))
/// look like a real embedding model's, which matters for the REST JSON size.
pub fn synthetic(count: usize, dim: usize, seed: u64) -> VectorSet {
    let mut rng = SplitMix64::new(seed);
    let mut data = Vec::with_capacity(count * dim);
    for _ in 0..count {
        let start = data.len();
        data.extend((0..dim).map(|_| rng.next_gaussian() as f32));
        normalise(&mut data[start..]);
    }
    VectorSet {
        dim,
        data,
        source: format!("synthetic(seed={seed})"),
    }
}

/// Scales `v` to unit length, as embedding models emit (a zero vector stays zero).
pub fn normalise(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_is_reproducible_and_unit_length() {
        let a = synthetic(10, 1024, 7);
        let b = synthetic(10, 1024, 7);
        let c = synthetic(10, 1024, 8);
        assert_eq!(a.data, b.data);
        assert_ne!(a.data, c.data);
        assert_eq!(a.len(), 10);
        for i in 0..10 {
            let n: f32 = a.row(i).iter().map(|x| x * x).sum();
            assert!((n - 1.0).abs() < 1e-4, "norm^2 {n}");
        }
    }
}
