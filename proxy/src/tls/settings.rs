//! TLS settings as the configuration file spells them: a listener's policy (versions,
//! groups, resumption, mTLS, ALPN) and where handshakes sign. They belong to this module,
//! which builds server configurations from them; `config` reads them from the file.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::crypto::KxGroupName;

/// Where a handshake's signing runs (`handshake.offload` in the file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HandshakeOffload {
    /// Sign on the reactor.
    #[default]
    Inline,
    /// Sign on the handshake pool.
    Pool,
}

/// TLS protocol versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TlsVersion {
    /// TLS 1.2.
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3.
    #[serde(rename = "1.3")]
    Tls13,
}

impl TlsVersion {
    /// As the configuration file, the command lines and loadgen's results write it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tls12 => "1.2",
            Self::Tls13 => "1.3",
        }
    }
}

impl std::fmt::Display for TlsVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TlsVersion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim_start_matches("TLS").trim_start_matches("tls").trim() {
            "1.2" => Ok(Self::Tls12),
            "1.3" => Ok(Self::Tls13),
            other => Err(format!(
                "unknown TLS version {other:?}; expected 1.2 or 1.3"
            )),
        }
    }
}

/// Per-listener TLS policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsPolicy {
    /// Lowest protocol version accepted.
    #[serde(default = "default_min_version")]
    pub min_version: TlsVersion,
    /// Highest protocol version accepted.
    #[serde(default = "default_max_version")]
    pub max_version: TlsVersion,
    /// Key-exchange groups, in preference order. Unset, the production default: the
    /// post-quantum hybrid X25519MLKEM768 where the provider has it, then X25519,
    /// secp256r1 and secp384r1 (every group a current nginx accepts), see
    /// [`KxGroupName::PRODUCTION_DEFAULT`]. Set, exactly these, and a group the provider
    /// lacks is refused at start-up: a benchmark pins one group so that providers are
    /// compared on the same handshake (aws-lc-rs would otherwise negotiate ML-KEM where
    /// ring cannot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kx_groups: Option<Vec<KxGroupName>>,
    /// Session resumption (tickets and a stateful cache). Off: every connection is a full
    /// handshake, the worst case the benchmark is about.
    #[serde(default = "default_true")]
    pub resumption: bool,
    /// When set, clients must present a certificate chaining to this CA (mTLS).
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// ALPN protocols offered; by default h2 and http/1.1 in `http` mode, none in `tcp`.
    #[serde(default)]
    pub alpn: Option<Vec<String>>,
}

impl Default for TlsPolicy {
    fn default() -> Self {
        Self {
            min_version: default_min_version(),
            max_version: default_max_version(),
            kx_groups: None,
            resumption: true,
            client_ca: None,
            alpn: None,
        }
    }
}

fn default_min_version() -> TlsVersion {
    TlsVersion::Tls12
}
fn default_max_version() -> TlsVersion {
    TlsVersion::Tls13
}
fn default_true() -> bool {
    true
}
