//! What the deployments ship, checked without a container engine or a cluster, against
//! our binaries: the proxy configurations they ship pass `proxy check-config`, every flag
//! they pass exists, the ports they publish are the ports the configurations listen on.
//! Here: the helpers the checks share, the systemd deployment and the prebuilt images; the
//! compose file in `compose_file` (as PyPI's docker-compose 1.29 resolves it), the
//! Kubernetes variants in `kubernetes` (against the schemas of a pinned Kubernetes version,
//! PyPI's kubernetes-validate). `.ci/run` installs the two Python tools.

use std::path::PathBuf;
use std::process::Command;

use e2e::*;
use proxy::crypto::CertAlgorithmName;
use serde_json::Value;

/// Where every variant mounts the certificates.
pub(crate) const CERT_DIR: &str = "/etc/vector-tls-proxy/certs/";

/// The virtualenv of a validator (`compose` or `k8s`), installed once on first use.
pub(crate) fn validator_python(which: &str) -> PathBuf {
    installed(
        "tests/deploy/install-validators.sh",
        "DEPLOY_VALIDATORS",
        "validators",
    )
    .join(which)
    .join("bin/python")
}

pub(crate) fn render(args: &[&str]) -> Value {
    let venv = if args[0] == "compose" {
        "compose"
    } else {
        "k8s"
    };
    let out = Command::new(validator_python(venv))
        .arg(repo_root().join("tests/deploy/render.py"))
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

pub(crate) fn help(binary: &str, subcommand: &str) -> String {
    let out = Command::new(e2e::binary(binary))
        .args([subcommand, "--help"])
        .output()
        .expect("help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every `--flag` of `args` is one `help` lists.
pub(crate) fn assert_flags_exist(args: &[String], help: &str, what: &str) {
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
pub(crate) fn assert_config_checks(toml: &str, what: &str) {
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
pub(crate) fn listen_ports(toml: &str) -> Vec<u16> {
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

/// `v` with every string's runs of white space folded into one space.
pub(crate) fn fold_whitespace(v: &Value) -> Value {
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

/// A JSON array of strings as strings (none for anything else).
pub(crate) fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

/// The Secret and key every Kubernetes variant keeps Qdrant's API key in.
pub(crate) const QDRANT_API_KEY_SECRET: (&str, &str) = ("qdrant-api-key", "api-key");

/// The Secret and key that `container`'s environment variable `name` comes from.
pub(crate) fn env_secret<'a>(container: &'a Value, name: &str) -> Option<(&'a str, &'a str)> {
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
        std::fs::read_to_string(repo_root().join(path))
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
    let config_text = std::fs::read_to_string(repo_root().join("config/proxy.toml")).unwrap();
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
    assert!(exec("ExecStart").ends_with(&format!(
        "run --config {config_path} --ready-file /run/vector-tls-proxy/ready.json"
    )));
    // The in-place upgrade: systemd follows the new process's MAINPID=, and the ready file
    // `proxy upgrade` reads lives in the unit's runtime directory.
    assert_eq!(exec("Type"), "notify");
    assert_eq!(exec("NotifyAccess"), "all");
    assert_eq!(exec("RuntimeDirectory"), "vector-tls-proxy");
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
        let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
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
