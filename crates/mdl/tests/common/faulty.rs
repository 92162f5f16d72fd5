//! [`FaultyFs`]: a file system that fails on purpose, for the tests that check every failure
//! leaves a repository as it was: the store's `Storage` trait implemented here, in the tests,
//! so that no build of the store itself carries it (nor a feature that would make the tests'
//! build of every crate above the store differ from a program's).

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mdl_store::fs::{RealFs, Storage, StorageFile};

/// A file system that runs out of space after a byte budget, or fails a chosen operation, to
/// test that every failure leaves the repository as it was.
#[derive(Debug, Clone)]
pub(crate) struct FaultyFs {
    budget: Arc<AtomicU64>,
    fail_renames_after: Arc<AtomicU64>,
    fail_syncs_after: Arc<AtomicU64>,
}

impl FaultyFs {
    /// Allows `bytes` bytes of writes, then fails every write with `ENOSPC`.
    pub(crate) fn disk_full_after(bytes: u64) -> Self {
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
    pub(crate) fn syncs_fail_after(n: u64) -> Self {
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
    pub(crate) fn renames_fail_after(n: u64) -> Self {
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
    fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        self.count_sync()?;
        RealFs.sync_filesystem(path)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        RealFs.remove_file(path)
    }
}
