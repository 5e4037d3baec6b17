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
    // Removed on every way out, the errors' too.
    let scratch = Scratch(tempdir_near(out)?);
    let staging = scratch.0.clone();
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
    let mut temp = crate::atomic::Temp::beside(out).at(out)?;
    let tmp = temp.path().to_owned();
    {
        let gz = flate2::write::GzEncoder::new(temp.file(), flate2::Compression::default());
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
    temp.commit(out).at(out)?;
    let digest = sha256_file(out)?;
    let side = PathBuf::from(format!("{}.sha256", out.display()));
    let file_name = out
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    crate::atomic::write(&side, format!("{digest}  {file_name}\n").as_bytes())?;
    drop(scratch);
    Ok(sums.len())
}

/// How many times its own size an archive may unpack to (plus [`UNPACK_ALLOWANCE`]). Results
/// compress ~1× (weights) to ~20× (JSON lines); a gzip bomb compresses ~1000×.
pub const UNPACK_RATIO: u64 = 64;
/// Bytes any archive may unpack to, whatever its size.
pub const UNPACK_ALLOWANCE: u64 = 64 << 20;
/// Entries (files, directories, extension headers) one archive may hold. The shipped archives
/// hold about 2,000; each entry costs a header's parsing, a file or directory made, a path
/// checked.
pub const MAX_ENTRIES: u64 = 1 << 16;
/// Bytes one extension entry (a GNU long name or link, a PAX header) may hold: the tar reader
/// keeps each one whole in memory, and a result's path is a few dozen bytes.
pub const MAX_EXTENSION_BYTES: u64 = 16 << 10;
/// Bytes of one entry's path inside the archive.
pub const MAX_PATH_BYTES: usize = 1024;
/// Components of one entry's path: the shipped archives' deepest is 3
/// (`run/checkpoints/step_N/...` is 4); every level is a directory made and checked.
pub const MAX_PATH_DEPTH: usize = 32;
/// What each entry is charged besides its bytes: the disk block a file or directory takes
/// however little it holds, so an archive of many empty entries is a bomb too.
pub const ENTRY_COST: u64 = 4096;

/// What unpacking one archive may spend, all checked before it is spent: bytes (each entry's
/// size as the tar reader will produce it, PAX `size` record honoured, its header, padding and
/// [`ENTRY_COST`]; the stream after the archive's end too), entries, bytes per extension entry,
/// and each path's length and depth. `verify` and every `--from` unpack within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    pub entries: u64,
    pub extension_bytes: u64,
    pub path_bytes: usize,
    pub path_depth: usize,
}

impl Budget {
    /// The budget of an archive of `compressed` bytes: [`UNPACK_RATIO`] × its size +
    /// [`UNPACK_ALLOWANCE`] bytes, and the fixed limits.
    pub fn of_archive(compressed: u64) -> Budget {
        Budget {
            bytes: compressed
                .saturating_mul(UNPACK_RATIO)
                .saturating_add(UNPACK_ALLOWANCE),
            entries: MAX_ENTRIES,
            extension_bytes: MAX_EXTENSION_BYTES,
            path_bytes: MAX_PATH_BYTES,
            path_depth: MAX_PATH_DEPTH,
        }
    }
}

const BLOCK: usize = 512;

/// What [`Guard`] tells the unpacker: why it refused (the tar reader's own error, which wraps
/// the guard's, may not carry the words), and the size it read for the last member.
#[derive(Debug, Default)]
struct Seen {
    refusal: Option<String>,
    last_size: Option<u64>,
}

/// Where the guard is in the tar stream.
#[derive(Debug)]
enum Position {
    /// The next block is a header.
    Header,
    /// `left` blocks of an entry's data (and padding) follow; an extension entry's are kept
    /// (at most its budget) in `kept`, its kind in `extension`.
    Data {
        left: u64,
        size: u64,
        extension: Option<u8>,
        kept: Vec<u8>,
    },
    /// After the end-of-archive block: the rest of the stream is only counted.
    End,
}

/// The decompressed stream between the gzip decoder and the tar reader, read block by block and
/// walked the way the tar reader (0.4) walks it: each header is checked against the [`Budget`]
/// before the tar reader sees it, so the tar reader never buffers an extension entry bigger than
/// the budget, never reaches an entry past the count, and never writes past the bytes. It knows
/// each member's size as the tar reader will: its PAX `size` record, else its header's. Kinds
/// the tar reader would read further headers for (GNU sparse files) are refused here, so the
/// two never disagree on where a header is; the unpacker checks each member's size against
/// the guard's all the same.
struct Guard<R> {
    inner: R,
    block: [u8; BLOCK],
    filled: usize,
    served: usize,
    position: Position,
    budget: Budget,
    /// Bytes planned (headers, sizes, padding, entry costs) or read past the end.
    spent: u64,
    entries: u64,
    /// The PAX extension (`x`) waiting for the member it describes.
    pax: Option<Vec<u8>>,
    /// The GNU long name (`L`) waiting for the member it names.
    long_name: Option<Vec<u8>>,
    seen: std::rc::Rc<std::cell::RefCell<Seen>>,
}

impl<R: std::io::Read> Guard<R> {
    fn new(inner: R, budget: Budget) -> (Self, std::rc::Rc<std::cell::RefCell<Seen>>) {
        let seen = std::rc::Rc::new(std::cell::RefCell::new(Seen::default()));
        let guard = Guard {
            inner,
            block: [0; BLOCK],
            filled: 0,
            served: 0,
            position: Position::Header,
            budget,
            spent: 0,
            entries: 0,
            pax: None,
            long_name: None,
            seen: seen.clone(),
        };
        (guard, seen)
    }

    fn refuse(&self, reason: String) -> std::io::Error {
        self.seen.borrow_mut().refusal = Some(reason.clone());
        std::io::Error::new(std::io::ErrorKind::InvalidData, reason)
    }

    fn bomb(&self) -> std::io::Error {
        self.refuse(format!(
            "unpacks to more than {} bytes ({UNPACK_RATIO} × its size + {UNPACK_ALLOWANCE}, each entry counted as at least {ENTRY_COST}): refused as a likely decompression bomb",
            self.budget.bytes
        ))
    }

    /// Plans `bytes` more of the budget.
    fn spend(&mut self, bytes: u64) -> std::io::Result<()> {
        self.spent = self.spent.saturating_add(bytes);
        if self.spent > self.budget.bytes {
            return Err(self.bomb());
        }
        Ok(())
    }

    /// Takes in the block just read, before any of it is served.
    fn observe(&mut self) -> std::io::Result<()> {
        match std::mem::replace(&mut self.position, Position::Header) {
            Position::End => {
                self.position = Position::End;
                self.spend(self.filled as u64)
            }
            Position::Header if self.filled < BLOCK => Ok(()),
            Position::Header => self.header(),
            Position::Data {
                left,
                size,
                extension,
                mut kept,
            } => {
                if extension.is_some() {
                    let want = (size as usize).saturating_sub(kept.len()).min(self.filled);
                    kept.extend_from_slice(&self.block[..want]);
                }
                if left > 1 {
                    self.position = Position::Data {
                        left: left - 1,
                        size,
                        extension,
                        kept,
                    };
                    return Ok(());
                }
                match extension {
                    Some(b'x') => self.pax = Some(kept),
                    Some(b'L') => self.long_name = Some(kept),
                    _ => {}
                }
                Ok(())
            }
        }
    }

    /// Checks the header in `block` against the budget.
    fn header(&mut self) -> std::io::Result<()> {
        if self.block.iter().all(|&b| b == 0) {
            // The tar reader stops at the first zero block; the rest is read to the gzip
            // trailer, and counted.
            self.position = Position::End;
            return Ok(());
        }
        self.spend(BLOCK as u64)?;
        self.entries += 1;
        if self.entries > self.budget.entries {
            return Err(self.refuse(format!(
                "holds more than {} entries: refused",
                self.budget.entries
            )));
        }
        let header = tar::Header::from_byte_slice(&self.block);
        let kind = header.entry_type().as_byte();
        let recognized = header.as_ustar().is_some() || header.as_gnu().is_some();
        let extension = matches!(kind, b'L' | b'K' | b'x' | b'g');
        let header_size = header
            .entry_size()
            .map_err(|e| self.refuse(format!("corrupt archive: {e}")))?;
        let size = if extension {
            header_size
        } else {
            self.pax
                .as_deref()
                .and_then(pax_size)
                .unwrap_or(header_size)
        };
        let name = self.name(header);
        let member = matches!(kind, b'0' | b'\0' | b'5');
        if !(member || (extension && recognized)) {
            return Err(self.refuse(format!(
                "entry `{name}` is not a regular file or directory (archives of results hold no links)"
            )));
        }
        if extension && size > self.budget.extension_bytes {
            let what = match kind {
                b'L' => "GNU long name",
                b'K' => "GNU long link",
                b'x' => "PAX header",
                _ => "PAX global header",
            };
            return Err(self.refuse(format!(
                "a {what} entry of {size} bytes, more than the {} an extension entry may hold: refused",
                self.budget.extension_bytes
            )));
        }
        let padded = size
            .checked_add(BLOCK as u64 - 1)
            .ok_or_else(|| self.bomb())?
            & !(BLOCK as u64 - 1);
        self.spend(padded)?;
        if !extension || kind == b'g' {
            // What the tar reader gives the unpacker as a member; it takes the extensions
            // waiting for it.
            self.spend(ENTRY_COST)?;
            self.pax = None;
            self.long_name = None;
            self.seen.borrow_mut().last_size = Some(size);
        }
        if padded > 0 {
            self.position = Position::Data {
                left: padded / BLOCK as u64,
                size,
                extension: (extension && kind != b'g').then_some(kind),
                kept: Vec::new(),
            };
        } else if extension {
            match kind {
                b'x' => self.pax = Some(Vec::new()),
                b'L' => self.long_name = Some(Vec::new()),
                _ => {}
            }
        }
        Ok(())
    }

    /// The member's name for an error: its long name or PAX path, else its header's.
    fn name(&self, header: &tar::Header) -> String {
        let from_pax = self.pax.as_deref().and_then(|p| {
            tar::PaxExtensions::new(p)
                .filter_map(|e| e.ok())
                .find(|e| e.key() == Ok("path"))
                .map(|e| String::from_utf8_lossy(e.value_bytes()).into_owned())
        });
        match (&self.long_name, from_pax) {
            (Some(long), _) => shown(long.strip_suffix(&[0]).unwrap_or(long)),
            (None, Some(path)) => shown(path.as_bytes()),
            (None, None) => shown(&header.path_bytes()),
        }
    }
}

/// The `size` record of a PAX extension as the tar reader reads it: the first `size` record,
/// none when a record before it is malformed or its value is not a number.
fn pax_size(pax: &[u8]) -> Option<u64> {
    for record in tar::PaxExtensions::new(pax) {
        let record = record.ok()?;
        if record.key() != Ok("size") {
            continue;
        }
        return record.value().ok()?.parse::<u64>().ok();
    }
    None
}

impl<R: std::io::Read> std::io::Read for Guard<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.served == self.filled {
            let mut filled = 0;
            while filled < BLOCK {
                match self.inner.read(&mut self.block[filled..]) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            self.block[filled..].fill(0);
            (self.filled, self.served) = (filled, 0);
            if filled == 0 {
                return Ok(0);
            }
            self.observe()?;
        }
        let n = out.len().min(self.filled - self.served);
        out[..n].copy_from_slice(&self.block[self.served..self.served + n]);
        self.served += n;
        Ok(n)
    }
}

/// A path inside an archive for an error: printable, and its start only when it is long.
fn shown(path: &[u8]) -> String {
    const SHOWN: usize = 120;
    let text = path.escape_ascii().to_string();
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], path.len()),
        None => text,
    }
}

/// Components of a path inside an archive, as the tar reader puts it under the target (empty and
/// `.` components are skipped).
fn depth(path: &[u8]) -> usize {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .count()
}

/// Unpacks an archive into `dest`, refusing paths outside it, entries that are not regular files
/// or directories, and anything beyond its [`Budget`] (checked from the headers before each
/// entry is read or written, so a bomb writes nothing big and buffers nothing big).
pub fn unpack(archive: &Path, dest: &Path) -> Result<()> {
    let file = crate::files::open(archive).at(archive)?;
    let compressed = file.metadata().at(archive)?.len();
    unpack_within(
        flate2::read::GzDecoder::new(file),
        Budget::of_archive(compressed),
        dest,
    )
    .map_err(|reason| ArchiveError::Unreadable {
        path: archive.to_owned(),
        reason,
    })
}

/// Unpacks the tar stream `stream` into `dest` within `budget` ([`unpack`]); why not, otherwise.
fn unpack_within(
    stream: impl std::io::Read,
    budget: Budget,
    dest: &Path,
) -> std::result::Result<(), String> {
    let (guard, seen) = Guard::new(stream, budget);
    // The guard's reason when it refused, else the tar reader's error.
    let why = |e: std::io::Error| {
        let refused = seen.borrow().refusal.clone();
        refused.unwrap_or_else(|| format!("corrupt archive: {e}"))
    };
    let mut tar = tar::Archive::new(guard);
    let entries = tar
        .entries()
        .map_err(|e| format!("not a readable .tar.gz: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(why)?;
        let name = shown(&entry.path_bytes());
        // The guard planned this entry's bytes from the size it read; the tar reader must read
        // the same, or the two disagree on where the next header is.
        let planned = seen.borrow().last_size;
        if planned != Some(entry.size()) {
            return Err(format!(
                "entry `{name}`: its size reads two ways ({} and {planned:?}): refused",
                entry.size()
            ));
        }
        // Results are regular files in directories: a link, device or FIFO could point
        // anywhere once unpacked, so an archive holding one is refused whole.
        let kind = entry.header().entry_type();
        let metadata = kind.is_pax_global_extensions() || kind.is_pax_local_extensions();
        if !(kind.is_file() || kind.is_dir() || metadata) {
            return Err(format!(
                "entry `{name}` is not a regular file or directory (archives of results hold no links)"
            ));
        }
        let path = entry.path_bytes();
        if path.len() > budget.path_bytes || depth(&path) > budget.path_depth {
            return Err(format!(
                "entry `{name}`: a path of {} bytes and {} levels, more than the {} bytes and {} levels an entry may have: refused",
                path.len(),
                depth(&path),
                budget.path_bytes,
                budget.path_depth
            ));
        }
        let inside = entry.unpack_in(dest).map_err(why)?;
        if !inside {
            return Err("an entry points outside the archive".into());
        }
    }
    // The tar reader stops at its end-of-archive blocks; reading the gzip stream to its end
    // checks its trailer (CRC-32 and size), so a corrupt trailer is caught without a sidecar.
    let mut rest = tar.into_inner();
    std::io::copy(&mut rest, &mut std::io::sink()).map_err(why)?;
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
    verify_into(target, &scratch.0)
}

/// Unpacks the archive `target` into the empty directory `dest` and checks what it holds, as
/// [`verify`] does; `dest` then holds the runs the report vouches for (when it is ok), so what
/// is checked is what is used, the archive read once.
pub fn verify_into(target: &Path, dest: &Path) -> Result<Report> {
    match unpack(target, dest) {
        Ok(()) => {
            let mut report = verify_dir(dest)?;
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
    remove_stale_staging(parent);
    // `mkdir` of a new name: a directory or link planted at the name (the temporary folder is
    // shared) makes it try the next name, never unpack into what is already there.
    let mut last = None;
    for _ in 0..64 {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = parent.join(format!("{STAGING}{}-{stamp}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some((dir, e)),
            Err(e) => return Err(PathIoError::new(dir, e).into()),
        }
    }
    let (dir, e) = last.expect("invariant: every try found its name taken");
    Err(PathIoError::new(dir, e).into())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A ustar header of `kind` for `path` (short) declaring `size` bytes.
    fn header(path: &str, kind: u8, size: u64) -> Vec<u8> {
        let mut h = tar::Header::new_ustar();
        h.set_path(path).expect("short path");
        h.set_size(size);
        h.set_entry_type(tar::EntryType::new(kind));
        h.set_mode(0o644);
        h.set_cksum();
        h.as_bytes().to_vec()
    }

    fn padded(data: &[u8]) -> Vec<u8> {
        let mut v = data.to_vec();
        v.resize(data.len().div_ceil(BLOCK) * BLOCK, 0);
        v
    }

    /// A whole entry: its header declaring its data's length, then the data.
    fn entry(path: &str, kind: u8, data: &[u8]) -> Vec<u8> {
        let mut v = header(path, kind, data.len() as u64);
        v.extend(padded(data));
        v
    }

    /// PAX records (`<length> <key>=<value>\n`, the length counting itself).
    fn pax(records: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in records {
            let body = format!(" {k}={v}\n");
            let mut n = body.len() + 1;
            while (n.to_string().len() + body.len()) != n {
                n += 1;
            }
            out.extend(format!("{n}{body}").into_bytes());
        }
        out
    }

    fn end() -> Vec<u8> {
        vec![0; 2 * BLOCK]
    }

    fn small() -> Budget {
        Budget {
            bytes: 1 << 20,
            entries: 64,
            extension_bytes: 1024,
            path_bytes: 256,
            path_depth: 8,
        }
    }

    fn run(
        stream: Vec<u8>,
        budget: Budget,
    ) -> (std::result::Result<(), String>, tempfile::TempDir) {
        let dest = tempfile::tempdir().expect("tmp");
        let got = unpack_within(std::io::Cursor::new(stream), budget, dest.path());
        (got, dest)
    }

    fn refused(got: std::result::Result<(), String>, says: &str) {
        match got {
            Err(reason) => assert!(reason.contains(says), "`{says}` not said: {reason}"),
            Ok(()) => panic!("unpacked; `{says}` expected"),
        }
    }

    #[test]
    fn a_pax_size_is_counted_as_the_tar_reader_reads_it() {
        // The header says 0 bytes, the PAX record 8 MiB (the data is there): refused from the
        // record, before a byte of the file is written.
        let mut s = entry("x", b'x', &pax(&[("size", &(8u64 << 20).to_string())]));
        s.extend(header("run/big.bin", b'0', 0));
        s.extend(vec![0; 8 << 20]);
        s.extend(end());
        let (got, dest) = run(s, small());
        refused(got, "decompression bomb");
        assert!(!dest.path().join("run/big.bin").exists());

        // Within the budget the record's size is what is unpacked.
        let mut s = entry("x", b'x', &pax(&[("size", "5")]));
        s.extend(header("run/five.txt", b'0', 0));
        s.extend(padded(b"12345"));
        s.extend(end());
        let (got, dest) = run(s, small());
        assert_eq!(got, Ok(()));
        let five = std::fs::read(dest.path().join("run/five.txt")).expect("unpacked");
        assert_eq!(five, b"12345");
    }

    #[test]
    fn an_extension_entry_beyond_its_budget_is_refused_before_it_is_read() {
        // Only the header is there: the refusal comes before the tar reader asks for the data
        // it would hold in memory.
        for (kind, says) in [
            (b'L', "GNU long name"),
            (b'x', "PAX header"),
            (b'K', "GNU long link"),
        ] {
            let s = header("././@LongLink", kind, 1 << 30);
            let (got, _dest) = run(s, small());
            refused(got, says);
        }
        // A long name within it is honoured.
        let name = format!("run/{}/file.txt", "n".repeat(150));
        let mut s = entry("././@LongLink", b'L', format!("{name}\0").as_bytes());
        s.extend(entry("run/short", b'0', b"ok"));
        s.extend(end());
        let (got, dest) = run(s, small());
        assert_eq!(got, Ok(()));
        assert!(dest.path().join(&name).is_file());
    }

    #[test]
    fn entries_are_counted_and_each_costs_a_block() {
        let many = |n: usize| {
            let mut s = Vec::new();
            for i in 0..n {
                s.extend(entry(&format!("d{i}/"), b'5', b""));
            }
            s.extend(end());
            s
        };
        let (got, _dest) = run(many(64), small());
        assert_eq!(got, Ok(()));
        let (got, dest) = run(many(65), small());
        refused(got, "more than 64 entries");
        let made = std::fs::read_dir(dest.path()).expect("ls").count();
        assert_eq!(
            made, 64,
            "the entry past the count is refused before it is made"
        );
        let budget = Budget {
            bytes: 10 * (ENTRY_COST + BLOCK as u64),
            ..small()
        };
        let (got, _dest) = run(many(11), budget);
        refused(got, "decompression bomb");
    }

    #[test]
    fn deep_or_long_paths_are_refused_before_anything_is_made() {
        let deep = format!("{}f", "a/".repeat(9));
        let mut s = entry("././@LongLink", b'L', deep.as_bytes());
        s.extend(entry("x", b'0', b"deep"));
        s.extend(end());
        let (got, dest) = run(s, small());
        refused(got, "10 levels");
        assert!(!dest.path().join("a").exists());
        let long = format!("run/{}", "n".repeat(300));
        let mut s = entry("x", b'x', &pax(&[("path", &long)]));
        s.extend(entry("x", b'0', b"long"));
        s.extend(end());
        let (got, _dest) = run(s, small());
        refused(got, "304 bytes");
    }

    #[test]
    fn links_devices_and_sparse_files_are_refused_by_their_header() {
        for kind in [b'1', b'2', b'3', b'4', b'6', b'7', b'S', b'V', b'M'] {
            let mut s = entry("run/odd", kind, b"");
            s.extend(end());
            let (got, _dest) = run(s, small());
            refused(got, "not a regular file or directory");
        }
        // An extension type in an old (pre-ustar) header is no extension to the tar reader.
        let mut h = tar::Header::new_old();
        h.set_path("././@LongLink").expect("path");
        h.set_size(0);
        h.set_entry_type(tar::EntryType::new(b'L'));
        h.set_cksum();
        let mut s = h.as_bytes().to_vec();
        s.extend(end());
        let (got, _dest) = run(s, small());
        refused(got, "not a regular file or directory");
    }

    #[test]
    fn bytes_after_the_end_of_the_archive_are_counted() {
        let mut s = entry("run/a.txt", b'0', b"a");
        s.extend(end());
        s.extend(vec![7; 2 << 20]);
        let (got, _dest) = run(s, small());
        refused(got, "decompression bomb");
    }
}
