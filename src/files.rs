//! Reading the files a user names, and those a command reads back (issue #35): regular files,
//! or a descriptor the command was handed already open. A pipe or a device named like a
//! manifest, a prompt file, an archive or a model's config would hold the command forever
//! (opening a FIFO waits for a writer; `/dev/zero` never ends), so each read checks the kind
//! first, without opening. `/dev/stdin`, `/dev/fd/N` and `/proc/self/fd/N` (a shell's `<(...)`,
//! the verl reward's pipe into `acpo score --input /dev/stdin`) are open already and end when
//! their writer closes them: read as they are.
//!
//! It is also the one home of an io error that names its path ([`PathIoError`], as `fs-err`
//! does for std): each module's error wraps it (`Io(#[from] PathIoError)`), and a call site
//! says `.at(path)?` ([`AtPath`]).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// An io error at a path: `<path>: <what the system said>`.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct PathIoError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl PathIoError {
    pub fn new(path: impl AsRef<Path>, source: io::Error) -> Self {
        PathIoError {
            path: path.as_ref().to_owned(),
            source,
        }
    }

    /// A refusal at `path` that the system did not raise (`kind`: what it is, `why`: the words).
    pub fn refused(path: impl AsRef<Path>, kind: io::ErrorKind, why: impl Into<String>) -> Self {
        Self::new(path, io::Error::new(kind, why.into()))
    }

    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }
}

/// `.at(path)`: an io result's error with the path it happened at.
pub trait AtPath<T> {
    fn at(self, path: impl AsRef<Path>) -> Result<T, PathIoError>;
}

impl<T> AtPath<T> for io::Result<T> {
    fn at(self, path: impl AsRef<Path>) -> Result<T, PathIoError> {
        self.map_err(|source| PathIoError::new(path, source))
    }
}

/// The directories directly under `root`, sorted by path; an entry that cannot be read is
/// passed over.
pub fn subdirs(root: &Path) -> Result<Vec<std::path::PathBuf>, PathIoError> {
    let mut dirs: Vec<std::path::PathBuf> = std::fs::read_dir(root)
        .at(root)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// [`std::fs::metadata`], naming the path.
pub fn metadata(path: impl AsRef<Path>) -> Result<std::fs::Metadata, PathIoError> {
    std::fs::metadata(path.as_ref()).at(path)
}

/// Why a path is refused.
pub const NOT_REGULAR: &str = "not a regular file (a pipe or a device would never end)";

/// Ok when `path` is a regular file (links followed) or one of the descriptors the process was
/// handed; its metadata error, or [`NOT_REGULAR`].
pub fn regular(path: &Path) -> io::Result<()> {
    if std::fs::metadata(path)?.is_file() || inherited(path) {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::InvalidInput, NOT_REGULAR))
    }
}

/// Whether `path` names a descriptor this process already holds open.
fn inherited(path: &Path) -> bool {
    path == Path::new("/dev/stdin")
        || ["/dev/fd", "/proc/self/fd"]
            .iter()
            .any(|dir| path.parent() == Some(Path::new(dir)))
}

/// [`std::fs::read_to_string`] of a regular file.
pub fn read_to_string(path: impl AsRef<Path>) -> io::Result<String> {
    regular(path.as_ref())?;
    std::fs::read_to_string(path)
}

/// [`std::fs::read`] of a regular file.
pub fn read(path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
    regular(path.as_ref())?;
    std::fs::read(path)
}

/// [`File::open`] of a regular file.
pub fn open(path: impl AsRef<Path>) -> io::Result<File> {
    regular(path.as_ref())?;
    File::open(path)
}

/// [`read_to_string`] of at most `limit` bytes: a longer file is an error saying so (kind
/// `InvalidData`), found after reading `limit + 1` bytes, so what is held never passes the limit
/// whatever the file's size (or a descriptor's stream) turns out to be.
pub fn read_to_string_at_most(path: impl AsRef<Path>, limit: u64) -> io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    open(path)?
        .take(limit.saturating_add(1))
        .read_to_string(&mut text)?;
    if text.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than the {limit} bytes read from it: refused"),
        ));
    }
    Ok(text)
}
