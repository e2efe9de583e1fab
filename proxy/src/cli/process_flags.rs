//! The flags of `proxy run` that set process-wide keys of the configuration, each with the
//! key it sets (the table is [`ProcessFlags::KEYS`]); the listener's are in
//! `listener_flags`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::config_flags::config_flags;
use crate::config::{Config, HandshakeOffload};
use crate::crypto::ProviderName;

config_flags! {
    /// The settings of the whole process that flags can set, each over the file's key.
    #[derive(Clone, Debug, Args, Default, PartialEq)]
    pub struct ProcessFlags sets Config {
        /// Crypto provider: ring, aws-lc-rs, openssl, openssl-qat.
        #[arg(long, value_name = "P")]
        provider: Option<ProviderName> => provider,
        /// Admin listener (/metrics, /healthz, /readyz).
        #[arg(long, value_name = "ADDR")]
        admin: Option<String> => admin.listen,
        /// Bearer token file that enables POST /admin/tls (run-time provider/certificate switch).
        #[arg(long, value_name = "FILE")]
        admin_token_file: Option<PathBuf> => admin.token_file via Some,
        /// Certificate (PEM) to serve the admin port over TLS; with --admin-tls-key.
        #[arg(long, value_name = "FILE")]
        admin_tls_cert: Option<PathBuf> => admin.tls_cert via Some,
        /// Private key (PEM) for --admin-tls-cert.
        #[arg(long, value_name = "FILE")]
        admin_tls_key: Option<PathBuf> => admin.tls_key via Some,
        /// Where handshakes sign: inline (on the reactor) or pool (dedicated threads).
        #[arg(long, value_enum)]
        handshake_offload: Option<HandshakeOffload> => handshake.offload via Some,
        /// Threads in the handshake pool (0: one per CPU).
        #[arg(long, value_name = "N")]
        handshake_threads: Option<usize> => handshake.pool_threads,
        /// OpenSSL provider name for openssl-qat.
        #[arg(long, value_name = "NAME")]
        qat_provider_name: Option<String> => qat.provider_name,
        /// Directory holding the provider module, or the module file itself.
        #[arg(long, value_name = "PATH")]
        qat_module_path: Option<PathBuf> => qat.module_path via Some,
        /// Who polls the QAT provider: internal (its own thread; the default, and what QAT
        /// hardware needs), external (qat_sw: the proxy's signer computes each batch itself with
        /// the module's qat_sw_poll) or inline (QAT hardware: the requesting thread).
        #[arg(long, value_enum)]
        qat_polling: Option<crate::crypto::qat::Polling> => qat.polling,
        /// If the QAT provider cannot be used: none (refuse to start) or software.
        #[arg(long, value_enum)]
        qat_fallback: Option<crate::crypto::qat::Fallback> => qat.fallback,
        /// The QAT provider's batch width: 8 for qat_sw (the default), 1 for QAT hardware.
        #[arg(long, value_name = "N")]
        qat_batch: Option<usize> => qat.batch,
        /// The longest a part batch of QAT signatures waits to fill (default 5ms).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        qat_batch_wait: Option<Duration> => qat.batch_wait,
        /// Send ECDSA P-256 signatures to the QAT provider too (off by default: qat_sw gains
        /// less on them than the hand-off costs).
        #[arg(long, value_name = "BOOL")]
        qat_offload_p256: Option<bool> => qat.offload_p256,
        /// Generate X25519 key pairs ahead in QAT provider batches (off by default: see
        /// docs/proxy.md, qat.offload_x25519).
        #[arg(long, value_name = "BOOL")]
        qat_offload_x25519: Option<bool> => qat.offload_x25519,
        /// Root of the sysfs tree holding QAT telemetry (default /sys).
        #[arg(long, value_name = "DIR")]
        qat_telemetry_root: Option<PathBuf> => qat.telemetry_root,
        /// Reactor worker threads (0: one per CPU).
        #[arg(long, value_name = "N")]
        worker_threads: Option<usize> => worker_threads,
        /// Maximum open client connections.
        #[arg(long, value_name = "N")]
        max_connections: Option<usize> => limits.max_connections,
        /// Largest request body accepted, in bytes (larger ones get 413).
        #[arg(long, value_name = "BYTES")]
        max_request_body: Option<u64> => limits.max_request_body_bytes,
        /// TLS handshake timeout (e.g. 10s, 500ms).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        handshake_timeout: Option<Duration> => limits.handshake_timeout,
        /// Time allowed for the upstream's response headers.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        upstream_timeout: Option<Duration> => limits.upstream_response_timeout,
        /// Idle connection timeout.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        idle_timeout: Option<Duration> => limits.idle_timeout,
        /// How long in-flight requests may take to finish after SIGTERM.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        shutdown_grace: Option<Duration> => limits.shutdown_grace,
        /// After SIGTERM: how long to keep accepting, reporting not ready, before draining.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        accept_grace: Option<Duration> => limits.accept_grace,
        /// How often certificate and key files are checked for replacement (0s: never; SIGHUP
        /// still reloads).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        cert_watch_interval: Option<Duration> => cert_watch_interval,
        /// A connection that sends no request this long after its handshake is closed.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        first_request_timeout: Option<Duration> => limits.first_request_timeout,
        /// A connection with requests in flight on which nothing moves this long is closed.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        stall_timeout: Option<Duration> => limits.stall_timeout,
        /// A connection asked to close that is still open after this is closed hard.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        drain_timeout: Option<Duration> => limits.drain_timeout,
        /// Connections older than this are asked to close (default: no maximum).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        max_connection_age: Option<Duration> => limits.max_connection_age via Some,
        /// Concurrent requests forwarded to the upstream; beyond it 503 / RESOURCE_EXHAUSTED.
        #[arg(long, value_name = "N")]
        max_upstream_requests: Option<usize> => limits.max_upstream_requests,
        /// Request bytes the proxy may hold across all connections.
        #[arg(long, value_name = "BYTES")]
        request_buffer_budget: Option<u64> => limits.request_buffer_budget via Some,
        /// The largest HTTP/2 frame clients may send (16384 to 16777215).
        #[arg(long, value_name = "BYTES")]
        h2_max_frame_size: Option<u32> => limits.h2_max_frame_size,
        /// A peer (address or CIDR block) that is a proxy itself and may set X-Forwarded-For;
        /// repeatable.
        #[arg(long, value_name = "CIDR")]
        trusted_proxy: Vec<String> => trusted_proxies,
        /// Log filter (overridden by RUST_LOG): error, warn, info, debug, trace.
        #[arg(long, value_name = "LEVEL")]
        log_level: Option<String> => log_level,
        /// Log lines as text (the default) or JSON, one object per line (for log shippers).
        #[arg(long, value_enum)]
        log_format: Option<crate::config::LogFormat> => log_format,
        /// Access log: off (the default), stdout, or a file to append to.
        #[arg(long, value_name = "TARGET")]
        access_log: Option<String> => access_log.target,
        /// Access log lines as JSON (the default) or the common log format.
        #[arg(long, value_enum, value_name = "FORMAT")]
        access_log_format: Option<crate::access_log::AccessLogFormat> => access_log.format,
        /// Log this share of the requests (0 < F <= 1).
        #[arg(long, value_name = "F")]
        access_log_sample: Option<f64> => access_log.sample,
    }
}
