//! The ready file `proxy run --ready-file` writes once every listener is bound (port 0
//! friendly): the process id, the bound addresses by listener name, and a failed in-place
//! upgrade. Written by the server and by an upgrade that failed; read by `proxy upgrade`,
//! loadgen and the tests.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// What `proxy run --ready-file` writes once it serves: every listener's bound address by
/// name, and the admin port's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    /// The proxy's process id.
    pub pid: u32,
    /// The admin port, when one is configured.
    pub admin: Option<SocketAddr>,
    /// Every listener's bound address, by name (in name order).
    pub listeners: BTreeMap<String, SocketAddr>,
    /// The last in-place upgrade this process tried that failed, and why: it keeps serving.
    /// (A successful one shows as another pid: the new process rewrites the file.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_failed: Option<String>,
}

impl Ready {
    /// Writes the file atomically (a temporary file renamed), so a reader never sees half.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(self)?)?;
        std::fs::rename(&tmp, path)
    }

    /// The listener named `name`.
    pub fn listener(&self, name: &str) -> Option<SocketAddr> {
        self.listeners.get(name).copied()
    }

    /// The first listener by name: the only one of a single-listener proxy.
    pub fn first_listener(&self) -> Option<SocketAddr> {
        self.listeners.values().next().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_file_is_read_back_as_written() {
        let dir = std::env::temp_dir().join(format!("launch-ready-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ready.json");
        let ready = Ready {
            pid: 7,
            admin: Some("127.0.0.1:9901".parse().unwrap()),
            listeners: [("grpc".to_owned(), "127.0.0.1:6334".parse().unwrap())].into(),
            upgrade_failed: None,
        };
        ready.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let back: Ready = serde_json::from_str(&text).unwrap();
        assert_eq!(back, ready);
        assert_eq!(back.first_listener(), back.listener("grpc"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
