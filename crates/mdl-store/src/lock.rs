//! The writers' lock: an advisory lock on `.mdl/lock` that records who holds it. Writers take it
//! exclusively, one at a time; `mdl fsck` takes it shared; readers do not take it.

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::StoreError;

/// The lock file inside `.mdl`.
pub(crate) const LOCK_FILE: &str = "lock";
/// Beside it while a writer waits for the lock: work that gives way to writers (deferred
/// re-encodes in the background) stops at its next step when it sees this.
pub(crate) const WANTED_FILE: &str = "lock.wanted";

/// Whether a writer of the repository at `dir` (the `.mdl` directory) is waiting for the lock.
pub fn writer_waiting(dir: &Path) -> bool {
    dir.join(WANTED_FILE).exists()
}

/// How a process uses the repository.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// Reads only, beside anything else: takes no repository lock, so it never waits for a
    /// writer's work (only, for a moment, for its publish; see `meta`).
    Read,
    /// Reads a repository no writer is changing (fsck): shares the lock with other checks and
    /// waits for a writer to finish.
    Check,
    /// Changes the repository: owns the lock exclusively, so writers take turns.
    Write,
    /// Reads a repository whose files may not be written at all.
    ReadOnlyFs,
}

/// A held repository lock; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct RepoLock {
    file: File,
    mode: LockMode,
}

impl Drop for RepoLock {
    fn drop(&mut self) {
        if self.mode == LockMode::Write {
            // Clear the holder note; a killed holder leaves it behind, which `holder` detects.
            let _ = self.file.set_len(0);
        }
    }
}

/// Whether the repository directory is marked read-only (no write permission bits).
///
/// Checked on the permission bits rather than by trying a write, so a repository made
/// read-only with `chmod -R a-w` is treated as such even for root.
pub(crate) fn is_read_only(dir: &Path) -> bool {
    std::fs::metadata(dir)
        .map(|m| m.permissions().readonly())
        .unwrap_or(false)
}

impl RepoLock {
    /// Takes the lock of the repository at `dir`, waiting up to `wait` for another holder.
    pub fn acquire(
        dir: &Path,
        mode: LockMode,
        wait: Duration,
        purpose: &str,
    ) -> Result<RepoLock, StoreError> {
        let path = dir.join(LOCK_FILE);
        let mut file = match mode {
            LockMode::Write => File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path),
            LockMode::Read | LockMode::Check | LockMode::ReadOnlyFs => File::open(&path),
        }
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EROFS) | Some(libc::EPERM) => {
                StoreError::ReadOnly(dir.to_path_buf())
            }
            _ => StoreError::Io {
                op: "open",
                path: path.clone(),
                source: e,
            },
        })?;
        let start = Instant::now();
        let mut told = false;
        let wanted = dir.join(WANTED_FILE);
        // A writer that has to wait says so (every try, in case another waiter took the lock and
        // removed the note), and removes the note once it has the lock or gives up.
        let waiting = |yes: bool| {
            if mode != LockMode::Write {
                return;
            }
            if yes && !wanted.exists() {
                let _ = File::create(&wanted);
            } else if !yes {
                let _ = std::fs::remove_file(&wanted);
            }
        };
        let mut waited_at_all = false;
        let mut nap = Duration::from_millis(1);
        loop {
            let attempt = match mode {
                LockMode::Write => file.try_lock(),
                LockMode::Read | LockMode::Check | LockMode::ReadOnlyFs => file.try_lock_shared(),
            };
            match attempt {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) => {
                    let waited = start.elapsed();
                    if waited >= wait {
                        if waited_at_all {
                            waiting(false);
                        }
                        return Err(StoreError::Busy {
                            holder: holder(&mut file),
                            waited_secs: waited.as_secs(),
                        });
                    }
                    if !told && waited >= Duration::from_millis(500) {
                        tracing::warn!("waiting for the repository, held by {}", holder(&mut file));
                        told = true;
                    }
                    waiting(true);
                    waited_at_all = true;
                    // Short naps first: work that gives way to writers lets go within
                    // milliseconds of seeing the note.
                    std::thread::sleep(
                        nap.min(wait.saturating_sub(waited))
                            .max(Duration::from_millis(1)),
                    );
                    nap = (nap * 2).min(Duration::from_millis(25));
                }
                Err(TryLockError::Error(e)) => {
                    return Err(StoreError::Io {
                        op: "lock",
                        path,
                        source: e,
                    });
                }
            }
        }
        if waited_at_all {
            waiting(false);
        }
        if mode == LockMode::Write {
            // Record who holds the repository for anyone who has to wait. The lock file is not
            // part of the repository's data, so this write does not go through the store helper.
            let note = format!(
                "pid {} ({}) since {}",
                std::process::id(),
                purpose,
                mdl_format::Timestamp::now()
            );
            let _ = file.set_len(0);
            let _ = file.rewind();
            let _ = file.write_all(note.as_bytes());
        }
        Ok(RepoLock { file, mode })
    }
}

/// Who holds the repository at `dir`, as its writer recorded (for a process that waited on the
/// database rather than on the lock).
pub(crate) fn holder_of(dir: &Path) -> String {
    match File::open(dir.join(LOCK_FILE)) {
        Ok(mut file) => holder(&mut file),
        Err(_) => "another process".to_string(),
    }
}

fn holder(file: &mut File) -> String {
    let mut s = String::new();
    let _ = file.rewind();
    let _ = file.take(4096).read_to_string(&mut s);
    let s = s.trim();
    let alive = s
        .strip_prefix("pid ")
        .and_then(|rest| rest.split_whitespace().next())
        .is_some_and(|pid| {
            Path::new("/proc").join(pid).exists() || !Path::new("/proc/self").exists()
        });
    if s.is_empty() || !alive {
        "another process (reading)".to_string()
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_writer_times_out_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let _held =
            RepoLock::acquire(dir.path(), LockMode::Write, Duration::ZERO, "mdl commit a").unwrap();
        let err = RepoLock::acquire(dir.path(), LockMode::Write, Duration::from_millis(100), "x")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        assert!(err.contains("mdl commit a"), "{err}");
        let err = RepoLock::acquire(dir.path(), LockMode::Read, Duration::ZERO, "x").unwrap_err();
        assert!(matches!(err, StoreError::Busy { .. }));
    }

    #[test]
    fn readers_share() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LOCK_FILE), "").unwrap();
        let _a = RepoLock::acquire(dir.path(), LockMode::Read, Duration::ZERO, "a").unwrap();
        let _b = RepoLock::acquire(dir.path(), LockMode::Read, Duration::ZERO, "b").unwrap();
        assert!(RepoLock::acquire(dir.path(), LockMode::Write, Duration::ZERO, "w").is_err());
    }
}
