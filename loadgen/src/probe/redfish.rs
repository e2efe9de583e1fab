//! Whole-server power from a BMC over Redfish (Dell iDRAC, HPE iLO, Lenovo XCC): the
//! `Power` resource of a chassis, `PowerControl[0].PowerConsumedWatts`, sampled through
//! the run. Energy is the mean of the samples times the measured time.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use base64::Engine;
use http::Method;
use rustls::ClientConfig;

use crate::client::http::{send, Options};

/// A BMC's Redfish Power resource, read for the whole server's watts.
pub struct Redfish {
    url: String,
    opts: Options,
}

impl Redfish {
    /// `url` is the Power resource, e.g.
    /// `https://idrac/redfish/v1/Chassis/System.Embedded.1/Power`.
    pub fn new(
        url: &str,
        user: Option<&str>,
        password: Option<&str>,
        tls: Option<Arc<ClientConfig>>,
    ) -> Self {
        let mut headers = vec![("accept".to_owned(), "application/json".to_owned())];
        if let Some(user) = user {
            let token = base64::engine::general_purpose::STANDARD
                .encode(format!("{user}:{}", password.unwrap_or("")));
            headers.push(("authorization".to_owned(), format!("Basic {token}")));
        }
        Self {
            url: url.to_owned(),
            opts: Options {
                tls,
                headers,
                timeout: Some(Duration::from_secs(5)),
                ..Default::default()
            },
        }
    }

    /// The resource read.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// One reading, in watts.
    pub async fn watts(&self) -> Result<f64> {
        let resp = send(Method::GET, &self.url, None, &self.opts).await?;
        if resp.status != 200 {
            return Err(anyhow!(
                "Redfish {} answered HTTP {}",
                self.url,
                resp.status
            ));
        }
        parse_power(&resp.body)
    }
}

/// `PowerControl[0].PowerConsumedWatts` of a Redfish Power resource.
pub fn parse_power(body: &[u8]) -> Result<f64> {
    let v: serde_json::Value =
        serde_json::from_slice(body).context("Redfish answer is not JSON")?;
    v.get("PowerControl")
        .and_then(|p| p.get(0))
        .and_then(|p| p.get("PowerConsumedWatts"))
        .and_then(|w| w.as_f64())
        .ok_or_else(|| anyhow!("Redfish answer has no PowerControl[0].PowerConsumedWatts"))
}
