//! Atomic file writes (docs/ARCHITECTURE.md: every file a run writes is complete or absent): write a
//! temporary file beside the target, then rename it over the target ([`commit`], the one commit
//! point of every file the harness writes).

use crate::files::{AtPath, PathIoError};
use std::path::{Path, PathBuf};

/// A temporary file beside the file it will become, made by this process: created with
/// `O_CREAT | O_EXCL | O_NOFOLLOW` under a name no file had (`<name>.<pid>-<n>.tmp`), so a link
/// or file planted at a temporary's name is never followed, truncated or reused, and a second
/// writer of the same target (another process, another thread) never shares it. Removed when
/// dropped, on every way out, unless [`Temp::commit`] renamed it over its target.
#[derive(Debug)]
pub struct Temp {
    path: PathBuf,
    file: std::fs::File,
    done: bool,
}

/// Names tried before a temporary is given up on: each taken name is one another file already
/// had (an earlier process's leftover, or one planted there).
const TEMP_TRIES: u32 = 64;

/// Tells apart the temporaries of one process.
static TEMP_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Temp {
    /// A new empty temporary beside `path` (`<name>.<pid>-<n>.tmp`).
    pub fn beside(path: &Path) -> std::io::Result<Temp> {
        Temp::create(path, None, None)
    }

    /// A new empty temporary beside `path` keeping its extension (`table.png` →
    /// `table.<pid>-<n>.tmp.png`), for writers that pick a format by extension (the figures'
    /// PNG and SVG backends, which then open it by its path).
    pub fn beside_keeping_extension(path: &Path) -> std::io::Result<Temp> {
        let ext = path.extension().map(|e| e.to_os_string());
        Temp::create(path, ext, None)
    }

    /// A new empty temporary beside `path` created with permission bits `mode` (Unix; the umask
    /// applies), so it is never readable by more than `mode` allows, even for a moment.
    pub fn beside_with_mode(path: &Path, mode: u32) -> std::io::Result<Temp> {
        Temp::create(path, None, Some(mode))
    }

    fn create(
        path: &Path,
        ext: Option<std::ffi::OsString>,
        mode: Option<u32>,
    ) -> std::io::Result<Temp> {
        let name = match &ext {
            Some(_) => path.file_stem(),
            None => path.file_name(),
        }
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no file name to write a temporary beside",
            )
        })?;
        let mut last = None;
        for _ in 0..TEMP_TRIES {
            let n = TEMP_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut temp = name.to_os_string();
            temp.push(format!(".{}-{n}.tmp", std::process::id()));
            if let Some(ext) = &ext {
                temp.push(".");
                temp.push(ext);
            }
            let temp = path.with_file_name(temp);
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                options.custom_flags(libc::O_NOFOLLOW);
                if let Some(mode) = mode {
                    options.mode(mode);
                }
            }
            #[cfg(not(unix))]
            let _ = mode;
            match options.open(&temp) {
                Ok(file) => {
                    return Ok(Temp {
                        path: temp,
                        file,
                        done: false,
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!(
                "no free name for a temporary beside it ({TEMP_TRIES} taken: {})",
                last.map_or_else(String::new, |e| e.to_string())
            ),
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open temporary, to write into.
    pub fn file(&mut self) -> &mut std::fs::File {
        &mut self.file
    }

    /// Renames the complete temporary over `path` ([`commit`]).
    pub fn commit(mut self, path: &Path) -> std::io::Result<()> {
        commit(&self.path, path)?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether a file or directory name is a temporary of an interrupted write (a file's
/// `.<pid>-<n>.tmp` or `.<pid>-<n>.tmp.png`, a checkpoint's `step_NNNNNN.tmp`): never part of a
/// result.
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
    use std::io::Write;
    let mut temp = Temp::beside(path).at(path)?;
    temp.file().write_all(bytes).at(path)?;
    temp.commit(path).at(path)
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
#[derive(Debug)]
pub struct StagedDir {
    path: PathBuf,
    done: bool,
}

impl StagedDir {
    /// A fresh staging directory for `dir` (what an interrupted run left there is removed).
    pub fn new(dir: &Path, what: &str) -> std::io::Result<StagedDir> {
        StagedDir::at(staging(dir, what))
    }

    /// A fresh staging directory at `path` (what an interrupted run left there is removed: a
    /// link there is removed itself, never followed). Made with `mkdir`, which fails on anything
    /// that appeared at `path` meanwhile, so what is staged is written into a folder this call
    /// made, never into one a link planted there leads to.
    fn at(path: PathBuf) -> std::io::Result<StagedDir> {
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&path)?,
            Ok(_) => std::fs::remove_file(&path)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::create_dir(&path)?;
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

    /// Puts the complete staged directory at `dir`, which must not exist: whatever is at `dir`
    /// when it is put in place (even what appeared after the caller looked) is refused, kind
    /// `AlreadyExists`, and left as it is ([`rename_dir_new`]); the staged directory is then
    /// removed when dropped.
    pub fn commit_new(mut self, dir: &Path) -> std::io::Result<()> {
        rename_dir_new(&self.path, dir)?;
        self.done = true;
        Ok(())
    }
}

/// Renames the directory `from` to `to` unless something is at `to` (kind `AlreadyExists`,
/// nothing replaced): Linux's `renameat2(RENAME_NOREPLACE)`, one step; where the file system or
/// the system has no such rename, `to` is made with `mkdir` (which refuses an existing one)
/// and `from` renamed onto that empty directory (a rename replaces only an empty one).
pub fn rename_dir_new(from: &Path, to: &Path) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| {
            std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "a path with a NUL byte")
            })
        };
        let (f, t) = (c(from)?, c(to)?);
        // SAFETY: both are NUL-terminated strings alive across the call.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                f.as_ptr(),
                libc::AT_FDCWD,
                t.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        // EINVAL: a file system without the flag; ENOSYS: a kernel without renameat2
        if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
            return Err(e);
        }
    }
    std::fs::create_dir(to)?;
    std::fs::rename(from, to).inspect_err(|_| {
        let _ = std::fs::remove_dir(to); // the empty directory this call made, if still empty
    })
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
        use std::io::Write;
        let staged = self.folder(dir)?.join(name);
        // A new file in the folder this set made: a name written twice is an error, not a
        // silent overwrite.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&staged)?
            .write_all(bytes)?;
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
    let mut staged: Vec<Replacement> = Vec::new();
    for (path, bytes) in files {
        let real = std::fs::canonicalize(path).at(path)?;
        if staged.iter().any(|s| s.real == real) {
            continue;
        }
        let old = std::fs::read(&real).at(path)?;
        let temp = write_like(&real, bytes).at(path)?;
        staged.push(Replacement {
            real,
            temp: Some(temp),
            old,
        });
    }
    for i in 0..staged.len() {
        let temp = staged[i]
            .temp
            .take()
            .expect("invariant: staged, not yet committed");
        if let Err(e) = temp.commit(&staged[i].real) {
            let failed = staged[i].real.clone();
            restore(&staged[..i]);
            return Err(PathIoError::new(failed, e));
        }
    }
    Ok(())
}

/// One file of [`replace_together`]: where it is, its staged new content (a [`Temp`], removed if
/// dropped uncommitted), its old bytes.
struct Replacement {
    real: PathBuf,
    temp: Option<Temp>,
    old: Vec<u8>,
}

/// Puts the old bytes back into the files already replaced (best effort: the error that
/// stopped the set is the one reported).
fn restore(replaced: &[Replacement]) {
    for r in replaced {
        if let Ok(temp) = write_like(&r.real, &r.old) {
            let _ = temp.commit(&r.real);
        }
    }
}

/// A new [`Temp`] beside the existing file `like` holding `bytes`, with `like`'s permissions and
/// owner, so that renaming it over `like` changes the content alone. Created with the
/// permissions already (never readable by more than `like` is, even for a moment), then given
/// them exactly (the umask may have taken bits away) and, on Unix, `like`'s owner and group
/// where they differ from the writer's: a file this process cannot give them is an error, never
/// a silent change.
fn write_like(like: &Path, bytes: &[u8]) -> std::io::Result<Temp> {
    use std::io::Write;
    let meta = std::fs::metadata(like)?;
    #[cfg(unix)]
    let mut temp = {
        use std::os::unix::fs::PermissionsExt;
        Temp::beside_with_mode(like, meta.permissions().mode() & 0o7777)?
    };
    #[cfg(not(unix))]
    let mut temp = Temp::beside(like)?;
    let file = temp.file();
    file.write_all(bytes)?;
    file.set_permissions(meta.permissions())?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let made = file.metadata()?;
        if (made.uid(), made.gid()) != (meta.uid(), meta.gid()) {
            std::os::unix::fs::fchown(&*file, Some(meta.uid()), Some(meta.gid())).map_err(|e| {
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
    Ok(temp)
}

/// Saves tensors as safetensors to `path` atomically.
pub fn save_safetensors(
    tensors: &std::collections::HashMap<String, candle_core::Tensor>,
    path: &Path,
) -> candle_core::Result<()> {
    // candle opens the file by its path: it writes into the temporary made here, never into
    // what a planted name leads to.
    let temp = Temp::beside(path)?;
    candle_core::safetensors::save(tensors, temp.path())?;
    temp.commit(path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staged_directory_committed_as_new_never_replaces_what_appeared_at_its_place() {
        let tmp = tempfile::tempdir().expect("tmp");
        let out = tmp.path().join("out");
        let stage = StagedDir::new(&out, "test").expect("stage");
        std::fs::write(stage.path().join("ours"), b"ours").expect("write");
        let staged = stage.path().to_owned();
        std::fs::create_dir(&out).expect("mkdir");
        std::fs::write(out.join("theirs"), b"theirs").expect("write");
        let err = stage.commit_new(&out).expect_err("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists, "{err}");
        assert_eq!(std::fs::read(out.join("theirs")).expect("kept"), b"theirs");
        assert!(!out.join("ours").exists());
        assert!(!staged.exists(), "the staged directory is removed");
        // an empty directory is refused too (a plain rename would replace it)
        std::fs::remove_file(out.join("theirs")).expect("rm");
        let stage = StagedDir::new(&out, "test").expect("stage");
        let err = stage.commit_new(&out).expect_err("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists, "{err}");
        // and with nothing there it is put in place
        std::fs::remove_dir(&out).expect("rmdir");
        let stage = StagedDir::new(&out, "test").expect("stage");
        std::fs::write(stage.path().join("ours"), b"ours").expect("write");
        stage.commit_new(&out).expect("committed");
        assert_eq!(std::fs::read(out.join("ours")).expect("read"), b"ours");
    }

    /// The names the next temporaries of `path` will try, from the counter on.
    fn next_names(path: &Path, n: u64) -> Vec<PathBuf> {
        let from = TEMP_COUNTER.load(std::sync::atomic::Ordering::Relaxed);
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .to_string();
        (from..from + n)
            .map(|k| path.with_file_name(format!("{name}.{}-{k}.tmp", std::process::id())))
            .collect()
    }

    #[cfg(unix)]
    #[test]
    fn a_write_never_follows_or_reuses_a_planted_temporary() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tmp");
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "the victim's").expect("w");
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let target = tmp.path().join("doc.md");
        // The name the writer used to take, and the next names it will try: links to the
        // victim, and a file another process left.
        let mut planted = vec![tmp.path().join("doc.md.tmp")];
        planted.extend(next_names(&target, 8));
        for (i, p) in planted.iter().enumerate() {
            if i % 2 == 0 {
                std::os::unix::fs::symlink(&victim, p).expect("link");
            } else {
                std::fs::write(p, "someone else's").expect("w");
            }
        }
        write(&target, b"the document").expect("written");
        assert_eq!(std::fs::read(&victim).expect("r"), b"the victim's");
        let mode = std::fs::metadata(&victim).expect("m").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the victim's mode changed");
        let meta = std::fs::symlink_metadata(&target).expect("m");
        assert!(meta.is_file(), "the target is a regular file, not a link");
        assert_eq!(std::fs::read(&target).expect("r"), b"the document");
        for (i, p) in planted.iter().enumerate() {
            let m = std::fs::symlink_metadata(p).expect("what was planted is still there");
            assert_eq!(m.file_type().is_symlink(), i % 2 == 0);
        }
        // Nothing of the writer's own is left beside it.
        let mut names: Vec<String> = std::fs::read_dir(tmp.path())
            .expect("ls")
            .map(|e| e.expect("e").file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        assert_eq!(names.len(), planted.len() + 2, "{names:?}");
    }

    #[test]
    fn a_temporary_is_removed_when_its_write_fails() {
        let tmp = tempfile::tempdir().expect("tmp");
        let target = tmp.path().join("figure.png");
        let temp = Temp::beside_keeping_extension(&target).expect("temp");
        let name = temp
            .path()
            .file_name()
            .expect("n")
            .to_string_lossy()
            .to_string();
        assert!(name.starts_with("figure.") && name.ends_with(".tmp.png") && is_temp(&name));
        let path = temp.path().to_owned();
        assert!(path.is_file());
        drop(temp);
        assert!(!path.exists(), "an uncommitted temporary is removed");
        // A target whose folder is a file: the error names the target, and nothing is left.
        std::fs::write(tmp.path().join("file"), "").expect("w");
        let err = write(&tmp.path().join("file/inside.txt"), b"x").expect_err("no folder");
        assert!(err.to_string().contains("inside.txt"), "{err}");
        // A staging folder whose name a link holds: the link goes, the folder is made fresh,
        // and the link's target is untouched.
        let victim = tmp.path().join("victim-dir");
        std::fs::create_dir(&victim).expect("mkdir");
        let mut set = FileSet::new("report");
        let out = tmp.path().join("out");
        std::fs::create_dir(&out).expect("mkdir");
        #[cfg(unix)]
        std::os::unix::fs::symlink(&victim, out.join(".report.staging")).expect("link");
        set.write(&out, "table.md", b"| a |").expect("staged");
        set.commit().expect("committed");
        assert_eq!(std::fs::read(out.join("table.md")).expect("r"), b"| a |");
        assert_eq!(std::fs::read_dir(&victim).expect("ls").count(), 0);
    }
}
