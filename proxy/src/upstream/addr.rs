//! An upstream node's address: parsing and checking it.

use std::fmt;

/// A parsed upstream: a host and port, reached in plaintext or over TLS (`https://`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamAddr {
    /// `host:port`, as used in request URIs and for TCP connects.
    pub authority: http::uri::Authority,
    /// `https://`: the node is reached over TLS (the listener's `upstream_tls`).
    pub tls: bool,
}

impl UpstreamAddr {
    /// Accepts `http://host:port`, `https://host:port` and bare `host:port` in http mode,
    /// and `tcp://host:port` too where `tcp_mode` (a tcp-mode listener splices bytes,
    /// so it has no way to add TLS of its own).
    pub fn parse(s: &str, tcp_mode: bool) -> Result<Self, String> {
        let (scheme, rest) = match s.split_once("://") {
            Some((scheme, rest)) => (Some(scheme.to_ascii_lowercase()), rest),
            None => (None, s),
        };
        let tls = match (scheme.as_deref(), tcp_mode) {
            (None | Some("http"), _) | (Some("tcp"), true) => false,
            (Some("https"), false) => true,
            (Some("https"), true) => {
                return Err(format!(
                    "{s:?}: a tcp listener splices the client's decrypted bytes and cannot encrypt them again; use mode = \"http\" for an https:// upstream"
                ))
            }
            (Some(other), _) => {
                let expected = if tcp_mode {
                    "tcp://host:port"
                } else {
                    "http://host:port or https://host:port"
                };
                return Err(format!(
                    "{s:?}: unsupported scheme {other:?}; use {expected}"
                ));
            }
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') {
            return Err(format!(
                "{s:?}: a path is not supported; give only scheme, host and port"
            ));
        }
        let authority: http::uri::Authority = rest
            .parse()
            .map_err(|e| format!("{s:?}: not a host:port ({e})"))?;
        if authority.port_u16().is_none() {
            return Err(format!(
                "{s:?}: the port is required (e.g. http://127.0.0.1:6333)"
            ));
        }
        Ok(Self { authority, tls })
    }

    /// The scheme of request URIs to this node.
    pub fn scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }
}

impl fmt::Display for UpstreamAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.authority.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        let a = UpstreamAddr::parse("http://127.0.0.1:6333/", false).unwrap();
        assert_eq!(a.authority.as_str(), "127.0.0.1:6333");
        assert!(UpstreamAddr::parse("[::1]:6334", false).is_ok());
        assert!(UpstreamAddr::parse("tcp://localhost:1", true).is_ok());
        assert!(UpstreamAddr::parse("tcp://localhost:1", false).is_err());
        let tls = UpstreamAddr::parse("https://qdrant-0.qdrant:6334", false).unwrap();
        assert!(tls.tls);
        assert_eq!(tls.scheme(), "https");
        assert!(UpstreamAddr::parse("https://x:1", true)
            .unwrap_err()
            .contains("cannot encrypt"));
        assert!(!UpstreamAddr::parse("http://x:1", false).unwrap().tls);
        assert!(UpstreamAddr::parse("http://x", false)
            .unwrap_err()
            .contains("port"));
        assert!(UpstreamAddr::parse("http://x:1/api", false).is_err());
    }
}
