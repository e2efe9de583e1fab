//! `[qat]`: the settings, their defaults and checks, and the OpenSSL configuration section
//! the proxy writes from them for QAT_Engine's provider to read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The default property query while QAT is active: OpenSSL's default provider for
/// everything a signature query does not override.
pub const ROUTE_EVERYTHING_ELSE: &str = "?provider=default";
/// The QAT provider's name as QAT_Engine builds it.
pub const DEFAULT_PROVIDER_NAME: &str = "qatprovider";
/// QAT_Engine's own default for `qat_poll_interval` (its internal poll thread, QAT
/// hardware): 10 µs.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_micros(10);
/// QAT_Engine's default `qat_max_retry_count`.
const DEFAULT_MAX_RETRY_COUNT: u32 = 5;
/// QAT_Engine's default `qat_epoll_timeout` (ms); only event-driven polling uses it, which
/// the provider cannot use without external polling, so it is written as the default.
const EPOLL_TIMEOUT_MS: u32 = 1000;
/// Signatures in flight on the signer: enough for 8 full qat_sw batches of 8, well under
/// qat_sw's 128 request slots per queue.
pub const DEFAULT_MAX_SIGNATURES_IN_FLIGHT: usize = 64;
/// qat_sw's multi-buffer width: it computes eight RSA or ECDSA operations per pass, and a
/// queue of eight at once.
pub const DEFAULT_BATCH: usize = 8;
/// The longest a part batch waits for the handshakes under way to fill it before its
/// signatures are made in software: half of qat_sw's own shortest poll timeout (10 ms).
/// A batch fills in about `batch` handshake arrivals, so at the study's load (32 and more
/// clients) it fills well within this; a part batch that cannot fill is handed back at
/// once, not after this wait (see `signer`).
pub const DEFAULT_BATCH_WAIT: Duration = Duration::from_millis(5);

/// Who collects QAT completions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Polling {
    /// The provider's own polling thread (qat_sw: one per signing thread, woken at every
    /// eighth request and flushing part batches every 10 ms; QAT hardware: every
    /// `poll_interval`).
    #[default]
    Internal,
    /// QAT hardware only: the requesting thread busy-polls for its own response
    /// (`enable_inline_polling`); no effect on qat_sw.
    Inline,
    /// qat_sw: `enable_external_polling`, and the signer thread computes each batch itself
    /// by calling the module's `qat_sw_poll` right after submitting it (QAT_Engine's external
    /// polling, what nginx's QAT module does through `ENGINE_ctrl("POLL")`, which provider
    /// builds lack but whose function they export). No wake-up of another thread, and no
    /// request count to keep aligned: the internal thread is woken at every eighth request
    /// of any kind, so one part batch leaves a remainder of every later batch to its 10 ms
    /// timer. Refused where the module exports no `qat_sw_poll` (QAT hardware builds).
    External,
    /// Refused: heuristic polling is nginx's and HAProxy's own schedule for calling the
    /// engine's poll; the signer's batching plays that part here (use `external`).
    Heuristic,
}

/// What to do when the provider is asked for but cannot be used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// Refuse to start (the default: a silent software fallback would make every figure
    /// measured with "openssl-qat" a lie).
    #[default]
    None,
    /// Run on software OpenSSL, with a log line and `proxy_qat_offload_active 0`.
    Software,
}

/// `[qat]` in the proxy configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QatConfig {
    /// The OpenSSL provider to load (QAT_Engine builds `qatprovider`).
    pub provider_name: String,
    /// Where the module lives: a directory (the module search path) or the module file
    /// itself, whose stem must then be `provider_name`. Unset: OpenSSL's own search path,
    /// `OPENSSL_MODULES`, or what `OPENSSL_CONF` configures.
    pub module_path: Option<PathBuf>,
    /// The property query signatures are fetched with; unset means
    /// `?provider=<provider_name>`. It applies to signatures only.
    pub property_query: Option<String>,
    /// Who polls for completions (`enable_inline_polling`; see [`Polling`]).
    pub polling: Polling,
    /// `qat_poll_interval`: the provider's internal poll period (QAT hardware).
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// `enable_sw_fallback`: QAT hardware only, the provider signs in software while a
    /// device is down (the start-up proof still requires offload at start).
    pub sw_fallback: bool,
    /// `qat_max_retry_count`: QAT hardware only, resubmissions of a request the device
    /// refused because its ring was full.
    pub max_retry_count: u32,
    /// `enable_instance_for_thread`: QAT hardware only, one device instance per thread.
    pub instance_for_thread: bool,
    /// Signatures the proxy keeps in flight in the provider at once; more wait in order.
    pub max_signatures_in_flight: usize,
    /// The longest a part batch waits to fill before its signatures are made in software
    /// (qat_sw; no effect with `batch = 1`).
    #[serde(with = "humantime_serde")]
    pub batch_wait: Duration,
    /// Send ECDSA P-256 signatures to the provider too. Off by default: qat_sw signs P-256
    /// only 1.2x-1.3x faster than OpenSSL (a 20 us signature), less than a handshake's
    /// round trip to the signer thread costs, so they are signed in software where the
    /// handshake runs. QAT hardware, which takes the whole signature off the CPU, may gain.
    pub offload_p256: bool,
    /// Generate X25519 key pairs ahead in provider batches (the signer's key stock). Off by
    /// default: with qat_sw 1.8.1 the stock corrupted the heap (`malloc(): corrupted size
    /// vs. prev_size`, the proxy aborted) once 32 clients resumed their sessions at once,
    /// handshakes that use the stock without a signature; found 2026-12-07, not yet traced
    /// to its cause. X25519 on OpenSSL's default provider costs about 50 us a handshake.
    pub offload_x25519: bool,
    /// The provider's batch width: 8 for qat_sw (a signature goes to the provider only
    /// when a batch of 8 can fill soon, else it is signed in software), 1 for QAT
    /// hardware (every signature goes to the provider at once).
    pub batch: usize,
    /// Behaviour when the provider cannot be used.
    pub fallback: Fallback,
    /// Root of the sysfs tree where QAT telemetry is looked for (tests point it at a
    /// recorded tree).
    pub telemetry_root: PathBuf,
    /// Write `1` to the in-kernel driver's telemetry `control` file if telemetry is off
    /// (needs root and debugfs).
    pub enable_telemetry: bool,
}

impl Default for QatConfig {
    fn default() -> Self {
        Self {
            provider_name: DEFAULT_PROVIDER_NAME.to_owned(),
            module_path: None,
            property_query: None,
            polling: Polling::Internal,
            poll_interval: DEFAULT_POLL_INTERVAL,
            sw_fallback: false,
            max_retry_count: DEFAULT_MAX_RETRY_COUNT,
            instance_for_thread: false,
            max_signatures_in_flight: DEFAULT_MAX_SIGNATURES_IN_FLIGHT,
            batch: DEFAULT_BATCH,
            batch_wait: DEFAULT_BATCH_WAIT,
            offload_p256: false,
            offload_x25519: false,
            fallback: Fallback::None,
            telemetry_root: PathBuf::from("/sys"),
            enable_telemetry: false,
        }
    }
}

impl QatConfig {
    /// The property query signatures are fetched with.
    pub fn effective_property_query(&self) -> String {
        self.property_query
            .clone()
            .unwrap_or_else(|| format!("?provider={}", self.provider_name))
    }

    /// What is wrong with these settings, for `Config::validate`.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.polling == Polling::Heuristic {
            problems.push(
                "qat.polling = \"heuristic\": heuristic polling is a schedule for an application's poll \
                 calls (nginx's and HAProxy's); the proxy's signer already polls right after each batch \
                 it forms: use \"external\" (qat_sw), \"internal\" (qat_sw and QAT hardware) or \
                 \"inline\" (QAT hardware)"
                    .to_owned(),
            );
        }
        if self.batch == 0 || self.batch > 64 {
            problems.push("qat.batch must be between 1 and 64".to_owned());
        }
        if self.batch_wait > Duration::from_secs(1) {
            problems.push(format!(
                "qat.batch_wait = {:?}: at most 1s (a handshake waits this long for its batch)",
                self.batch_wait
            ));
        }
        if self.max_signatures_in_flight < self.batch {
            problems.push(format!(
                "qat.max_signatures_in_flight ({}) must be at least qat.batch ({})",
                self.max_signatures_in_flight, self.batch
            ));
        }

        if self.poll_interval.as_nanos() == 0 || self.poll_interval.as_nanos() > i32::MAX as u128 {
            problems.push("qat.poll_interval must be between 1 ns and 2 s".to_owned());
        }
        if self.provider_name.is_empty()
            || !self
                .provider_name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            problems.push(format!(
                "qat.provider_name {:?}: a provider name is letters, digits, '_' and '-'",
                self.provider_name
            ));
        }
        problems
    }

    /// The settings QAT_Engine's provider reads from its configuration section, as
    /// `key = value` pairs. All of them are always written: the provider reads the others
    /// only when `enable_external_polling` is present, and then without a check.
    pub fn provider_settings(&self) -> Vec<(&'static str, String)> {
        let flag = |b: bool| u8::from(b).to_string();
        vec![
            (
                "enable_external_polling",
                flag(self.polling == Polling::External),
            ),
            ("enable_heuristic_polling", "0".to_owned()),
            ("enable_sw_fallback", flag(self.sw_fallback)),
            (
                "enable_inline_polling",
                flag(self.polling == Polling::Inline),
            ),
            (
                "qat_poll_interval",
                self.poll_interval.as_nanos().to_string(),
            ),
            ("qat_epoll_timeout", EPOLL_TIMEOUT_MS.to_string()),
            ("enable_event_driven_polling", "0".to_owned()),
            ("enable_instance_for_thread", flag(self.instance_for_thread)),
            ("qat_max_retry_count", self.max_retry_count.to_string()),
        ]
    }

    /// The OpenSSL configuration the proxy loads to activate the provider with
    /// [`provider_settings`](Self::provider_settings): the default provider stays active
    /// beside it (for everything QAT does not implement, and the DRBG).
    pub fn openssl_config(&self, module_file: Option<&Path>) -> String {
        let mut text = format!(
            "# Written by the proxy from [qat]; loaded with OSSL_LIB_CTX_load_config.\n\
             openssl_conf = openssl_init\n\n[openssl_init]\nproviders = provider_sect\n\n\
             [provider_sect]\ndefault = default_sect\n{name} = qat_sect\n\n\
             [default_sect]\nactivate = 1\n\n[qat_sect]\n",
            name = self.provider_name
        );
        if let Some(module) = module_file {
            text.push_str(&format!("module = {}\n", module.display()));
        }
        text.push_str("activate = 1\n");
        for (key, value) in self.provider_settings() {
            text.push_str(&format!("{key} = {value}\n"));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key QAT_Engine's provider reads is written, with [qat]'s values, in the
    /// section OpenSSL's provider configuration module hands to the provider.
    #[test]
    fn the_openssl_section_carries_every_provider_setting() {
        let cfg = QatConfig {
            polling: Polling::Inline,
            poll_interval: Duration::from_micros(25),
            sw_fallback: true,
            max_retry_count: 9,
            ..QatConfig::default()
        };
        let text = cfg.openssl_config(Some(Path::new("/opt/qat/qatprovider.so")));
        for line in [
            "qatprovider = qat_sect",
            "module = /opt/qat/qatprovider.so",
            "activate = 1",
            "enable_external_polling = 0",
            "enable_heuristic_polling = 0",
            "enable_sw_fallback = 1",
            "enable_inline_polling = 1",
            "qat_poll_interval = 25000",
            "qat_epoll_timeout = 1000",
            "enable_event_driven_polling = 0",
            "enable_instance_for_thread = 0",
            "qat_max_retry_count = 9",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from:\n{text}"
            );
        }
        assert_eq!(cfg.provider_settings().len(), 9);
        assert!(cfg.problems().is_empty(), "{:?}", cfg.problems());
        let external = QatConfig {
            polling: Polling::External,
            ..QatConfig::default()
        };
        let text = external.openssl_config(None);
        assert!(
            text.lines().any(|l| l == "enable_external_polling = 1"),
            "{text}"
        );
        assert!(
            text.lines().any(|l| l == "enable_inline_polling = 0"),
            "{text}"
        );
        assert!(external.problems().is_empty(), "{:?}", external.problems());
    }

    #[test]
    fn settings_the_provider_cannot_honour_are_refused() {
        let cfg = QatConfig {
            polling: Polling::Heuristic,
            ..QatConfig::default()
        };
        let problems = cfg.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("use \"external\""), "{problems:?}");
        let cfg = QatConfig {
            batch: 16,
            max_signatures_in_flight: 8,
            provider_name: "qat provider".to_owned(),
            ..QatConfig::default()
        };
        let problems = cfg.problems().join("\n");
        assert!(
            problems.contains("must be at least qat.batch"),
            "{problems}"
        );
        assert!(problems.contains("provider name"), "{problems}");
    }
}
