//! The compose file as docker-compose resolves it (PyPI's docker-compose 1.29, `config`),
//! against our binaries.

use std::path::Path;
use std::process::Command;

use e2e::*;
use proxy::crypto::CertAlgorithmName;
use serde_json::Value;

use super::manifests::*;

#[test]
fn compose_file_is_valid_and_agrees_with_the_binaries() {
    let compose = repo_root().join("deploy/compose/compose.yaml");
    let c = render(&["compose", compose.to_str().unwrap()]);
    let services = c["services"].as_object().expect("services");
    for name in [
        "qdrant",
        "certs",
        "proxy",
        "ovms",
        "node-exporter",
        "prometheus",
        "grafana",
        "loadgen",
    ] {
        assert!(services.contains_key(name), "service {name} missing");
    }
    every_image_is_pinned(&c);
    qdrant_stays_inside_behind_its_key(&c);
    the_proxy_publishes_its_listeners(&c);
    the_rest_publishes_on_loopback_only(&c);
    the_proxy_runs_its_checked_configuration(&c);
    the_certificates_come_from_gen_certs(&c);
    loadgen_runs_compare_with_flags_it_has(&c);
    mounted_files_exist_and_prometheus_loads(&c);
}

/// Every image pinned by version.
fn every_image_is_pinned(c: &Value) {
    let services = c["services"].as_object().expect("services");
    for (name, s) in services {
        let image = s["image"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no image"));
        let tag = image
            .rsplit('/')
            .next()
            .unwrap()
            .split_once(':')
            .map(|(_, t)| t);
        assert!(
            tag.is_some_and(|t| t != "latest" && t.chars().any(|c| c.is_ascii_digit())),
            "{name}: image {image} is not pinned to a version"
        );
    }
}

/// Qdrant's own ports stay inside; Qdrant on a network of its own, internal, shared with the
/// proxy alone, with an API key generated into a volume that only Qdrant, the generator
/// and loadgen mount; the project's containers read-only, without capabilities.
fn qdrant_stays_inside_behind_its_key(c: &Value) {
    let services = c["services"].as_object().expect("services");
    assert!(
        services["qdrant"].get("ports").is_none(),
        "qdrant publishes ports"
    );
    // Qdrant on a network of its own, internal (no route out), shared with the proxy alone
    // (it once shared the proxy's network namespace and both bound 6333/6334 there), with
    // an API key generated into a volume that only Qdrant, the generator and loadgen mount.
    let qdrant = &services["qdrant"];
    assert!(qdrant.get("network_mode").is_none(), "{qdrant}");
    let qdrant_networks: Vec<&String> = qdrant["networks"]
        .as_object()
        .expect("qdrant's networks")
        .keys()
        .collect();
    assert_eq!(qdrant_networks, ["qdrant"]);
    assert_eq!(c["networks"]["qdrant"]["internal"], true);
    let on_qdrant_network: Vec<&String> = services
        .iter()
        .filter(|(_, s)| s["networks"].get("qdrant").is_some())
        .map(|(name, _)| name)
        .collect();
    assert_eq!(on_qdrant_network, ["proxy", "qdrant"]);
    // The project's containers: read-only, no capabilities, no privilege escalation; no
    // ulimits a host with a lower hard limit would refuse.
    for name in ["certs", "proxy"] {
        let s = &services[name];
        assert_eq!(s["read_only"], true, "{name}");
        assert_eq!(strings(&s["cap_drop"]), ["ALL"], "{name}");
        assert!(s.get("ulimits").is_none(), "{name}");
    }
    let qdrant_start = strings(&qdrant["command"]).join(" ");
    let key_file = "/run/secrets/vector-tls-proxy/qdrant-api-key";
    // `$$` is compose's escape for the shell's `$`: docker-compose config keeps it.
    assert!(
        qdrant_start.contains(&format!(
            "export QDRANT__SERVICE__API_KEY=\"$$(cat {key_file})\""
        )),
        "{qdrant_start}"
    );
    let secrets_mounted_by: Vec<&String> = services
        .iter()
        .filter(|(_, s)| {
            s["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| v["source"] == "secrets")
        })
        .map(|(name, _)| name)
        .collect();
    assert_eq!(secrets_mounted_by, ["certs", "loadgen", "qdrant"]);
    assert!(
        strings(&services["certs"]["command"])
            .join(" ")
            .contains(&format!("> {key_file}")),
        "the certs one-shot does not generate the API key"
    );
}

/// The proxy publishes exactly its listeners and forwards to the qdrant service.
fn the_proxy_publishes_its_listeners(c: &Value) {
    let services = c["services"].as_object().expect("services");
    let published: Vec<u64> = services["proxy"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["target"].as_u64().unwrap())
        .collect();
    let config_text =
        std::fs::read_to_string(repo_root().join("deploy/compose/proxy.toml")).unwrap();
    let ports = listen_ports(&config_text);
    for upstream in toml::from_str::<toml::Value>(&config_text).unwrap()["listener"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["upstream"].as_str().unwrap())
    {
        assert!(
            upstream.starts_with("http://qdrant:"),
            "{upstream}: not the qdrant service"
        );
    }
    assert_eq!(published, [ports[0] as u64, ports[1] as u64]);
    assert_eq!(ports[2], 9900);
}

/// Everything else that publishes (Prometheus, Grafana: no authentication, or a default
/// password) does so on the host's loopback only.
fn the_rest_publishes_on_loopback_only(c: &Value) {
    let services = c["services"].as_object().expect("services");
    for (name, s) in services {
        if name == "proxy" {
            continue;
        }
        for p in s["ports"].as_array().into_iter().flatten() {
            // docker-compose keeps "IP:HOST:CONTAINER" as a string, the rest as objects.
            let host_ip = match p.as_str() {
                Some(short) => short.split(':').next().unwrap_or_default().to_owned(),
                None => p["host_ip"].as_str().unwrap_or_default().to_owned(),
            };
            assert_eq!(
                host_ip, "127.0.0.1",
                "{name} publishes {p} beyond the host's loopback"
            );
        }
    }
}

/// The proxy runs the mounted configuration, which checks out.
fn the_proxy_runs_its_checked_configuration(c: &Value) {
    let services = c["services"].as_object().expect("services");
    let config_text =
        std::fs::read_to_string(repo_root().join("deploy/compose/proxy.toml")).unwrap();
    let proxy = &services["proxy"];
    let command = strings(&proxy["command"]);
    assert_eq!(command[..2], ["run", "--config"]);
    assert_flags_exist(&command, &help("proxy", "run"), "proxy command");
    let volumes = proxy["volumes"].as_array().unwrap();
    let mounted = |target: &str| {
        volumes
            .iter()
            .find(|v| v["target"] == target)
            .unwrap_or_else(|| panic!("nothing mounted at {target}: {volumes:?}"))
    };
    let config_mount = mounted(&command[2]);
    assert!(
        config_mount["source"]
            .as_str()
            .unwrap()
            .ends_with("deploy/compose/proxy.toml"),
        "{config_mount}"
    );
    assert_eq!(mounted(CERT_DIR.trim_end_matches('/'))["source"], "certs");
    assert_config_checks(&config_text, "deploy/compose/proxy.toml");
}

/// The certificates come from our gen-certs, into the volume the proxy reads.
fn the_certificates_come_from_gen_certs(c: &Value) {
    let services = c["services"].as_object().expect("services");
    let certs_script = strings(&services["certs"]["command"]).join(" ");
    assert!(
        certs_script.contains("proxy gen-certs --out /etc/vector-tls-proxy/certs --san proxy"),
        "{certs_script}"
    );
    let gen_flags: Vec<String> = certs_script
        .split_whitespace()
        .skip_while(|w| *w != "gen-certs")
        .take_while(|w| *w != "&&")
        .map(str::to_owned)
        .collect();
    assert_flags_exist(&gen_flags, &help("proxy", "gen-certs"), "certs command");
}

/// loadgen: compare's flags, then every cell's run flags after `--`; the bench runs the
/// pipeline's first stage live beside ingestion in every cell.
fn loadgen_runs_compare_with_flags_it_has(c: &Value) {
    let services = c["services"].as_object().expect("services");
    let config_text =
        std::fs::read_to_string(repo_root().join("deploy/compose/proxy.toml")).unwrap();
    let ports = listen_ports(&config_text);
    let key_file = "/run/secrets/vector-tls-proxy/qdrant-api-key";
    let lg = strings(&services["loadgen"]["command"]);
    let split = lg
        .iter()
        .position(|a| a == "--")
        .expect("-- before run flags");
    assert_eq!(lg[0], "compare");
    assert_flags_exist(&lg[..split], &help("loadgen", "compare"), "loadgen compare");
    assert_flags_exist(
        &lg[split + 1..],
        &help("loadgen", "run"),
        "loadgen run flags",
    );
    let target = &lg[lg.iter().position(|a| a == "--target").unwrap() + 1];
    assert_eq!(
        target,
        &format!("proxy:{}", ports[1]),
        "loadgen's gRPC target"
    );
    assert_eq!(
        lg[lg
            .iter()
            .position(|a| a == "--api-key-file")
            .expect("loadgen sends the API key")
            + 1],
        key_file
    );
    let model = &lg[lg.iter().position(|a| a == "--embeddings-model").unwrap() + 1];
    assert!(
        strings(&services["ovms"]["command"]).contains(model),
        "loadgen asks OVMS for the model it serves"
    );
    assert_eq!(
        services["loadgen"]["profiles"],
        serde_json::json!(["bench"])
    );
    // The bench runs the pipeline's first stage live beside ingestion in every cell.
    let concurrency = lg
        .iter()
        .position(|a| a == "--embed-concurrency")
        .map(|i| lg[i + 1].as_str());
    assert!(
        concurrency.is_some_and(|n| n.parse::<usize>().is_ok_and(|n| n >= 1)),
        "loadgen runs OVMS live beside ingestion: {lg:?}"
    );
}

/// Every file mounted from the repository exists; Prometheus' configuration loads with
/// the shipped rules and scrapes the proxy's admin port.
fn mounted_files_exist_and_prometheus_loads(c: &Value) {
    let services = c["services"].as_object().expect("services");
    for (name, s) in services {
        for v in s["volumes"].as_array().into_iter().flatten() {
            if v["type"] == "bind" {
                let source = v["source"].as_str().unwrap();
                if source.starts_with(repo_root().to_str().unwrap())
                    && !source.ends_with("/results")
                {
                    assert!(Path::new(source).exists(), "{name}: {source} missing");
                }
            }
        }
    }
    let prom = std::fs::read_to_string(repo_root().join("deploy/compose/prometheus.yml")).unwrap();
    assert!(prom.contains("\"proxy:9900\""), "{prom}");
    let dir = temp_dir("deploy-prom");
    std::fs::copy(
        repo_root().join("deploy/prometheus/vector-tls-proxy.rules.yml"),
        dir.join("vector-tls-proxy.rules.yml"),
    )
    .unwrap();
    let (cert, _) = server_cert(CertAlgorithmName::EcdsaP256);
    let local = prom
        .replace(
            "/etc/prometheus/vector-tls-proxy.rules.yml",
            dir.join("vector-tls-proxy.rules.yml").to_str().unwrap(),
        )
        .replace("/etc/vector-tls-proxy/certs/ca.crt", cert.to_str().unwrap());
    std::fs::write(dir.join("prometheus.yml"), local).unwrap();
    let out = Command::new(system_tool("promtool"))
        .args(["check", "config"])
        .arg(dir.join("prometheus.yml"))
        .output()
        .expect("promtool");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
