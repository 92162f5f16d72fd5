//! The file-system operations the store performs, behind a trait so tests can inject faults.

use std::fmt::Debug;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
}

/// A file system that runs out of space after a byte budget, or fails a chosen operation, to
/// test that every failure leaves the repository as it was.
#[derive(Debug, Clone)]
pub struct FaultyFs {
    budget: Arc<AtomicU64>,
    fail_renames_after: Arc<AtomicU64>,
    fail_syncs_after: Arc<AtomicU64>,
}

impl FaultyFs {
    /// Allows `bytes` bytes of writes, then fails every write with `ENOSPC`.
    pub fn disk_full_after(bytes: u64) -> Self {
        FaultyFs {
            budget: Arc::new(AtomicU64::new(bytes)),
            ..FaultyFs::none()
        }
    }

    /// Fails nothing.
    fn none() -> Self {
        FaultyFs {
            budget: Arc::new(AtomicU64::new(u64::MAX)),
            fail_renames_after: Arc::new(AtomicU64::new(u64::MAX)),
            fail_syncs_after: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }

    /// Allows `n` file or directory fsyncs, then fails the next ones with `EIO` (a disk that
    /// reports a write error).
    pub fn syncs_fail_after(n: u64) -> Self {
        FaultyFs {
            fail_syncs_after: Arc::new(AtomicU64::new(n)),
            ..FaultyFs::none()
        }
    }

    fn count_sync(&self) -> io::Result<()> {
        self.fail_syncs_after
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .map(|_| ())
            .map_err(|_| io::Error::from_raw_os_error(libc::EIO))
    }

    /// Allows `n` renames, then fails the next ones with `EIO` (a crash-like failure between
    /// writing a record and publishing it).
    pub fn renames_fail_after(n: u64) -> Self {
        FaultyFs {
            fail_renames_after: Arc::new(AtomicU64::new(n)),
            ..FaultyFs::none()
        }
    }

    fn take(&self, n: u64) -> io::Result<()> {
        self.budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(n))
            .map(|_| ())
            .map_err(|_| {
                self.budget.store(0, Ordering::SeqCst);
                io::Error::from_raw_os_error(libc::ENOSPC)
            })
    }
}

struct FaultyFile {
    inner: File,
    fs: FaultyFs,
}

impl Write for FaultyFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.fs.take(buf.len() as u64)?;
        self.inner.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl StorageFile for FaultyFile {}

impl Storage for FaultyFs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        RealFs.create_dir_all(path)
    }
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        self.take(0)?;
        let inner = File::options().write(true).create_new(true).open(path)?;
        Ok(Box::new(FaultyFile {
            inner,
            fs: self.clone(),
        }))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.fail_renames_after
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .map_err(|_| io::Error::from_raw_os_error(libc::EIO))?;
        RealFs.rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.count_sync()?;
        RealFs.sync_dir(path)
    }
    fn sync_file(&self, path: &Path) -> io::Result<()> {
        self.count_sync()?;
        RealFs.sync_file(path)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        RealFs.remove_file(path)
    }
}
