//! Atomic file writes (DESIGN.md: every file a run writes is complete or absent): write a
//! temporary file beside the target, then rename it over the target.

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

/// Whether a file or directory name is a temporary of an interrupted write (a file's `.tmp`, a
/// checkpoint's `step_NNNNNN.tmp`): never part of a result.
pub fn is_temp(name: &str) -> bool {
    name.ends_with(".tmp")
}

/// Writes `bytes` to `path` atomically.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temp_path(path);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
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
    std::fs::rename(&tmp, path)?;
    Ok(())
}
