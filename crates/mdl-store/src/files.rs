//! The repository's files other than records and the database, written only here: exclusive
//! temporary files (an upload being received, a pack being sent, an evaluation's candidate
//! checkpoint, a large tensor's coded planes), small files replaced atomically (`serve.json`), and the removal of files that
//! interrupted writes left behind. Every other crate asks the store; a clippy rule
//! (`disallowed-methods` in `clippy.toml`) keeps direct `std::fs` writes out of them.

use std::io::Write;
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

use crate::{Store, StoreError};

/// Where uploads and outgoing packs are spooled.
pub const INCOMING_DIR: &str = "incoming";

/// An exclusive temporary file `dir/PREFIX…`, `dir` created if missing: [`Store::incoming_file`]
/// for a repository that is not open (`dir` its `.mdl/incoming`, or a folder beside a replica
/// not made yet). Removed when dropped. `PREFIX` starts with `.`: the temporaries of a process
/// that died are found by that ([`sweep_abandoned`]).
pub fn incoming_file_in(dir: &Path, prefix: &str) -> Result<NamedTempFile, StoreError> {
    debug_assert!(prefix.starts_with('.'), "{prefix}");
    std::fs::create_dir_all(dir).map_err(StoreError::io("create", dir))?;
    let made = tempfile::Builder::new().prefix(prefix).tempfile_in(dir);
    let file = made.map_err(StoreError::io("create", dir))?;
    claim(file.as_file()).map_err(StoreError::io("lock", file.path()))?;
    Ok(file)
}

/// A temporary folder in `incoming/` ([`Store::incoming_dir`]): removed with what it holds
/// when dropped, and claimed by its owner for as long as it lives.
#[derive(Debug)]
pub struct IncomingDir {
    dir: tempfile::TempDir,
    /// The folder opened, its lock held: the claim.
    _claim: std::fs::File,
}

impl IncomingDir {
    /// Where it is.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Takes the advisory lock of `file` (a temporary's own handle): while the process that made
/// a temporary lives, the lock cannot be taken by another, so a sweep at start tells a
/// temporary being written from one a killed process left, whatever its age.
fn claim(file: &std::fs::File) -> std::io::Result<()> {
    use rustix::fs::{flock, FlockOperation};
    flock(file, FlockOperation::NonBlockingLockExclusive).map_err(std::io::Error::from)
}

/// Temporaries younger than this are never swept: their maker may not have claimed them yet.
const SWEEP_MIN_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// Removes from `dir` (an `incoming/` folder) the temporaries whose maker is gone: those named
/// `.…` that nobody claims ([`claim`]) and are at least a few seconds old. A staged upload
/// (named without a dot) is left to gc's age rule. Returns the paths removed.
pub fn sweep_abandoned(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
    let now = std::time::SystemTime::now();
    let mut removed = Vec::new();
    for entry in entries {
        let path = entry.path();
        if !entry.file_name().as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let Ok(md) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let young = md
            .modified()
            .is_ok_and(|m| now.duration_since(m).unwrap_or_default() < SWEEP_MIN_AGE);
        if young || !(md.is_file() || md.is_dir()) {
            continue;
        }
        // Held while it is removed, so no owner can claim it meanwhile.
        let Ok(handle) = std::fs::File::open(&path) else {
            continue;
        };
        if claim(&handle).is_err() {
            continue;
        }
        let gone = if md.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        if gone.is_ok() {
            removed.push(path);
        }
    }
    removed
}

impl Store {
    /// An exclusive temporary file in `.mdl/incoming/` (created if missing), named
    /// `PREFIX…`; it is removed when dropped, and gc or `fsck --repair` removes one a killed
    /// process left.
    pub fn incoming_file(&self, prefix: &str) -> Result<NamedTempFile, StoreError> {
        incoming_file_in(&self.incoming()?, prefix)
    }

    /// A temporary folder in `.mdl/incoming/`, removed with what it holds when dropped (a tree
    /// uploaded for a commit, unpacked); a server's start, gc or `fsck --repair` removes one a
    /// killed process left. `PREFIX` starts with `.` (see [`incoming_file_in`]).
    pub fn incoming_dir(&self, prefix: &str) -> Result<IncomingDir, StoreError> {
        debug_assert!(prefix.starts_with('.'), "{prefix}");
        let dir = self.incoming()?;
        let made = tempfile::Builder::new().prefix(prefix).tempdir_in(&dir);
        let made = made.map_err(StoreError::io("create", &dir))?;
        let handle =
            std::fs::File::open(made.path()).map_err(StoreError::io("open", made.path()))?;
        claim(&handle).map_err(StoreError::io("lock", made.path()))?;
        Ok(IncomingDir {
            dir: made,
            _claim: handle,
        })
    }

    /// [`sweep_abandoned`] of this repository's `incoming/`.
    pub fn sweep_incoming(&self) -> Vec<PathBuf> {
        sweep_abandoned(&self.dir.join(INCOMING_DIR))
    }

    /// `.mdl/incoming/`, created if missing: where uploads wait to be committed.
    pub fn incoming(&self) -> Result<PathBuf, StoreError> {
        let dir = self.dir.join(INCOMING_DIR);
        std::fs::create_dir_all(&dir).map_err(StoreError::io("create", &dir))?;
        Ok(dir)
    }

    /// An exclusive temporary file `.mdl/PREFIX…SUFFIX` for a program to read (an evaluation
    /// command's candidate checkpoint); removed when dropped.
    pub fn scratch_file(&self, prefix: &str, suffix: &str) -> Result<NamedTempFile, StoreError> {
        tempfile::Builder::new()
            .prefix(prefix)
            .suffix(suffix)
            .tempfile_in(&self.dir)
            .map_err(StoreError::io("create", &self.dir))
    }

    /// An exclusive temporary folder `.mdl/PREFIX…` for a program to read (an evaluation
    /// command's candidate tree); removed when dropped.
    pub fn scratch_dir(&self, prefix: &str) -> Result<tempfile::TempDir, StoreError> {
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(&self.dir)
            .map_err(StoreError::io("create", &self.dir))
    }

    /// Creates the file `rel` (a `/`-separated relative path, its parents created) inside
    /// `dir`, a folder from [`Self::scratch_dir`].
    pub fn scratch_dir_file(dir: &Path, rel: &str) -> Result<std::fs::File, StoreError> {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(StoreError::io("create", parent))?;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(StoreError::io("create", &path))
    }

    /// Replaces `.mdl/NAME` with `bytes`, atomically and durably (a temporary file with
    /// permissions `mode`, fsynced, renamed over the old one, the directory fsynced): a reader
    /// sees the old file or the new one, never a part.
    pub fn replace_file(&self, name: &str, bytes: &[u8], mode: u32) -> Result<PathBuf, StoreError> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.join(name);
        let io = |op| StoreError::io(op, &path);
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .permissions(std::fs::Permissions::from_mode(mode))
            .tempfile_in(&self.dir)
            .map_err(io("create"))?;
        tmp.write_all(bytes).map_err(io("write"))?;
        tmp.as_file().sync_all().map_err(io("sync"))?;
        tmp.persist(&path).map_err(|e| io("rename")(e.error))?;
        self.fs.sync_dir(&self.dir).map_err(io("sync"))?;
        Ok(path)
    }

    /// Removes `.mdl/NAME` if it is there; whether it was.
    pub fn remove_file(&self, name: &str) -> bool {
        std::fs::remove_file(self.dir.join(name)).is_ok()
    }

    /// Removes a file that listing the store found left behind (a temporary record, an
    /// unindexed record, an abandoned upload); only a path inside this store's directory is
    /// touched. Whether it was removed.
    pub fn remove_leftover(&self, path: &Path) -> bool {
        let inside = path.starts_with(&self.dir)
            && !path
                .components()
                .any(|c| c == std::path::Component::ParentDir);
        // A folder only as a whole upload's (an unpacked tree in `incoming/`).
        let upload_dir = path.parent() == Some(&self.dir.join(INCOMING_DIR)) && path.is_dir();
        inside
            && if upload_dir {
                std::fs::remove_dir_all(path).is_ok()
            } else {
                std::fs::remove_file(path).is_ok()
            }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;

    use crate::{OpenOptions, RealFs, Store};

    #[test]
    fn files_are_replaced_whole_and_only_the_stores_own_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mdl = dir.path().join(".mdl");
        Store::init(&mdl, Arc::new(RealFs)).unwrap();
        let store = Store::open(&mdl, &OpenOptions::default()).unwrap();

        let path = store.replace_file("serve.json", b"one", 0o600).unwrap();
        store.replace_file("serve.json", b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let strays: Vec<_> = std::fs::read_dir(&mdl)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".serve.json"))
            .collect();
        assert!(strays.is_empty(), "{strays:?}");

        let upload = store.incoming_file(".upload-").unwrap();
        assert!(upload.path().starts_with(mdl.join(super::INCOMING_DIR)));
        let scratch = store.scratch_file("eval-", ".safetensors").unwrap();
        assert!(scratch.path().to_string_lossy().ends_with(".safetensors"));

        let precious = dir.path().join("precious");
        std::fs::write(&precious, b"x").unwrap();
        assert!(!store.remove_leftover(&precious));
        assert!(!store.remove_leftover(&mdl.join("../precious")));
        assert!(precious.exists());
        assert!(store.remove_leftover(upload.path()));
        assert!(!upload.path().exists());

        assert!(store.remove_file("serve.json"));
        assert!(!store.remove_file("serve.json"));
    }

    /// Ages `path` past the sweep's minimum age.
    fn age(path: &std::path::Path) {
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        let f = std::fs::File::open(path).unwrap();
        f.set_modified(old).unwrap();
    }

    #[test]
    fn a_sweep_removes_only_the_temporaries_of_a_maker_that_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let mdl = dir.path().join(".mdl");
        Store::init(&mdl, Arc::new(RealFs)).unwrap();
        let store = Store::open(&mdl, &OpenOptions::default()).unwrap();
        let incoming = store.incoming().unwrap();

        // Live temporaries (this process holds their claims), however old.
        let live_file = store.incoming_file(".upload-").unwrap();
        let live_dir = store.incoming_dir(".tree-").unwrap();
        std::fs::write(live_dir.path().join("a"), b"a").unwrap();
        age(live_file.path());
        age(live_dir.path());
        // What a killed process left: the same names, nobody's claim.
        let dead_file = incoming.join(".upload-dead");
        std::fs::write(&dead_file, b"x").unwrap();
        let dead_dir = incoming.join(".hf-commit-dead");
        std::fs::create_dir_all(dead_dir.join("sub")).unwrap();
        std::fs::write(dead_dir.join("sub/f"), b"y").unwrap();
        age(&dead_file);
        age(&dead_dir);
        // Just made (its maker may not have claimed it yet), and a staged upload.
        let young = incoming.join(".upload-young");
        std::fs::write(&young, b"z").unwrap();
        let staged = incoming.join("lfs-0123");
        std::fs::write(&staged, b"w").unwrap();
        age(&staged);

        let mut removed = store.sweep_incoming();
        removed.sort();
        assert_eq!(removed, vec![dead_dir.clone(), dead_file.clone()]);
        assert!(live_file.path().exists() && live_dir.path().join("a").exists());
        assert!(young.exists() && staged.exists());
        assert!(!dead_file.exists() && !dead_dir.exists());
        drop(live_file);
        let gone = live_dir.path().to_path_buf();
        drop(live_dir);
        assert!(!gone.exists());
    }
}
