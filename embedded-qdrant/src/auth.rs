//! API-key authentication as Qdrant does it (`service.api_key`): every request but the
//! health checks must carry the key in an `api-key` header (gRPC metadata) or as
//! `authorization: Bearer <key>`; REST answers 401 without it, gRPC UNAUTHENTICATED.

use http::HeaderMap;

/// Qdrant's message for a request without a valid key.
pub const REFUSAL: &str = "Must provide an API key or an Authorization bearer token";

/// The configured key.
#[derive(Clone)]
pub struct ApiKey(String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

impl ApiKey {
    /// A key; empty keys are refused by the caller.
    pub fn new(key: String) -> Self {
        Self(key)
    }

    /// True when `headers` carry this key, as `api-key` or as a bearer token.
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        let api_key = headers.get("api-key").map(|v| v.as_bytes());
        let bearer = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::as_bytes);
        [api_key, bearer]
            .into_iter()
            .flatten()
            .any(|given| constant_time_eq(given, self.0.as_bytes()))
    }
}

/// Compares without an early exit, so the time taken does not tell how much matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_taken_from_either_header_and_nothing_else() {
        let key = ApiKey::new("s3cret".to_owned());
        let mut h = HeaderMap::new();
        assert!(!key.admits(&h));
        h.insert("api-key", "s3cret".parse().unwrap());
        assert!(key.admits(&h));
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            "Bearer s3cret".parse().unwrap(),
        );
        assert!(key.admits(&h));
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, "Basic s3cret".parse().unwrap());
        h.insert("api-key", "s3cre".parse().unwrap());
        assert!(!key.admits(&h));
    }
}
