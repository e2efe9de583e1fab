//! An upstream node's address: parsing and checking it.

use std::fmt;

/// A parsed upstream: plaintext, on a host and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamAddr {
    /// `host:port`, as used in request URIs and for TCP connects.
    pub authority: http::uri::Authority,
}

impl UpstreamAddr {
    /// Accepts `http://host:port`, bare `host:port`, and `tcp://host:port` where
    /// `tcp_allowed` (a tcp-mode listener).
    pub fn parse(s: &str, tcp_allowed: bool) -> Result<Self, String> {
        let (scheme, rest) = match s.split_once("://") {
            Some((scheme, rest)) => (Some(scheme.to_ascii_lowercase()), rest),
            None => (None, s),
        };
        match (scheme.as_deref(), tcp_allowed) {
            (None | Some("http"), _) | (Some("tcp"), true) => {}
            (Some("https"), _) => {
                return Err(format!(
                    "{s:?}: the proxy forwards plaintext to a local upstream; use http://"
                ))
            }
            (Some(other), _) => {
                return Err(format!(
                    "{s:?}: unsupported scheme {other:?}; use http://host:port"
                ))
            }
        }
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
        Ok(Self { authority })
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
        assert!(UpstreamAddr::parse("https://x:1", false)
            .unwrap_err()
            .contains("plaintext"));
        assert!(UpstreamAddr::parse("http://x", false)
            .unwrap_err()
            .contains("port"));
        assert!(UpstreamAddr::parse("http://x:1/api", false).is_err());
    }
}
