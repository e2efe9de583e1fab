//! deploy/compose and deploy/kubernetes, checked without a container engine or a cluster:
//! the compose file as docker-compose resolves it (PyPI's docker-compose 1.29, `config`),
//! every Kubernetes manifest of every variant against the schemas of a pinned Kubernetes
//! version (PyPI's kubernetes-validate), and both against our binaries: the proxy
//! configurations they ship pass `proxy check-config`, every flag they pass exists, the
//! ports they publish are the ports the configurations listen on. `.ci/run` installs the
//! two Python tools.

use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::*;
use proxy::crypto::CertAlgorithmName;
use serde_json::Value;

/// The Kubernetes version whose schemas the manifests are validated against.
const KUBERNETES_VERSION: &str = "1.31.0";
/// Where every variant mounts the certificates.
const CERT_DIR: &str = "/etc/vector-tls-proxy/certs/";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned()
}

/// The virtualenv of a validator (`compose` or `k8s`), installed once on first use.
fn validator_python(which: &str) -> PathBuf {
    installed(
        "tests/deploy/install-validators.sh",
        "DEPLOY_VALIDATORS",
        "validators",
    )
    .join(which)
    .join("bin/python")
}

fn render(args: &[&str]) -> Value {
    let venv = if args[0] == "compose" {
        "compose"
    } else {
        "k8s"
    };
    let out = Command::new(validator_python(venv))
        .arg(repo().join("tests/deploy/render.py"))
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "render.py {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("render.py prints JSON")
}

fn help(binary: &str, subcommand: &str) -> String {
    let out = Command::new(e2e::binary(binary))
        .args([subcommand, "--help"])
        .output()
        .expect("help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every `--flag` of `args` is one `help` lists.
fn assert_flags_exist(args: &[String], help: &str, what: &str) {
    for a in args.iter().filter(|a| a.starts_with("--") && a.len() > 2) {
        let flag = a.split('=').next().unwrap();
        assert!(
            help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
            "{what}: {flag} is not a flag of ours:\n{help}"
        );
    }
}

/// A proxy configuration as shipped, with the certificate folder pointed at test files of
/// the names the deployment provides (gen-certs' names, cert-manager's tls.crt/tls.key);
/// it must pass `proxy check-config`.
fn assert_config_checks(toml: &str, what: &str) {
    let dir = temp_dir("deploy-certs");
    let (cert, key) = server_cert(CertAlgorithmName::EcdsaP256);
    for (src, names) in [
        (&cert, ["ecdsa-p256.crt", "tls.crt"]),
        (&key, ["ecdsa-p256.key", "tls.key"]),
    ] {
        for name in names {
            std::fs::copy(src, dir.join(name)).unwrap();
        }
    }
    std::fs::write(dir.join("admin.token"), "0123456789abcdef0123456789abcdef").unwrap();
    // The CA that an https:// upstream's certificate chains to (the deployment overlay).
    std::fs::copy(&certs().ca_cert, dir.join("qdrant-ca.crt")).unwrap();
    let local = toml.replace(CERT_DIR, &format!("{}/", dir.display()));
    let file = dir.join("proxy.toml");
    std::fs::write(&file, local).unwrap();
    let (status, text) = run_proxy_to_exit(&["check-config", file.to_str().unwrap()]);
    assert!(status.success(), "{what}: proxy check-config: {text}");
}

/// The ports a proxy configuration's listeners and admin port listen on.
fn listen_ports(toml: &str) -> Vec<u16> {
    let v: toml::Value = toml::from_str(toml).expect("TOML");
    let port = |s: &str| s.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let mut ports: Vec<u16> = v["listener"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| port(l["listen"].as_str().unwrap()))
        .collect();
    ports.push(port(v["admin"]["listen"].as_str().unwrap()));
    ports
}

/// Some NetworkPolicy selects the Qdrant pods, and every ingress rule that opens Qdrant's
/// plaintext ports (6333, 6334) admits only pods with the proxy Deployment's labels
/// (`proxy_labels`): no other pod can go around TLS. In the sidecar variant
/// (`proxy_labels` None) no rule opens them at all: the pod's own proxy reaches them over
/// loopback.
fn assert_qdrant_reachable_through_the_proxy_only(
    list: &[Value],
    proxy_labels: Option<&Value>,
    variant: &str,
) {
    let policies: Vec<&Value> = list
        .iter()
        .filter(|r| {
            r["kind"] == "NetworkPolicy"
                && r["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "qdrant"
        })
        .collect();
    assert!(
        !policies.is_empty(),
        "{variant}: no NetworkPolicy guards Qdrant"
    );
    for rule in policies
        .iter()
        .flat_map(|p| p["spec"]["ingress"].as_array().unwrap())
    {
        // A rule without ports opens every port.
        let opens_plaintext = rule["ports"]
            .as_array()
            .is_none_or(|ports| ports.iter().any(|p| p["port"] == 6333 || p["port"] == 6334));
        if !opens_plaintext {
            continue;
        }
        let proxy_labels = proxy_labels
            .unwrap_or_else(|| panic!("{variant}: Qdrant's plaintext ports opened: {rule}"));
        let from = rule["from"].as_array().unwrap_or_else(|| {
            panic!("{variant}: Qdrant's plaintext ports open to every pod: {rule}")
        });
        for peer in from {
            let wanted = peer["podSelector"]["matchLabels"].as_object();
            assert!(
                wanted
                    .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| proxy_labels[k] == *v))
                    && peer["namespaceSelector"].is_null()
                    && peer["ipBlock"].is_null(),
                "{variant}: Qdrant's plaintext ports open to more than the proxy's pods: {rule}"
            );
        }
    }
}

/// The monitoring overlay (deploy/kubernetes/monitoring) scrapes `metrics`, a variant's
/// metrics Service, under the job its rules select on: the ServiceMonitor selects the
/// Service and its port, and its `jobLabel` names a label of the Service whose value is
/// the `job` of every selector in the rules. Without that, the "proxy down" alert and the
/// recording rules would never match on Kubernetes.
fn assert_monitoring_matches(metrics: &Value, variant: &str) {
    let monitoring = render(&[
        "kustomize",
        repo()
            .join("deploy/kubernetes/monitoring")
            .to_str()
            .unwrap(),
    ]);
    let list = monitoring.as_array().unwrap();
    let find = |kind: &str| {
        list.iter()
            .find(|r| r["kind"] == kind && r["metadata"]["name"] == "vector-tls-proxy")
            .unwrap_or_else(|| panic!("monitoring: no {kind}/vector-tls-proxy"))
    };
    // kube-prometheus-stack selects both by its release label, set once in the
    // kustomization.
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        assert_eq!(
            find(kind)["metadata"]["labels"]["release"],
            "kube-prometheus-stack",
            "{kind} lacks the label a default kube-prometheus-stack selects"
        );
    }
    let monitor = &find("ServiceMonitor")["spec"];
    let labels = metrics["metadata"]["labels"].as_object().unwrap();
    for (k, v) in monitor["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            labels.get(k),
            Some(v),
            "{variant}: the ServiceMonitor does not select the metrics Service"
        );
    }
    assert_eq!(
        monitor["endpoints"][0]["port"],
        metrics["spec"]["ports"][0]["name"]
    );
    let job_label = monitor["jobLabel"]
        .as_str()
        .expect("the ServiceMonitor sets jobLabel");
    let job = labels[job_label]
        .as_str()
        .unwrap_or_else(|| panic!("{variant}: the metrics Service has no {job_label} label"));
    // The rules file, read by the same YAML parser, is the PrometheusRule's content.
    let rules_file = repo().join("deploy/prometheus/vector-tls-proxy.rules.yml");
    let out = Command::new(validator_python("k8s"))
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
        ])
        .arg(&rules_file)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rules: Value = serde_json::from_slice(&out.stdout).unwrap();
    let groups = &find("PrometheusRule")["spec"]["groups"];
    // kustomize re-emits block scalars with blank lines of its own: compare the PromQL and
    // the texts with their white space folded.
    assert_eq!(
        fold_whitespace(groups),
        fold_whitespace(&rules["groups"]),
        "prometheusrule.yaml differs from deploy/prometheus/vector-tls-proxy.rules.yml"
    );
    let text = groups.to_string();
    let selected: Vec<&str> = text
        .split("job=\\\"")
        .skip(1)
        .map(|rest| rest.split("\\\"").next().unwrap())
        .collect();
    assert!(!selected.is_empty(), "the rules select no job: {text}");
    assert!(
        selected.iter().all(|j| *j == job),
        "{variant}: the rules select job {selected:?}, the ServiceMonitor makes it {job:?}"
    );
    // promtool reads the PrometheusRule's groups as a rules file (JSON is YAML).
    let dir = temp_dir("deploy-prometheusrule");
    let file = dir.join("groups.yml");
    std::fs::write(&file, serde_json::json!({"groups": groups}).to_string()).unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool");
    assert!(
        out.status.success(),
        "promtool check rules on the PrometheusRule: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `v` with every string's runs of white space folded into one space.
fn fold_whitespace(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(s.split_whitespace().collect::<Vec<_>>().join(" ")),
        Value::Array(a) => Value::Array(a.iter().map(fold_whitespace).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), fold_whitespace(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

#[test]
fn compose_file_is_valid_and_agrees_with_the_binaries() {
    let compose = repo().join("deploy/compose/compose.yaml");
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
    // Every image pinned by version.
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
    // Qdrant's own ports stay inside; the proxy publishes exactly its listeners.
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
    let published: Vec<u64> = services["proxy"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["target"].as_u64().unwrap())
        .collect();
    let config_text = std::fs::read_to_string(repo().join("deploy/compose/proxy.toml")).unwrap();
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
    // Everything else that publishes (Prometheus, Grafana: no authentication, or a default
    // password) does so on the host's loopback only.
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

    // The proxy runs the mounted configuration, which checks out.
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

    // The certificates come from our gen-certs, into the volume the proxy reads.
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

    // loadgen: compare's flags, then every cell's run flags after `--`.
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

    // Every file mounted from the repository exists; Prometheus' configuration loads with
    // the shipped rules and scrapes the proxy's admin port.
    for (name, s) in services {
        for v in s["volumes"].as_array().into_iter().flatten() {
            if v["type"] == "bind" {
                let source = v["source"].as_str().unwrap();
                if source.starts_with(repo().to_str().unwrap()) && !source.ends_with("/results") {
                    assert!(Path::new(source).exists(), "{name}: {source} missing");
                }
            }
        }
    }
    let prom = std::fs::read_to_string(repo().join("deploy/compose/prometheus.yml")).unwrap();
    assert!(prom.contains("\"proxy:9900\""), "{prom}");
    let dir = temp_dir("deploy-prom");
    std::fs::copy(
        repo().join("deploy/prometheus/vector-tls-proxy.rules.yml"),
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
    let out = Command::new("promtool")
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

#[test]
fn kubernetes_manifests_validate_and_agree_with_the_binaries() {
    let k8s = repo().join("deploy/kubernetes");
    let dirs: Vec<String> = [
        "overlays/deployment",
        "overlays/sidecar",
        "overlays/qat",
        "loadgen",
        "monitoring",
    ]
    .iter()
    .map(|d| k8s.join(d).display().to_string())
    .collect();
    let mut validate_args = vec!["validate", KUBERNETES_VERSION];
    validate_args.extend(dirs.iter().map(String::as_str));
    let report = render(&validate_args);
    let mut valid = 0;
    for r in report.as_array().unwrap() {
        match r["outcome"].as_str().unwrap() {
            "valid" => valid += 1,
            "no schema" => assert!(
                ["ServiceMonitor/", "PrometheusRule/"]
                    .iter()
                    .any(|k| r["resource"].as_str().unwrap().contains(k)),
                "only the Prometheus Operator's CRDs lack a bundled schema: {r}"
            ),
            _ => panic!("invalid against Kubernetes {KUBERNETES_VERSION}: {r}"),
        }
    }
    eprintln!("kubernetes {KUBERNETES_VERSION}: {valid} resources valid\n{report:#}");
    assert!(valid >= 25, "{valid} resources validated");

    let run_help = help("proxy", "run");
    let loadgen_help = help("loadgen", "run");
    for (variant, dir) in ["deployment", "sidecar", "qat"].iter().zip(&dirs) {
        let resources = render(&["kustomize", dir]);
        let list = resources.as_array().unwrap();
        let find = |kind: &str, name: &str| {
            list.iter()
                .find(|r| r["kind"] == kind && r["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("{variant}: no {kind}/{name}"))
        };
        // Qdrant: three peers in cluster mode, behind a disruption budget, refusing every
        // request without the API key of the Secret the operator creates.
        let qdrant = find("StatefulSet", "qdrant");
        assert_eq!(qdrant["spec"]["replicas"], 3);
        find("PodDisruptionBudget", "qdrant");
        let qdrant_container = qdrant["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "qdrant")
            .unwrap_or_else(|| panic!("{variant}: no qdrant container"));
        assert_eq!(
            env_secret(qdrant_container, "QDRANT__SERVICE__API_KEY"),
            Some(QDRANT_API_KEY_SECRET),
            "{variant}: Qdrant without the API key"
        );
        // Every object carries Kubernetes' recommended labels; every pod runs under the
        // runtime's default seccomp profile; Qdrant's peers and the proxy's replicas
        // spread over nodes; Qdrant is the release the tested clients speak.
        for r in list {
            let labels = &r["metadata"]["labels"];
            assert_eq!(
                labels["app.kubernetes.io/part-of"], "vector-tls-proxy",
                "{variant}: {}",
                r["metadata"]["name"]
            );
            assert_eq!(
                labels["app.kubernetes.io/managed-by"], "kustomize",
                "{variant}: {}",
                r["metadata"]["name"]
            );
            if let Some(pod) = r["spec"]["template"]["spec"].as_object() {
                assert_eq!(
                    pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
                    "{variant}: {} without a seccomp profile",
                    r["metadata"]["name"]
                );
                if r["kind"] != "Job" {
                    assert!(
                        pod.get("topologySpreadConstraints").is_some(),
                        "{variant}: {} does not spread",
                        r["metadata"]["name"]
                    );
                }
            }
        }
        assert!(qdrant_container["image"]
            .as_str()
            .unwrap()
            .ends_with(":v1.20.0"));
        // The proxy container: where it runs depends on the variant.
        let pod = if *variant == "sidecar" {
            &qdrant["spec"]["template"]["spec"]
        } else {
            &find("Deployment", "vector-tls-proxy")["spec"]["template"]["spec"]
        };
        let container = pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "proxy")
            .unwrap_or_else(|| panic!("{variant}: no proxy container"));
        let args = strings(&container["args"]);
        assert_eq!(
            args[..3],
            ["run", "--config", "/etc/vector-tls-proxy/config/proxy.toml"]
        );
        // The configuration: the whole ConfigMap mounted (a subPath mount never sees an
        // update), under a name kustomize derives from its content, so that an edit
        // rolls the pods.
        let mounts = container["volumeMounts"].as_array().unwrap();
        assert!(
            mounts.iter().all(|m| m["subPath"].is_null()),
            "{variant}: a subPath mount: {mounts:?}"
        );
        let config_mount = mounts
            .iter()
            .find(|m| m["mountPath"] == "/etc/vector-tls-proxy/config")
            .unwrap_or_else(|| panic!("{variant}: no configuration mount"));
        let config_volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == config_mount["name"])
            .unwrap();
        let config_map = config_volume["configMap"]["name"].as_str().unwrap();
        let hash = config_map
            .strip_prefix("vector-tls-proxy-")
            .unwrap_or_else(|| panic!("{variant}: ConfigMap {config_map} has no content hash"));
        assert!(
            hash.len() >= 8 && hash.chars().all(|c| c.is_ascii_alphanumeric()),
            "{variant}: ConfigMap {config_map} has no content hash"
        );
        let config = find("ConfigMap", config_map)["data"]["proxy.toml"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_config_checks(&config, &format!("{variant} ConfigMap"));
        let ports = listen_ports(&config);
        let parsed: toml::Value = toml::from_str(&config).expect("proxy.toml");
        // `upstream` is one URL or a list of them.
        let upstreams: Vec<String> = parsed["listener"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|l| match &l["upstream"] {
                toml::Value::Array(nodes) => nodes.clone(),
                one => vec![one.clone()],
            })
            .map(|u| u.as_str().unwrap().to_owned())
            .collect();
        if *variant == "sidecar" {
            // Beside its own Qdrant: loopback only.
            assert!(
                upstreams.iter().all(|u| u.starts_with("http://127.0.0.1:")),
                "{variant}: {upstreams:?}"
            );
        } else {
            // Across nodes: TLS to Qdrant, verified against the CA of Qdrant's Secret,
            // which the certificate volume projects where the configuration reads it.
            assert!(
                upstreams.iter().all(|u| u.starts_with("https://")),
                "{variant}: plaintext across nodes: {upstreams:?}"
            );
            let env = strings(
                &qdrant_container["env"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|e| e["value"] == "true")
                    .map(|e| e["name"].clone())
                    .collect::<Value>(),
            );
            for key in [
                "QDRANT__SERVICE__ENABLE_TLS",
                "QDRANT__CLUSTER__P2P__ENABLE_TLS",
            ] {
                assert!(
                    env.iter().any(|e| e == key),
                    "{variant}: Qdrant without {key}"
                );
            }
            for l in parsed["listener"].as_array().unwrap() {
                let ca = l["upstream_tls"]["ca"].as_str().unwrap();
                let file = ca
                    .strip_prefix(CERT_DIR)
                    .expect("the CA among the certificates");
                let certs_volume = pod["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|v| v["name"] == "certs")
                    .unwrap();
                assert!(
                    certs_volume["projected"]["sources"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|s| s["secret"]["name"] == "qdrant-tls"
                            && s["secret"]["items"][0]["path"] == file),
                    "{variant}: {ca} is not projected from qdrant-tls: {certs_volume}"
                );
            }
        }
        assert_flags_exist(&args, &run_help, variant);
        let container_ports: Vec<u64> = container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["containerPort"].as_u64().unwrap())
            .collect();
        assert_eq!(
            container_ports,
            ports.iter().map(|p| *p as u64).collect::<Vec<_>>(),
            "{variant}: container ports are the configuration's"
        );
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
        // A rollout drops nothing: after SIGTERM the proxy keeps accepting (not ready)
        // for accept_grace, at least two readiness periods so the endpoint is removed
        // first, then drains for shutdown_grace; the pod's termination grace covers both.
        let limits: toml::Value = toml::from_str(&config).expect("proxy.toml");
        let secs = |key: &str, default: f64| {
            limits
                .get("limits")
                .and_then(|l| l.get(key))
                .and_then(|v| v.as_str())
                .map_or(default, |d| {
                    humantime::parse_duration(d).unwrap().as_secs_f64()
                })
        };
        let (accept, drain) = (secs("accept_grace", 0.0), secs("shutdown_grace", 30.0));
        let termination = pod["terminationGracePeriodSeconds"]
            .as_f64()
            .unwrap_or(30.0);
        assert!(
            termination >= accept + drain,
            "{variant}: terminationGracePeriodSeconds {termination} < accept_grace {accept} + shutdown_grace {drain}"
        );
        if *variant != "sidecar" {
            let period = container["readinessProbe"]["periodSeconds"]
                .as_f64()
                .unwrap_or(10.0);
            assert!(
                accept >= 2.0 * period,
                "{variant}: accept_grace {accept} s is under two readiness periods ({period} s)"
            );
        }
        assert!(
            mounts
                .iter()
                .any(|m| m["mountPath"] == CERT_DIR.trim_end_matches('/')),
            "{variant}: certificates not mounted where the configuration reads them"
        );
        assert!(
            !container["resources"]["requests"].is_null(),
            "{variant}: no resource requests"
        );
        if *variant == "qat" {
            assert!(args.windows(2).any(|w| w == ["--provider", "openssl-qat"]));
            assert_eq!(
                container["resources"]["limits"]["qat.intel.com/cy"], "1",
                "the QAT device plugin's resource"
            );
        }
        // Base and variants apply on a cluster without the Prometheus Operator.
        assert!(
            list.iter().all(|r| !r["apiVersion"]
                .as_str()
                .unwrap_or("")
                .starts_with("monitoring.coreos.com")),
            "{variant}: a Prometheus Operator resource outside deploy/kubernetes/monitoring"
        );
        let metrics = find("Service", "vector-tls-proxy-metrics");
        assert_eq!(metrics["spec"]["ports"][0]["name"], "admin");
        assert_monitoring_matches(metrics, variant);
        let proxy_labels = (*variant != "sidecar").then(|| {
            &find("Deployment", "vector-tls-proxy")["spec"]["template"]["metadata"]["labels"]
        });
        assert_qdrant_reachable_through_the_proxy_only(list, proxy_labels, variant);
        if *variant != "sidecar" {
            find("PodDisruptionBudget", "vector-tls-proxy");
        }
    }
    let job = render(&["kustomize", &dirs[3]]);
    let job = job
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "Job")
        .expect("loadgen Job");
    assert_eq!(job["spec"]["completionMode"], "Indexed");
    let args = strings(&job["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert_eq!(args[0], "run");
    assert_flags_exist(&args, &loadgen_help, "loadgen Job");
    assert!(args.iter().any(|a| a == "--start-at"));
    assert_eq!(
        env_secret(
            &job["spec"]["template"]["spec"]["containers"][0],
            "LOADGEN_API_KEY"
        ),
        Some(QDRANT_API_KEY_SECRET),
        "loadgen Job without Qdrant's API key"
    );
}

/// The Secret and key that hold Qdrant's API key on Kubernetes.
const QDRANT_API_KEY_SECRET: (&str, &str) = ("qdrant-api-key", "api-key");

/// The Secret and key that `container`'s environment variable `name` comes from.
fn env_secret<'a>(container: &'a Value, name: &str) -> Option<(&'a str, &'a str)> {
    let var = container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?;
    let r = &var["valueFrom"]["secretKeyRef"];
    Some((r["name"].as_str()?, r["key"].as_str()?))
}

/// The systemd deployment on one host: Qdrant (through the shipped drop-in) listens in
/// plaintext on loopback only, on exactly the ports the example configuration forwards
/// to, with an API key from a root-only environment file; the proxy's unit checks that
/// configuration before it runs it.
#[test]
fn systemd_keeps_qdrant_on_loopback_behind_a_key() {
    let unit_settings = |path: &str| -> Vec<(String, String)> {
        std::fs::read_to_string(repo().join(path))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with('['))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect()
    };
    let drop_in = unit_settings("deploy/systemd/qdrant.service.d/vector-tls-proxy.conf");
    let env: Vec<(&str, &str)> = drop_in
        .iter()
        .filter(|(k, _)| k == "Environment")
        .filter_map(|(_, v)| v.split_once('='))
        .collect();
    let get = |name: &str| {
        env.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("the drop-in sets no {name}"))
    };
    assert_eq!(get("QDRANT__SERVICE__HOST"), "127.0.0.1");
    assert!(
        drop_in
            .iter()
            .any(|(k, v)| k == "EnvironmentFile" && v == "/etc/qdrant/api-key.env"),
        "the drop-in gives Qdrant no API key: {drop_in:?}"
    );
    let config_text = std::fs::read_to_string(repo().join("config/proxy.toml")).unwrap();
    let config: toml::Value = toml::from_str(&config_text).unwrap();
    let upstreams: Vec<&str> = config["listener"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["upstream"].as_str().unwrap())
        .collect();
    assert_eq!(
        upstreams,
        [
            format!("http://127.0.0.1:{}", get("QDRANT__SERVICE__HTTP_PORT")),
            format!("http://127.0.0.1:{}", get("QDRANT__SERVICE__GRPC_PORT")),
        ],
        "config/proxy.toml forwards where the drop-in puts Qdrant"
    );
    assert_config_checks(&config_text, "config/proxy.toml");
    // The unit shipped for Qdrant's own packages (which have none) puts Qdrant exactly
    // where the drop-in does.
    let qdrant_unit = unit_settings("deploy/systemd/qdrant.service");
    for setting in drop_in.iter().filter(|(k, _)| k.starts_with("Environment")) {
        assert!(
            qdrant_unit.contains(setting),
            "deploy/systemd/qdrant.service lacks {setting:?}"
        );
    }
    let unit = unit_settings("deploy/systemd/vector-tls-proxy.service");
    let exec = |key: &str| {
        unit.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("the unit has no {key}"))
    };
    let config_path = "/etc/vector-tls-proxy/proxy.toml";
    assert!(exec("ExecStartPre").ends_with(&format!("check-config {config_path}")));
    // A reload checks the file before the SIGHUP (the first ExecReload= line).
    assert!(exec("ExecReload").ends_with(&format!("check-config {config_path}")));
    assert!(exec("ExecStart").ends_with(&format!("run --config {config_path}")));
    assert!(exec("After").contains("qdrant.service"));
}

/// The images built without a registry (Containerfile.prebuilt, what every container test
/// runs) end as the images built from source do (Containerfile): for each target, the
/// same labels, user, ports, health check, entry point and command, and the same files.
#[test]
fn prebuilt_images_end_as_the_source_built_ones() {
    // The instructions of stage `target`, continuation lines joined, COPY sources dropped
    // (one copies from a build stage, the other from the context).
    let stage = |file: &str, target: &str| -> Vec<String> {
        let text = std::fs::read_to_string(repo().join(file)).unwrap();
        let joined = text.replace("\\\n", " ");
        let mut lines = joined.lines().map(str::trim);
        let header = lines
            .by_ref()
            .find(|l| l.starts_with("FROM ") && l.ends_with(&format!(" AS {target}")))
            .unwrap_or_else(|| panic!("{file}: no stage {target}"));
        assert!(header.starts_with("FROM "));
        lines
            .take_while(|l| !l.starts_with("FROM "))
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let l = l.split_whitespace().collect::<Vec<_>>().join(" ");
                match l.strip_prefix("COPY ") {
                    Some(rest) => format!("COPY -> {}", rest.rsplit(' ').next().unwrap()),
                    None => l,
                }
            })
            .collect()
    };
    for target in ["proxy", "tools"] {
        let source = stage("deploy/container/Containerfile", target);
        let prebuilt = stage("deploy/container/Containerfile.prebuilt", target);
        assert_eq!(source, prebuilt, "target {target}");
        assert!(source.len() >= 5, "{target}: {source:?}");
        assert!(
            source.iter().any(|l| l.starts_with("USER 10001")),
            "{target}: {source:?}"
        );
    }
}
