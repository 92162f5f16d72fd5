//! The file-system operations the store performs, behind a trait so tests can inject faults.

use std::fmt::Debug;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// A file being written by the store (made durable later by [`Storage::sync_file`]).
pub trait StorageFile: Write + Send {}

/// The writes the store makes under `.mdl/objects`. Reads use plain files.
pub trait Storage: Debug + Send + Sync {
    /// `mkdir -p`.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Creates a new file, failing if it exists.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Atomically renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes a directory's entries durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Makes a written file's contents durable.
    fn sync_file(&self, path: &Path) -> io::Result<()>;
    /// Makes everything written to the file system that holds `path` durable, its files'
    /// contents and every directory's entries (`syncfs(2)`): one call for many files.
    fn sync_filesystem(&self, path: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

impl StorageFile for File {}

impl Storage for RealFs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        Ok(Box::new(
            File::options().write(true).create_new(true).open(path)?,
        ))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
    fn sync_file(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
    fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        rustix::fs::syncfs(File::open(path)?).map_err(io::Error::from)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
}
