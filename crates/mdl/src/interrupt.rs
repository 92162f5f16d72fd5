//! What an interrupted command must not leave behind: a checkout's temporary file, a clone's
//! half-made directory. Commands register such paths while they exist; the `mdl` binary's
//! SIGINT/SIGTERM handler calls [`remove_registered`] before it exits. (A SIGKILL cannot be
//! handled: what it leaves has a name the next command recognises and sweeps.)

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

static REGISTERED: Mutex<Vec<(u64, PathBuf)>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(0);
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Records that the process was interrupted (the signal handler's first step), so that the
/// command's own threads, whose files the handler is removing, do not report those files'
/// disappearance as the command's error.
pub fn mark_interrupted() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Whether [`mark_interrupted`] was called.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// A registration: the path is removed on interruption until this is dropped.
#[derive(Debug)]
pub struct Registered(u64);

/// Removes `path` (a file, or a directory and everything in it) if the process is interrupted
/// before the returned registration is dropped.
pub fn register(path: &Path) -> Registered {
    let key = NEXT.fetch_add(1, Ordering::Relaxed);
    REGISTERED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((key, path.to_path_buf()));
    Registered(key)
}

impl Drop for Registered {
    fn drop(&mut self) {
        REGISTERED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(k, _)| *k != self.0);
    }
}

/// Removes every registered path (for a signal handler, just before the process exits).
// The paths are this process's own temporary files and folders, registered when made.
#[allow(clippy::disallowed_methods)]
pub fn remove_registered() {
    let paths: Vec<PathBuf> = REGISTERED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain(..)
        .map(|(_, p)| p)
        .collect();
    // The command's other threads go on writing until the process exits: a clone's workers
    // may recreate a folder just removed, or add a file to it while it is being removed (which
    // then fails as not empty). So each path is removed until it has stayed gone for a moment.
    for p in paths {
        let mut gone_for = 0;
        for _ in 0..200 {
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => {
                    gone_for = 0;
                    let _ = std::fs::remove_dir_all(&p);
                }
                Ok(_) => {
                    gone_for = 0;
                    let _ = std::fs::remove_file(&p);
                }
                Err(_) => {
                    gone_for += 1;
                    if gone_for == 3 {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
        }
    }
}
