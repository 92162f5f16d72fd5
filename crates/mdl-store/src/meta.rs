//! `meta.redb`: refs, reflog, the physical index, the commit index and configuration.
//!
//! Every value is a small versioned binary encoding documented in `docs/FORMAT.md`. Refs change
//! only through [`MetaWrite::update_ref`], a compare-and-swap that appends to the reflog in the
//! same transaction.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mdl_format::{ObjectId, Ref, Timestamp};
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::error::db;
use crate::guard::guarded;
use crate::journal::{Change, Journal, JournalState};
use crate::{LockMode, StoreError};

pub use crate::values::{CommitSummary, Expired, IndexEntry, RefValue, ReflogEntry};

/// The database file inside `.mdl`.
pub const META_FILE: &str = "meta.redb";

/// Version of the repository layout and of the encodings in this module.
pub const REPO_VERSION: u64 = 1;

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

/// Commits whose parent's tensors wait to be re-encoded as reverse deltas against theirs
/// (deferred re-encodes): sequence number → commit id, oldest first. A hint, not history: it is
/// not journaled, and a rebuilt index starts without it (the repository then stays as large as
/// it is, nothing is lost).
pub(crate) const PENDING: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("pending");

/// The symbolic ref every repository starts with.
pub const HEAD: &str = "HEAD";

enum Db {
    Rw(redb::Database),
    Ro(redb::ReadOnlyDatabase),
}

/// How this process holds the database file. redb lets one process have it open for writing
/// or any number for reading, never both at once; so a process that does not own the
/// repository for its lifetime opens the file read-only for each read transaction (the
/// transaction lets go of it when it ends), and for writing only when it first writes. A commit
/// then keeps readers out only from its publish on, and a reader keeps a writer waiting only
/// for one read transaction.
enum Handle {
    /// Opened once, for the lifetime of the [`Meta`] (the server, which owns its repositories).
    Held(Db),
    /// Opened read-only for each read; for writing at the first write, and kept then.
    Brief {
        path: PathBuf,
        /// How long to wait for another process's transaction to let go of the file.
        wait: Duration,
        /// The database opened for writing, once this process has written: every later
        /// transaction goes through it (a read-only open would wait for it).
        written: Mutex<Option<Arc<redb::Database>>>,
    },
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
                .insert("repo_version", REPO_VERSION)
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
            _ => Db::Ro(retrying(path, wait, || try_open(path))?),
        };
        let mut meta = Meta {
            handle: Some(Handle::Held(db)),
            journal: None,
            failed: AtomicBool::new(false),
            commits: AtomicU64::new(0),
        };
        let version = meta.read()?.info("repo_version")?.unwrap_or(0);
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
            } => retrying(path, *wait, || {
                if let Some(d) = lock(written).as_ref() {
                    return d.begin_read().map(Some).map_err(db);
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
        let txn = self.note(guarded(|| match self.handle() {
            Handle::Held(Db::Rw(d)) => d.begin_write().map_err(db),
            Handle::Held(Db::Ro(_)) => Err(StoreError::ReadOnlyDatabase),
            Handle::Brief {
                path,
                wait,
                written,
            } => {
                // Not holding `written` while waiting: a thread of this process may need a
                // read to finish the transaction this open waits for.
                let d = retrying(path, *wait, || {
                    if let Some(d) = lock(written).as_ref() {
                        return Ok(Some(d.clone()));
                    }
                    let opened = try_open::<redb::Database>(path)?;
                    Ok(opened.map(|d| lock(written).insert(Arc::new(d)).clone()))
                })?;
                d.begin_write().map_err(db)
            }
        }))?;
        Ok(MetaWrite {
            txn,
            journal,
            failed: &self.failed,
            commits: &self.commits,
            changes: Vec::new(),
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

/// Read access shared by read and write transactions.
macro_rules! readers {
    () => {
        /// The oldest commit whose deferred re-encode is pending, with its sequence number.
        pub fn pending_first(&self) -> Result<Option<(u64, ObjectId)>, StoreError> {
            guarded(|| {
                let t = match self.txn.open_table(PENDING) {
                    Ok(t) => t,
                    // Repositories written before deferred re-encodes have no such table.
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                    Err(e) => return Err(db(e)),
                };
                let first = t.first().map_err(db)?;
                first
                    .map(|(k, v)| Ok((k.value(), key_id(v.value())?)))
                    .transpose()
            })
        }

        /// How many commits' deferred re-encodes are pending.
        pub fn pending_count(&self) -> Result<u64, StoreError> {
            guarded(|| match self.txn.open_table(PENDING) {
                Ok(t) => t.len().map_err(db),
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
                Err(e) => Err(db(e)),
            })
        }

        /// A ref's value.
        pub fn get_ref(&self, name: &str) -> Result<Option<RefValue>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(REFS).map_err(db)?;
                let v = t.get(name).map_err(db)?;
                v.map(|v| RefValue::decode(v.value())).transpose()
            })
        }

        /// Refs whose names start with `prefix`, in name order.
        pub fn refs(&self, prefix: &str) -> Result<Vec<(String, RefValue)>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(REFS).map_err(db)?;
                let mut out = Vec::new();
                for item in t.range(prefix..).map_err(db)? {
                    let (k, v) = item.map_err(db)?;
                    if !k.value().starts_with(prefix) {
                        break;
                    }
                    out.push((k.value().to_string(), RefValue::decode(v.value())?));
                }
                Ok(out)
            })
        }

        /// The reflog of a ref, oldest first.
        pub fn reflog(&self, name: &str) -> Result<Vec<ReflogEntry>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(REFLOG).map_err(db)?;
                let mut out = Vec::new();
                for item in t.range((name, 0)..=(name, u64::MAX)).map_err(db)? {
                    let (_, v) = item.map_err(db)?;
                    out.push(ReflogEntry::decode(v.value())?);
                }
                Ok(out)
            })
        }

        /// An object's index entry.
        pub fn object(&self, id: &ObjectId) -> Result<Option<IndexEntry>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(OBJECTS).map_err(db)?;
                let v = t.get(id.as_bytes().as_slice()).map_err(db)?;
                v.map(|v| IndexEntry::decode(v.value())).transpose()
            })
        }

        /// Every indexed object, in id order.
        pub fn objects(&self) -> Result<Vec<(ObjectId, IndexEntry)>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(OBJECTS).map_err(db)?;
                let mut out = Vec::new();
                for item in t.iter().map_err(db)? {
                    let (k, v) = item.map_err(db)?;
                    out.push((key_id(k.value())?, IndexEntry::decode(v.value())?));
                }
                Ok(out)
            })
        }

        /// A commit's summary.
        pub fn commit(&self, id: &ObjectId) -> Result<Option<CommitSummary>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(COMMITS).map_err(db)?;
                let v = t.get(id.as_bytes().as_slice()).map_err(db)?;
                v.map(|v| CommitSummary::decode(v.value())).transpose()
            })
        }

        /// Every commit, in id order.
        pub fn commits(&self) -> Result<Vec<(ObjectId, CommitSummary)>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(COMMITS).map_err(db)?;
                let mut out = Vec::new();
                for item in t.iter().map_err(db)? {
                    let (k, v) = item.map_err(db)?;
                    out.push((key_id(k.value())?, CommitSummary::decode(v.value())?));
                }
                Ok(out)
            })
        }

        /// Commits whose id starts with `prefix`.
        pub fn commits_with_prefix(
            &self,
            prefix: &mdl_format::IdPrefix,
        ) -> Result<Vec<ObjectId>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(COMMITS).map_err(db)?;
                let lower = prefix.lower_bound();
                let mut out = Vec::new();
                for item in t.range(lower.as_bytes().as_slice()..).map_err(db)? {
                    let (k, _) = item.map_err(db)?;
                    let id = key_id(k.value())?;
                    if !prefix.matches(&id) {
                        break;
                    }
                    out.push(id);
                }
                Ok(out)
            })
        }

        /// Objects whose records name `base` as their delta base.
        pub fn dependents(&self, base: &ObjectId) -> Result<Vec<ObjectId>, StoreError> {
            guarded(|| {
                let t = match self.txn.open_table(DEPENDENTS) {
                    Ok(t) => t,
                    // Repositories written before delta codecs have no such table yet.
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(e) => return Err(db(e)),
                };
                let lo = dependent_key(base, &ObjectId::from_bytes([0; 32]));
                let hi = dependent_key(base, &ObjectId::from_bytes([0xff; 32]));
                let mut out = Vec::new();
                for item in t.range(lo.as_slice()..=hi.as_slice()).map_err(db)? {
                    let (k, _) = item.map_err(db)?;
                    out.push(key_id(&k.value()[32..])?);
                }
                Ok(out)
            })
        }

        /// Whether (and how) a retention rule deleted an object.
        pub fn expired(&self, id: &ObjectId) -> Result<Option<Expired>, StoreError> {
            guarded(|| {
                let t = match self.txn.open_table(EXPIRED) {
                    Ok(t) => t,
                    // Repositories written before retention rules have no such table yet.
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                    Err(e) => return Err(db(e)),
                };
                let v = t.get(id.as_bytes().as_slice()).map_err(db)?;
                v.map(|v| Expired::decode(v.value())).transpose()
            })
        }

        /// Every object deleted by a retention rule, in id order.
        pub fn expired_all(&self) -> Result<Vec<(ObjectId, Expired)>, StoreError> {
            guarded(|| {
                let t = match self.txn.open_table(EXPIRED) {
                    Ok(t) => t,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(e) => return Err(db(e)),
                };
                let mut out = Vec::new();
                for item in t.iter().map_err(db)? {
                    let (k, v) = item.map_err(db)?;
                    out.push((key_id(k.value())?, Expired::decode(v.value())?));
                }
                Ok(out)
            })
        }

        /// Names of the refs that have reflog entries.
        pub fn reflog_names(&self) -> Result<Vec<String>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(REFLOG).map_err(db)?;
                let mut out: Vec<String> = Vec::new();
                for item in t.iter().map_err(db)? {
                    let (k, _) = item.map_err(db)?;
                    let name = k.value().0;
                    if out.last().map(String::as_str) != Some(name) {
                        out.push(name.to_string());
                    }
                }
                Ok(out)
            })
        }

        /// A configuration value.
        pub fn config(&self, key: &str) -> Result<Option<String>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(CONFIG).map_err(db)?;
                let v = t.get(key).map_err(db)?;
                Ok(v.map(|v| v.value().to_string()))
            })
        }

        /// Configuration values whose keys start with `prefix`, in key order.
        pub fn configs(&self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(CONFIG).map_err(db)?;
                let mut out = Vec::new();
                for item in t.range(prefix..).map_err(db)? {
                    let (k, v) = item.map_err(db)?;
                    if !k.value().starts_with(prefix) {
                        break;
                    }
                    out.push((k.value().to_string(), v.value().to_string()));
                }
                Ok(out)
            })
        }

        /// What the journal must hold for this database: refs, reflogs, configuration and
        /// records of expiry.
        pub fn journaled(&self) -> Result<JournalState, StoreError> {
            let mut state = JournalState::default();
            for (name, value) in self.refs("")? {
                state.refs.insert(name, value);
            }
            for name in self.reflog_names()? {
                let log = self.reflog(&name)?;
                state.reflogs.insert(name, log);
            }
            state.config = self.configs("")?.into_iter().collect();
            state.expired = self.expired_all()?.into_iter().collect();
            Ok(state)
        }

        #[allow(dead_code)]
        fn info(&self, key: &str) -> Result<Option<u64>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(INFO).map_err(db)?;
                let v = t.get(key).map_err(db)?;
                Ok(v.map(|v| v.value()))
            })
        }
    };
}

pub(crate) fn dependent_key(base: &ObjectId, dependent: &ObjectId) -> [u8; 64] {
    let mut k = [0u8; 64];
    k[..32].copy_from_slice(base.as_bytes());
    k[32..].copy_from_slice(dependent.as_bytes());
    k
}

fn key_id(k: &[u8]) -> Result<ObjectId, StoreError> {
    let bytes: [u8; 32] = k
        .try_into()
        .map_err(|_| StoreError::Malformed("object key"))?;
    Ok(ObjectId::from_bytes(bytes))
}

/// A read transaction.
pub struct MetaRead {
    txn: redb::ReadTransaction,
}

impl MetaRead {
    readers!();
}

/// A write transaction. Changes to refs, reflogs, configuration and expiry are also collected
/// for the journal, which receives them before the transaction commits.
pub struct MetaWrite<'m> {
    txn: redb::WriteTransaction,
    journal: &'m Journal,
    /// The database's [`Meta::failed`] flag, set if the commit fails.
    failed: &'m AtomicBool,
    /// The database's count of committed writes ([`Meta::generation`]).
    commits: &'m AtomicU64,
    changes: Vec<Change>,
}

impl MetaWrite<'_> {
    readers!();

    /// Adds or replaces an object's index entry.
    pub fn put_object(&mut self, id: &ObjectId, entry: &IndexEntry) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(OBJECTS).map_err(db)?;
            t.insert(id.as_bytes().as_slice(), entry.encode().as_slice())
                .map_err(db)?;
            Ok(())
        })
    }

    /// Queues the deferred re-encode of `commit`'s parent against it, after every one queued.
    pub fn push_pending(&mut self, commit: &ObjectId) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(PENDING).map_err(db)?;
            let next = t.last().map_err(db)?.map_or(0, |(k, _)| k.value() + 1);
            t.insert(next, commit.as_bytes().as_slice()).map_err(db)?;
            Ok(())
        })
    }

    /// Takes a deferred re-encode off the queue (done, or nothing left to do).
    pub fn remove_pending(&mut self, seq: u64) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(PENDING).map_err(db)?;
            t.remove(seq).map_err(db)?;
            Ok(())
        })
    }

    /// Records that `dependent`'s record is a delta against `base`.
    pub fn add_dependent(
        &mut self,
        base: &ObjectId,
        dependent: &ObjectId,
    ) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(DEPENDENTS).map_err(db)?;
            t.insert(dependent_key(base, dependent).as_slice(), ())
                .map_err(db)?;
            Ok(())
        })
    }

    /// Forgets that `dependent` decodes through `base` (its record changed).
    pub fn remove_dependent(
        &mut self,
        base: &ObjectId,
        dependent: &ObjectId,
    ) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(DEPENDENTS).map_err(db)?;
            t.remove(dependent_key(base, dependent).as_slice())
                .map_err(db)?;
            Ok(())
        })
    }

    /// Removes an object's index entry and its link to its delta base (the record file is the
    /// caller's to delete once this transaction is durable).
    pub fn remove_object(&mut self, id: &ObjectId) -> Result<Option<IndexEntry>, StoreError> {
        guarded(|| {
            let old = {
                let mut t = self.txn.open_table(OBJECTS).map_err(db)?;
                let v = t.remove(id.as_bytes().as_slice()).map_err(db)?;
                v.map(|v| IndexEntry::decode(v.value())).transpose()?
            };
            if let Some(base) = old.as_ref().and_then(|e| e.base) {
                self.remove_dependent(&base, id)?;
            }
            Ok(old)
        })
    }

    /// Removes a commit from the commit index.
    pub fn remove_commit(&mut self, id: &ObjectId) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(COMMITS).map_err(db)?;
            t.remove(id.as_bytes().as_slice()).map_err(db)?;
            Ok(())
        })
    }

    /// Records that a retention rule deleted `id`.
    pub fn put_expired(&mut self, id: &ObjectId, e: &Expired) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(EXPIRED).map_err(db)?;
            t.insert(id.as_bytes().as_slice(), e.encode().as_slice())
                .map_err(db)?;
            Ok(())
        })?;
        self.changes.push(Change::Expired {
            id: *id,
            value: Some(e.clone()),
        });
        Ok(())
    }

    /// Forgets that `id` expired (it was stored again, e.g. a later commit has the same tensor).
    pub fn remove_expired(&mut self, id: &ObjectId) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(EXPIRED).map_err(db)?;
            t.remove(id.as_bytes().as_slice()).map_err(db)?;
            Ok(())
        })?;
        self.changes.push(Change::Expired {
            id: *id,
            value: None,
        });
        Ok(())
    }

    /// Deletes the reflog entries of `name` older than `before`; returns how many.
    pub fn expire_reflog(&mut self, name: &str, before: Timestamp) -> Result<usize, StoreError> {
        let removed = guarded(|| {
            let mut log = self.txn.open_table(REFLOG).map_err(db)?;
            let mut removed = 0;
            log.retain_in((name, 0)..=(name, u64::MAX), |_, v| {
                let keep = ReflogEntry::decode(v).map_or(true, |e| e.time >= before);
                removed += usize::from(!keep);
                keep
            })
            .map_err(db)?;
            Ok(removed)
        })?;
        if removed > 0 {
            self.changes.push(Change::ExpireReflog {
                name: name.to_string(),
                before,
            });
        }
        Ok(removed)
    }

    /// Adds a commit to the commit index.
    pub fn put_commit(&mut self, id: &ObjectId, summary: &CommitSummary) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(COMMITS).map_err(db)?;
            t.insert(id.as_bytes().as_slice(), summary.encode().as_slice())
                .map_err(db)?;
            Ok(())
        })
    }

    /// Sets a configuration value.
    pub fn set_config(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(CONFIG).map_err(db)?;
            t.insert(key, value).map_err(db)?;
            Ok(())
        })?;
        self.changes.push(Change::Config {
            key: key.to_string(),
            value: Some(value.to_string()),
        });
        Ok(())
    }

    /// Removes a configuration value; whether there was one.
    pub fn remove_config(&mut self, key: &str) -> Result<bool, StoreError> {
        let had = guarded(|| {
            let mut t = self.txn.open_table(CONFIG).map_err(db)?;
            let had = t.remove(key).map_err(db)?.is_some();
            Ok(had)
        })?;
        if had {
            self.changes.push(Change::Config {
                key: key.to_string(),
                value: None,
            });
        }
        Ok(had)
    }

    /// Compare-and-swap of a ref: succeeds only if its current value equals `expected`
    /// (`None`: must not exist). `new = None` deletes the ref; its reflog stays, the deletion
    /// its last entry. Every change appends a reflog entry in the same transaction.
    pub fn update_ref(
        &mut self,
        name: &str,
        expected: Option<&RefValue>,
        new: Option<&RefValue>,
        message: &str,
    ) -> Result<(), StoreError> {
        let current = self.get_ref(name)?;
        if current.as_ref() != expected {
            let show = |v: Option<&RefValue>| match v {
                None => "nothing".to_string(),
                Some(RefValue::Symbolic(s)) => s.clone(),
                Some(v) => v.target().map(|t| t.short(12)).unwrap_or_default(),
            };
            return Err(StoreError::RefConflict {
                name: name.to_string(),
                expected: show(expected),
                found: show(current.as_ref()),
            });
        }
        let entry = ReflogEntry {
            old: current.as_ref().and_then(RefValue::target),
            new: new.and_then(RefValue::target),
            time: Timestamp::now(),
            message: message.to_string(),
        };
        // A deleted ref's reflog stays (what it pointed at can be found again until gc
        // expires the entries), with the deletion as its last entry.
        let kept = guarded(|| {
            let mut refs = self.txn.open_table(REFS).map_err(db)?;
            let mut log = self.txn.open_table(REFLOG).map_err(db)?;
            match new {
                Some(v) => refs.insert(name, v.encode().as_slice()).map_err(db)?,
                None => refs.remove(name).map_err(db)?,
            };
            let mut kept = Vec::new();
            if new.is_none() {
                for item in log.range((name, 0)..=(name, u64::MAX)).map_err(db)? {
                    kept.push(ReflogEntry::decode(item.map_err(db)?.1.value())?);
                }
            }
            let next = log
                .range((name, 0)..=(name, u64::MAX))
                .map_err(db)?
                .next_back()
                .transpose()
                .map_err(db)?
                .map(|(k, _)| k.value().1 + 1)
                .unwrap_or(0);
            log.insert((name, next), entry.encode().as_slice())
                .map_err(db)?;
            Ok(kept)
        })?;
        self.changes.push(Change::Ref {
            name: name.to_string(),
            value: new.cloned(),
        });
        // The journal's deletion drops the reflog (as builds before this one did), so the
        // entries kept follow it again.
        for entry in kept.into_iter().chain([entry]) {
            self.changes.push(Change::Reflog {
                name: name.to_string(),
                entry,
            });
        }
        Ok(())
    }

    /// Makes every change durable and visible, atomically. Changes to refs, reflogs,
    /// configuration and expiry reach the journal (durably) first; if the database then fails
    /// to commit, an abort entry follows them.
    pub fn commit_txn(self) -> Result<(), StoreError> {
        if !self.changes.is_empty() {
            self.journal.append(&self.changes)?;
        }
        let result = guarded(|| self.txn.commit().map_err(db));
        // Counted whether or not it took: a failed commit may still have changed the file.
        self.commits.fetch_add(1, Ordering::Release);
        if result.is_err() {
            self.failed.store(true, Ordering::Relaxed);
            if !self.changes.is_empty() {
                let _ = self.journal.append(&[Change::Abort]);
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_moves_with_every_committed_write_of_a_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(META_FILE);
        Meta::create(&path).unwrap();
        let meta = Meta::open(&path, LockMode::Write, true, Duration::ZERO).unwrap();
        let g0 = meta.generation().expect("held for writing");
        let mut w = meta.write().unwrap();
        w.set_config("user.name", "a").unwrap();
        drop(w);
        assert_eq!(
            meta.generation(),
            Some(g0),
            "an abandoned write changes nothing"
        );
        let mut w = meta.write().unwrap();
        w.set_config("user.name", "a").unwrap();
        w.commit_txn().unwrap();
        assert_ne!(meta.generation(), Some(g0));
        drop(meta);
        // Not held: another process may write at any time, so nothing can vouch.
        let brief = Meta::open(&path, LockMode::Write, false, Duration::ZERO).unwrap();
        assert_eq!(brief.generation(), None);
        drop(brief);
        let reader = Meta::open(&path, LockMode::Read, true, Duration::ZERO).unwrap();
        assert_eq!(reader.generation(), None);
    }

    #[test]
    fn compare_and_swap_with_reflog() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(META_FILE);
        Meta::create(&path).unwrap();
        let meta = Meta::open(&path, LockMode::Write, true, std::time::Duration::ZERO).unwrap();
        let a = RefValue::Direct(ObjectId::hash(b"a"));
        let b = RefValue::Direct(ObjectId::hash(b"b"));
        let mut w = meta.write().unwrap();
        w.update_ref("refs/heads/x", None, Some(&a), "create")
            .unwrap();
        w.commit_txn().unwrap();
        let mut w = meta.write().unwrap();
        let err = w
            .update_ref("refs/heads/x", Some(&b), Some(&a), "bad")
            .unwrap_err();
        assert!(matches!(err, StoreError::RefConflict { .. }));
        drop(w);
        let mut w = meta.write().unwrap();
        w.update_ref("refs/heads/x", Some(&a), Some(&b), "move")
            .unwrap();
        w.commit_txn().unwrap();
        let r = meta.read().unwrap();
        assert_eq!(r.get_ref("refs/heads/x").unwrap(), Some(b.clone()));
        let log = r.reflog("refs/heads/x").unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!(log[1].old, a.target());
        assert_eq!(log[1].new, b.target());
        drop(r);
        let mut w = meta.write().unwrap();
        w.update_ref("refs/heads/x", Some(&b), None, "delete")
            .unwrap();
        w.commit_txn().unwrap();
        let r = meta.read().unwrap();
        assert_eq!(r.get_ref("refs/heads/x").unwrap(), None);
        // The deleted ref's reflog stays, the deletion last, and the journal says the same.
        let log = r.reflog("refs/heads/x").unwrap();
        assert_eq!(log.len(), 3);
        assert_eq!((log[2].old, log[2].new), (b.target(), None));
        assert_eq!(log[2].message, "delete");
        let journal = crate::journal::replay(&dir.path().join(crate::journal::JOURNAL_FILE))
            .unwrap()
            .state;
        assert_eq!(journal, r.journaled().unwrap());
        assert_eq!(journal.reflogs["refs/heads/x"], log);
        assert_eq!(
            r.get_ref(HEAD).unwrap(),
            Some(RefValue::Symbolic("refs/heads/main".into()))
        );
    }
}
