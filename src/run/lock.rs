//! Exclusive locks on what a process writes: a run directory (two `train` processes on one run
//! would interleave their lines and checkpoints) and a created model (two runs sharing it would
//! race on its `.partial` build). The lock is `flock` on a hidden file beside the directory, so
//! it never enters the directory's SHA256SUMS and the OS releases it when the process dies: a
//! kill leaves no stale lock. (Without `flock`, on non-Unix systems, nothing is locked.)

use std::fs::File;
use std::path::{Path, PathBuf};

/// Held while its owner writes; released when dropped.
#[derive(Debug)]
pub struct Lock {
    _file: File,
    pub path: PathBuf,
}

/// Whether to wait for another holder or give up at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    Block,
    NoWait,
}

/// The lock file of `dir`: `.<name>.lock` beside it. It stays after use (removing a lock file
/// another process may be waiting on would let a third one lock a new file beside it).
pub fn path_for(dir: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(dir.file_name().unwrap_or_default());
    name.push(".lock");
    dir.with_file_name(name)
}

/// Locks `dir` (creating its parent if needed). `Ok(None)`: another process holds it and
/// `wait` is [`Wait::NoWait`].
pub fn acquire(dir: &Path, wait: Wait) -> std::io::Result<Option<Lock>> {
    let path = path_for(dir);
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.create(true).truncate(false).write(true);
    // A link planted at the lock's name is refused, never opened (nor created) where it leads.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NOFOLLOW);
    let file = options.open(&path)?;
    if !flock(&file, wait)? {
        return Ok(None);
    }
    Ok(Some(Lock { _file: file, path }))
}

#[cfg(unix)]
fn flock(file: &File, wait: Wait) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let op = match wait {
        Wait::Block => libc::LOCK_EX,
        Wait::NoWait => libc::LOCK_EX | libc::LOCK_NB,
    };
    loop {
        // SAFETY: flock on a descriptor this function's caller owns for the call's duration.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(err),
        }
    }
}

#[cfg(not(unix))]
fn flock(_file: &File, _wait: Wait) -> std::io::Result<bool> {
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_link_planted_at_the_lock_is_refused_and_not_followed() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("run");
        let victim = tmp.path().join("victim");
        std::os::unix::fs::symlink(&victim, path_for(&dir)).expect("link");
        assert!(acquire(&dir, Wait::NoWait).is_err());
        assert!(
            !victim.exists(),
            "the lock was created where the link leads"
        );
        std::fs::remove_file(path_for(&dir)).expect("rm");
        let held = acquire(&dir, Wait::NoWait).expect("lock").expect("free");
        assert!(acquire(&dir, Wait::NoWait).expect("lock").is_none());
        drop(held);
        assert!(acquire(&dir, Wait::NoWait).expect("lock").is_some());
    }
}
