//! `meta.redb`: refs, reflog, the physical index, the commit index and configuration.
//!
//! Every value is a small versioned binary encoding documented in `docs/FORMAT.md`. Refs change
//! only through [`MetaWrite::update_ref`], a compare-and-swap that appends to the reflog in the
//! same transaction.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mdl_format::{ObjectId, Ref};
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::error::db;
use crate::guard::guarded;
use crate::journal::{Change, Journal, JournalState};
use crate::{LockMode, StoreError};

pub use crate::values::{CommitSummary, Expired, IndexEntry, Packed, RefValue, ReflogEntry};

/// The database file inside `.mdl`.
pub const META_FILE: &str = "meta.redb";

/// Version of the repository layout and of the encodings in this module: the newest this mdl
/// reads. A repository is created at version 1 and moves to [`PACKS_VERSION`] when the index
/// first names a record in a pack.
pub const REPO_VERSION: u64 = 2;

/// The first version whose index entries may name a record in a pack (`packs/`).
pub const PACKS_VERSION: u64 = 2;

/// How far past [`REPO_VERSION`] a stored version may be and still be taken for a newer mdl's
/// (versions go up one at a time); anything further is damage.
const NEWER_VERSIONS: u64 = 16;

pub(crate) const REFS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("refs");
pub(crate) const REFLOG: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("reflog");
pub(crate) const OBJECTS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("objects");
pub(crate) const COMMITS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("commits");
pub(crate) const CONFIG: TableDefinition<'_, &str, &str> = TableDefinition::new("config");
pub(crate) const INFO: TableDefinition<'_, &str, u64> = TableDefinition::new("info");
/// Reverse delta links: key `base id ‖ dependent id`, so a range scan lists what decodes
/// through a base (to keep depths true when a base itself becomes a delta).
pub(crate) const DEPENDENTS: TableDefinition<'_, &[u8], ()> = TableDefinition::new("dependents");
/// Objects deleted by a retention rule although commits still name them: id → [`Expired`].
pub(crate) const EXPIRED: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("expired");

/// Commits whose parents this repository does not hold, on purpose: where a shallow clone's
/// history was cut (key: commit id). Journaled.
pub(crate) const SHALLOW: TableDefinition<'_, &[u8], ()> = TableDefinition::new("shallow");

/// Commits whose parent's tensors wait to be re-encoded as reverse deltas against theirs
/// (deferred re-encodes): sequence number → commit id, oldest first. A hint, not history: it is
/// not journaled, and a rebuilt index starts without it (the repository then stays as large as
/// it is, nothing is lost).
pub(crate) const PENDING: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("pending");

/// The previous versions a queued commit's re-encode tried without a rewrite (it did not pay),
/// recorded by a run stopped before the commit's end so that the next run does not try them
/// again: key `commit id ‖ previous version's id`. Cleared with the commit's queue entry; a
/// hint like [`PENDING`].
pub(crate) const TRIED: TableDefinition<'_, &[u8], ()> = TableDefinition::new("tried");

/// The symbolic ref every repository starts with.
pub const HEAD: &str = "HEAD";

enum Db {
    Rw(redb::Database),
    Ro(redb::ReadOnlyDatabase),
}

/// How this process holds the database file. redb lets one process have it open for writing
/// or any number for reading, never both at once; so a process that does not own the
/// repository for its lifetime opens the file read-only for each read transaction (the
/// transaction lets go of it when it ends), and for writing for each write transaction (closed
/// once it is committed). A writer then keeps readers out only while it publishes — not for
/// the rest of its work, however long (maintenance re-encoding a series) — and a reader keeps
/// a writer waiting only for one read transaction.
enum Handle {
    /// Opened once, for the lifetime of the [`Meta`] (the server, which owns its repositories).
    Held(Db),
    /// Opened read-only for each read (a writer's reads share one open until it writes); for
    /// writing at the first write, and kept then.
    Brief {
        path: PathBuf,
        /// How long to wait for another process's transaction to let go of the file.
        wait: Duration,
        /// The database opened for writing, while this process writes: every transaction
        /// meanwhile goes through it (a read-only open would wait for it). Emptied when the
        /// write is committed.
        written: Mutex<Option<Arc<redb::Database>>>,
        /// For a writer (which holds the repository lock, so no other process can be waiting
        /// to publish): the read-only open its reads share until its first write, instead of
        /// one open a read. `None` for a reader.
        reads: Option<Mutex<SharedReads>>,
    },
}

/// A writer's read-only open, shared by its reads until it first writes.
enum SharedReads {
    /// Not opened yet.
    None,
    Open(Arc<redb::ReadOnlyDatabase>),
    /// Given up for a write: reads open the file each on its own from then on, so that no
    /// new shared open can keep the write waiting.
    Retired,
}

/// The open metadata database.
pub struct Meta {
    /// Always present; an option only so that `Drop` can close it inside [`guarded`].
    handle: Option<Handle>,
    /// Where changes to refs, reflogs, configuration and expiry go first (writers only).
    journal: Option<Journal>,
    /// A transaction failed to start or to commit (redb then refuses every later one until
    /// the database is reopened).
    failed: AtomicBool,
    /// Write transactions committed through this [`Meta`] (see [`Meta::generation`]).
    commits: AtomicU64,
}

impl std::fmt::Debug for Meta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Meta")
    }
}

impl Meta {
    /// Creates a database with every table, `HEAD → refs/heads/main` and the layout version,
    /// and the journal beside it.
    pub(crate) fn create(path: &Path) -> Result<(), StoreError> {
        guarded(|| Meta::create_tables(path))?;
        let head = Change::Ref {
            name: HEAD.into(),
            value: Some(RefValue::Symbolic(Ref::main().full())),
        };
        crate::journal::write_fresh(&journal_path(path), &[head])
    }

    /// Creates the database file and its tables (an empty index), with HEAD on main.
    pub(crate) fn create_tables(path: &Path) -> Result<(), StoreError> {
        let database = redb::Database::create(path).map_err(db)?;
        let txn = database.begin_write().map_err(db)?;
        {
            txn.open_table(REFLOG).map_err(db)?;
            txn.open_table(OBJECTS).map_err(db)?;
            txn.open_table(COMMITS).map_err(db)?;
            txn.open_table(CONFIG).map_err(db)?;
            txn.open_table(DEPENDENTS).map_err(db)?;
            txn.open_table(EXPIRED).map_err(db)?;
            txn.open_table(INFO)
                .map_err(db)?
                .insert("repo_version", 1)
                .map_err(db)?;
            let head = RefValue::Symbolic(Ref::main().full()).encode();
            txn.open_table(REFS)
                .map_err(db)?
                .insert(HEAD, head.as_slice())
                .map_err(db)?;
        }
        txn.commit().map_err(db)?;
        Ok(())
    }

    /// Opens the database for `mode`; `hold` keeps it open for the [`Meta`]'s lifetime (see
    /// [`Handle`]), else each transaction opens it, waiting up to `wait` for other processes'
    /// transactions.
    pub(crate) fn open(
        path: &Path,
        mode: LockMode,
        hold: bool,
        wait: Duration,
    ) -> Result<Meta, StoreError> {
        if !path.is_file() {
            return Err(StoreError::Damaged(format!(
                "{} is missing",
                path.display()
            )));
        }
        // A writer opens the file for writing first, whatever it holds later: that is what
        // lets redb recover from a writer that was killed.
        let db = match mode {
            LockMode::Write => Db::Rw(retrying(path, wait, || try_open(path))?),
            _ => Db::Ro(retrying(path, wait.max(PUBLISH), || try_open(path))?),
        };
        let mut meta = Meta {
            handle: Some(Handle::Held(db)),
            journal: None,
            failed: AtomicBool::new(false),
            commits: AtomicU64::new(0),
        };
        let version = meta.read()?.info("repo_version")?.unwrap_or(0);
        if version > REPO_VERSION + NEWER_VERSIONS {
            // A bit flipped in the stored number, not a format from the future: damage, which
            // `mdl fsck --repair` rebuilds, not a reason to refuse the repository forever.
            return Err(StoreError::Damaged(format!(
                "its repo_version, {version}, is no version mdl writes"
            )));
        }
        if version > REPO_VERSION {
            return Err(StoreError::NewerFormat {
                found: version,
                supported: REPO_VERSION,
            });
        }
        if mode == LockMode::Write {
            let dir = path.parent().unwrap_or(Path::new("."));
            let current = meta.read()?.journaled()?;
            meta.journal = Some(Journal::open(dir, &current)?);
        }
        if !hold {
            meta.close()?;
            meta.handle = Some(Handle::Brief {
                path: path.to_path_buf(),
                wait,
                written: Mutex::new(None),
                reads: (mode == LockMode::Write).then(|| Mutex::new(SharedReads::None)),
            });
        }
        Ok(meta)
    }

    /// Replaces the journal by one entry holding the current state (so it stops growing with
    /// every commit ever made). Runs as a write transaction, so no other change interleaves.
    pub fn compact_journal(&self) -> Result<(), StoreError> {
        let Some(journal) = &self.journal else {
            return Err(StoreError::ReadOnlyDatabase);
        };
        let w = self.write()?;
        journal.rewrite(&w.journaled()?.snapshot())?;
        drop(w);
        Ok(())
    }

    /// Whether a transaction of this database failed to start or commit: redb refuses every
    /// later one until the database is reopened (a long-running owner such as the server
    /// reopens it then).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// A number that changes whenever the database does, for a process that holds it for
    /// writing (the server): only then can no other process change it, so what was read from
    /// it stays true until this number moves. `None` for any other way of holding it.
    ///
    /// Read it before reading what it is to vouch for: a write counts once it is visible.
    pub fn generation(&self) -> Option<u64> {
        match self.handle() {
            Handle::Held(Db::Rw(_)) => Some(self.commits.load(Ordering::Acquire)),
            _ => None,
        }
    }

    fn note<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if matches!(
            r,
            Err(StoreError::Db(_) | StoreError::DbIo(_) | StoreError::Damaged(_))
        ) {
            self.failed.store(true, Ordering::Relaxed);
        }
        r
    }

    /// A consistent read-only view.
    pub fn read(&self) -> Result<MetaRead, StoreError> {
        let txn = self.note(guarded(|| match self.handle() {
            Handle::Held(Db::Rw(d)) => d.begin_read().map_err(db),
            Handle::Held(Db::Ro(d)) => d.begin_read().map_err(db),
            Handle::Brief {
                path,
                wait,
                written,
                reads,
            } => retrying(path, (*wait).max(PUBLISH), || {
                if let Some(d) = lock(written).as_ref() {
                    return d.begin_read().map(Some).map_err(db);
                }
                if let Some(reads) = reads {
                    let mut shared = lock(reads);
                    if let SharedReads::None = *shared {
                        if let Some(d) = try_open::<redb::ReadOnlyDatabase>(path)? {
                            *shared = SharedReads::Open(Arc::new(d));
                        }
                    }
                    match &*shared {
                        SharedReads::Open(d) => return d.begin_read().map(Some).map_err(db),
                        SharedReads::None => return Ok(None),
                        SharedReads::Retired => {}
                    }
                }
                // The transaction keeps the file open (and its shared lock) until it ends.
                try_open::<redb::ReadOnlyDatabase>(path)?
                    .map(|d| d.begin_read())
                    .transpose()
                    .map_err(db)
            }),
        }))?;
        Ok(MetaRead { txn })
    }

    /// A write transaction; nothing is visible until [`MetaWrite::commit_txn`].
    pub fn write(&self) -> Result<MetaWrite<'_>, StoreError> {
        let Some(journal) = &self.journal else {
            return Err(StoreError::ReadOnlyDatabase);
        };
        let mut kept = None;
        let txn = self.note(guarded(|| match self.handle() {
            Handle::Held(Db::Rw(d)) => d.begin_write().map_err(db),
            Handle::Held(Db::Ro(_)) => Err(StoreError::ReadOnlyDatabase),
            Handle::Brief {
                path,
                wait,
                written,
                reads,
            } => {
                // This process's own read-only open would keep the write open waiting; its
                // transactions still open end on their own.
                if let Some(reads) = reads {
                    *lock(reads) = SharedReads::Retired;
                }
                // Not holding `written` while waiting: a thread of this process may need a
                // read to finish the transaction this open waits for.
                let d = retrying(path, *wait, || {
                    if let Some(d) = lock(written).as_ref() {
                        return Ok(Some(d.clone()));
                    }
                    let opened = try_open::<redb::Database>(path)?;
                    Ok(opened.map(|d| lock(written).insert(Arc::new(d)).clone()))
                })?;
                kept = Some(written);
                d.begin_write().map_err(db)
            }
        }))?;
        Ok(MetaWrite {
            txn,
            journal,
            failed: &self.failed,
            commits: &self.commits,
            changes: Vec::new(),
            _written: write::Release(kept),
        })
    }
}

impl Meta {
    fn handle(&self) -> &Handle {
        self.handle.as_ref().expect("open until dropped")
    }

    /// Closes the database, whichever way it is held. Closing writes to it (redb records its
    /// allocator state), which can trip over damage like any other write: it is guarded too.
    fn close(&mut self) -> Result<(), StoreError> {
        let handle = self.handle.take();
        guarded(|| {
            drop(handle);
            Ok(())
        })
    }
}

impl Drop for Meta {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How the database file can be opened: for writing, or read-only.
trait Open: Sized {
    fn open(path: &Path) -> Result<Self, redb::DatabaseError>;
}

impl Open for redb::Database {
    fn open(path: &Path) -> Result<Self, redb::DatabaseError> {
        redb::Database::open(path)
    }
}

impl Open for redb::ReadOnlyDatabase {
    fn open(path: &Path) -> Result<Self, redb::DatabaseError> {
        redb::Builder::new().open_read_only(path)
    }
}

/// Opens the file once: `None` while another handle's lock keeps this one out.
fn try_open<D: Open>(path: &Path) -> Result<Option<D>, StoreError> {
    match D::open(path) {
        Ok(d) => Ok(Some(d)),
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => Ok(None),
        Err(e) => Err(open_err(e)),
    }
}

/// Runs `attempt` (inside [`guarded`]) until it opens the database (`Some`), trying again
/// while another handle has the file (a writer's publish keeps readers out; readers keep a
/// writer out) for up to `wait`, then failing as busy, naming the repository's writer.
/// How long a read waits for the database whatever `--wait` says: long enough for another
/// process's publish (a transaction of milliseconds, and the exit of the process that made
/// it, but its fsync can take far longer on a disk busy with other writes), so that a reader
/// never fails for one, while a writer's work never holds it up. It was 250 ms: 2 of 4,112
/// reads during a compaction of a 2 GiB series beside 2 GiB checkouts were refused.
const PUBLISH: Duration = Duration::from_secs(2);

fn retrying<T>(
    path: &Path,
    wait: Duration,
    mut attempt: impl FnMut() -> Result<Option<T>, StoreError>,
) -> Result<T, StoreError> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(200);
    loop {
        // Opening reads the file's header, which redb trusts: guarded like every call into it.
        if let Some(t) = guarded(&mut attempt)? {
            return Ok(t);
        }
        let waited = start.elapsed();
        if waited >= wait {
            let dir = path.parent().unwrap_or(Path::new("."));
            return Err(StoreError::Busy {
                holder: crate::lock::holder_of(dir),
                waited_secs: waited.as_secs(),
            });
        }
        std::thread::sleep(pause.min(wait - waited));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// The journal beside the database file at `path`.
fn journal_path(path: &Path) -> std::path::PathBuf {
    path.with_file_name(crate::journal::JOURNAL_FILE)
}

pub(crate) fn open_err(e: redb::DatabaseError) -> StoreError {
    match e {
        redb::DatabaseError::RepairAborted => StoreError::NeedsRecovery,
        // A file that is not a redb database at all (overwritten, truncated) reads as an I/O
        // or format error; either way the index must be rebuilt.
        redb::DatabaseError::Storage(redb::StorageError::Io(e))
            if e.kind() != std::io::ErrorKind::PermissionDenied =>
        {
            StoreError::Damaged(e.to_string())
        }
        other => db(other),
    }
}

#[macro_use]
mod read;
#[cfg(test)]
mod tests;
mod write;

pub(crate) use read::dependent_key;
use read::key_id;
pub use write::MetaWrite;

/// A read transaction.
pub struct MetaRead {
    txn: redb::ReadTransaction,
}

impl MetaRead {
    readers!();
}
