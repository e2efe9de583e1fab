//! Where `loadgen compare` finds an installed QAT provider.

use std::path::{Path, PathBuf};

/// Where QAT_Engine's `make install` puts the provider (deploy/QAT.md): its default prefix
/// and the Debian/Ubuntu OpenSSL module directory.
pub(super) const QAT_INSTALL_DIRS: [&str; 3] = [
    "/usr/local/lib64/ossl-modules",
    "/usr/local/lib/ossl-modules",
    "/usr/lib/x86_64-linux-gnu/ossl-modules",
];

/// The directory holding an installed `qatprovider.so`: `named`, else the first of
/// QAT_PROVIDER_DIR, OPENSSL_MODULES and the install directories deploy/QAT.md names
/// that holds one.
pub fn find_qat_provider(named: Option<&Path>) -> Option<PathBuf> {
    if let Some(dir) = named {
        return Some(dir.to_owned());
    }
    ["QAT_PROVIDER_DIR", "OPENSSL_MODULES"]
        .iter()
        .filter_map(|var| std::env::var_os(var).map(PathBuf::from))
        .chain(QAT_INSTALL_DIRS.iter().map(PathBuf::from))
        .find(|dir| dir.join("qatprovider.so").is_file())
}
