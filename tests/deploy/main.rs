//! What the project ships, started the way users start it: checked against the binaries
//! without an engine, `compose_file` (as docker-compose resolves it), `kubernetes` (every
//! variant rendered by real kustomize and validated), `manifests` (the systemd deployment,
//! the prebuilt images, and the helpers the three share); and in real containers `compose` (the compose stack),
//! `systemd` (the README's quick start in a systemd container), `package_upgrade` (the
//! package upgrading a running proxy in place under load) and `topology` (a balanced
//! multi-node topology with faults). The container tests are selected by module:
//! `cargo test -p e2e --test deploy compose::`. A new test goes into the module of the
//! deployment it checks.

mod compose;
mod compose_file;
mod kubernetes;
mod manifests;
mod package_upgrade;
mod systemd;
mod topology;
