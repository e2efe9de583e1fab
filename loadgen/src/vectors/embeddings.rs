//! An OpenAI-compatible embeddings endpoint, as OpenVINO Model Server serves it
//! (`POST {url}/v3/embeddings` with `{"model", "input": [...]}`, answering
//! `{"data": [{"index", "embedding": [...]}]}`), fed chunks of a text corpus in batches.
//! Results are cached to a vectors file keyed by model and corpus, so reruns do not
//! re-embed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
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

/// How the co-located embedding load is paced during a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LivePace {
    /// A fixed rate of calls per second, whatever the server manages (`--embed-live`): a
    /// background load of known size.
    Rate(f64),
    /// This many calls in flight, the next sent as soon as one is answered
    /// (`--embed-concurrency`): the study's maximum-throughput mode, where what the embedder
    /// achieves is what the host leaves it.
    ClosedLoop(usize),
}

/// What the live embedding load achieved over the measured phase.
#[derive(Debug)]
pub struct LiveOutcome {
    /// Calls answered within the measured phase.
    pub ok: u64,
    /// Calls failed within the measured phase.
    pub failed: u64,
    /// Texts embedded by the answered calls.
    pub embeddings: u64,
    /// Seconds counted: from the measured phase's start to the stop.
    pub seconds: f64,
    /// Latency of the answered calls, microseconds.
    pub latency_us: Histogram<u64>,
    /// The first failure's message, for the result's reader.
    pub first_error: Option<String>,
}

/// Counts of the live load; only calls that end while `counting` is set are recorded, so
/// the warm-up's calls load the host without entering the figures.
struct LiveTally {
    counting: AtomicBool,
    counting_since: Mutex<Option<Instant>>,
    ok: AtomicU64,
    failed: AtomicU64,
    embeddings: AtomicU64,
    latency_us: Mutex<Histogram<u64>>,
    first_error: Mutex<Option<String>>,
}

impl LiveTally {
    fn record(&self, started: Instant, texts: usize, result: &Result<Vec<Vec<f32>>>) {
        if !self.counting.load(Ordering::Relaxed) {
            return;
        }
        match result {
            Ok(_) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                self.embeddings.fetch_add(texts as u64, Ordering::Relaxed);
                let us = started.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
                if let Ok(mut h) = self.latency_us.lock() {
                    h.saturating_record(us.max(1));
                }
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = self.first_error.lock() {
                    first.get_or_insert_with(|| format!("{e:#}"));
                }
            }
        }
    }
}

/// The co-located embedding load (`--embed-live`, `--embed-concurrency`): embedding calls
/// beside ingestion, as the study's pipeline runs its first stage on the same host. It
/// starts before the warm-up, so the host is loaded from the first measured request, and
/// counts from [`LiveEmbedder::start_counting`].
pub struct LiveEmbedder {
    tally: Arc<LiveTally>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stop: CancellationToken,
}

impl LiveEmbedder {
    /// Starts sending batches of `batch` of `texts` (cycled in order) at `pace`.
    pub fn start(
        client: EmbeddingsClient,
        texts: Vec<String>,
        batch: usize,
        pace: LivePace,
    ) -> Self {
        let tally = Arc::new(LiveTally {
            counting: AtomicBool::new(false),
            counting_since: Mutex::new(None),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            embeddings: AtomicU64::new(0),
            latency_us: Mutex::new(
                Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds"),
            ),
            first_error: Mutex::new(None),
        });
        let stop = CancellationToken::new();
        let client = Arc::new(client);
        let texts: Arc<[String]> = texts.into();
        let batch = batch.max(1).min(texts.len().max(1));
        // Each call takes the next `batch` texts of the corpus, wrapping around.
        let cursor = Arc::new(AtomicU64::new(0));
        let next_batch = {
            let (texts, cursor) = (texts.clone(), cursor.clone());
            move || -> Vec<String> {
                let first = cursor.fetch_add(batch as u64, Ordering::Relaxed) as usize;
                (0..batch)
                    .map(|k| texts[(first + k) % texts.len()].clone())
                    .collect()
            }
        };
        let tasks = match pace {
            LivePace::Rate(rate) => {
                let (client, tally, stop) = (client.clone(), tally.clone(), stop.clone());
                vec![tokio::spawn(async move {
                    let mut tick =
                        tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1e-3)));
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tokio::select! {
                            _ = tick.tick() => {}
                            _ = stop.cancelled() => return,
                        }
                        let batch_texts = next_batch();
                        let (client, tally, stop) = (client.clone(), tally.clone(), stop.clone());
                        tokio::spawn(async move {
                            let started = Instant::now();
                            tokio::select! {
                                r = client.embed(&batch_texts) => {
                                    tally.record(started, batch_texts.len(), &r)
                                }
                                _ = stop.cancelled() => {}
                            }
                        });
                    }
                })]
            }
            LivePace::ClosedLoop(concurrency) => (0..concurrency.max(1))
                .map(|_| {
                    let (client, tally, stop) = (client.clone(), tally.clone(), stop.clone());
                    let next_batch = next_batch.clone();
                    tokio::spawn(async move {
                        loop {
                            let batch_texts = next_batch();
                            let started = Instant::now();
                            let result = tokio::select! {
                                r = client.embed(&batch_texts) => r,
                                // A call cut off by the stop is neither answered nor failed.
                                _ = stop.cancelled() => return,
                            };
                            let failed = result.is_err();
                            tally.record(started, batch_texts.len(), &result);
                            if failed {
                                // A refusing server is not hammered in a tight loop.
                                tokio::select! {
                                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                                    _ = stop.cancelled() => return,
                                }
                            }
                        }
                    })
                })
                .collect(),
        };
        Self { tally, tasks, stop }
    }

    /// From now on, calls that end are counted: the measured phase has begun.
    pub fn start_counting(&self) {
        if let Ok(mut since) = self.tally.counting_since.lock() {
            since.get_or_insert_with(Instant::now);
        }
        self.tally.counting.store(true, Ordering::Relaxed);
    }

    /// Stops the load (calls in flight are abandoned, uncounted) and returns what the
    /// measured phase saw.
    pub async fn stop(self) -> LiveOutcome {
        self.tally.counting.store(false, Ordering::Relaxed);
        let seconds = self
            .tally
            .counting_since
            .lock()
            .ok()
            .and_then(|s| *s)
            .map_or(0.0, |since| since.elapsed().as_secs_f64());
        self.stop.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        let tally = &self.tally;
        let latency_us = tally
            .latency_us
            .lock()
            .map(|h| h.clone())
            .unwrap_or_else(|_| Histogram::new(3).expect("histogram"));
        LiveOutcome {
            ok: tally.ok.load(Ordering::Relaxed),
            failed: tally.failed.load(Ordering::Relaxed),
            embeddings: tally.embeddings.load(Ordering::Relaxed),
            seconds,
            latency_us,
            first_error: tally.first_error.lock().ok().and_then(|e| e.clone()),
        }
    }
}
