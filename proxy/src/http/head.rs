//! The request head as the upstream gets it (hop-by-hop headers gone, the host where the
//! upstream's protocol names it, X-Forwarded-For and -Proto, the request id) and what the
//! forwarder reads from a client's head before it is rewritten.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::Version;

/// The client's request head as the upstream gets it: hop-by-hop headers gone (but `te:
/// trailers`, which gRPC over HTTP/2 requires), the host where the upstream's protocol
/// names it (`:authority` alone on h2c; `Host` on HTTP/1.1, from the client's
/// `:authority` or else `first_node`), X-Forwarded-For and X-Forwarded-Proto set, and the
/// upstream protocol's version. The URI is the caller's to set per node.
pub(crate) fn rewrite_head(
    parts: &mut http::request::Parts,
    use_h2c: bool,
    first_node: &http::uri::Authority,
    peer_ip: &HeaderValue,
    peer_trusted: bool,
) {
    let keep_te_trailers = use_h2c && te_is_trailers(&parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    if keep_te_trailers {
        parts
            .headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if use_h2c {
        // HTTP/2 names the host in :authority (from the URI) and nowhere else: a host
        // header beside it is a "duplicate host" 400 for nginx and others.
        parts.headers.remove(header::HOST);
    } else if !parts.headers.contains_key(header::HOST) {
        let host = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .or_else(|| HeaderValue::from_str(first_node.as_str()).ok());
        if let Some(host) = host {
            parts.headers.insert(header::HOST, host);
        }
    }
    set_forwarded_for(&mut parts.headers, peer_ip, peer_trusted);
    parts.headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static("https"),
    );
    parts.version = if use_h2c {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    };
}

pub(super) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

pub(super) fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The request's `x-request-id`: the client's (or a front proxy's), kept as it came, or a
/// new one, added to the request so that the upstream and the access log carry the same.
/// A new id is 32 hex digits: a random per-process prefix and a hashed per-request
/// counter (unique within the process, unlikely to repeat across processes; not secret).
pub(super) fn ensure_request_id(headers: &mut http::HeaderMap) -> HeaderValue {
    static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
    if let Some(id) = headers.get(&X_REQUEST_ID) {
        return id.clone();
    }
    use std::hash::BuildHasher;
    static STATE: std::sync::OnceLock<(std::collections::hash_map::RandomState, u64)> =
        std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let (state, prefix) = STATE.get_or_init(|| {
        let state = std::collections::hash_map::RandomState::new();
        let prefix = state.hash_one(std::process::id());
        (state, prefix)
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut text = [0u8; 32];
    let hex = b"0123456789abcdef";
    for (i, word) in [*prefix, state.hash_one(n)].into_iter().enumerate() {
        for j in 0..16 {
            text[i * 16 + j] = hex[((word >> (60 - 4 * j)) & 0xf) as usize];
        }
    }
    let id = HeaderValue::from_bytes(&text).expect("hex digits are a valid header value");
    headers.insert(X_REQUEST_ID.clone(), id.clone());
    id
}

fn te_is_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"))
}

/// The headers a `Connection` header names: hop-by-hop for this connection only.
pub(crate) fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect()
}

/// Hop-by-hop headers (RFC 9110 7.6.1) describe one connection and must not be forwarded,
/// nor any header the Connection header names.
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in connection_named(headers) {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
}

/// X-Forwarded-For names the peer. A trusted proxy's list is extended; anybody else's
/// is replaced, and their Forwarded and X-Real-IP dropped, so the upstream never takes a
/// client's word for its own address.
fn set_forwarded_for(headers: &mut HeaderMap, peer_ip: &HeaderValue, peer_trusted: bool) {
    let name = HeaderName::from_static("x-forwarded-for");
    if !peer_trusted {
        headers.remove(header::FORWARDED);
        headers.remove(HeaderName::from_static("x-real-ip"));
        headers.insert(name, peer_ip.clone());
        return;
    }
    let combined = headers.get(&name).and_then(|prev| {
        let mut v = Vec::with_capacity(prev.len() + 2 + peer_ip.len());
        v.extend_from_slice(prev.as_bytes());
        v.extend_from_slice(b", ");
        v.extend_from_slice(peer_ip.as_bytes());
        HeaderValue::from_bytes(&v).ok()
    });
    headers.insert(name, combined.unwrap_or_else(|| peer_ip.clone()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::CONTENT_TYPE));
    }

    #[test]
    fn forwarded_for_is_extended_for_trusted_peers_only() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        h.insert(header::FORWARDED, HeaderValue::from_static("for=6.6.6.6"));
        h.insert("x-real-ip", HeaderValue::from_static("6.6.6.6"));
        set_forwarded_for(&mut h, &HeaderValue::from_static("127.0.0.1"), false);
        assert_eq!(h["x-forwarded-for"], "127.0.0.1");
        assert!(!h.contains_key(header::FORWARDED) && !h.contains_key("x-real-ip"));
        set_forwarded_for(&mut h, &HeaderValue::from_static("10.0.0.9"), true);
        assert_eq!(h["x-forwarded-for"], "127.0.0.1, 10.0.0.9");
    }
}
