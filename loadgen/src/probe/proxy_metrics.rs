//! The proxy's Prometheus /metrics, scraped before and after a run: handshakes done (full
//! and resumed), requests, and the proxy's own CPU-seconds (microsecond resolution, from
//! getrusage, steadier than /proc's 10 ms ticks).

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use http::Method;

use crate::client::http::{send, Options};

/// The figures a run uses from one scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// `proxy_tls_handshakes_total{outcome="ok"}`, summed.
    pub handshakes_ok: f64,
    /// Of which `resumed="true"`.
    pub handshakes_resumed: f64,
    /// `proxy_tls_handshake_failures_total`, summed.
    pub handshake_failures: f64,
    /// `proxy_http_requests_total`, summed.
    pub requests: f64,
    /// `process_cpu_seconds_total`, when exported.
    pub cpu_seconds: Option<f64>,
    /// openssl-qat: signatures the QAT provider took asynchronously (batched or sent to
    /// the device).
    pub qat_offloaded: Option<f64>,
    /// openssl-qat: all the other signatures (in software at low load, inline, failed).
    pub qat_not_offloaded: Option<f64>,
    /// openssl-qat: part batches submitted as they were.
    pub qat_part_batches: Option<f64>,
    /// openssl-qat: what computes the provider's work (`qat_sw`, `qat_hw`) and the batch.
    pub qat_mode: Option<(String, u32)>,
    /// Labels of `proxy_listener_info` series: provider, algorithm, mode, offload.
    pub listeners: Vec<BTreeMap<String, String>>,
}

/// Scrapes `url` (the proxy's /metrics) once.
pub async fn scrape(url: &str, opts: &Options) -> Result<Snapshot> {
    let resp = send(Method::GET, url, None, opts).await?;
    if resp.status != 200 {
        return Err(anyhow!("{url} answered HTTP {}", resp.status));
    }
    Ok(parse(&resp.text()))
}

/// Parses the Prometheus text exposition format for the series above.
pub fn parse(text: &str) -> Snapshot {
    let mut s = Snapshot::default();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = split_series(series);
        match name {
            "proxy_tls_handshakes_total" => {
                if labels.get("outcome").map(String::as_str) == Some("ok") {
                    s.handshakes_ok += value;
                    if labels.get("resumed").map(String::as_str) == Some("true") {
                        s.handshakes_resumed += value;
                    }
                } else {
                    s.handshake_failures += value;
                }
            }
            "proxy_http_requests_total" => s.requests += value,
            "process_cpu_seconds_total" => s.cpu_seconds = Some(value),
            "proxy_listener_info" => s.listeners.push(labels),
            "proxy_qat_part_batches_submitted_total" => s.qat_part_batches = Some(value),
            "proxy_qat_provider_info" if value > 0.0 => {
                s.qat_mode = Some((
                    labels.get("mode").cloned().unwrap_or_default(),
                    labels
                        .get("batch")
                        .and_then(|b| b.parse().ok())
                        .unwrap_or(0),
                ))
            }
            "proxy_qat_signatures_total" => match labels.get("outcome").map(String::as_str) {
                Some("offloaded") => *s.qat_offloaded.get_or_insert(0.0) += value,
                _ => *s.qat_not_offloaded.get_or_insert(0.0) += value,
            },
            _ => {}
        }
    }
    s
}

fn split_series(series: &str) -> (&str, BTreeMap<String, String>) {
    let Some((name, rest)) = series.split_once('{') else {
        return (series, BTreeMap::new());
    };
    let mut labels = BTreeMap::new();
    let body = rest.trim_end_matches('}');
    // Label values in our metrics never hold commas or quotes; a general parser would
    // have to honour escapes.
    for pair in body.split(',') {
        if let Some((k, v)) = pair.split_once('=') {
            labels.insert(k.trim().to_owned(), v.trim().trim_matches('"').to_owned());
        }
    }
    (name, labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_proxy_exposition() {
        let text = r#"# HELP proxy_tls_handshakes_total x
# TYPE proxy_tls_handshakes_total counter
proxy_tls_handshakes_total{algorithm="rsa2048",listener="rest",outcome="ok",provider="ring",resumed="false",tls_version="TLSv1_3"} 10
proxy_tls_handshakes_total{algorithm="rsa2048",listener="rest",outcome="ok",provider="ring",resumed="true",tls_version="TLSv1_3"} 5
proxy_tls_handshakes_total{algorithm="rsa2048",listener="rest",outcome="error",provider="ring",resumed="false",tls_version=""} 2
proxy_http_requests_total{listener="rest",protocol="http1",status="200"} 14
proxy_http_requests_total{listener="rest",protocol="http1",status="502"} 1
process_cpu_seconds_total 1.234567
proxy_listener_info{algorithm="rsa2048",handshake_offload="inline",listener="rest",mode="http",provider="ring"} 1
"#;
        let s = parse(text);
        assert_eq!(s.handshakes_ok, 15.0);
        assert_eq!(s.handshakes_resumed, 5.0);
        assert_eq!(s.handshake_failures, 2.0);
        assert_eq!(s.requests, 15.0);
        assert_eq!(s.cpu_seconds, Some(1.234567));
        assert_eq!(s.listeners[0]["provider"], "ring");
        // No QAT series: no QAT figures (not zeros).
        assert_eq!((s.qat_offloaded, s.qat_not_offloaded), (None, None));
        let qat = parse(
            "proxy_qat_signatures_total{outcome=\"offloaded\"} 40\n\
             proxy_qat_signatures_total{outcome=\"software\"} 7\n\
             proxy_qat_signatures_total{outcome=\"inline\"} 2\n\
             proxy_qat_signatures_total{outcome=\"failed\"} 1\n",
        );
        assert_eq!(qat.qat_offloaded, Some(40.0));
        let info = parse(
            "proxy_qat_provider_info{batch=\"8\",mode=\"qat_sw\",provider=\"qatprovider\"} 1\n\
             proxy_qat_part_batches_submitted_total 5\n",
        );
        assert_eq!(info.qat_mode, Some(("qat_sw".to_owned(), 8)));
        assert_eq!(info.qat_part_batches, Some(5.0));
        assert_eq!(qat.qat_not_offloaded, Some(10.0));
    }
}
