//! A remote cell: a running proxy switched to the cell's provider and certificate through
//! its admin API, waited for, then measured.

use super::*;

/// One cell against a remote proxy: its provider and certificate switched, then measured.
pub(super) async fn run_remote_cell(
    mode: &Mode,
    base: &RunArgs,
    cell: &Cell,
    cert_dir: &Path,
    out: &Path,
    stop: CancellationToken,
) -> Result<String> {
    let Mode::Remote {
        admin,
        token,
        target,
        ca,
        ..
    } = mode
    else {
        bail!("a remote cell needs remote mode");
    };
    let body = serde_json::json!({
        "provider": cell.provider,
        "cert": cert_dir.join(format!("{}.crt", cell.algorithm)),
        "key": cert_dir.join(format!("{}.key", cell.algorithm)),
    });
    let resp = send(
        http::Method::POST,
        &format!("{admin}/admin/tls"),
        Some(bytes::Bytes::from(body.to_string())),
        &Options {
            headers: vec![("authorization".into(), format!("Bearer {token}"))],
            timeout: Some(Duration::from_secs(30)),
            tls: if admin.starts_with("https://") {
                Some(crate::client::http::trust_config(Some(ca), false)?)
            } else {
                None
            },
            ..Default::default()
        },
    )
    .await?;
    if resp.status != 200 {
        bail!(
            "switching the proxy to {} {}: HTTP {}: {}",
            cell.provider,
            cell.algorithm,
            resp.status,
            resp.text()
        );
    }
    let mut run = cell_run_args(base, cell, target, ca, out);
    run.proxy_metrics = Some(format!("{admin}/metrics"));
    measure(run, stop).await
}
