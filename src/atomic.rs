//! Atomic file writes (docs/ARCHITECTURE.md: every file a run writes is complete or absent): write a
//! temporary file beside the target, then rename it over the target ([`commit`], the one commit
//! point of every file the harness writes).

use crate::files::{AtPath, PathIoError};
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

/// Writes `bytes` to `path` atomically: the one atomic writer of a whole file, its error naming
/// the path.
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), PathIoError> {
    let tmp = temp_path(path);
    std::fs::write(&tmp, bytes)
        .and_then(|()| commit(&tmp, path))
        .at(path)
}

/// Writes `bytes` atomically to `dir/name`, creating `dir` first; returns the path written
/// (an error names it too).
pub fn write_in(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf, PathIoError> {
    let path = dir.join(name);
    std::fs::create_dir_all(dir).at(&path)?;
    write(&path, bytes)?;
    Ok(path)
}

/// The hidden sibling of `dir` where a command builds what it will put at `dir`
/// (`.name.what`), so that an interrupted command leaves `dir` as it was.
pub fn staging(dir: &Path, what: &str) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    dir.with_file_name(format!(".{name}.{what}"))
}

/// A directory being built beside `dir` ([`staging`]): removed when dropped, on every way out,
/// unless [`StagedDir::commit`] put it in place.
pub struct StagedDir {
    path: PathBuf,
    done: bool,
}

impl StagedDir {
    /// A fresh staging directory for `dir` (what an interrupted run left there is removed).
    pub fn new(dir: &Path, what: &str) -> std::io::Result<StagedDir> {
        StagedDir::at(staging(dir, what))
    }

    /// A fresh staging directory at `path` (what an interrupted run left there is removed).
    fn at(path: PathBuf) -> std::io::Result<StagedDir> {
        if path.exists() {
            std::fs::remove_dir_all(&path)?;
        }
        std::fs::create_dir_all(&path)?;
        Ok(StagedDir { path, done: false })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Puts the complete staged directory at `dir` ([`commit_dir`]).
    pub fn commit(mut self, dir: &Path) -> std::io::Result<()> {
        commit_dir(&self.path, dir)?;
        self.done = true;
        Ok(())
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Puts the complete directory `stage` at `dir`. An earlier `dir` (the caller's own: an earlier
/// run of the same command) is moved aside first and removed once the new one is in place.
pub fn commit_dir(stage: &Path, dir: &Path) -> std::io::Result<()> {
    let old = staging(dir, "replaced");
    if old.exists() {
        std::fs::remove_dir_all(&old)?;
    }
    let replacing = dir.exists();
    if replacing {
        std::fs::rename(dir, &old)?;
    }
    commit(stage, dir)?;
    if replacing {
        std::fs::remove_dir_all(&old)?;
    }
    Ok(())
}

/// Files written as one set (a report's tables and figures, issue #47): each is written into a
/// staging folder inside the folder it goes to (`.<what>.staging`, so nothing is written outside
/// the folders the command writes anyway), and none is put in place before
/// all of them are written ([`FileSet::commit`]). A set dropped before its commit (an error on
/// the way) removes what it staged, so a command that fails leaves the earlier set whole, never
/// part of a new one beside the rest of the old. (The commit renames one file after another: a
/// kill among those renames leaves each file whole, old or new, and the next run completes it.)
pub struct FileSet {
    what: &'static str,
    /// Each destination folder and its staging folder.
    stages: Vec<(PathBuf, StagedDir)>,
    /// Each staged file and where it goes, in the order written.
    files: Vec<(PathBuf, PathBuf)>,
}

impl FileSet {
    /// An empty set; `what` names its staging folders (`<folder>/.<what>.staging`).
    pub fn new(what: &'static str) -> FileSet {
        FileSet {
            what,
            stages: Vec::new(),
            files: Vec::new(),
        }
    }

    /// The staging folder of the files bound for `dir` (made on first use): a writer that makes
    /// its own files puts them there under their final names, then [`FileSet::adopt`]s them.
    pub fn folder(&mut self, dir: &Path) -> std::io::Result<PathBuf> {
        if let Some((_, stage)) = self.stages.iter().find(|(d, _)| d == dir) {
            return Ok(stage.path().to_owned());
        }
        std::fs::create_dir_all(dir)?;
        let stage = StagedDir::at(dir.join(format!(".{}.staging", self.what)))?;
        let path = stage.path().to_owned();
        self.stages.push((dir.to_owned(), stage));
        Ok(path)
    }

    /// Stages `bytes` as `dir/name`; returns the path it will have.
    pub fn write(&mut self, dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
        let staged = self.folder(dir)?.join(name);
        std::fs::write(&staged, bytes)?;
        let path = dir.join(name);
        self.files.push((staged, path.clone()));
        Ok(path)
    }

    /// Takes into the set the files a writer made in [`FileSet::folder`]`(dir)`; returns the
    /// paths they will have in `dir`.
    pub fn adopt(&mut self, dir: &Path, staged: Vec<PathBuf>) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for file in staged {
            let path = match file.file_name() {
                Some(name) => dir.join(name),
                None => continue,
            };
            self.files.push((file, path.clone()));
            out.push(path);
        }
        out
    }

    /// The paths the set's files will have, in the order written.
    pub fn files(&self) -> Vec<PathBuf> {
        self.files.iter().map(|(_, path)| path.clone()).collect()
    }

    /// Puts every staged file in place ([`commit`] each, its folder made first), then removes
    /// the staging folders.
    pub fn commit(self) -> std::io::Result<()> {
        for (staged, path) in &self.files {
            commit(staged, path)?;
        }
        Ok(())
    }
}

/// Replaces existing files together or not at all (issue #47: `acpo doc A B` rewrote A, then
/// failed on B). Each new content is written beside the file it replaces — the file a link
/// points to, so a link stays a link — with that file's permissions and owner; once every one is
/// written they are renamed over their files. On an error nothing is left behind: the
/// temporaries are removed, and when a rename fails the files already replaced get their old
/// bytes back. A file named twice (itself and through a link) is written once. The error names
/// the file it is about.
pub fn replace_together(files: &[(PathBuf, Vec<u8>)]) -> Result<(), PathIoError> {
    let mut staged = Staged(Vec::new());
    for (path, bytes) in files {
        let real = std::fs::canonicalize(path).at(path)?;
        if staged.0.iter().any(|s| s.real == real) {
            continue;
        }
        let old = std::fs::read(&real).at(path)?;
        let temp = temp_path(&real);
        staged.0.push(Replacement {
            real: real.clone(),
            temp: temp.clone(),
            old,
            replaced: false,
        });
        write_like(&real, &temp, bytes).at(path)?;
    }
    for i in 0..staged.0.len() {
        let r = &staged.0[i];
        if let Err(e) = commit(&r.temp, &r.real) {
            let failed = r.real.clone();
            staged.restore();
            return Err(PathIoError::new(failed, e));
        }
        staged.0[i].replaced = true;
    }
    staged.0.clear();
    Ok(())
}

/// One file of [`replace_together`]: where it is, its staged new content, its old bytes.
struct Replacement {
    real: PathBuf,
    temp: PathBuf,
    old: Vec<u8>,
    replaced: bool,
}

/// The replacements under way: dropped before they all went through, their temporaries go.
struct Staged(Vec<Replacement>);

impl Staged {
    /// Puts the old bytes back into the files already replaced (best effort: the error that
    /// stopped the set is the one reported).
    fn restore(&mut self) {
        for r in self.0.iter().filter(|r| r.replaced) {
            if write_like(&r.real, &r.temp, &r.old).is_ok() {
                let _ = std::fs::rename(&r.temp, &r.real);
            }
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for r in &self.0 {
            let _ = std::fs::remove_file(&r.temp);
        }
    }
}

/// Writes `bytes` to `temp` with the permissions and owner of the existing file `like`, so that
/// renaming it over `like` changes the content alone. Created with the permissions already
/// (never readable by more than `like` is, even for a moment), then given them exactly (the
/// umask may have taken bits away) and, on Unix, `like`'s owner and group where they differ
/// from the writer's: a file this process cannot give them is an error, never a silent change.
fn write_like(like: &Path, temp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let meta = std::fs::metadata(like)?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        options.mode(meta.permissions().mode() & 0o7777);
    }
    let mut file = options.open(temp)?;
    file.write_all(bytes)?;
    file.set_permissions(meta.permissions())?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let made = file.metadata()?;
        if (made.uid(), made.gid()) != (meta.uid(), meta.gid()) {
            std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid())).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot keep its owner {}:{} in the rewritten file ({e})",
                        meta.uid(),
                        meta.gid()
                    ),
                )
            })?;
            // chown clears the set-id bits: give the permissions again.
            file.set_permissions(meta.permissions())?;
        }
    }
    Ok(())
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
