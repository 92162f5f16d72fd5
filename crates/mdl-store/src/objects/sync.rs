//! Making a batch's record files durable while the batch is still being written: each record is
//! handed to a few threads that fsync it as soon as it is in place, so the disk's work overlaps
//! the encoding of the records after it instead of all of it waiting for the end.
//! [`Syncer::finish`] waits for every file handed over and reports the first failure.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::fs::Storage;
use crate::StoreError;

/// fsyncs in flight at once, for files while a batch is written and for directories when it
/// finishes: enough for the file system to merge many into one journal commit (the threads
/// wait on the disk, not the CPU; 4 of them measured 15 % slower on an ext4 disk).
const SYNC_THREADS: usize = 16;

/// Record files waiting for their fsync, and whether more may come.
#[derive(Default)]
struct Queue {
    paths: VecDeque<PathBuf>,
    closed: bool,
    /// The first failure, with the file it was for.
    failed: Option<StoreError>,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
}

/// A pool that fsyncs record files as they are handed to it.
pub(super) struct Syncer {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Syncer {
    /// Starts the pool's threads.
    pub(super) fn start(fs: &Arc<dyn Storage>) -> Syncer {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
        });
        let workers = (0..SYNC_THREADS)
            .map(|_| {
                let (shared, fs) = (shared.clone(), fs.clone());
                std::thread::spawn(move || work(&shared, &*fs))
            })
            .collect();
        Syncer { shared, workers }
    }

    /// Queues `path` for its fsync.
    pub(super) fn push(&self, path: PathBuf) {
        let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.paths.push_back(path);
        drop(q);
        self.shared.ready.notify_one();
    }

    /// Waits until every queued file is durable; the first failure, if any.
    pub(super) fn finish(mut self) -> Result<(), StoreError> {
        self.close();
        let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        match q.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Lets the workers drain the queue and stop, and waits for them.
    fn close(&mut self) {
        let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.closed = true;
        drop(q);
        self.shared.ready.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Drop for Syncer {
    /// A batch abandoned on an error: its records are never published, but no fsync may still
    /// be running on them once the batch is gone.
    fn drop(&mut self) {
        self.close();
    }
}

/// One worker: fsyncs queued files until the queue is closed and empty. After a failure the
/// rest are still taken off the queue (the batch fails as a whole) but not synced.
fn work(shared: &Shared, fs: &dyn Storage) {
    loop {
        let mut q = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        let path = loop {
            if let Some(p) = q.paths.pop_front() {
                break p;
            }
            if q.closed {
                return;
            }
            q = shared.ready.wait(q).unwrap_or_else(|p| p.into_inner());
        };
        if q.failed.is_some() {
            continue;
        }
        drop(q);
        if let Err(e) = fs.sync_file(&path) {
            let mut q = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.failed.get_or_insert(StoreError::io("sync", &path)(e));
        }
    }
}

/// Runs `op` on every path, [`SYNC_THREADS`] at a time; the first failure, if any.
pub(super) fn sync_all(
    paths: &[PathBuf],
    op: &(dyn Fn(&Path) -> std::io::Result<()> + Sync),
) -> Result<(), StoreError> {
    let next = AtomicU64::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..SYNC_THREADS.min(paths.len()))
            .map(|_| {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(p) = paths.get(i) else {
                        return Ok(());
                    };
                    op(p).map_err(StoreError::io("sync", p))?;
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("sync thread panicked"))
    })
}
