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
/// not made yet). Removed when dropped.
pub fn incoming_file_in(dir: &Path, prefix: &str) -> Result<NamedTempFile, StoreError> {
    std::fs::create_dir_all(dir).map_err(StoreError::io("create", dir))?;
    let made = tempfile::Builder::new().prefix(prefix).tempfile_in(dir);
    made.map_err(StoreError::io("create", dir))
}

impl Store {
    /// An exclusive temporary file in `.mdl/incoming/` (created if missing), named
    /// `PREFIX…`; it is removed when dropped, and gc or `fsck --repair` removes one a killed
    /// process left.
    pub fn incoming_file(&self, prefix: &str) -> Result<NamedTempFile, StoreError> {
        incoming_file_in(&self.incoming()?, prefix)
    }

    /// A temporary folder in `.mdl/incoming/`, removed with what it holds when dropped (a tree
    /// uploaded for a commit, unpacked); gc or `fsck --repair` removes one a killed process left.
    pub fn incoming_dir(&self, prefix: &str) -> Result<tempfile::TempDir, StoreError> {
        let dir = self.incoming()?;
        let made = tempfile::Builder::new().prefix(prefix).tempdir_in(&dir);
        made.map_err(StoreError::io("create", &dir))
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
}
