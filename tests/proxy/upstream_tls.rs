//! TLS from the proxy to `https://` upstream nodes (`upstream_tls`), end to end over real
//! processes and sockets: a client -> the proxy under test -> a TLS server -> a
//! Qdrant-compatible upstream. The TLS server is a second proxy process (rustls, as
//! Qdrant's own `service.enable_tls` is), so the test can read from its metrics that the
//! hop was TLS; REST goes over HTTP/1.1, gRPC over h2 negotiated by ALPN. A node whose
//! certificate does not verify (another CA, another name) takes no request: the client
//! gets 502, and the log says why.

use std::path::Path;

use e2e::*;
use proxy::crypto::{generate_cert_set, CertAlgorithmName};

/// A proxy listening on two TLS listeners, `rest` and `grpc`, forwarding to the given
/// upstreams with the given extra listener settings (TOML lines), from a config file.
fn proxy_with(name: &str, rest: &str, grpc: &str, listener_extra: &str) -> ProxyProcess {
    let (cert, key) = server_cert(CertAlgorithmName::EcdsaP256);
    let dir = temp_dir(name);
    let config = dir.join("proxy.toml");
    let listener = |n: &str, upstream: &str, protocol: &str| {
        format!(
            "[[listener]]\nname = \"{n}\"\nlisten = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\n\
             upstream = \"{upstream}\"\nupstream_protocol = \"{protocol}\"\n{listener_extra}\n",
            cert.display(),
            key.display(),
        )
    };
    let h2 = if grpc.starts_with("https") {
        "h2"
    } else {
        "h2c"
    };
    std::fs::write(
        &config,
        format!(
            "provider = \"aws-lc-rs\"\n{}{}",
            listener("rest", rest, "http1"),
            listener("grpc", grpc, h2)
        ),
    )
    .unwrap();
    ProxyProcess::start_raw(&args(&["--config", config.to_str().unwrap()]))
}

fn upstream_tls(ca: &Path, extra: &str) -> String {
    format!("upstream_tls = {{ ca = \"{}\"{extra} }}", ca.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_are_verified_and_carry_rest_and_grpc() {
    use qdrant_client::qdrant::collections_client::CollectionsClient;
    use qdrant_client::qdrant::{GetCollectionInfoRequest, ListCollectionsRequest};

    let eq = EmbeddedQdrant::start(&temp_dir("upstream-tls-qdrant"));
    create_collection(eq.rest, "over_tls", 4);
    // The TLS node: plaintext to embedded-qdrant behind it, TLS (the test CA, names
    // localhost and 127.0.0.1) in front.
    let node = proxy_with(
        "upstream-tls-node",
        &format!("http://{}", eq.rest),
        &format!("http://{}", eq.grpc),
        "",
    );
    let node_rest = node.listener("rest");
    let node_grpc = node.listener("grpc");

    // The proxy under test, verifying the node against the test CA, by the URL's IP
    // address (an IP SAN) on REST and by a configured name on gRPC.
    let ca = &certs().ca_cert;
    let front = proxy_with(
        "upstream-tls-front",
        &format!("https://127.0.0.1:{}", node_rest.port()),
        &format!("https://127.0.0.1:{}", node_grpc.port()),
        &upstream_tls(ca, ""),
    );
    let log = front.log_text();
    assert!(
        log.contains("upstream_tls=\"ca file\"") || log.contains("upstream_tls=ca file"),
        "{log}"
    );

    // REST over HTTP/1.1 inside TLS, with curl as the client.
    let rest = front.listener("rest");
    let out = std::process::Command::new(system_tool("curl"))
        .args(["-sS", "--max-time", "20", "--cacert"])
        .arg(ca)
        .arg(format!(
            "https://localhost:{}/collections/over_tls",
            rest.port()
        ))
        .output()
        .expect("curl");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["status"], "ok", "{body}");
    assert_eq!(
        v["result"]["config"]["params"]["vectors"]["size"], 4,
        "{body}"
    );

    // gRPC: h2 by ALPN to the node, then h2c to Qdrant; OK and an error status both pass.
    let mut client = CollectionsClient::new(grpc_channel(front.listener("grpc")));
    let list = client
        .list(ListCollectionsRequest {})
        .await
        .expect("list collections")
        .into_inner();
    assert!(
        list.collections.iter().any(|c| c.name == "over_tls"),
        "{list:?}"
    );
    let err = client
        .get(GetCollectionInfoRequest {
            collection_name: "missing".into(),
        })
        .await
        .expect_err("no such collection");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err}");

    // The hops really were TLS: the node completed handshakes from the front proxy, and
    // served its requests (REST over HTTP/1.1, gRPC over HTTP/2).
    let m = node.metrics();
    let negotiated = metric_sum(&m, "proxy_tls_negotiated_total", &[("tls_version", "1.3")]);
    assert!(
        negotiated >= 2.0,
        "handshakes at the node: {negotiated}\n{m}"
    );
    node.wait_metric(
        "proxy_http_requests_total",
        &[("listener", "grpc"), ("grpc_status", "5")],
        1.0,
    );
    assert!(
        metric_sum(
            &m,
            "proxy_http_requests_total",
            &[("listener", "rest"), ("status", "200")]
        ) >= 1.0,
        "{m}"
    );

    unverified_nodes_get_no_request(&node, ca).await;
}

/// Nodes behind `node` whose certificates do not verify: one chaining to another CA, and
/// one asked for by a name its certificate lacks. Both refused with 502 / UNAVAILABLE, the
/// reason in the log, and no request reaches the node.
async fn unverified_nodes_get_no_request(node: &ProxyProcess, ca: &std::path::Path) {
    use qdrant_client::qdrant::collections_client::CollectionsClient;
    use qdrant_client::qdrant::ListCollectionsRequest;

    let (node_rest, node_grpc) = (node.listener("rest"), node.listener("grpc"));
    // A node whose certificate chains to another CA: no request reaches it.
    let other = generate_cert_set(
        &temp_dir("upstream-tls-other-ca"),
        &[CertAlgorithmName::EcdsaP256],
        &[],
    )
    .expect("certificates");
    let distrustful = proxy_with(
        "upstream-tls-other",
        &format!("https://127.0.0.1:{}", node_rest.port()),
        &format!("https://127.0.0.1:{}", node_grpc.port()),
        &upstream_tls(&other.ca_cert, ""),
    );
    // A node presenting a certificate for other names than the one asked for.
    let misnamed = proxy_with(
        "upstream-tls-misnamed",
        &format!("https://127.0.0.1:{}", node_rest.port()),
        &format!("https://127.0.0.1:{}", node_grpc.port()),
        &upstream_tls(ca, ", server_name = \"qdrant.example.test\""),
    );
    let requests_at_node = |m: &str| metric_sum(m, "proxy_http_requests_total", &[]);
    let before = requests_at_node(&node.metrics());
    for (refused, why) in [
        (&distrustful, "invalid peer certificate"),
        (
            &misnamed,
            "invalid peer certificate: certificate not valid for name",
        ),
    ] {
        let answer = get(refused.listener("rest"), "/collections")
            .await
            .expect("an answer");
        assert_eq!(answer.status.as_u16(), 502, "{why}: {answer:?}");
        let log = refused.log_text();
        assert!(log.contains(why), "the log does not say {why}:\n{log}");
        let mut client = CollectionsClient::new(grpc_channel(refused.listener("grpc")));
        let err = client
            .list(ListCollectionsRequest {})
            .await
            .expect_err("an unverified node");
        assert_eq!(err.code(), tonic::Code::Unavailable, "{why}: {err}");
    }
    assert_eq!(
        requests_at_node(&node.metrics()),
        before,
        "a request reached a node whose certificate did not verify"
    );
}

/// `upstream_tls` is checked at start-up: settings without an https:// node, a missing
/// CA file, a certificate without its key, and an https:// node in tcp mode are refused
/// with the field named.
#[test]
fn bad_upstream_tls_settings_are_refused_at_start_up() {
    let (cert, key) = server_cert(CertAlgorithmName::EcdsaP256);
    let dir = temp_dir("upstream-tls-bad");
    let ca = certs().ca_cert.display().to_string();
    for (listener, expected) in [
        (
            format!("upstream = \"http://127.0.0.1:1\"\nupstream_tls = {{ ca = \"{ca}\" }}"),
            "no upstream node is https://",
        ),
        (
            "upstream = \"https://127.0.0.1:1\"\nupstream_tls = { ca = \"/nonexistent/ca.crt\" }"
                .to_owned(),
            "upstream_tls.ca: file not found",
        ),
        (
            format!(
                "upstream = \"https://127.0.0.1:1\"\nupstream_tls = {{ ca = \"{ca}\", cert = \"{}\" }}",
                cert.display()
            ),
            "cert and key go together",
        ),
        (
            "upstream = \"https://127.0.0.1:1\"\nmode = \"tcp\"".to_owned(),
            "cannot encrypt them again",
        ),
    ] {
        let config = dir.join("proxy.toml");
        std::fs::write(
            &config,
            format!(
                "[[listener]]\nname = \"rest\"\nlisten = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\n{listener}\n",
                cert.display(),
                key.display()
            ),
        )
        .unwrap();
        let (status, text) = run_proxy_to_exit(&["check-config", config.to_str().unwrap()]);
        assert!(!status.success(), "{listener}: accepted:\n{text}");
        assert!(text.contains(expected), "{listener}: expected {expected:?}:\n{text}");
    }
}

/// A node that requires a client certificate (mTLS, as Qdrant behind a mutual-TLS
/// ingress, or a proxy with `client_ca`): the proxy presents `upstream_tls.cert`/`key` and
/// is served; without them the node refuses the handshake and the client gets 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_requires_a_client_certificate_gets_the_configured_one() {
    let eq = EmbeddedQdrant::start(&temp_dir("upstream-mtls-qdrant"));
    let ca = &certs().ca_cert;
    let node = proxy_with(
        "upstream-mtls-node",
        &format!("http://{}", eq.rest),
        &format!("http://{}", eq.grpc),
        &format!("[listener.tls]\nclient_ca = \"{}\"", ca.display()),
    );
    let port = node.listener("rest").port();
    let (client_cert, client_key) = &certs().client;
    let with_cert = proxy_with(
        "upstream-mtls-front",
        &format!("https://127.0.0.1:{port}"),
        &format!("https://127.0.0.1:{}", node.listener("grpc").port()),
        &upstream_tls(
            ca,
            &format!(
                ", cert = \"{}\", key = \"{}\"",
                client_cert.display(),
                client_key.display()
            ),
        ),
    );
    let answer = get(with_cert.listener("rest"), "/collections")
        .await
        .expect("an answer");
    assert_eq!(answer.status.as_u16(), 200, "{answer:?}");
    assert_eq!(answer.json()["status"], "ok", "{answer:?}");

    let without = proxy_with(
        "upstream-mtls-none",
        &format!("https://127.0.0.1:{port}"),
        &format!("https://127.0.0.1:{}", node.listener("grpc").port()),
        &upstream_tls(ca, ""),
    );
    let answer = get(without.listener("rest"), "/collections")
        .await
        .expect("an answer");
    assert_eq!(answer.status.as_u16(), 502, "{answer:?}");
    // The node saw a client without a certificate, and said so.
    node.wait_metric(
        "proxy_connection_errors_total",
        &[("listener", "rest"), ("kind", "handshake")],
        1.0,
    );
}
