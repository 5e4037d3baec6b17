//! Checksummed archives of run directories (`acpo archive`) and their verification
//! (`acpo verify`).
//!
//! A run directory carries `SHA256SUMS` (sha256sum format, every file but itself, sorted). An
//! archive is a `.tar.gz` of run directories plus a top-level `SHA256SUMS` covering every file
//! in it, written atomically, with a `<archive>.sha256` beside it. Verification recomputes every
//! hash and reports each file that differs, is missing or is extra; an unreadable archive is a
//! failed check too. Unpacking refuses paths that would leave the target directory.

use crate::files::{AtPath, PathIoError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use crate::checksum::SUMS;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
}

type Result<T> = std::result::Result<T, ArchiveError>;

/// SHA-256 of a file, hex.
fn sha256_file(path: &Path) -> Result<String> {
    Ok(crate::checksum::sha256_file(path).at(path)?)
}

/// Every regular file under `root` (relative, `/`-separated, sorted) but the top-level
/// SHA256SUMS.
fn files(root: &Path) -> Result<Vec<String>> {
    Ok(entries(root)?.0)
}

/// The regular files under `root` (as [`files`]) and every other entry that is not a
/// directory — symbolic links, devices, FIFOs — which no run directory holds.
fn entries(root: &Path) -> Result<(Vec<String>, Vec<String>)> {
    let (mut out, mut others) = (Vec::new(), Vec::new());
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).at(&dir)? {
            let entry = entry.at(&dir)?;
            let path = entry.path();
            // file_type does not follow symbolic links: a link is reported, never entered.
            let kind = entry.file_type().at(&path)?;
            // What an interrupted write left behind (a regular file or directory named as a
            // temporary) is not part of any result; a link is reported whatever its name.
            let temp = crate::atomic::is_temp(&entry.file_name().to_string_lossy());
            if temp && (kind.is_file() || kind.is_dir()) {
                continue;
            }
            if kind.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(root)
                .expect("invariant: walked from root")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().to_string())
                .collect::<Vec<_>>()
                .join("/");
            if kind.is_file() {
                out.push(rel);
            } else {
                others.push(rel);
            }
        }
    }
    out.retain(|f| f != SUMS);
    out.sort();
    others.sort();
    Ok((out, others))
}

/// Hashes of every file under `root` but the top-level SHA256SUMS.
pub fn hashes(root: &Path) -> Result<BTreeMap<String, String>> {
    files(root)?
        .into_iter()
        .map(|f| Ok((f.clone(), sha256_file(&root.join(&f))?)))
        .collect()
}

fn render(sums: &BTreeMap<String, String>) -> String {
    sums.iter().map(|(f, h)| format!("{h}  {f}\n")).collect()
}

/// The entries of a SHA256SUMS file; the reason it is malformed otherwise. A listed name must be
/// a relative path inside the directory (no `..`, no absolute path, `/`-separated), so that
/// verification never reads a file outside what it verifies.
fn parse(text: &str) -> std::result::Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let bad = |what: &str| format!("line {}: {what}", i + 1);
        let (h, f) = line
            .split_once("  ")
            .ok_or_else(|| bad("not `<sha256>  <file>`"))?;
        if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("not a SHA-256 in hex"));
        }
        let inside = !f.is_empty()
            && !f.starts_with('/')
            && !f.contains('\\')
            && f.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
        if !inside {
            return Err(bad(&format!("`{f}` is not a path inside the directory")));
        }
        if out.insert(f.to_string(), h.to_string()).is_some() {
            return Err(bad(&format!("`{f}` is listed twice")));
        }
    }
    Ok(out)
}

/// Writes `root/SHA256SUMS` over every other file under `root` (atomically).
pub fn write_sums(root: &Path) -> Result<BTreeMap<String, String>> {
    let sums = hashes(root)?;
    let path = root.join(SUMS);
    crate::atomic::write(&path, render(&sums).as_bytes())?;
    Ok(sums)
}

/// What a verification found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub checked: usize,
    pub differ: Vec<String>,
    pub missing: Vec<String>,
    pub extra: Vec<String>,
    /// Entries that are not regular files (symbolic links, devices): never part of a result.
    pub not_regular: Vec<String>,
    /// Why the target could not be read at all (corrupt archive, no or malformed SHA256SUMS).
    pub unreadable: Option<String>,
    /// What the `.sha256` beside an archive said (issue #47: an OK without one is said to be
    /// the inside's only, since a resealed archive agrees with its own sums).
    pub sidecar: Sidecar,
}

/// The `<archive>.sha256` beside an archive, as a verification found it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Sidecar {
    /// A directory was verified: it has none.
    #[default]
    NotApplicable,
    /// There was none: only the archive's own SHA256SUMS vouched for its files.
    Absent(PathBuf),
    /// It was there and named the archive's digest (a mismatch is one of `differ`).
    Checked(PathBuf),
}

impl Report {
    pub fn ok(&self) -> bool {
        self.differ.is_empty()
            && self.missing.is_empty()
            && self.extra.is_empty()
            && self.not_regular.is_empty()
            && self.unreadable.is_none()
    }

    /// One line per problem, or a one-line success.
    pub fn describe(&self) -> String {
        if let Some(u) = &self.unreadable {
            return format!("FAILED: {u}");
        }
        if self.ok() {
            let sidecar = match &self.sidecar {
                Sidecar::NotApplicable => String::new(),
                Sidecar::Checked(side) => {
                    format!("; the archive matches {}", side.display())
                }
                Sidecar::Absent(side) => format!(
                    "; no {} beside it, so the archive itself was not checked against a published SHA-256 (a resealed archive agrees with its own sums)",
                    side.display()
                ),
            };
            return format!("OK: {} files match SHA256SUMS{sidecar}", self.checked);
        }
        let mut s = format!(
            "FAILED: {} differ, {} missing, {} extra, {} not regular files (of {} listed)",
            self.differ.len(),
            self.missing.len(),
            self.extra.len(),
            self.not_regular.len(),
            self.checked
        );
        for (what, list) in [
            ("differs", &self.differ),
            ("missing", &self.missing),
            ("extra", &self.extra),
            ("not a regular file", &self.not_regular),
        ] {
            for f in list {
                s.push_str(&format!("\n  {what}: {f}"));
            }
        }
        s
    }
}

/// Checks a directory against its top-level SHA256SUMS, and every SHA256SUMS it lists (each
/// run's) against its own directory.
pub fn verify_dir(root: &Path) -> Result<Report> {
    let sums_path = root.join(SUMS);
    let unreadable = |reason: String| Report {
        unreadable: Some(reason),
        ..Report::default()
    };
    if !sums_path.is_file() {
        return Ok(unreadable(format!("{} has no {SUMS}", root.display())));
    }
    let listed = match parse(&crate::files::read_to_string(&sums_path).at(&sums_path)?) {
        Ok(listed) => listed,
        Err(reason) => return Ok(unreadable(format!("{}: {reason}", sums_path.display()))),
    };
    let (present, not_regular) = entries(root)?;
    let mut report = Report {
        checked: listed.len(),
        not_regular,
        ..Report::default()
    };
    for (f, want) in &listed {
        let path = root.join(f);
        // symlink_metadata: a listed name that is a link is not a file of the result.
        let regular = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
        if !regular {
            if !report.not_regular.contains(f) {
                report.missing.push(f.clone());
            }
        } else if &sha256_file(&path)? != want {
            report.differ.push(f.clone());
        }
    }
    report.extra = present
        .into_iter()
        .filter(|f| !listed.contains_key(f))
        .collect();
    for sums in listed.keys().filter(|f| f.ends_with(&format!("/{SUMS}"))) {
        if !report.differ.contains(sums) && !report.missing.contains(sums) {
            check_inner_sums(root, sums, &listed, &mut report)?;
        }
    }
    Ok(report)
}

/// A run's own SHA256SUMS (`dir/SHA256SUMS`, listed at the top) must give each of its files
/// the hash the top-level SHA256SUMS gives it. Those were just checked against the files, so
/// nothing is hashed twice.
fn check_inner_sums(
    root: &Path,
    sums: &str,
    top: &BTreeMap<String, String>,
    report: &mut Report,
) -> Result<()> {
    let dir = sums.trim_end_matches(SUMS);
    let path = root.join(sums);
    let inner = match parse(&crate::files::read_to_string(&path).at(&path)?) {
        Ok(inner) => inner,
        Err(reason) => {
            report.differ.push(format!("{sums} ({reason})"));
            return Ok(());
        }
    };
    for (f, want) in inner {
        let name = format!("{dir}{f}");
        if top.get(&name) == Some(&want) {
            continue;
        }
        let present = std::fs::symlink_metadata(root.join(&name)).is_ok_and(|m| m.is_file());
        match present {
            true => report.differ.push(name),
            false => report.missing.push(name),
        }
    }
    Ok(())
}

/// What an archive holds of each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contents {
    /// The runs' `checkpoints/` (weights and optimizer state: most of a run's bytes). Without
    /// them an archive still rebuilds every table and figure.
    pub checkpoints: bool,
}

/// Packs `runs` (each with a fresh SHA256SUMS) into `out` (.tar.gz) with a top-level SHA256SUMS.
pub fn archive(runs: &[PathBuf], out: &Path, contents: Contents) -> Result<usize> {
    let staging = tempdir_near(out)?;
    let mut names = std::collections::BTreeSet::new();
    for run in runs {
        if !run.is_dir() {
            return Err(ArchiveError::Invalid {
                path: run.clone(),
                reason: "not a run directory".into(),
            });
        }
        let name = run
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        if !names.insert(name.clone()) {
            return Err(ArchiveError::Invalid {
                path: run.clone(),
                reason: format!("two runs are named `{name}`"),
            });
        }
        write_sums(run)?;
        if contents.checkpoints {
            copy_tree(run, &staging.join(&name))?;
        } else {
            // The run's own sums are made again over what is packed.
            let skip = crate::run::RunDir::at(run).checkpoints();
            copy_files(run, &staging.join(&name), |f| {
                !run.join(f).starts_with(&skip)
            })?;
            write_sums(&staging.join(&name))?;
        }
    }
    let sums = write_sums(&staging)?;
    let tmp = crate::atomic::temp_path(out);
    {
        let file = std::fs::File::create(&tmp).at(&tmp)?;
        let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        tar.mode(tar::HeaderMode::Deterministic);
        let mut entries = files(&staging)?;
        entries.push(SUMS.to_string());
        for f in &entries {
            tar.append_path_with_name(staging.join(f), f).at(&tmp)?;
        }
        let gz = tar.into_inner().at(&tmp)?;
        gz.finish().at(&tmp)?;
    }
    crate::atomic::commit(&tmp, out).at(out)?;
    let digest = sha256_file(out)?;
    let side = PathBuf::from(format!("{}.sha256", out.display()));
    let file_name = out
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    crate::atomic::write(&side, format!("{digest}  {file_name}\n").as_bytes())?;
    std::fs::remove_dir_all(&staging).at(&staging)?;
    Ok(sums.len())
}

/// How many times its own size an archive may unpack to (plus [`UNPACK_ALLOWANCE`]). Results
/// compress ~1× (weights) to ~20× (JSON lines); a gzip bomb compresses ~1000×.
pub const UNPACK_RATIO: u64 = 64;
/// Bytes any archive may unpack to, whatever its size.
pub const UNPACK_ALLOWANCE: u64 = 64 << 20;

/// Unpacks an archive into `dest`, refusing paths outside it, entries that are not regular files
/// or directories, and more bytes than [`UNPACK_RATIO`] × its size + [`UNPACK_ALLOWANCE`]
/// (counted from the entries' headers before each is written, so a bomb writes nothing big).
pub fn unpack(archive: &Path, dest: &Path) -> Result<()> {
    let unreadable = |reason: String| ArchiveError::Unreadable {
        path: archive.to_owned(),
        reason,
    };
    let file = crate::files::open(archive).at(archive)?;
    let compressed = file.metadata().at(archive)?.len();
    let limit = compressed
        .saturating_mul(UNPACK_RATIO)
        .saturating_add(UNPACK_ALLOWANCE);
    let mut unpacked = 0u64;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let entries = tar
        .entries()
        .map_err(|e| unreadable(format!("not a readable .tar.gz: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| unreadable(format!("corrupt archive: {e}")))?;
        // Results are regular files in directories: a link, device or FIFO could point
        // anywhere once unpacked, so an archive holding one is refused whole.
        let kind = entry.header().entry_type();
        unpacked = unpacked.saturating_add(entry.header().size().unwrap_or(u64::MAX));
        if unpacked > limit {
            return Err(unreadable(format!(
                "unpacks to more than {limit} bytes ({UNPACK_RATIO} × its {compressed} bytes + {UNPACK_ALLOWANCE}): refused as a likely decompression bomb"
            )));
        }
        let metadata = kind.is_pax_global_extensions() || kind.is_pax_local_extensions();
        if !(kind.is_file() || kind.is_dir() || metadata) {
            let name = entry
                .path()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            return Err(unreadable(format!(
                "entry `{name}` is not a regular file or directory (archives of results hold no links)"
            )));
        }
        let inside = entry
            .unpack_in(dest)
            .map_err(|e| unreadable(format!("corrupt archive: {e}")))?;
        if !inside {
            return Err(unreadable("an entry points outside the archive".into()));
        }
    }
    // The tar reader stops at its end-of-archive blocks; reading the gzip stream to its end
    // checks its trailer (CRC-32 and size), so a corrupt trailer is caught without a sidecar.
    let mut rest = tar.into_inner();
    std::io::copy(&mut rest, &mut std::io::sink())
        .map_err(|e| unreadable(format!("corrupt archive: {e}")))?;
    Ok(())
}

/// Checks an archive (unpacked to a temporary directory) or a directory.
pub fn verify(target: &Path) -> Result<Report> {
    if target.is_dir() {
        return verify_dir(target);
    }
    if !target.exists() {
        return Err(ArchiveError::Invalid {
            path: target.to_owned(),
            reason: "no such archive or directory".into(),
        });
    }
    // Removed on every way out, the verdict's and the errors'.
    let scratch = Scratch(tempdir_near(&std::env::temp_dir().join("acpo-verify"))?);
    match unpack(target, &scratch.0) {
        Ok(()) => {
            let mut report = verify_dir(&scratch.0)?;
            check_sidecar(target, &mut report)?;
            Ok(report)
        }
        Err(ArchiveError::Unreadable { reason, .. }) => Ok(Report {
            unreadable: Some(format!("{}: {reason}", target.display())),
            ..Report::default()
        }),
        Err(e) => Err(e),
    }
}

/// A temporary directory removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `<archive>.sha256`, when it is beside the archive, must name the archive's own digest.
fn check_sidecar(archive: &Path, report: &mut Report) -> Result<()> {
    let side = PathBuf::from(format!("{}.sha256", archive.display()));
    if std::fs::symlink_metadata(&side).is_err() {
        report.sidecar = Sidecar::Absent(side);
        return Ok(());
    }
    report.sidecar = Sidecar::Checked(side.clone());
    let Ok(text) = crate::files::read_to_string(&side) else {
        report
            .differ
            .push(format!("{} (unreadable)", side.display()));
        return Ok(());
    };
    let listed = text.split_whitespace().next().unwrap_or("");
    if listed != sha256_file(archive)? {
        report.differ.push(side.display().to_string());
    }
    Ok(())
}

fn tempdir_near(path: &Path) -> Result<PathBuf> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).at(parent)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    remove_stale_staging(parent);
    let dir = parent.join(format!("{STAGING}{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir).at(&dir)?;
    Ok(dir)
}

/// The name prefix of staging directories: `.acpo-staging-<pid>-<nanoseconds>`.
const STAGING: &str = ".acpo-staging-";

/// Removes the staging directories in `parent` whose process is gone (a killed `verify` or
/// `archive` leaves one): the next start cleans up after it. Best effort: what cannot be
/// removed stays.
fn remove_stale_staging(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(STAGING)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        let gone = pid
            .is_some_and(|p| p != std::process::id() && !Path::new(&format!("/proc/{p}")).exists());
        if gone && Path::new("/proc/self").exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    copy_files(from, to, |_| true)
}

/// Copies the files of `from` (and its SHA256SUMS) that `keep` accepts.
fn copy_files(from: &Path, to: &Path, keep: impl Fn(&str) -> bool) -> Result<()> {
    for f in files(from)?
        .into_iter()
        .chain([SUMS.to_string()])
        .filter(|f| keep(f))
    {
        let src = from.join(&f);
        if !src.exists() {
            continue;
        }
        let dst = to.join(&f);
        if let Some(p) = dst.parent() {
            std::fs::create_dir_all(p).at(p)?;
        }
        std::fs::copy(&src, &dst).at(&dst)?;
    }
    Ok(())
}
