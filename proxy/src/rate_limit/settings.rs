//! A listener's rate limits as the configuration file spells them (`[[listener.rate_limit]]`,
//! `max_connections_per_client`); `config` re-exports them, this module acts on them.

use serde::{Deserialize, Serialize};

/// What a rate limit's buckets belong to.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum LimitKey {
    /// The request's API key: the first of `api_key_headers` it carries (Qdrant's `api-key`,
    /// `authorization` as Qdrant, Milvus and Chroma send it, Chroma's `x-chroma-token`),
    /// hashed; requests without one share one bucket.
    #[default]
    ApiKey,
    /// The client's address (the one a trusted balancer's PROXY header names).
    Client,
}

impl LimitKey {
    /// The `key_class` of a request this limit keys by its key: `anonymous` for an API-key
    /// limit's requests that carry none.
    pub fn label(self, keyed: bool) -> &'static str {
        match (self, keyed) {
            (Self::ApiKey, true) => "api_key",
            (Self::ApiKey, false) => "anonymous",
            (Self::Client, _) => "client",
        }
    }
}

/// The headers an API key is read from, in order, unless a limit names its own.
pub const DEFAULT_API_KEY_HEADERS: [&str; 3] = ["api-key", "authorization", "x-chroma-token"];
/// Buckets a limit keeps at most, unless it says otherwise: about 50 bytes each.
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// One `[[listener.rate_limit]]`: token buckets of requests (and optionally of request
/// bytes) per key, as Envoy's local rate limit and nginx's `limit_req` keep them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Its name in metrics, logs and the answer's message; defaults to the key's name
    /// (`api_key`, `client`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What a bucket belongs to.
    #[serde(default)]
    pub key: LimitKey,
    /// Requests per second each key may send, sustained.
    pub requests_per_second: f64,
    /// Requests a key may send at once after a quiet spell (nginx's `burst` plus one, with
    /// `nodelay`); default: one second's worth, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// Request body bytes per second each key may send, sustained (ingestion is measured in
    /// MB as much as in calls); unset: no byte limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_bytes_per_second: Option<u64>,
    /// Bytes a key may send at once; default: one second's worth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_bytes_burst: Option<u64>,
    /// Where an `api_key` limit reads the key, the first present one; default
    /// `api-key`, `authorization`, `x-chroma-token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_headers: Option<Vec<String>>,
    /// Buckets kept at most; keys beyond them (a flood of new addresses or keys) share one
    /// bucket until idle ones are dropped. Default 100,000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_keys: Option<usize>,
}

impl RateLimitConfig {
    /// The name it goes by.
    pub fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            match self.key {
                LimitKey::ApiKey => "api_key",
                LimitKey::Client => "client",
            }
            .to_owned()
        })
    }

    /// Every problem of this limit, each naming its field under `field`'s prefix.
    pub fn problems(&self, field: &dyn Fn(&str) -> String) -> Vec<String> {
        let mut problems = Vec::new();
        if !(self.requests_per_second.is_finite() && self.requests_per_second > 0.0) {
            problems.push(format!(
                "{}: must be a number greater than zero",
                field("requests_per_second")
            ));
        }
        if self.burst == Some(0) {
            problems.push(format!("{}: must be at least 1", field("burst")));
        }
        if self.request_bytes_per_second == Some(0) {
            problems.push(format!(
                "{}: must be greater than zero (leave it unset for no byte limit)",
                field("request_bytes_per_second")
            ));
        }
        if self.request_bytes_burst.is_some() && self.request_bytes_per_second.is_none() {
            problems.push(format!(
                "{}: set request_bytes_per_second too",
                field("request_bytes_burst")
            ));
        }
        if self.request_bytes_burst == Some(0) {
            problems.push(format!(
                "{}: must be at least 1",
                field("request_bytes_burst")
            ));
        }
        if self.max_keys == Some(0) {
            problems.push(format!("{}: must be at least 1", field("max_keys")));
        }
        if let Some(headers) = &self.api_key_headers {
            if self.key != LimitKey::ApiKey {
                problems.push(format!(
                    "{}: only meaningful with key = \"api_key\"",
                    field("api_key_headers")
                ));
            }
            if headers.is_empty() {
                problems.push(format!(
                    "{}: name at least one header",
                    field("api_key_headers")
                ));
            }
            for h in headers {
                if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                    problems.push(format!(
                        "{}: {h:?} is not a header name",
                        field("api_key_headers")
                    ));
                }
            }
        }
        problems
    }
}
