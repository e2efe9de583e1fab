//! Every Kubernetes manifest of every variant, rendered by real kustomize, against the
//! schemas of a pinned Kubernetes version (PyPI's kubernetes-validate) and against our
//! binaries.

use std::process::Command;

use e2e::*;
use serde_json::Value;

use super::manifests::*;

/// The Kubernetes version whose schemas the manifests are validated against.
const KUBERNETES_VERSION: &str = "1.31.0";

#[test]
fn kubernetes_manifests_validate_and_agree_with_the_binaries() {
    let k8s = repo_root().join("deploy/kubernetes");
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
        let v = Variant {
            name: variant,
            list: resources.as_array().unwrap(),
        };
        v.agrees_with_the_binaries(&run_help);
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

/// One variant's rendered resources.
struct Variant<'a> {
    name: &'a str,
    list: &'a [Value],
}

impl<'a> Variant<'a> {
    /// The resource of `kind` named `name`; the variant must have it.
    fn find(&self, kind: &str, name: &str) -> &'a Value {
        let variant = self.name;
        self.list
            .iter()
            .find(|r| r["kind"] == kind && r["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{variant}: no {kind}/{name}"))
    }

    /// Every check of the variant, in named steps.
    fn agrees_with_the_binaries(&self, run_help: &str) {
        let variant = self.name;
        let (qdrant, qdrant_container) = self.qdrant_peers_behind_a_key();
        self.objects_are_labelled_confined_and_spread();
        assert!(qdrant_container["image"]
            .as_str()
            .unwrap()
            .ends_with(":v1.20.0"));
        let (pod, container) = self.proxy_pod_and_container(qdrant);
        let args = strings(&container["args"]);
        assert_eq!(
            args[..3],
            ["run", "--config", "/etc/vector-tls-proxy/config/proxy.toml"]
        );
        let config = self.mounted_configuration(pod, container);
        let ports = listen_ports(&config);
        self.upstreams_are_loopback_or_verified_tls(&config, pod, qdrant_container);
        assert_flags_exist(&args, run_help, variant);
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
        self.a_rollout_drops_nothing(&config, pod, container, &args);
        self.monitoring_and_network_policy();
    }

    /// Qdrant: three peers in cluster mode, behind a disruption budget, refusing every
    /// request without the API key of the Secret the operator creates. The StatefulSet and
    /// its Qdrant container.
    fn qdrant_peers_behind_a_key(&self) -> (&'a Value, &'a Value) {
        let variant = self.name;
        let qdrant = self.find("StatefulSet", "qdrant");
        assert_eq!(qdrant["spec"]["replicas"], 3);
        self.find("PodDisruptionBudget", "qdrant");
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
        (qdrant, qdrant_container)
    }

    /// Every object carries Kubernetes' recommended labels; every pod runs under the
    /// runtime's default seccomp profile; Qdrant's peers and the proxy's replicas spread
    /// over nodes.
    fn objects_are_labelled_confined_and_spread(&self) {
        let (variant, list) = (self.name, self.list);
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
    }

    /// The pod the proxy runs in (beside Qdrant in the sidecar variant, its own Deployment
    /// otherwise) and its container.
    fn proxy_pod_and_container(&self, qdrant: &'a Value) -> (&'a Value, &'a Value) {
        let variant = self.name;
        let pod = if variant == "sidecar" {
            &qdrant["spec"]["template"]["spec"]
        } else {
            &self.find("Deployment", "vector-tls-proxy")["spec"]["template"]["spec"]
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
        (pod, container)
    }

    /// The configuration: the whole ConfigMap mounted (a subPath mount never sees an
    /// update), under a name kustomize derives from its content, so that an edit rolls the
    /// pods; it checks out.
    fn mounted_configuration(&self, pod: &Value, container: &Value) -> String {
        let variant = self.name;
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
        let config = self.find("ConfigMap", config_map)["data"]["proxy.toml"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_config_checks(&config, &format!("{variant} ConfigMap"));
        config
    }

    /// Beside its own Qdrant the proxy reaches it over loopback; across nodes over TLS,
    /// verified against the CA of Qdrant's Secret, which the certificate volume projects
    /// where the configuration reads it.
    fn upstreams_are_loopback_or_verified_tls(
        &self,
        config: &str,
        pod: &Value,
        qdrant_container: &Value,
    ) {
        let variant = self.name;
        let parsed: toml::Value = toml::from_str(config).expect("proxy.toml");
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
        if variant == "sidecar" {
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
    }

    /// A rollout drops nothing: after SIGTERM the proxy keeps accepting (not ready) for
    /// accept_grace, at least two readiness periods so the endpoint is removed first, then
    /// drains for shutdown_grace; the pod's termination grace covers both. Certificates
    /// mounted, resources requested, QAT's device asked for in its variant.
    fn a_rollout_drops_nothing(
        &self,
        config: &str,
        pod: &Value,
        container: &Value,
        args: &[String],
    ) {
        let variant = self.name;
        let mounts = container["volumeMounts"].as_array().unwrap();
        let limits: toml::Value = toml::from_str(config).expect("proxy.toml");
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
        if variant != "sidecar" {
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
        if variant == "qat" {
            assert!(args.windows(2).any(|w| w == ["--provider", "openssl-qat"]));
            assert_eq!(
                container["resources"]["limits"]["qat.intel.com/cy"], "1",
                "the QAT device plugin's resource"
            );
        }
    }

    /// Base and variants apply on a cluster without the Prometheus Operator; the metrics
    /// Service is what the monitoring overlay scrapes; only the proxy reaches Qdrant's
    /// plaintext ports.
    fn monitoring_and_network_policy(&self) {
        let (variant, list) = (self.name, self.list);
        assert!(
            list.iter().all(|r| !r["apiVersion"]
                .as_str()
                .unwrap_or("")
                .starts_with("monitoring.coreos.com")),
            "{variant}: a Prometheus Operator resource outside deploy/kubernetes/monitoring"
        );
        let metrics = self.find("Service", "vector-tls-proxy-metrics");
        assert_eq!(metrics["spec"]["ports"][0]["name"], "admin");
        assert_monitoring_matches(metrics, variant);
        let proxy_labels = (variant != "sidecar").then(|| {
            &self.find("Deployment", "vector-tls-proxy")["spec"]["template"]["metadata"]["labels"]
        });
        assert_qdrant_reachable_through_the_proxy_only(list, proxy_labels, variant);
        if variant != "sidecar" {
            self.find("PodDisruptionBudget", "vector-tls-proxy");
        }
    }
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
        repo_root()
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
    let rules_file = repo_root().join("deploy/prometheus/vector-tls-proxy.rules.yml");
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
    let out = Command::new(system_tool("promtool"))
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
