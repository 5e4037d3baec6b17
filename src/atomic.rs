//! Atomic file writes (DESIGN.md: every file a run writes is complete or absent): write a
//! temporary file beside the target, then rename it over the target ([`commit`], the one commit
//! point of every file the harness writes).

use std::path::{Path, PathBuf};

/// The temporary path used while writing `path`.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}

/// The temporary path for `path` keeping its extension (`table.png` → `table.tmp.png`), for
/// writers that pick a format by extension (the figures' PNG and SVG backends).
pub fn temp_path_keeping_extension(path: &Path) -> PathBuf {
    match path.extension() {
        Some(ext) => {
            let mut ext_tmp = std::ffi::OsString::from("tmp.");
            ext_tmp.push(ext);
            path.with_extension(ext_tmp)
        }
        None => temp_path(path),
    }
}

/// Whether a file or directory name is a temporary of an interrupted write (a file's `.tmp` or
/// `.tmp.png`, a checkpoint's `step_NNNNNN.tmp`): never part of a result.
pub fn is_temp(name: &str) -> bool {
    name.ends_with(".tmp") || name.contains(".tmp.")
}

/// The fault-injection hook of the kill tests: with this variable set to a file name, the
/// process aborts (as a SIGKILL would stop it) just before that file is committed.
pub const FAULT_ABORT_BEFORE_COMMIT: &str = "ACPO_FAULT_ABORT_BEFORE_COMMIT";

/// Renames the complete temporary `tmp` over `path`.
pub fn commit(tmp: &Path, path: &Path) -> std::io::Result<()> {
    if let Some(name) = std::env::var_os(FAULT_ABORT_BEFORE_COMMIT) {
        if path.file_name() == Some(name.as_os_str()) {
            std::process::abort();
        }
    }
    std::fs::rename(tmp, path)
}

/// Writes `bytes` to `path` atomically.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temp_path(path);
    std::fs::write(&tmp, bytes)?;
    commit(&tmp, path)
}

/// Writes `bytes` atomically to `dir/name`, creating `dir` first; returns the path written.
pub fn write_in(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::create_dir_all(dir)?;
    write(&path, bytes)?;
    Ok(path)
}

/// Saves tensors as safetensors to `path` atomically.
pub fn save_safetensors(
    tensors: &std::collections::HashMap<String, candle_core::Tensor>,
    path: &Path,
) -> candle_core::Result<()> {
    let tmp = temp_path(path);
    candle_core::safetensors::save(tensors, &tmp)?;
    commit(&tmp, path)?;
    Ok(())
}
