//! An OpenAI-compatible embeddings endpoint, as OpenVINO Model Server serves it
//! (`POST {url}/v3/embeddings` with `{"model", "input": [...]}`, answering
//! `{"data": [{"index", "embedding": [...]}]}`), fed chunks of a text corpus in batches.
//! Results are cached to a vectors file keyed by model and corpus, so reruns do not
//! re-embed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http::Method;
use tokio_util::sync::CancellationToken;

use super::{read_vectors_file, write_vectors_file, VectorSet};
use crate::client::http::{send, Options};

/// How vectors are made from a corpus through an embeddings endpoint.
#[derive(Clone, Debug)]
pub struct EmbeddingsOptions {
    /// Base URL of the server, e.g. http://ovms:8000 (the path /v3/embeddings is added).
    pub url: String,
    /// The model name sent with every request.
    pub model: String,
    /// The text file (or folder of them) the texts are cut from.
    pub corpus: PathBuf,
    /// Texts per embeddings request.
    pub batch: usize,
    /// Characters per chunk of corpus text.
    pub chunk_chars: usize,
    /// Stop after this many chunks (0: all).
    pub max_chunks: usize,
    /// Where the vectors are kept, so a second run embeds nothing (keyed by model, corpus and
    /// chunking).
    pub cache: PathBuf,
}

/// An OpenAI-compatible embeddings endpoint (OVMS's `/v3/embeddings`).
pub struct EmbeddingsClient {
    endpoint: String,
    model: String,
    opts: Options,
}

impl EmbeddingsClient {
    /// A client of `url` (a base URL, or the endpoint itself when it ends in `/embeddings`).
    pub fn new(url: &str, model: &str, opts: Options) -> Self {
        let base = url.trim_end_matches('/');
        let endpoint = if base.ends_with("/embeddings") {
            base.to_owned()
        } else {
            format!("{base}/v3/embeddings")
        };
        Self {
            endpoint,
            model: model.to_owned(),
            opts,
        }
    }

    /// The endpoint requests go to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Embeds `texts`, in order.
    pub async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let body = serde_json::json!({ "model": self.model, "input": texts });
        let resp = send(
            Method::POST,
            &self.endpoint,
            Some(Bytes::from(body.to_string())),
            &self.opts,
        )
        .await?;
        if resp.status != 200 {
            bail!(
                "{} answered HTTP {}: {}",
                self.endpoint,
                resp.status,
                resp.text().chars().take(300).collect::<String>()
            );
        }
        let v: serde_json::Value = serde_json::from_slice(&resp.body)
            .with_context(|| format!("{}: answer is not JSON", self.endpoint))?;
        let data = v["data"]
            .as_array()
            .ok_or_else(|| anyhow!("{}: answer has no data[]", self.endpoint))?;
        if data.len() != texts.len() {
            bail!(
                "{}: sent {} texts, got {} embeddings",
                self.endpoint,
                texts.len(),
                data.len()
            );
        }
        let mut out = vec![Vec::new(); texts.len()];
        for (pos, item) in data.iter().enumerate() {
            let index = item["index"].as_u64().map(|i| i as usize).unwrap_or(pos);
            let emb = item["embedding"]
                .as_array()
                .ok_or_else(|| anyhow!("{}: data[{pos}] has no embedding array", self.endpoint))?;
            let vector: Vec<f32> = emb
                .iter()
                .map(|x| x.as_f64().unwrap_or(f64::NAN) as f32)
                .collect();
            if vector.iter().any(|x| !x.is_finite()) {
                bail!(
                    "{}: data[{pos}].embedding holds a non-number",
                    self.endpoint
                );
            }
            *out.get_mut(index).ok_or_else(|| {
                anyhow!("{}: data[{pos}].index {index} out of range", self.endpoint)
            })? = vector;
        }
        Ok(out)
    }
}

/// The corpus as chunks of about `chunk_chars` characters, split on paragraph, then line,
/// then word boundaries. A directory is read file by file in name order.
pub fn chunk_corpus(path: &Path, chunk_chars: usize) -> Result<Vec<String>> {
    let mut files = Vec::new();
    if path.is_dir() {
        for entry in std::fs::read_dir(path)
            .with_context(|| format!("reading corpus dir {}", path.display()))?
        {
            let p = entry?.path();
            if p.is_file() {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_owned());
    }
    let mut chunks = Vec::new();
    for f in files {
        let bytes =
            std::fs::read(&f).with_context(|| format!("reading corpus file {}", f.display()))?;
        let text = String::from_utf8_lossy(&bytes);
        let mut current = String::new();
        for word in text.split_whitespace() {
            if !current.is_empty() && current.len() + word.len() + 1 > chunk_chars {
                chunks.push(std::mem::take(&mut current));
            }
            if !current.is_empty() {
                current.push(' ');
            }
            current.push_str(word);
        }
        if !current.is_empty() {
            chunks.push(current);
        }
    }
    if chunks.is_empty() {
        bail!("corpus {} holds no text", path.display());
    }
    Ok(chunks)
}

/// FNV-1a, 64 bit: a stable digest for the cache key (not for security).
fn fnv1a(data: &[u8], mut h: u64) -> u64 {
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Loads the cached vectors for this model and corpus, or embeds the corpus and writes the
/// cache. Returns the vectors and whether the cache was used.
pub async fn load_or_embed(opts: &EmbeddingsOptions, http: Options) -> Result<(VectorSet, bool)> {
    let mut chunks = chunk_corpus(&opts.corpus, opts.chunk_chars)?;
    if opts.max_chunks > 0 {
        chunks.truncate(opts.max_chunks);
    }
    let mut h = fnv1a(opts.model.as_bytes(), 0xcbf2_9ce4_8422_2325);
    for c in &chunks {
        h = fnv1a(c.as_bytes(), h);
        h = fnv1a(b"\0", h);
    }
    let key = format!(
        "model={};chunks={};digest={h:016x}",
        opts.model,
        chunks.len()
    );
    if opts.cache.exists() {
        match read_vectors_file(&opts.cache) {
            Ok((set, cached_key)) if cached_key == key => return Ok((set, true)),
            Ok(_) => tracing::info!(
                "vectors cache {} is for other inputs; re-embedding",
                opts.cache.display()
            ),
            Err(e) => tracing::warn!("vectors cache unusable ({e:#}); re-embedding"),
        }
    }
    let client = EmbeddingsClient::new(&opts.url, &opts.model, http);
    let mut data = Vec::new();
    let mut dim = 0;
    for batch in chunks.chunks(opts.batch.max(1)) {
        for v in client.embed(batch).await? {
            if dim == 0 {
                dim = v.len();
            } else if v.len() != dim {
                bail!(
                    "{}: embeddings of different sizes ({dim} and {})",
                    client.endpoint(),
                    v.len()
                );
            }
            data.extend(v);
        }
    }
    let set = VectorSet {
        dim,
        data,
        source: format!(
            "embeddings({}, model {}, {} chunks)",
            client.endpoint(),
            opts.model,
            chunks.len()
        ),
    };
    write_vectors_file(&opts.cache, &set, &key)?;
    Ok((set, false))
}

/// Embedding requests at a fixed rate in the background (`--embed-live`), so the proxy and
/// the database share the machine with an embedding stage as in a live pipeline.
pub struct LiveEmbedder {
    /// Requests answered so far.
    pub ok: Arc<AtomicU64>,
    /// Requests failed so far.
    pub failed: Arc<AtomicU64>,
    handle: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
}

impl LiveEmbedder {
    /// Starts sending batches of `batch` of `texts` at `rate` requests per second.
    pub fn start(client: EmbeddingsClient, texts: Vec<String>, batch: usize, rate: f64) -> Self {
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let (ok2, failed2, stop2) = (ok.clone(), failed.clone(), stop.clone());
        let handle = tokio::spawn(async move {
            let client = Arc::new(client);
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1e-3)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut i = 0usize;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop2.cancelled() => return,
                }
                let n = batch.max(1).min(texts.len());
                let batch_texts: Vec<String> = (0..n)
                    .map(|k| texts[(i + k) % texts.len()].clone())
                    .collect();
                i += n;
                let (client, ok, failed) = (client.clone(), ok2.clone(), failed2.clone());
                tokio::spawn(async move {
                    match client.embed(&batch_texts).await {
                        Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                });
            }
        });
        Self {
            ok,
            failed,
            handle,
            stop,
        }
    }

    /// Stops, and returns (answered, failed).
    pub async fn stop(self) -> (u64, u64) {
        self.stop.cancel();
        let _ = self.handle.await;
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}
