//! The flags of the one listener `proxy run` can be given on the command line, each with
//! the `[[listener]]` key it sets (the table is [`ListenerFlags::KEYS`]). Every default is
//! the config's own (serde's), so a listener made from flags and one read from a file cannot
//! differ in what was left unset.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::config::{
    Balance, ClientProtocol, Config, ConfigError, ErrorBody, HealthCheckKind, ListenerConfig,
    ListenerMode, ProxyProtocolConfig, RateLimitConfig, TlsVersion, UpstreamProtocol,
};
use crate::crypto::KxGroupName;

use super::config_flags::config_flags;
use super::parse_on_off;

config_flags! {
    /// A listener's settings from flags; unset ones leave the file's (or the default) as is.
    #[derive(Clone, Debug, Args, Default, PartialEq)]
    pub struct ListenerFlags sets ListenerConfig {
        /// Listener bind address (e.g. 0.0.0.0:6334).
        #[arg(long, value_name = "ADDR")]
        listen: Option<String> => listen,
        /// Listener name in logs and metrics.
        #[arg(long)]
        name: Option<String> => name via Some,
        /// Upstream URL (e.g. http://127.0.0.1:6333); repeat it for several nodes.
        #[arg(long, value_name = "URL")]
        upstream: Vec<String> => upstream,
        /// How requests pick one of several upstream nodes.
        #[arg(long, value_enum)]
        balance: Option<Balance> => balance,
        /// Active health checks of the upstream nodes (auto: when there are several).
        #[arg(long, value_enum, value_name = "KIND")]
        health_check: Option<HealthCheckKind> => health_check.kind,
        /// Time between two health checks of a node.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        health_check_interval: Option<Duration> => health_check.interval,
        /// Certificate chain, PEM.
        #[arg(long, value_name = "FILE")]
        cert: Option<PathBuf> => cert,
        /// Private key, PEM (PKCS#8, PKCS#1 or SEC1).
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf> => key,
        /// How requests reach the upstream in http mode.
        #[arg(long, value_enum)]
        upstream_protocol: Option<UpstreamProtocol> => upstream_protocol,
        /// Close idle upstream connections after this (keep it under the upstream's own
        /// keep-alive timeout; 0s: reuse none). Default 4s, under Qdrant's 5 s.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        upstream_idle_timeout: Option<Duration> => upstream_idle_timeout,
        /// CA certificates (PEM) that `https://` upstream nodes must chain to (default: the
        /// system's trust store).
        #[arg(long, value_name = "FILE")]
        upstream_ca: Option<PathBuf> => upstream_tls.ca via Some,
        /// The name verified in `https://` upstream nodes' certificates and sent as SNI
        /// (default: each node's host).
        #[arg(long, value_name = "NAME")]
        upstream_server_name: Option<String> => upstream_tls.server_name via Some,
        /// Expect a PROXY protocol header (v1 or v2) from this load balancer's address or CIDR
        /// block (repeatable); connections from anywhere else are refused.
        #[arg(long, value_name = "CIDR")]
        proxy_protocol_from: Vec<String> => proxy_protocol via |trusted| Some(ProxyProtocolConfig { trusted }),
        /// http (L7) or tcp (decrypt and splice).
        #[arg(long, value_enum)]
        mode: Option<ListenerMode> => mode,
        /// A request rate limit: the keys of one `[[listener.rate_limit]]` table, as TOML
        /// (repeatable; replaces the file's list), e.g.
        /// `--rate-limit 'key = "client", requests_per_second = 50, burst = 100'`.
        #[arg(long, value_name = "TOML", value_parser = parse_rate_limit)]
        rate_limit: Vec<RateLimitConfig> => rate_limit,
        /// Open connections per client address at most.
        #[arg(long, value_name = "N")]
        max_connections_per_client: Option<usize> => max_connections_per_client via Some,
        /// Metrics per API method (`method_metrics.enabled`): on (the default) or off.
        #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
        method_metrics: Option<bool> => method_metrics.enabled,
        /// tcp mode: how clients open their connections: tls (the ClientHello first, the
        /// default) or postgres (PostgreSQL's SSLRequest, or direct TLS with ALPN postgresql).
        #[arg(long, value_enum)]
        protocol: Option<ClientProtocol> => protocol,
        /// The body of the proxy's own REST error answers: qdrant (Qdrant's envelope, the
        /// default) or text (plain text, for any other database).
        #[arg(long, value_enum, value_name = "SHAPE")]
        error_body: Option<ErrorBody> => error_body,
        /// Lowest TLS version: 1.2 or 1.3.
        #[arg(long, value_name = "V")]
        tls_min: Option<TlsVersion> => tls.min_version,
        /// Highest TLS version: 1.2 or 1.3.
        #[arg(long, value_name = "V")]
        tls_max: Option<TlsVersion> => tls.max_version,
        /// Key-exchange groups, comma-separated, in preference order (x25519mlkem768, x25519,
        /// secp256r1, secp384r1). Unset: x25519mlkem768 where the provider has it, then the
        /// other three.
        #[arg(long, value_name = "GROUPS", value_delimiter = ',')]
        kx: Option<Vec<KxGroupName>> => tls.kx_groups via Some,
        /// Session resumption: on or off.
        #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
        resumption: Option<bool> => tls.resumption,
        /// Require client certificates chaining to this CA (mTLS).
        #[arg(long, value_name = "FILE")]
        client_ca: Option<PathBuf> => tls.client_ca via Some,
    }
}

/// `--rate-limit`'s value: the keys of a `[[listener.rate_limit]]` table, read by the same
/// definition as the file's.
fn parse_rate_limit(text: &str) -> Result<RateLimitConfig, String> {
    #[derive(serde::Deserialize)]
    struct Inline {
        limit: RateLimitConfig,
    }
    toml::from_str::<Inline>(&format!("limit = {{ {text} }}"))
        .map(|i| i.limit)
        .map_err(|e| e.message().to_owned())
}

impl ListenerFlags {
    /// Whether any listener flag was given.
    pub fn is_set(&self) -> bool {
        *self != Self::default()
    }

    /// Applies the flags to the file's single listener, or makes the listener from them
    /// when the file has none (then `--listen`, `--upstream`, `--cert` and `--key` are
    /// required). With several listeners in the file, flags would be ambiguous: an error.
    pub fn apply(&self, cfg: &mut Config) -> Result<(), ConfigError> {
        if !self.is_set() {
            return Ok(());
        }
        match cfg.listeners.len() {
            0 => cfg.listeners.push(self.new_listener()?),
            1 => {}
            n => {
                return Err(ConfigError {
                    problems: vec![format!(
                        "listener flags (--listen, --cert, --upstream, ...) are ambiguous: the config file defines {n} listeners; set these in the file instead"
                    )],
                })
            }
        }
        self.set(&mut cfg.listeners[0]);
        Ok(())
    }

    /// A listener of the required flags, every other field at the config's default.
    fn new_listener(&self) -> Result<ListenerConfig, ConfigError> {
        let missing: Vec<&str> = [
            ("--listen", self.listen.is_none()),
            ("--upstream", self.upstream.is_empty()),
            ("--cert", self.cert.is_none()),
            ("--key", self.key.is_none()),
        ]
        .into_iter()
        .filter_map(|(flag, absent)| absent.then_some(flag))
        .collect();
        if !missing.is_empty() {
            return Err(ConfigError {
                problems: vec![format!(
                    "a listener given by flags needs {}",
                    missing.join(", ")
                )],
            });
        }
        // `set` fills the required keys in.
        Ok(ListenerConfig::new(
            String::new(),
            PathBuf::new(),
            PathBuf::new(),
            Vec::new(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        listener: ListenerFlags,
    }

    /// The flags a listener from flags needs.
    const REQUIRED: [&str; 8] = [
        "--listen",
        "127.0.0.1:6333",
        "--upstream",
        "http://q:6333",
        "--cert",
        "c.pem",
        "--key",
        "k.pem",
    ];

    fn flags(args: &[&str]) -> ListenerFlags {
        Flags::parse_from(std::iter::once("proxy").chain(args.iter().copied())).listener
    }

    #[test]
    fn a_listener_from_flags_has_the_files_defaults() {
        let mut from_flags = Config::empty();
        flags(&REQUIRED).apply(&mut from_flags).unwrap();
        let from_file: ListenerConfig = toml::from_str(
            "listen = \"127.0.0.1:6333\"\nupstream = \"http://q:6333\"\ncert = \"c.pem\"\nkey = \"k.pem\"",
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(&from_flags.listeners[0]).unwrap(),
            serde_json::to_value(&from_file).unwrap()
        );
    }

    #[test]
    fn flags_override_the_files_listener_and_need_the_required_ones_alone() {
        assert!(!flags(&[]).is_set());
        let mut cfg = Config::empty();
        let err = flags(&["--listen", "127.0.0.1:1"])
            .apply(&mut cfg)
            .unwrap_err();
        assert!(
            err.to_string().contains("--upstream, --cert, --key"),
            "{err}"
        );
        let mut cfg = Config::empty();
        cfg.listeners.push(
            toml::from_str(
                "listen = \"a:1\"\nupstream = \"http://q:1\"\ncert = \"c\"\nkey = \"k\"",
            )
            .unwrap(),
        );
        flags(&["--error-body", "text", "--mode", "tcp"])
            .apply(&mut cfg)
            .unwrap();
        assert_eq!(cfg.listeners[0].error_body, ErrorBody::Text);
        assert_eq!(cfg.listeners[0].mode, ListenerMode::Tcp);
        assert_eq!(cfg.listeners[0].listen, "a:1");
    }

    #[test]
    fn rate_limits_are_read_as_the_file_reads_them() {
        let mut cfg = Config::empty();
        let required = REQUIRED.iter().copied();
        flags(&required
            .chain([
            "--rate-limit",
            "key = \"client\", requests_per_second = 50, burst = 100",
            "--rate-limit",
            "name = \"bytes\", requests_per_second = 1000, request_bytes_per_second = 50000000",
            "--max-connections-per-client",
            "8",
            "--method-metrics",
            "off",
        ])
        .collect::<Vec<_>>())
        .apply(&mut cfg)
        .unwrap();
        let l = &cfg.listeners[0];
        assert_eq!(l.rate_limit.len(), 2);
        assert_eq!(l.rate_limit[0].key, crate::config::LimitKey::Client);
        assert_eq!(l.rate_limit[0].burst, Some(100));
        assert_eq!(l.rate_limit[1].request_bytes_per_second, Some(50_000_000));
        assert_eq!(l.max_connections_per_client, Some(8));
        assert!(!l.method_metrics.enabled);
        assert!(parse_rate_limit("requests_per_second = \"fast\"").is_err());
    }
}
