//! The flags `loadgen compare` and `loadgen bench` share, defined once: which of our
//! providers and which certificate algorithms are measured (one named order for both), and
//! which proxy and database binaries, with what further proxy flags. Each command flattens
//! [`TerminatorFlags`] into its own flags and reads them through its methods.

use std::path::PathBuf;

use clap::Args;
use proxy::crypto::{CertAlgorithmName, ProviderName};
use serde::Serialize;

use crate::procs::sibling_binary;

/// The algorithms measured when none are named: [`CertAlgorithmName::ALL`], in its order
/// (RSA by size, then ECDSA by curve), as the reports list them.
pub const DEFAULT_ALGORITHMS: &str = "rsa2048,rsa4096,ecdsa-p256,ecdsa-p384";

/// The congestion control of the measuring clients' sockets unless told otherwise: cubic,
/// the kernel's default, which does not pace without an fq qdisc (a pacing algorithm's
/// timer would land on the terminator's CPU over loopback).
pub const DEFAULT_CLIENT_CONGESTION_CONTROL: &str = "cubic";

/// Providers, algorithms and the binaries a comparison or a bench starts.
#[derive(Clone, Debug, Args, Serialize)]
pub struct TerminatorFlags {
    /// Our providers to measure (comma-separated). Default: ring, aws-lc-rs, openssl
    /// (`compare` adds openssl-qat when a QAT provider is installed; see --qat-module-path).
    #[arg(long, value_delimiter = ',')]
    pub providers: Option<Vec<ProviderName>>,
    /// Certificate algorithms (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_ALGORITHMS)]
    pub algorithms: Vec<CertAlgorithmName>,
    /// A further `proxy run` flag for every proxy started, repeatable, e.g.
    /// `--proxy-arg=--qat-module-path=/opt/qat/lib/ossl-modules` for openssl-qat.
    #[arg(long = "proxy-arg", value_name = "FLAG", allow_hyphen_values = true)]
    pub proxy_args: Vec<String>,
    /// The proxy binary (default: next to this loadgen).
    #[arg(long)]
    pub proxy_bin: Option<PathBuf>,
    /// The database binary started behind the proxies (default: embedded-qdrant next to
    /// this loadgen).
    #[arg(long)]
    pub upstream_bin: Option<PathBuf>,
}

impl TerminatorFlags {
    /// The providers named, or the software ones.
    pub fn providers(&self) -> &[ProviderName] {
        self.providers.as_deref().unwrap_or(&ProviderName::SOFTWARE)
    }

    /// The proxy binary to start.
    pub fn proxy_bin(&self) -> PathBuf {
        self.proxy_bin
            .clone()
            .unwrap_or_else(|| sibling_binary("proxy"))
    }

    /// The database binary to start.
    pub fn upstream_bin(&self) -> PathBuf {
        self.upstream_bin
            .clone()
            .unwrap_or_else(|| sibling_binary("embedded-qdrant"))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        terminators: TerminatorFlags,
    }

    #[test]
    fn the_defaults_are_the_registries_own_order() {
        let flags = Flags::parse_from(["loadgen"]).terminators;
        assert_eq!(flags.algorithms, CertAlgorithmName::ALL);
        assert_eq!(flags.providers(), ProviderName::SOFTWARE);
    }
}
