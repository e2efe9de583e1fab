//! The access log: one line per request (JSON or the common log format), to stdout or a
//! file, optionally for a sample of the requests. Off by default.
//!
//! The data path never writes: a finished request hands its [`Record`] to a bounded queue
//! and one writer thread, waking every 100 ms (never per line: waking it for each line cost
//! a request 10-20 us of CPU), formats what is queued and writes it through a buffer in
//! one go. A full queue (a disk slower than the traffic) drops lines and counts them
//! rather than slow the requests down. A log file replaced under the proxy (logrotate's
//! `create` mode) is noticed within a second and reopened, no signal needed.

use std::fs::OpenOptions;
use std::io::{self, BufWriter, Write};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus::IntCounter;
use serde::{Deserialize, Serialize};

/// Lines waiting for the writer; beyond this they are dropped (and counted). At one
/// drain every `DRAIN_EVERY`, 160,000 lines a second.
const QUEUE_LINES: usize = 16 * 1024;
/// How often the writer drains the queue and flushes: lines reach the file this late.
const DRAIN_EVERY: Duration = Duration::from_millis(100);
/// How often the writer looks whether its file was replaced.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How access log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AccessLogFormat {
    /// One JSON object per line, every field named.
    #[default]
    Json,
    /// The common log format (`host - - [time] "request" status bytes`), which every log
    /// tool reads, followed by the other fields as `name=value`.
    Common,
}

/// `[access_log]`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLogConfig {
    /// `off` (the default), `stdout`, or a file path (appended to).
    pub target: String,
    /// The line format.
    pub format: AccessLogFormat,
    /// The share of requests logged, 0 < sample <= 1 (every request by default). Every
    /// n-th request, not a random draw: the log of a steady load is steady.
    pub sample: f64,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        Self {
            target: "off".to_owned(),
            format: AccessLogFormat::Json,
            sample: 1.0,
        }
    }
}

impl AccessLogConfig {
    /// Problems with these settings, for `Config::validate`.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !(self.sample > 0.0 && self.sample <= 1.0) {
            out.push(format!(
                "access_log.sample: {} is not in (0, 1]",
                self.sample
            ));
        }
        if self.target.is_empty() {
            out.push("access_log.target: empty (use off, stdout or a file path)".to_owned());
        }
        out
    }

    fn sink(&self) -> Option<Sink> {
        match self.target.as_str() {
            "off" => None,
            "stdout" | "-" => Some(Sink::Stdout),
            path => Some(Sink::File(PathBuf::from(path))),
        }
    }
}

#[derive(Clone)]
enum Sink {
    Stdout,
    File(PathBuf),
}

/// What the log says of one request. Built only for requests that are logged.
#[derive(Debug, Serialize)]
pub struct Record {
    /// When the request head arrived.
    #[serde(serialize_with = "rfc3339")]
    pub time: SystemTime,
    /// The listener's name.
    #[serde(serialize_with = "shared_str")]
    pub listener: Arc<str>,
    /// The client's address.
    pub peer: SocketAddr,
    /// The request method.
    #[serde(serialize_with = "display")]
    pub method: http::Method,
    /// Path and query as the client sent them.
    #[serde(serialize_with = "display")]
    pub path: http::uri::PathAndQuery,
    /// `http1`, `h2` or `grpc`.
    pub protocol: &'static str,
    /// The response status.
    pub status: u16,
    /// A gRPC call's grpc-status (as the request counter labels it); none for other
    /// protocols.
    pub grpc_status: Option<&'static str>,
    /// The request's `x-request-id`, as the client sent it or as the proxy added it.
    #[serde(serialize_with = "header_opt")]
    pub request_id: Option<http::HeaderValue>,
    /// The W3C trace the request belongs to (its `traceparent`, as the client sent it or as
    /// the proxy started it), as 32 hex digits.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "display_opt"
    )]
    pub trace_id: Option<opentelemetry::trace::TraceId>,
    /// Request body bytes received.
    pub bytes_in: u64,
    /// Response body bytes sent.
    pub bytes_out: u64,
    /// From the request head to the end of the response body.
    pub duration_ms: f64,
    /// The upstream node that answered (or failed); none when the proxy answered itself.
    #[serde(serialize_with = "display_opt")]
    pub upstream: Option<http::uri::Authority>,
    /// `1.3` or `1.2`.
    pub tls_version: &'static str,
    /// The crypto provider that made the connection's handshake.
    pub provider: &'static str,
    /// A resumed TLS session.
    pub resumed: bool,
}

fn header_opt<S: serde::Serializer>(
    v: &Option<http::HeaderValue>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        // A client's id may hold bytes that are not UTF-8: written lossily, never dropped.
        Some(h) => s.serialize_str(&String::from_utf8_lossy(h.as_bytes())),
        None => s.serialize_none(),
    }
}

fn display<S: serde::Serializer, T: std::fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn display_opt<S: serde::Serializer, T: std::fmt::Display>(
    v: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

fn shared_str<S: serde::Serializer>(v: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v)
}

fn rfc3339<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*t))
}

/// A logged request on its way: its record is completed and queued when the response
/// body is done (or abandoned), so the duration and byte counts are the whole exchange's.
pub struct PendingRecord {
    /// Taken when the record is queued (on drop).
    record: Option<Box<Record>>,
    started: tokio::time::Instant,
    bytes_in: Arc<AtomicU64>,
    log: Arc<AccessLog>,
}

impl std::fmt::Debug for PendingRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PendingRecord").field(&self.record).finish()
    }
}

impl PendingRecord {
    /// The counter the request body adds its bytes to.
    pub fn bytes_in(&self) -> &Arc<AtomicU64> {
        &self.bytes_in
    }

    /// The node the request went to.
    pub fn set_upstream(&mut self, node: &http::uri::Authority) {
        if let Some(r) = &mut self.record {
            r.upstream = Some(node.clone());
        }
    }

    /// The request's `x-request-id`.
    pub fn set_request_id(&mut self, id: http::HeaderValue) {
        if let Some(r) = &mut self.record {
            r.request_id = Some(id);
        }
    }

    /// The trace the request belongs to.
    pub fn set_trace_id(&mut self, id: Option<opentelemetry::trace::TraceId>) {
        if let Some(r) = &mut self.record {
            r.trace_id = id;
        }
    }

    /// A gRPC call's grpc-status label.
    pub fn set_grpc_status(&mut self, grpc_status: &'static str) {
        if let Some(r) = &mut self.record {
            r.grpc_status = Some(grpc_status);
        }
    }

    /// The response status.
    pub fn set_status(&mut self, status: http::StatusCode) {
        if let Some(r) = &mut self.record {
            r.status = status.as_u16();
        }
    }

    /// Response body bytes sent so far.
    pub fn sent(&mut self, n: usize) {
        if let Some(r) = &mut self.record {
            r.bytes_out += n as u64;
        }
    }
}

impl Drop for PendingRecord {
    fn drop(&mut self) {
        let Some(mut record) = self.record.take() else {
            return;
        };
        // Microsecond resolution: the float prints short (0.335, not 0.33533999999999997).
        record.duration_ms = self.started.elapsed().as_micros() as f64 / 1000.0;
        record.bytes_in = self.bytes_in.load(Ordering::Relaxed);
        self.log.log(record);
    }
}

/// What a connection contributes to its requests' records.
#[derive(Clone, Debug)]
pub struct ConnectionFacts {
    /// The listener's name.
    pub listener: Arc<str>,
    /// The client.
    pub peer: SocketAddr,
    /// `1.3` or `1.2`.
    pub tls_version: &'static str,
    /// The handshake's provider.
    pub provider: &'static str,
    /// Resumed session.
    pub resumed: bool,
}

/// The data path's handle on the access log.
pub struct AccessLog {
    queue: SyncSender<Message>,
    /// Log request n when floor((n+1)·sample) > floor(n·sample).
    sample: f64,
    seen: AtomicU64,
    dropped: IntCounter,
}

enum Message {
    Line(Box<Record>),
    /// Flush, then say so.
    Flush(SyncSender<()>),
}

impl AccessLog {
    /// Opens the target and starts the writer; `None` when the log is off.
    pub fn start(
        config: &AccessLogConfig,
        written: IntCounter,
        dropped: IntCounter,
        errors: IntCounter,
    ) -> io::Result<Option<Arc<Self>>> {
        let Some(sink) = config.sink() else {
            return Ok(None);
        };
        let out = Output::open(&sink)?;
        let (queue, lines) = mpsc::sync_channel(QUEUE_LINES);
        let format = config.format;
        std::thread::Builder::new()
            .name("access-log".to_owned())
            .spawn(move || write_lines(lines, out, sink, format, written, errors))?;
        Ok(Some(Arc::new(Self {
            queue,
            sample: config.sample,
            seen: AtomicU64::new(0),
            dropped,
        })))
    }

    /// Whether the next request is one the sample keeps.
    pub fn samples_next(&self) -> bool {
        if self.sample >= 1.0 {
            return true;
        }
        let n = self.seen.fetch_add(1, Ordering::Relaxed) as f64;
        ((n + 1.0) * self.sample).floor() > (n * self.sample).floor()
    }

    /// Starts the record of a request that the sample keeps; `None` for the others.
    pub fn begin(
        self: &Arc<Self>,
        conn: &ConnectionFacts,
        method: &http::Method,
        uri: &http::Uri,
        protocol: &'static str,
    ) -> Option<PendingRecord> {
        if !self.samples_next() {
            return None;
        }
        let record = Box::new(Record {
            time: SystemTime::now(),
            listener: conn.listener.clone(),
            peer: conn.peer,
            // Both share the request's bytes: no copy for the standard methods and paths.
            method: method.clone(),
            path: uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
            protocol,
            status: 0,
            grpc_status: None,
            request_id: None,
            trace_id: None,
            bytes_in: 0,
            bytes_out: 0,
            duration_ms: 0.0,
            upstream: None,
            tls_version: conn.tls_version,
            provider: conn.provider,
            resumed: conn.resumed,
        });
        Some(PendingRecord {
            record: Some(record),
            started: tokio::time::Instant::now(),
            bytes_in: Arc::new(AtomicU64::new(0)),
            log: self.clone(),
        })
    }

    /// Queues a finished request's line; never waits.
    pub fn log(&self, record: Box<Record>) {
        if let Err(TrySendError::Full(_)) = self.queue.try_send(Message::Line(record)) {
            self.dropped.inc();
        }
    }

    /// Writes out everything queued so far (at shutdown), waiting at most `limit`.
    pub fn flush(&self, limit: Duration) {
        let (done, wait) = mpsc::sync_channel(1);
        if self.queue.send(Message::Flush(done)).is_ok() {
            let _ = wait.recv_timeout(limit);
        }
    }
}

struct Output {
    writer: BufWriter<Box<dyn Write + Send>>,
    /// The open file's inode, to notice a replaced file.
    inode: Option<u64>,
}

impl Output {
    fn open(sink: &Sink) -> io::Result<Self> {
        Ok(match sink {
            Sink::Stdout => Self {
                writer: BufWriter::with_capacity(64 * 1024, Box::new(io::stdout())),
                inode: None,
            },
            Sink::File(path) => {
                let file = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| {
                        io::Error::new(e.kind(), format!("access log {}: {e}", path.display()))
                    })?;
                let inode = Some(file.metadata()?.ino());
                Self {
                    writer: BufWriter::with_capacity(64 * 1024, Box::new(file) as Box<_>),
                    inode,
                }
            }
        })
    }

    /// True when the file at the path is no longer the one open here.
    fn replaced(&self, sink: &Sink) -> bool {
        match (sink, self.inode) {
            (Sink::File(path), Some(inode)) => {
                std::fs::metadata(path).map_or(true, |m| m.ino() != inode)
            }
            _ => false,
        }
    }
}

fn write_lines(
    lines: Receiver<Message>,
    mut out: Output,
    sink: Sink,
    format: AccessLogFormat,
    written: IntCounter,
    errors: IntCounter,
) {
    let mut line = Vec::with_capacity(512);
    let mut failing = false;
    let mut last_check = std::time::Instant::now();
    loop {
        // Sleeping, not blocking on the queue: a sender never has a thread to wake.
        std::thread::sleep(DRAIN_EVERY);
        let mut flushed = Vec::new();
        let disconnected = loop {
            match lines.try_recv() {
                Ok(Message::Line(record)) => {
                    line.clear();
                    format_line(&record, format, &mut line);
                    match out.writer.write_all(&line) {
                        Ok(()) => {
                            written.inc();
                            failing = false;
                        }
                        Err(e) => {
                            errors.inc();
                            if !failing {
                                tracing::warn!(error = %e, "writing the access log failed");
                                failing = true;
                            }
                        }
                    }
                }
                Ok(Message::Flush(done)) => flushed.push(done),
                Err(mpsc::TryRecvError::Empty) => break false,
                Err(mpsc::TryRecvError::Disconnected) => break true,
            }
        };
        if let Err(e) = out.writer.flush() {
            errors.inc();
            if !failing {
                tracing::warn!(error = %e, "writing the access log failed");
                failing = true;
            }
        }
        for done in flushed {
            let _ = done.send(());
        }
        if disconnected {
            return;
        }
        if last_check.elapsed() >= CHECK_EVERY {
            last_check = std::time::Instant::now();
            if out.replaced(&sink) {
                match Output::open(&sink) {
                    Ok(new) => out = new,
                    Err(e) => {
                        errors.inc();
                        tracing::warn!(error = %e, "cannot reopen the access log");
                    }
                }
            }
        }
    }
}

/// Appends one line (with its newline) to `out`.
pub fn format_line(r: &Record, format: AccessLogFormat, out: &mut Vec<u8>) {
    match format {
        AccessLogFormat::Json => {
            // Serialising plain fields into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, r);
        }
        AccessLogFormat::Common => {
            let t = time::OffsetDateTime::from(r.time);
            const MONTHS: [&str; 12] = [
                "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            ];
            let version = match r.protocol {
                "http1" => "HTTP/1.1",
                _ => "HTTP/2.0",
            };
            // The request line is the client's: quotes and control bytes are escaped so a
            // crafted path cannot forge a line or a field.
            let _ = write!(
                out,
                "{} - - [{:02}/{}/{}:{:02}:{:02}:{:02} +0000] \"{} {} {version}\" {} {}",
                r.peer.ip(),
                t.day(),
                MONTHS[usize::from(u8::from(t.month())) - 1],
                t.year(),
                t.hour(),
                t.minute(),
                t.second(),
                r.method.as_str().escape_default(),
                r.path.as_str().escape_default(),
                r.status,
                r.bytes_out,
            );
            let _ = write!(
                out,
                " in={} ms={:.3} upstream={} tls={} provider={} resumed={} listener={}",
                r.bytes_in,
                r.duration_ms,
                r.upstream.as_ref().map_or("-", |a| a.as_str()),
                r.tls_version,
                r.provider,
                r.resumed,
                r.listener,
            );
            if let Some(code) = r.grpc_status {
                let _ = write!(out, " grpc_status={code}");
            }
            if let Some(id) = &r.trace_id {
                let _ = write!(out, " trace_id={id}");
            }
            if let Some(id) = &r.request_id {
                // The client's bytes: escaped like the request line, so no line is forged.
                let _ = write!(
                    out,
                    " request_id={}",
                    String::from_utf8_lossy(id.as_bytes()).escape_default()
                );
            }
        }
    }
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_558_245_123),
            listener: Arc::from("rest"),
            peer: "10.1.2.3:40000".parse().unwrap(),
            method: http::Method::PUT,
            path: http::uri::PathAndQuery::from_static("/collections/c/points?wait=%22true%22"),
            protocol: "http1",
            status: 200,
            grpc_status: None,
            request_id: Some(http::HeaderValue::from_static("req-7")),
            trace_id: None,
            bytes_in: 812_345,
            bytes_out: 91,
            duration_ms: 12.5,
            upstream: Some(http::uri::Authority::from_static("127.0.0.1:6333")),
            tls_version: "1.3",
            provider: "aws-lc-rs",
            resumed: false,
        }
    }

    #[test]
    fn json_lines_name_every_field() {
        let mut out = Vec::new();
        format_line(&record(), AccessLogFormat::Json, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["time"], "2025-12-01T03:04:05.123Z");
        assert_eq!(v["path"], "/collections/c/points?wait=%22true%22");
        assert_eq!(v["bytes_in"], 812_345);
        assert_eq!(v["upstream"], "127.0.0.1:6333");
        assert_eq!(v["provider"], "aws-lc-rs");
        assert_eq!(v["resumed"], false);
        assert_eq!(v["grpc_status"], serde_json::Value::Null, "not a gRPC call");
        assert_eq!(v["request_id"], "req-7");
        let mut out = Vec::new();
        format_line(
            &Record {
                protocol: "grpc",
                grpc_status: Some("5"),
                ..record()
            },
            AccessLogFormat::Json,
            &mut out,
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["grpc_status"], "5");
    }

    #[test]
    fn common_log_format_comes_first_and_escapes_the_client_s_bytes() {
        let mut r = record();
        // hyper accepts a double quote in a request target; unescaped it would end the
        // request field early. (Control bytes never reach here: hyper refuses them.)
        r.path = http::uri::PathAndQuery::try_from("/x\" 200 1")
            .unwrap_or_else(|_| http::uri::PathAndQuery::from_static("/x%22"));
        let mut out = Vec::new();
        format_line(&r, AccessLogFormat::Common, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("10.1.2.3 - - [01/Dec/2025:03:04:05 +0000] \"PUT /x"),
            "{text}"
        );
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        assert_eq!(
            text.matches('"').count() - text.matches("\\\"").count(),
            2,
            "only the request field's own quotes are bare: {text}"
        );
        assert!(text.contains("HTTP/1.1\" 200 91 in=812345 ms=12.500 upstream=127.0.0.1:6333 tls=1.3 provider=aws-lc-rs resumed=false listener=rest request_id=req-7"), "{text}");
    }

    #[test]
    fn sampling_keeps_the_configured_share() {
        let log = AccessLog {
            queue: mpsc::sync_channel(1).0,
            sample: 0.25,
            seen: AtomicU64::new(0),
            dropped: IntCounter::new("d", "d").unwrap(),
        };
        let kept = (0..1000).filter(|_| log.samples_next()).count();
        assert_eq!(kept, 250);
    }
}
