//! In-place upgrade, and the listening sockets a process is handed at start.
//!
//! SIGUSR2 (nginx's upgrade signal) starts the binary now at this process's path, with the
//! same arguments, and hands it every listening socket: the TLS listeners and the admin
//! port, as inherited descriptors named by listener (`VTP_UPGRADE_FDS`). The kernel keeps
//! queueing connections on them throughout, so none is refused. The new process adopts
//! each socket whose listener still has that name and address, binds the rest, loads
//! everything as any start-up does (configuration, certificates, providers, QAT), and says
//! it is ready over a pipe (`VTP_UPGRADE_READY_FD`) once it serves. Only then does this
//! process stop accepting and drain as on SIGTERM: HTTP/2 connections get GOAWAY and their
//! calls finish, HTTP/1.1 connections close after their response. If the new process
//! fails (it exits, its configuration or a certificate is bad, or it is not ready within
//! [`READY_LIMIT`]), this one keeps serving as if nothing happened, and says so in its log,
//! in `proxy_upgrades_total{outcome="failed"}` and in its ready file.
//!
//! Under systemd (`Type=notify`, `NotifyAccess=all`) every start sends `READY=1` with
//! `MAINPID=`, so after an upgrade systemd follows the new process as the service's main
//! one; socket activation (`LISTEN_FDS`, `LISTEN_FDNAMES`) is adopted like a handover.
//!
//! Why a re-executed binary and not a master process that keeps its pid (HAProxy's
//! master-worker): the proxy is one process with no state to keep across the upgrade, and
//! systemd's `MAINPID=` follows the new one; one process is one fewer thing to supervise.

// The descriptors handed over are adopted with `from_raw_fd`, and the child keeps them by
// clearing close-on-exec between fork and exec: both need unsafe, said why at each block.
#![allow(unsafe_code)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// The sockets a new process is handed: `[[listener name, descriptor], ...]` as JSON.
pub const FDS_ENV: &str = "VTP_UPGRADE_FDS";
/// The pipe a new process says it is ready on.
pub const READY_FD_ENV: &str = "VTP_UPGRADE_READY_FD";
/// The name the admin port's socket is handed over under.
pub const ADMIN: &str = "admin";
/// How long a new process may take to load and bind before the upgrade is given up: QAT
/// start-up and thousands of SNI certificates take seconds, not a minute.
pub const READY_LIMIT: Duration = Duration::from_secs(60);

/// A listening socket handed to this process, with the listener name it was served under
/// (socket activation without names has none).
struct Inherited {
    name: Option<String>,
    socket: std::net::TcpListener,
}

static INHERITED: Mutex<Vec<Inherited>> = Mutex::new(Vec::new());
/// What this process listens on: (listener name, descriptor, bound address).
static BOUND: Mutex<Vec<(String, RawFd, SocketAddr)>> = Mutex::new(Vec::new());
/// The write end of the pipe the previous process waits on.
static READY_PIPE: Mutex<Option<std::fs::File>> = Mutex::new(None);
/// The binary's path as this process was started (not /proc/self/exe, which names the old
/// file once a package replaced it).
static EXE: OnceLock<PathBuf> = OnceLock::new();

/// What [`adopt_from_environment`] found.
#[derive(Debug, Default)]
pub struct Adopted {
    /// Listening sockets taken over.
    pub sockets: usize,
    /// Whether a previous process waits for this one (an upgrade).
    pub upgrade: bool,
}

/// Called first in `proxy run`, before any other thread exists: takes the sockets and the
/// ready pipe handed over (an upgrade's, or systemd's socket activation), removes their
/// variables so this process's own children never see them, and remembers the binary's
/// path for a later upgrade.
pub fn adopt_from_environment() -> Result<Adopted, String> {
    let _ = EXE.set(binary_path());
    let mut adopted = Adopted::default();
    let mut handed: Vec<(Option<String>, RawFd)> = Vec::new();
    if let Ok(text) = std::env::var(FDS_ENV) {
        let list: Vec<(String, RawFd)> = serde_json::from_str(&text)
            .map_err(|e| format!("{FDS_ENV}={text:?} is not the handover's list: {e}"))?;
        handed.extend(list.into_iter().map(|(n, fd)| (Some(n), fd)));
    }
    // systemd's socket activation: descriptors from 3, for this pid only.
    let for_us = std::env::var("LISTEN_PID").ok() == Some(std::process::id().to_string());
    if let (true, Ok(n)) = (for_us, std::env::var("LISTEN_FDS")) {
        let n: RawFd = n.parse().map_err(|_| format!("LISTEN_FDS={n:?}"))?;
        let names = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
        let mut names = names.split(':');
        for fd in 3..3 + n {
            let name = names.next().filter(|n| !n.is_empty() && *n != "unknown");
            handed.push((name.map(str::to_owned), fd));
        }
    }
    let ready = std::env::var(READY_FD_ENV).ok();
    // Called before the runtime or any other thread starts (cli::run's first step), so no
    // thread reads the environment while it changes.
    for var in [
        FDS_ENV,
        READY_FD_ENV,
        "LISTEN_PID",
        "LISTEN_FDS",
        "LISTEN_FDNAMES",
    ] {
        std::env::remove_var(var);
    }
    let mut inherited = INHERITED.lock().unwrap_or_else(|e| e.into_inner());
    for (name, fd) in handed {
        // SAFETY: the previous process (or systemd) handed this descriptor to us for this
        // purpose and nothing else in this process knows of it; it is owned from here on.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let sock = socket2::SockRef::from(&owned);
        if !sock.is_listener().unwrap_or(false) {
            return Err(format!(
                "descriptor {fd} handed over for {name:?} is not a listening socket"
            ));
        }
        owned_set_cloexec(&owned);
        inherited.push(Inherited {
            name,
            socket: std::net::TcpListener::from(owned),
        });
        adopted.sockets += 1;
    }
    if let Some(fd) = ready {
        let fd: RawFd = fd.parse().map_err(|_| format!("{READY_FD_ENV}={fd:?}"))?;
        // SAFETY: as above: the pipe's write end was handed to this process alone.
        let pipe = unsafe { std::fs::File::from_raw_fd(fd) };
        *READY_PIPE.lock().unwrap_or_else(|e| e.into_inner()) = Some(pipe);
        adopted.upgrade = true;
    }
    Ok(adopted)
}

/// The handed-over socket for listener `name` at `addr` (the same address, or any port on
/// the same address where `addr` asks for port 0), if there is one; a socket whose address
/// no longer fits the configuration is closed.
pub(crate) fn take_inherited(name: &str, addr: SocketAddr) -> Option<std::net::TcpListener> {
    let mut inherited = INHERITED.lock().unwrap_or_else(|e| e.into_inner());
    let fits = |bound: SocketAddr| bound == addr || (addr.port() == 0 && bound.ip() == addr.ip());
    let at = inherited.iter().position(|i| {
        let bound = i.socket.local_addr().ok();
        match &i.name {
            Some(n) => n == name,
            None => bound == Some(addr),
        }
    })?;
    let found = inherited.remove(at);
    match found.socket.local_addr() {
        Ok(bound) if fits(bound) => Some(found.socket),
        other => {
            tracing::warn!(listener = name, configured = %addr, inherited = ?other, "the handed-over socket's address no longer fits the configuration: binding afresh");
            None
        }
    }
}

/// Records that listener `name` listens on `socket`, for a later handover.
pub(crate) fn record(name: &str, socket: &tokio::net::TcpListener) {
    let Ok(addr) = socket.local_addr() else {
        return;
    };
    let mut bound = BOUND.lock().unwrap_or_else(|e| e.into_inner());
    bound.retain(|(n, _, _)| n != name);
    bound.push((name.to_owned(), socket.as_raw_fd(), addr));
}

/// Closes the handed-over sockets no listener took (a listener the new configuration
/// removed): each stops queueing connections nobody will accept.
pub(crate) fn drop_unclaimed() {
    let left: Vec<Inherited> =
        std::mem::take(&mut *INHERITED.lock().unwrap_or_else(|e| e.into_inner()));
    for i in left {
        tracing::info!(listener = ?i.name, address = ?i.socket.local_addr().ok(), "closing a handed-over socket no listener claimed");
    }
}

/// Tells whoever waits that this process serves: the previous process over its pipe (an
/// upgrade), and systemd (`READY=1` with `MAINPID=`, which is how systemd learns that the
/// upgraded process is now the service's main one).
pub fn announce_ready() {
    if let Some(mut pipe) = READY_PIPE.lock().unwrap_or_else(|e| e.into_inner()).take() {
        if let Err(e) = writeln!(pipe, "ready {}", std::process::id()) {
            tracing::warn!(error = %e, "cannot tell the previous process that this one is ready");
        }
    }
    notify_systemd(&format!("READY=1\nMAINPID={}\n", std::process::id()));
}

/// One sd_notify message to `$NOTIFY_SOCKET`, where systemd set one (a path, or an abstract
/// name written with `@`). The protocol is one datagram; no library is needed for it.
pub fn notify_systemd(message: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = (|| -> std::io::Result<()> {
        let socket = std::os::unix::net::UnixDatagram::unbound()?;
        let bytes = path.as_encoded_bytes();
        if let Some(name) = bytes.strip_prefix(b"@") {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(message.as_bytes(), &addr)?;
        } else {
            socket.send_to(message.as_bytes(), &path)?;
        }
        Ok(())
    })();
    if let Err(e) = sent {
        tracing::warn!(error = %e, "sd_notify failed");
    }
}

/// How an upgrade ended, for the log, the metric and the ready file.
#[derive(Debug)]
pub enum Outcome {
    /// The new process serves; this one drains.
    Ready {
        /// The new process.
        pid: u32,
    },
    /// The new process could not take over; this one keeps serving.
    Failed(String),
}

/// Waits for SIGUSR2 and upgrades; on success cancels `shutdown` (this process then
/// drains as on SIGTERM). A SIGUSR2 while an upgrade is under way, or after one succeeded,
/// is refused with a log line. `on_outcome` is told each outcome (the ready file).
pub async fn on_sigusr2(
    shutdown: CancellationToken,
    metrics: Metrics,
    on_outcome: impl Fn(&Outcome) + Send + Sync + 'static,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut usr2 = match signal(SignalKind::user_defined2()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install the SIGUSR2 handler: in-place upgrades are off");
            return;
        }
    };
    let busy = std::sync::Arc::new(AtomicBool::new(false));
    let on_outcome = std::sync::Arc::new(on_outcome);
    while usr2.recv().await.is_some() {
        if busy.swap(true, Ordering::AcqRel) {
            tracing::warn!("SIGUSR2 refused: an upgrade is already under way (or done, and this process is draining)");
            continue;
        }
        let (busy, metrics, shutdown, on_outcome) = (
            busy.clone(),
            metrics.clone(),
            shutdown.clone(),
            on_outcome.clone(),
        );
        tokio::spawn(async move {
            let outcome = match tokio::task::spawn_blocking(upgrade).await {
                Ok(outcome) => outcome,
                Err(e) => Outcome::Failed(format!("the upgrade task failed: {e}")),
            };
            on_outcome(&outcome);
            match outcome {
                Outcome::Ready { pid } => {
                    metrics.upgraded(true);
                    tracing::info!(
                        new_pid = pid,
                        "upgrade: the new process serves; draining this one"
                    );
                    shutdown.cancel();
                    // Stays busy: this process is on its way out.
                }
                Outcome::Failed(reason) => {
                    metrics.upgraded(false);
                    tracing::error!(%reason, "upgrade failed: this process keeps serving");
                    busy.store(false, Ordering::Release);
                }
            }
        });
    }
}

/// Starts the new process with every listening socket and waits for it to be ready, for
/// [`READY_LIMIT`] at most. Blocking.
fn upgrade() -> Outcome {
    let exe = EXE.get().cloned().unwrap_or_else(binary_path);
    let handed: Vec<(String, RawFd)> = BOUND
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        // A listener a reload removed has closed its descriptor; a number reused since by
        // another socket is told apart by the address and the listening state.
        .filter(|(_, fd, addr)| still_listening(*fd, *addr))
        .map(|(name, fd, _)| (name.clone(), *fd))
        .collect();
    tracing::info!(binary = %exe.display(), sockets = handed.len(), names = ?handed.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), "upgrade: starting the new binary with the listening sockets");
    let (mut read_end, write_end) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(format!("cannot make the readiness pipe: {e}")),
    };
    let list = serde_json::to_string(&handed).expect("names and numbers serialise");
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(std::env::args_os().skip(1))
        .env(FDS_ENV, list)
        .env(READY_FD_ENV, write_end.as_raw_fd().to_string());
    let keep: Vec<RawFd> = handed
        .iter()
        .map(|(_, fd)| *fd)
        .chain([write_end.as_raw_fd()])
        .collect();
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec only fcntl runs, an async-signal-safe system call,
        // on descriptor numbers collected before the fork; nothing is allocated or locked.
        unsafe {
            cmd.pre_exec(move || {
                for &fd in &keep {
                    if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Outcome::Failed(format!("cannot start {}: {e}", exe.display())),
    };
    // Only the child holds the write end now: its exit closes the pipe.
    drop(write_end);
    let pid = child.id();
    tracing::info!(
        new_pid = pid,
        "upgrade: the new process started; waiting for it to serve"
    );
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut said = String::new();
        let _ = read_end.read_to_string(&mut said);
        let _ = tx.send(said);
    });
    let said = match rx.recv_timeout(READY_LIMIT) {
        Ok(said) => said,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Outcome::Failed(format!(
                "the new process (pid {pid}) was not ready within {READY_LIMIT:?}: stopped"
            ));
        }
    };
    if said.starts_with("ready") {
        // Reaped by no one else: a thread waits for it so it never lingers as a zombie if
        // it exits while this process still drains.
        std::thread::spawn(move || {
            let _ = child.wait();
        });
        return Outcome::Ready { pid };
    }
    let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
    Outcome::Failed(format!(
        "the new process (pid {pid}) exited before it served ({status}); its log says why"
    ))
}

/// Whether `fd` is still a listening socket bound to `addr`.
fn still_listening(fd: RawFd, addr: SocketAddr) -> bool {
    // SAFETY: borrowed only for the two queries; `fd` is not closed or kept.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let sock = socket2::SockRef::from(&fd);
    sock.is_listener().unwrap_or(false)
        && sock.local_addr().ok().and_then(|a| a.as_socket()) == Some(addr)
}

fn owned_set_cloexec(fd: &OwnedFd) {
    let _ = socket2::SockRef::from(fd).set_cloexec(true);
}

/// The path this binary was started as: argv[0] made absolute against the directory it was
/// started in, else (found on PATH, or unknown) /proc/self/exe as it is now.
fn binary_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let Some(arg0) = std::env::args_os().next().map(PathBuf::from) else {
        return exe;
    };
    if arg0.components().count() > 1 {
        if let Ok(absolute) = std::path::absolute(&arg0) {
            return absolute;
        }
    }
    // A bare name came from PATH: the first match is what a shell would start again.
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(&arg0))
                .find(|c| c.is_file())
        })
        .unwrap_or(exe)
}
