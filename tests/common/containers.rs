//! The container engine for the tests that start the shipped deployments for real: Docker
//! Engine and its Compose tool, images built on this machine (no registry is reachable),
//! and a compose project that is brought down with its volumes when its handle drops.
//!
//! Where no engine answers, a test says so and skips; with `VTP_REQUIRE_CONTAINERS=1`
//! (which `.ci/run` sets) that is a failure instead, so CI always runs them.

#[allow(unused_imports)]
use super::*;

/// The images the container tests run: the project's own (from the binaries this test
/// build made) and the stand-ins for images that cannot be pulled here.
#[derive(Clone, Debug)]
pub struct TestImages {
    /// The proxy alone (`proxy` target of deploy/container/Containerfile.prebuilt).
    pub proxy: String,
    /// loadgen and embedded-qdrant (`tools` target).
    pub tools: String,
    /// embedded-qdrant under Qdrant's image contract: `./entrypoint.sh` in /qdrant, the
    /// `QDRANT__SERVICE__*` variables, storage in /qdrant/storage (a test double for
    /// qdrant/qdrant, which cannot be pulled here).
    pub qdrant: String,
    /// Prometheus from Debian's package (for prom/prometheus).
    pub prometheus: String,
    /// HAProxy from Debian's package (for haproxy).
    pub haproxy: String,
    /// The local Debian base with systemd as PID 1.
    pub systemd_base: String,
}

/// Whether a container engine answers. If not: with `VTP_REQUIRE_CONTAINERS=1` the test
/// fails, else it prints why it skips and returns false.
pub fn containers_available(test: &str) -> bool {
    let info = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output();
    let why = match info {
        Ok(out) if out.status.success() => {
            // An engine without its Compose tool is a missing package, not a reason to skip.
            let compose = Command::new(system_tool("docker-compose"))
                .arg("version")
                .output();
            match compose {
                Ok(c) if c.status.success() => return true,
                Ok(c) => format!(
                    "docker-compose version failed: {}",
                    String::from_utf8_lossy(&c.stderr).trim()
                ),
                Err(e) => format!("docker-compose: {e}"),
            }
        }
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        Err(e) => format!("docker: {e}"),
    };
    if std::env::var("VTP_REQUIRE_CONTAINERS").as_deref() == Ok("1") {
        panic!("{test}: no container engine ({why}), and VTP_REQUIRE_CONTAINERS=1");
    }
    eprintln!("{test}: SKIPPED: no container engine ({why})");
    false
}

/// Runs `cmd`, failing the test with its output if it fails; its stdout.
pub fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds the images once per test process: the local bases, the project's images from
/// this build's binaries (deploy/container/build-images.sh), and the stand-ins.
pub fn test_images() -> &'static TestImages {
    static IMAGES: OnceLock<TestImages> = OnceLock::new();
    IMAGES.get_or_init(|| {
        let root = repo_root();
        // deploy/container/base-image.sh makes the Debian base with it.
        system_tool("debootstrap");
        let bin_dir = binary("proxy")
            .parent()
            .expect("the binaries' folder")
            .to_path_buf();
        let built = run_ok(
            Command::new(root.join("deploy/container/build-images.sh"))
                .args(["--bin-dir", bin_dir.to_str().expect("utf-8 path")])
                .args(["--tag", "test"]),
            "deploy/container/build-images.sh",
        );
        let names: Vec<&str> = built.lines().collect();
        assert_eq!(names.len(), 2, "build-images.sh printed {built}");
        let bases = run_ok(
            Command::new(root.join("deploy/container/base-image.sh")).arg("systemd"),
            "deploy/container/base-image.sh systemd",
        );
        let systemd_base = bases.lines().last().expect("the systemd base").to_owned();
        let base = bases.lines().next().expect("the base").to_owned();

        // The stand-ins, each from a Containerfile of tests/containers.
        let ctx = temp_dir("image-context");
        std::fs::copy(system_tool("prometheus"), ctx.join("prometheus"))
            .expect("copy prometheus into the image context");
        // HAProxy and the libraries it links (the base has libc and OpenSSL, not Lua and
        // the rest), as ldd resolves them on this Debian host.
        let haproxy = ctx.join("haproxy");
        std::fs::create_dir_all(haproxy.join("lib")).expect("haproxy/lib");
        let haproxy_bin = system_tool("haproxy");
        std::fs::copy(&haproxy_bin, haproxy.join("haproxy")).expect("copy haproxy");
        let libs = run_ok(Command::new("ldd").arg(&haproxy_bin), "ldd haproxy");
        for lib in libs.lines().filter_map(|l| l.split("=> ").nth(1)) {
            let path = lib.split(" (").next().unwrap_or_default().trim();
            if path.starts_with('/') {
                let name = Path::new(path).file_name().expect("a library's name");
                std::fs::copy(path, haproxy.join("lib").join(name)).expect("a library");
            }
        }
        let stand_in = |file: &str, tag: &str| {
            run_ok(
                Command::new("docker")
                    .args(["build", "-q", "-t", tag, "-f"])
                    .arg(root.join("tests/containers").join(file))
                    .args(["--build-arg", &format!("TOOLS_IMAGE={}", names[1])])
                    .args(["--build-arg", &format!("BASE_IMAGE={base}")])
                    .arg(&ctx),
                &format!("docker build {file}"),
            );
            tag.to_owned()
        };
        TestImages {
            proxy: names[0].to_owned(),
            tools: names[1].to_owned(),
            qdrant: stand_in("Containerfile.qdrant", "vector-tls-proxy-test/qdrant:test"),
            prometheus: stand_in(
                "Containerfile.prometheus",
                "vector-tls-proxy-test/prometheus:test",
            ),
            haproxy: stand_in(
                "Containerfile.haproxy",
                "vector-tls-proxy-test/haproxy:test",
            ),
            systemd_base,
        }
    })
}

/// The stand-in for OpenVINO Model Server's image (tests/containers/Containerfile.ovms): the
/// tests' real embedding model, served with OVMS's API and flags. Built once per test
/// process on the local base with Python; its OpenVINO wheels come from PyPI through the
/// installer's pip on the host.
pub fn ovms_stand_in_image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let root = repo_root();
        let install = embedder_install();
        let bases = run_ok(
            Command::new(root.join("deploy/container/base-image.sh")).arg("python"),
            "deploy/container/base-image.sh python",
        );
        let base = bases.lines().last().expect("the python base").to_owned();
        let ctx = temp_dir("ovms-context");
        let embedder = ctx.join("embedder");
        std::fs::create_dir_all(embedder.join("model")).expect("context");
        for file in ["requirements.txt", "server.py"] {
            std::fs::copy(root.join("tests/embedder").join(file), embedder.join(file))
                .expect("tests/embedder file");
        }
        for entry in std::fs::read_dir(&install.model_dir).expect("the converted model") {
            let path = entry.expect("model file").path();
            if path.is_file() {
                std::fs::copy(
                    &path,
                    embedder.join("model").join(path.file_name().unwrap()),
                )
                .expect("model file");
            }
        }
        // The wheels from the installer's pip (its cache has them): the build's own network
        // reaches Debian's mirror but not PyPI's TLS.
        run_ok(
            Command::new(install.python.with_file_name("pip"))
                .args(["download", "-q", "--only-binary=:all:", "-r"])
                .arg(embedder.join("requirements.txt"))
                .arg("-d")
                .arg(embedder.join("wheels")),
            "pip download (the OVMS stand-in's wheels)",
        );
        let tag = "vector-tls-proxy-test/ovms:test";
        run_ok(
            Command::new("docker")
                .args(["build", "-q", "-t", tag, "-f"])
                .arg(root.join("tests/containers/Containerfile.ovms"))
                .args(["--build-arg", &format!("BASE_IMAGE={base}")])
                .arg(&ctx),
            "docker build Containerfile.ovms",
        );
        tag.to_owned()
    })
}

/// A compose project started from the shipped file(s), brought down with its volumes and
/// orphans when dropped.
pub struct ComposeProject {
    /// The project name (`-p`): unique per test.
    pub name: String,
    dir: PathBuf,
    files: Vec<PathBuf>,
    env: Vec<(String, String)>,
}

impl ComposeProject {
    /// A project over `files` (the first names the project directory), with `env` for the
    /// file's variables.
    pub fn new(name: &str, files: &[PathBuf], env: &[(&str, String)]) -> Self {
        Self {
            name: format!("{name}-{}", std::process::id()),
            dir: files[0].parent().expect("compose dir").to_path_buf(),
            files: files.to_vec(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        }
    }

    /// `docker-compose -p NAME -f ... ARGS`, unchecked.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(system_tool("docker-compose"));
        cmd.current_dir(&self.dir)
            .args(["--ansi", "never", "-p", &self.name]);
        for f in &self.files {
            cmd.arg("-f").arg(f);
        }
        cmd.args(args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// `docker-compose ARGS`, which must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        run_ok(
            &mut self.command(args),
            &format!("docker-compose {}", args.join(" ")),
        )
    }

    /// The container id of `service`.
    pub fn container(&self, service: &str) -> String {
        self.ok(&["ps", "-q", service]).trim().to_owned()
    }

    /// The logs of every service, for a failure's message.
    pub fn logs(&self) -> String {
        let out = self
            .command(&["logs", "--no-color", "--tail", "60"])
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// What Docker still holds of this project: containers, volumes, networks.
    pub fn leftovers(&self) -> Vec<String> {
        let label = format!("label=com.docker.compose.project={}", self.name);
        let mut left = Vec::new();
        for (kind, args) in [
            ("container", vec!["ps", "-a", "-q", "--filter", &label]),
            ("volume", vec!["volume", "ls", "-q", "--filter", &label]),
            ("network", vec!["network", "ls", "-q", "--filter", &label]),
        ] {
            let out = Command::new("docker").args(&args).output().expect("docker");
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                left.push(format!("{kind} {id}"));
            }
        }
        left
    }

    /// `down -v --remove-orphans`, which must succeed and leave nothing behind.
    pub fn down(&self) {
        self.ok(&["down", "-v", "--remove-orphans", "-t", "10"]);
        let left = self.leftovers();
        assert!(left.is_empty(), "down -v left {left:?}");
    }
}

impl Drop for ComposeProject {
    fn drop(&mut self) {
        let _ = self
            .command(&["down", "-v", "--remove-orphans", "-t", "5"])
            .output();
    }
}

/// A TCP port on the host's loopback that was free a moment ago.
pub fn free_port() -> u16 {
    free_loopback_addr().port()
}

/// A container booted with systemd as PID 1 (the local systemd base), unprivileged: the
/// engine here refuses `--privileged`, and systemd needs only the cgroup tree and tmpfs
/// mounts. Removed when dropped.
pub struct SystemdContainer {
    /// The container's name.
    pub name: String,
}

impl SystemdContainer {
    /// Boots `image` with `mounts` (host path, container path; read-only) and waits until
    /// systemd has started its units.
    pub fn boot(image: &str, mounts: &[(&Path, &str)]) -> Self {
        // Unique per boot: two tests of one binary may each boot one at once.
        static BOOTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let boot = BOOTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("vtp-systemd-{}-{boot}", std::process::id());
        let _ = Command::new("docker").args(["rm", "-f", &name]).output();
        let mut cmd = Command::new("docker");
        cmd.args(["run", "-d", "--name", &name, "--stop-signal", "SIGRTMIN+3"])
            .args(["--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp"])
            .args(["-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro"]);
        for (host, inside) in mounts {
            cmd.arg("-v").arg(format!("{}:{inside}:ro", host.display()));
        }
        cmd.args([image, "/sbin/init"]);
        run_ok(&mut cmd, "docker run (systemd)");
        let booted = Self { name };
        eventually("systemd booted", WAIT, || {
            let state = booted.sh("systemctl is-system-running || true");
            ready(matches!(state.trim(), "running" | "degraded"), || state)
        });
        booted
    }

    /// Runs `script` with bash in the container (as root, in /root), unchecked: (exit code,
    /// stdout and stderr together).
    pub fn try_sh(&self, script: &str) -> (i32, String) {
        let out = Command::new("docker")
            .args(["exec", "-w", "/root", &self.name, "bash", "-c", script])
            .output()
            .expect("docker exec");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    }

    /// Runs `script`, which must succeed; its output.
    pub fn sh(&self, script: &str) -> String {
        let (code, text) = self.try_sh(script);
        assert_eq!(code, 0, "in the container: {script}\n{text}");
        text
    }
}

impl Drop for SystemdContainer {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v", &self.name])
            .output();
    }
}
