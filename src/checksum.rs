//! SHA-256 of files, hex: the one digest of the project (prepared datasets, created models,
//! run directories and archives).

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

/// The checksum file of a run directory, an archive or a created model (sha256sum format).
pub const SUMS: &str = "SHA256SUMS";

/// SHA-256 of a file's bytes, as lowercase hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = crate::files::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(crate::checksum::hex(&h.finalize()))
}

/// Bytes as lowercase hexadecimal (a digest's usual form).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
