//! Rate limits per API key and per client address, and the cap on a client address's
//! concurrent connections: what nginx's `limit_req`/`limit_conn`, Envoy's local rate limit
//! and HAProxy's stick tables give operators in front of a database.
//!
//! - A [`Limiter`] is one `[[listener.rate_limit]]`: a token bucket of requests (and,
//!   optionally, of request body bytes) per key, kept as GCRA's one timestamp per bucket (the
//!   algorithm of the `governor` crate and of Envoy's token bucket, written here because the
//!   table must stay bounded: `governor`'s keyed store grows with every key it sees). Keys
//!   are SipHash digests under a per-process random key, so an API key never reaches a
//!   label, a log line or the admin port. The table is sharded and bounded: when a shard is
//!   full, buckets that have filled up again (the same as no bucket) are dropped, and keys
//!   that still find no room share one overflow bucket, so a flood of new addresses or keys
//!   is limited as one client and costs no memory.
//! - [`ClientConnections`] counts each client address's open connections on a listener;
//!   its table holds only addresses with connections open, so it is bounded by
//!   `limits.max_connections`.
//! - The [`Registry`] keeps both across configuration reloads by listener and limit name:
//!   a reload that changes a limit's rate keeps its buckets (and the counts of open
//!   connections), one that removes it drops them with the last connection that used them.

pub mod settings;

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http::{HeaderMap, HeaderName};
use prometheus::{IntCounter, IntGauge};

pub use settings::{LimitKey, RateLimitConfig, DEFAULT_API_KEY_HEADERS, DEFAULT_MAX_KEYS};

use crate::metrics::RateLimitMetrics;

const SHARDS: usize = 16;
/// How often a full shard may be swept for buckets that filled up again: sweeping is
/// linear in the shard, and a shard full of active keys would otherwise be swept for
/// every new key.
const SWEEP_EVERY_NS: u64 = 1_000_000_000;

/// The keys are SipHash digests already; hashing them again would only cost time.
#[derive(Default)]
struct Digest(u64);

impl Hasher for Digest {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// GCRA's parameters for one kind of unit (requests, bytes): the time one unit costs, and
/// how far ahead of now a bucket's theoretical arrival time may run (the burst).
#[derive(Clone, Copy, Debug)]
struct Rate {
    ns_per_unit: f64,
    tolerance_ns: u64,
}

impl Rate {
    /// `burst` units at once, `per_second` sustained. A request costs one unit and is let in
    /// while the bucket is at most `burst - 1` units ahead; bytes are charged after the fact
    /// and the next request waits while the bucket is more than `burst` bytes ahead.
    fn new(per_second: f64, burst: u64, charged_after: bool) -> Self {
        let ns_per_unit = 1e9 / per_second;
        let ahead = if charged_after { burst } else { burst - 1 };
        Self {
            ns_per_unit,
            tolerance_ns: (ns_per_unit * ahead as f64).min(u64::MAX as f64 / 4.0) as u64,
        }
    }

    /// How long until a request may pass, or `None` when it may now.
    fn wait(&self, tat: u64, now: u64) -> Option<u64> {
        let limit = now.saturating_add(self.tolerance_ns);
        (tat > limit).then(|| tat - limit)
    }

    fn charge(&self, tat: &mut u64, now: u64, units: u64) {
        let cost = (self.ns_per_unit * units as f64).min(u64::MAX as f64 / 4.0) as u64;
        *tat = (*tat).max(now).saturating_add(cost);
    }
}

/// One key's state: when each of its buckets will be full again.
#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    requests: u64,
    bytes: u64,
}

struct Shard {
    buckets: HashMap<u64, Bucket, BuildHasherDefault<Digest>>,
    /// Where keys go that find the shard full.
    overflow: Bucket,
    last_sweep: u64,
}

/// What a limit is set to; replaced whole by a reload.
#[derive(Debug)]
struct Params {
    key: LimitKey,
    requests: Rate,
    bytes: Option<Rate>,
    headers: Vec<HeaderName>,
    max_keys_per_shard: usize,
    /// For the client's message: `50 requests/s (burst 100) per API key`.
    describe: String,
}

impl Params {
    fn new(c: &RateLimitConfig) -> Self {
        let burst = c
            .burst
            .unwrap_or_else(|| (c.requests_per_second.ceil() as u64).max(1));
        let bytes = c
            .request_bytes_per_second
            .map(|rate| Rate::new(rate as f64, c.request_bytes_burst.unwrap_or(rate), true));
        let per = match c.key {
            LimitKey::ApiKey => "per API key",
            LimitKey::Client => "per client address",
        };
        let mut describe = format!("{} requests/s (burst {burst}) {per}", c.requests_per_second);
        if let Some(rate) = c.request_bytes_per_second {
            describe.push_str(&format!(", {rate} request bytes/s"));
        }
        Self {
            key: c.key,
            requests: Rate::new(c.requests_per_second, burst, false),
            bytes,
            headers: c
                .api_key_headers
                .as_deref()
                .map(|hs| hs.iter().filter_map(|h| h.parse().ok()).collect())
                .unwrap_or_else(|| {
                    DEFAULT_API_KEY_HEADERS
                        .iter()
                        .map(|h| HeaderName::from_static(h))
                        .collect()
                }),
            max_keys_per_shard: c.max_keys.unwrap_or(DEFAULT_MAX_KEYS).div_ceil(SHARDS),
            describe,
        }
    }
}

/// A request let through, and where its body bytes are charged.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticket {
    key: u64,
    overflow: bool,
}

/// A request over a limit: how long to wait, and what to tell the client.
#[derive(Debug)]
pub(crate) struct Limited {
    /// Until the bucket lets a request through again.
    pub retry_after: Duration,
    /// The limit's name and setting, for the answer's message.
    pub message: String,
}

/// One `[[listener.rate_limit]]` (see the module's documentation).
pub(crate) struct Limiter {
    name: Arc<str>,
    params: ArcSwap<Params>,
    origin: Instant,
    digest: RandomState,
    shards: [Mutex<Shard>; SHARDS],
    metrics: RateLimitMetrics,
}

impl Limiter {
    fn new(name: &str, config: &RateLimitConfig, metrics: RateLimitMetrics) -> Self {
        Self {
            name: Arc::from(name),
            params: ArcSwap::from_pointee(Params::new(config)),
            origin: Instant::now(),
            digest: RandomState::new(),
            shards: std::array::from_fn(|_| {
                Mutex::new(Shard {
                    buckets: HashMap::default(),
                    overflow: Bucket::default(),
                    last_sweep: 0,
                })
            }),
            metrics,
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Whether it limits request bytes too.
    pub(crate) fn limits_bytes(&self) -> bool {
        self.params.load().bytes.is_some()
    }

    /// Lets a request through or says how long it must wait. `content_length`, when known,
    /// is charged to the byte bucket at once; a body of unknown length is charged with
    /// [`Limiter::charge_bytes`] once it has been read.
    pub(crate) fn admit(
        &self,
        headers: &HeaderMap,
        client: IpAddr,
        content_length: Option<u64>,
    ) -> Result<Ticket, Limited> {
        let params = self.params.load();
        let (key, class) = match params.key {
            LimitKey::ApiKey => match params.headers.iter().find_map(|h| headers.get(h)) {
                Some(v) => (
                    self.digest.hash_one(v.as_bytes()),
                    LimitKey::ApiKey.label(true),
                ),
                None => (0, LimitKey::ApiKey.label(false)),
            },
            LimitKey::Client => (self.digest.hash_one(client), LimitKey::Client.label(true)),
        };
        let now = self.now();
        let mut shard = self.shards[(key % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let overflow = !shard.buckets.contains_key(&key)
            && shard.buckets.len() >= params.max_keys_per_shard
            && !self.make_room(&mut shard, now);
        let bucket = if overflow {
            self.metrics.overflow.inc();
            &mut shard.overflow
        } else {
            shard.buckets.entry(key).or_insert_with(|| {
                self.metrics.keys.inc();
                Bucket {
                    requests: now,
                    bytes: now,
                }
            })
        };
        let byte_wait = params.bytes.and_then(|b| b.wait(bucket.bytes, now));
        let request_wait = params.requests.wait(bucket.requests, now);
        if let Some(wait) = request_wait.max(byte_wait) {
            let kind = if byte_wait.is_some() {
                "bytes"
            } else {
                "requests"
            };
            self.metrics.refused(class, kind).inc();
            return Err(Limited {
                retry_after: Duration::from_nanos(wait),
                message: format!(
                    "rate limit {:?} exceeded ({}): retry later",
                    &*self.name, params.describe
                ),
            });
        }
        params.requests.charge(&mut bucket.requests, now, 1);
        if let (Some(bytes), Some(len)) = (params.bytes, content_length) {
            bytes.charge(&mut bucket.bytes, now, len);
        }
        Ok(Ticket { key, overflow })
    }

    /// Charges `bytes` read of a body of unknown length to the bucket that let it in.
    pub(crate) fn charge_bytes(&self, ticket: Ticket, bytes: u64) {
        let params = self.params.load();
        let Some(rate) = params.bytes else { return };
        let now = self.now();
        let mut shard = self.shards[(ticket.key % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let bucket = if ticket.overflow {
            Some(&mut shard.overflow)
        } else {
            shard.buckets.get_mut(&ticket.key)
        };
        if let Some(bucket) = bucket {
            rate.charge(&mut bucket.bytes, now, bytes);
        }
    }

    /// Drops the shard's buckets that have filled up again (at most once a second);
    /// whether that made room.
    fn make_room(&self, shard: &mut Shard, now: u64) -> bool {
        if now.saturating_sub(shard.last_sweep) < SWEEP_EVERY_NS && shard.last_sweep != 0 {
            return false;
        }
        shard.last_sweep = now.max(1);
        let before = shard.buckets.len();
        shard
            .buckets
            .retain(|_, b| b.requests > now || b.bytes > now);
        self.metrics.keys.sub((before - shard.buckets.len()) as i64);
        shard.buckets.len() < self.params.load().max_keys_per_shard
    }
}

/// Open connections per client address on one listener, at most `cap` each.
pub(crate) struct ClientConnections {
    cap: AtomicUsize,
    shards: [Mutex<HashMap<IpAddr, usize>>; SHARDS],
    refused: IntCounter,
    tracked: IntGauge,
}

/// One connection counted against its client's cap, until dropped.
pub(crate) struct ClientSlot {
    table: Arc<ClientConnections>,
    client: IpAddr,
}

impl ClientConnections {
    fn shard(&self, client: &IpAddr) -> &Mutex<HashMap<IpAddr, usize>> {
        let spread = match client {
            IpAddr::V4(a) => u32::from(*a) as usize,
            IpAddr::V6(a) => (u128::from(*a) >> 64) as usize ^ u128::from(*a) as usize,
        };
        &self.shards[spread % SHARDS]
    }

    /// A slot for one more connection from `client`, or `None` at its cap (counted).
    pub(crate) fn enter(self: &Arc<Self>, client: IpAddr) -> Option<ClientSlot> {
        let cap = self.cap.load(Ordering::Relaxed);
        let mut counts = self
            .shard(&client)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let open = counts.entry(client).or_insert_with(|| {
            self.tracked.inc();
            0
        });
        if *open >= cap {
            if *open == 0 {
                counts.remove(&client);
                self.tracked.dec();
            }
            self.refused.inc();
            return None;
        }
        *open += 1;
        Some(ClientSlot {
            table: self.clone(),
            client,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut counts = self
            .table
            .shard(&self.client)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(open) = counts.get_mut(&self.client) {
            *open -= 1;
            if *open == 0 {
                counts.remove(&self.client);
                self.table.tracked.dec();
            }
        }
    }
}

/// The limits of every listener, by listener and limit name, kept across reloads (see the
/// module's documentation).
#[derive(Default)]
pub(crate) struct Registry {
    limiters: Mutex<HashMap<(String, String), Weak<Limiter>>>,
    connections: Mutex<HashMap<String, Weak<ClientConnections>>>,
}

impl Registry {
    /// Listener `listener`'s limits as `configs` set them: the running ones kept (their
    /// buckets too) with the new settings, new ones created.
    pub(crate) fn limiters(
        &self,
        listener: &str,
        configs: &[RateLimitConfig],
        metrics: &crate::metrics::Metrics,
    ) -> Vec<Arc<Limiter>> {
        let mut running = self.limiters.lock().unwrap_or_else(|e| e.into_inner());
        running.retain(|_, l| l.strong_count() > 0);
        configs
            .iter()
            .map(|c| {
                let name = c.display_name();
                let key = (listener.to_owned(), name.clone());
                if let Some(l) = running.get(&key).and_then(Weak::upgrade) {
                    l.params.store(Arc::new(Params::new(c)));
                    return l;
                }
                let l = Arc::new(Limiter::new(&name, c, metrics.rate_limit(listener, &name)));
                running.insert(key, Arc::downgrade(&l));
                l
            })
            .collect()
    }

    /// Listener `listener`'s per-client connection cap, the running counts kept.
    pub(crate) fn client_connections(
        &self,
        listener: &str,
        cap: usize,
        metrics: &crate::metrics::Metrics,
    ) -> Arc<ClientConnections> {
        let mut running = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        running.retain(|_, c| c.strong_count() > 0);
        if let Some(c) = running.get(listener).and_then(Weak::upgrade) {
            c.cap.store(cap, Ordering::Relaxed);
            return c;
        }
        let (refused, tracked) = metrics.client_connections(listener);
        let c = Arc::new(ClientConnections {
            cap: AtomicUsize::new(cap),
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
            refused,
            tracked,
        });
        running.insert(listener.to_owned(), Arc::downgrade(&c));
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rate: f64, burst: u64) -> RateLimitConfig {
        RateLimitConfig {
            name: None,
            key: LimitKey::ApiKey,
            requests_per_second: rate,
            burst: Some(burst),
            request_bytes_per_second: None,
            request_bytes_burst: None,
            api_key_headers: None,
            max_keys: None,
        }
    }

    fn headers(key: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("api-key", key.parse().unwrap());
        h
    }

    fn limiter(c: &RateLimitConfig) -> Limiter {
        Limiter::new(
            "test",
            c,
            crate::metrics::Metrics::new().rate_limit("l", "test"),
        )
    }

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    /// A burst of 5 passes at once, the sixth waits about one interval (1/10 s), and
    /// another key has a bucket of its own.
    #[test]
    fn a_key_gets_its_burst_then_waits_its_rate() {
        let l = limiter(&config(10.0, 5));
        for _ in 0..5 {
            l.admit(&headers("a"), CLIENT, None).unwrap();
        }
        let limited = l.admit(&headers("a"), CLIENT, None).unwrap_err();
        assert!(
            limited.retry_after > Duration::from_millis(50)
                && limited.retry_after <= Duration::from_millis(100),
            "{limited:?}"
        );
        assert!(limited
            .message
            .contains("10 requests/s (burst 5) per API key"));
        l.admit(&headers("b"), CLIENT, None).unwrap();
        // Without a key: the anonymous bucket, shared.
        for _ in 0..5 {
            l.admit(&HeaderMap::new(), CLIENT, None).unwrap();
        }
        assert!(l.admit(&HeaderMap::new(), CLIENT, None).is_err());
    }

    /// Bytes are charged after the fact: a body over the burst passes, the next request
    /// waits until the debt is paid.
    #[test]
    fn bytes_are_charged_and_the_next_request_waits() {
        let c = RateLimitConfig {
            request_bytes_per_second: Some(1_000_000),
            ..config(1000.0, 1000)
        };
        let l = limiter(&c);
        let t = l.admit(&headers("a"), CLIENT, None).unwrap();
        l.charge_bytes(t, 3_000_000);
        let limited = l.admit(&headers("a"), CLIENT, None).unwrap_err();
        assert!(
            limited.retry_after > Duration::from_millis(1900),
            "{limited:?}"
        );
        // Known lengths are charged at admission.
        l.admit(&headers("b"), CLIENT, Some(2_500_000)).unwrap();
        assert!(l.admit(&headers("b"), CLIENT, None).is_err());
    }

    /// A flood of keys beyond `max_keys` shares the overflow bucket: the table does not grow.
    #[test]
    fn the_table_is_bounded() {
        let c = RateLimitConfig {
            max_keys: Some(64),
            ..config(1.0, 2)
        };
        let l = limiter(&c);
        let mut refused = 0;
        for i in 0..10_000 {
            if l.admit(&headers(&format!("key-{i}")), CLIENT, None)
                .is_err()
            {
                refused += 1;
            }
        }
        let kept: usize = l
            .shards
            .iter()
            .map(|s| s.lock().unwrap().buckets.len())
            .sum();
        assert!(kept <= 64 + SHARDS, "{kept}");
        assert!(
            refused > 9_000,
            "the overflow bucket limits the flood as one: {refused}"
        );
    }

    /// A reload that changes the rate keeps the buckets: a drained key stays drained.
    #[test]
    fn a_reload_keeps_the_buckets() {
        let registry = Registry::default();
        let metrics = crate::metrics::Metrics::new();
        let first = registry.limiters("l", &[config(1.0, 1)], &metrics);
        first[0].admit(&headers("a"), CLIENT, None).unwrap();
        let second = registry.limiters("l", &[config(2.0, 1)], &metrics);
        assert!(Arc::ptr_eq(&first[0], &second[0]));
        assert!(second[0].admit(&headers("a"), CLIENT, None).is_err());
        drop((first, second));
        let third = registry.limiters("l", &[config(2.0, 1)], &metrics);
        third[0].admit(&headers("a"), CLIENT, None).unwrap();
    }

    #[test]
    fn a_client_gets_its_cap_of_connections() {
        let registry = Registry::default();
        let metrics = crate::metrics::Metrics::new();
        let c = registry.client_connections("l", 2, &metrics);
        let a = c.enter(CLIENT).unwrap();
        let _b = c.enter(CLIENT).unwrap();
        assert!(c.enter(CLIENT).is_none());
        assert!(c.enter("10.0.0.1".parse().unwrap()).is_some());
        drop(a);
        assert!(c.enter(CLIENT).is_some());
        assert_eq!(
            c.shards
                .iter()
                .map(|s| s.lock().unwrap().len())
                .sum::<usize>(),
            1
        );
    }
}
