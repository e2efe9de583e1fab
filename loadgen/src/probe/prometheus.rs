//! Figures from a Prometheus server that already scrapes the machines: the power of the
//! server under test, and the CPU of the proxy's host when loadgen runs elsewhere.
//!
//! Power: an instant query (`GET /api/v1/query`) whose answer is watts, sampled through the
//! run like Redfish: `ipmi_dcmi_power_consumption_watts` (ipmi_exporter),
//! `scaph_host_power_microwatts / 1e6` (Scaphandre),
//! `sum(rate(kepler_node_platform_joules_total[30s]))` (Kepler), a PDU outlet's SNMP
//! series. A vector answer is summed (one series per power supply or outlet adds up to the
//! server); an empty answer is an error, never zero. Readings are only as fresh as the
//! server's scrape interval, which the record says.
//!
//! Target host CPU: node_exporter's idle time over exactly the measured window, asked once
//! at the end of the run.
//!
//! Basic auth (Prometheus' own `web.config`) or a bearer token (hosted Prometheus, Mimir,
//! Thanos behind an auth proxy) when the server asks for it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use http::Method;
use rustls::ClientConfig;

use crate::client::http::{send, Options};

/// How to authenticate to the Prometheus server.
pub enum Auth {
    /// HTTP basic authentication.
    Basic {
        /// User name.
        user: String,
        /// Password.
        password: String,
    },
    /// A bearer token.
    Bearer(String),
}

/// A Prometheus server's query API.
pub struct Prometheus {
    base: String,
    opts: Options,
}

/// One evaluated query: the sum of its samples (watts, or percent for the CPU query) and
/// how many series were summed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    /// The sum of the samples.
    pub value: f64,
    /// How many series were summed.
    pub series: usize,
}

impl Prometheus {
    /// `base` is the server, e.g. `http://prometheus:9090`.
    pub fn new(base: &str, tls: Option<Arc<ClientConfig>>, auth: Option<Auth>) -> Self {
        let mut headers = vec![("accept".to_owned(), "application/json".to_owned())];
        match auth {
            Some(Auth::Basic { user, password }) => {
                let token =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                headers.push(("authorization".to_owned(), format!("Basic {token}")));
            }
            Some(Auth::Bearer(token)) => {
                headers.push(("authorization".to_owned(), format!("Bearer {token}")));
            }
            None => {}
        }
        Self {
            base: base.trim_end_matches('/').to_owned(),
            opts: Options {
                tls,
                headers,
                timeout: Some(Duration::from_secs(5)),
                ..Default::default()
            },
        }
    }

    fn query_url(&self, query: &str) -> String {
        let encoded: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", query)
            .finish();
        format!("{}/api/v1/query?{encoded}", self.base)
    }

    /// Evaluates an instant query now: a scalar, or the sum of a vector's samples.
    pub async fn instant(&self, query: &str) -> Result<Reading> {
        let url = self.query_url(query);
        let resp = send(Method::GET, &url, None, &self.opts).await?;
        if resp.status == 401 || resp.status == 403 {
            bail!(
                "Prometheus at {url} refused the request (HTTP {}): check --prometheus-user and \
                 LOADGEN_PROMETHEUS_PASSWORD, or --prometheus-bearer-token-file",
                resp.status
            );
        }
        // Prometheus answers 400/422 with the same JSON envelope and the error in it.
        parse_answer(&resp.body).with_context(|| {
            format!(
                "Prometheus query {query:?} (HTTP {}) at {}",
                resp.status, self.base
            )
        })
    }
}

/// Power sampled from a Prometheus query in watts.
pub struct PrometheusPower {
    server: Arc<Prometheus>,
    query: String,
}

impl PrometheusPower {
    /// `query` (in watts) evaluated by `server` on every sample.
    pub fn new(server: Arc<Prometheus>, query: &str) -> Self {
        Self {
            server,
            query: query.to_owned(),
        }
    }

    /// The query, for the record.
    pub fn query(&self) -> &str {
        &self.query
    }

    /// The query evaluated now.
    pub async fn reading(&self) -> Result<Reading> {
        self.server.instant(&self.query).await
    }
}

/// The PromQL for a node_exporter host's CPU utilisation (all cores, 0..=100) over the
/// `seconds` before the evaluation.
pub fn host_cpu_query(instance: &str, seconds: u64) -> String {
    let instance = instance.replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        "100 * (1 - avg(rate(node_cpu_seconds_total{{mode=\"idle\",instance=\"{instance}\"}}[{seconds}s])))"
    )
}

/// The target host's CPU utilisation over the run that just ended.
pub async fn host_cpu_percent(
    server: &Prometheus,
    instance: &str,
    measured: Duration,
) -> Result<f64> {
    let seconds = measured.as_secs_f64().ceil().max(1.0) as u64;
    let query = host_cpu_query(instance, seconds);
    let reading = server.instant(&query).await.with_context(|| {
        format!("node_exporter {instance:?}: a {seconds} s window needs at least two scrapes of it")
    })?;
    if reading.series != 1 || reading.value > 100.0 {
        bail!("{query} gave {} series, {}", reading.series, reading.value);
    }
    Ok(reading.value)
}

/// The value of an instant-query answer: a scalar, or the sum of a vector's samples.
pub fn parse_answer(body: &[u8]) -> Result<Reading> {
    let v: serde_json::Value = serde_json::from_slice(body).context("the answer is not JSON")?;
    if v["status"] != "success" {
        bail!(
            "{}: {}",
            v["errorType"].as_str().unwrap_or("error"),
            v["error"].as_str().unwrap_or("no error message")
        );
    }
    let data = &v["data"];
    let sample = |pair: &serde_json::Value| -> Result<f64> {
        let text = pair
            .get(1)
            .and_then(|s| s.as_str())
            .ok_or_else(|| anyhow!("a sample is not [time, \"value\"]"))?;
        let value: f64 = text
            .parse()
            .map_err(|_| anyhow!("sample value {text:?} is not a number"))?;
        // Watts and CPU percentages alike are finite and never negative.
        if !value.is_finite() || value < 0.0 {
            bail!("sample value {text} is not a finite, non-negative figure");
        }
        Ok(value)
    };
    match data["resultType"].as_str() {
        Some("scalar") => Ok(Reading {
            value: sample(&data["result"])?,
            series: 1,
        }),
        Some("vector") => {
            let series = data["result"]
                .as_array()
                .ok_or_else(|| anyhow!("vector answer without a result list"))?;
            if series.is_empty() {
                bail!("the query matched no series (is the exporter scraped, is the name right?)");
            }
            let mut value = 0.0;
            for s in series {
                value += sample(&s["value"])?;
            }
            Ok(Reading {
                value,
                series: series.len(),
            })
        }
        other => bail!(
            "result type {} is not an instant value (use an instant query)",
            other.unwrap_or("missing")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_is_summed_over_its_series() {
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"ipmi_dcmi_power_consumption_watts","instance":"psu1"},"value":[1764490000.123,"301.5"]},
            {"metric":{"__name__":"ipmi_dcmi_power_consumption_watts","instance":"psu2"},"value":[1764490000.123,"298"]}]}}"#;
        assert_eq!(
            parse_answer(body).unwrap(),
            Reading {
                value: 599.5,
                series: 2
            }
        );
    }

    #[test]
    fn a_scalar_is_taken_as_is() {
        let body = br#"{"status":"success","data":{"resultType":"scalar","result":[1764490000,"412.25"]}}"#;
        assert_eq!(parse_answer(body).unwrap().value, 412.25);
    }

    #[test]
    fn no_series_errors_and_bad_values_are_refused_never_zero() {
        let empty = br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert!(parse_answer(empty)
            .unwrap_err()
            .to_string()
            .contains("no series"));
        let error = br#"{"status":"error","errorType":"bad_data","error":"parse error at char 5"}"#;
        let e = parse_answer(error).unwrap_err().to_string();
        assert!(e.contains("bad_data") && e.contains("parse error"), "{e}");
        for value in ["\"NaN\"", "\"-3\"", "\"+Inf\"", "\"abc\"", "3"] {
            let body = format!(
                r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{}},"value":[1,{value}]}}]}}}}"#
            );
            assert!(parse_answer(body.as_bytes()).is_err(), "{value} accepted");
        }
        let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(parse_answer(matrix)
            .unwrap_err()
            .to_string()
            .contains("matrix"));
    }

    #[test]
    fn credentials_become_the_authorization_header() {
        let header = |auth| {
            Prometheus::new("http://p:9090", None, Some(auth))
                .opts
                .headers
                .into_iter()
                .find(|(k, _)| k == "authorization")
                .map(|(_, v)| v)
                .unwrap()
        };
        assert_eq!(
            header(Auth::Basic {
                user: "loadgen".into(),
                password: "pw".into()
            }),
            "Basic bG9hZGdlbjpwdw=="
        );
        assert_eq!(header(Auth::Bearer("t0k3n".into())), "Bearer t0k3n");
    }

    #[test]
    fn queries_are_url_encoded() {
        let p = Prometheus::new("http://prom:9090/", None, None);
        assert_eq!(
            p.query_url("sum(scaph_host_power_microwatts{job=\"a b\"}) / 1e6"),
            "http://prom:9090/api/v1/query?query=sum%28scaph_host_power_microwatts%7Bjob%3D%22a+b%22%7D%29+%2F+1e6"
        );
    }

    #[test]
    fn the_host_cpu_query_covers_the_window_and_quotes_the_instance() {
        assert_eq!(
            host_cpu_query("db1:9100", 67),
            "100 * (1 - avg(rate(node_cpu_seconds_total{mode=\"idle\",instance=\"db1:9100\"}[67s])))"
        );
        assert!(host_cpu_query("a\"b", 1).contains("instance=\"a\\\"b\""));
    }
}
