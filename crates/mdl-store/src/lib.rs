//! Storage of an mdl repository (`.mdl/`): object records, the metadata database, the lock.
//!
//! - [`fs`]: the [`Storage`] trait every write into `.mdl/objects` goes through (the disk-full
//!   and crash tests of `crates/mdl/tests` implement a failing one).
//! - [`Store`]: records written atomically (temporary file, fsync, rename, fsync directory),
//!   read back with checksum and hash verification.
//! - [`meta`]: `meta.redb` — refs with compare-and-swap and a reflog, the physical index
//!   (id → record, codec, base, depth), the commit index and configuration.
//! - [`source`]: records kept elsewhere (a copy of a repository in object storage), fetched
//!   the first time they are read.
//! - [`lock`]: writers take turns on the repository lock; others wait, then say who holds it.
//!   Readers take none (see [`meta`] for how they share the database with a writer).
//!
//! Layout and byte formats: `docs/FORMAT.md`; why redb: `docs/DECISIONS.md`.

// This crate is where a repository's files are written: the workspace bans direct `std::fs`
// writes elsewhere (clippy.toml), not here.
#![allow(clippy::disallowed_methods)]

pub mod budget;
mod error;
mod files;
pub mod fs;
mod guard;
pub mod journal;
mod lock;
pub mod meta;
mod objects;
pub mod rebuild;
pub mod source;
mod values;

pub use error::{DbError, StoreError};
pub use files::{incoming_file_in, sweep_abandoned, IncomingDir, INCOMING_DIR};
pub use fs::{RealFs, Storage};
pub use lock::{writer_waiting, LockMode, RepoLock};
pub use meta::{CommitSummary, Expired, IndexEntry, Meta, Packed, RefValue, ReflogEntry};
pub use objects::{
    windowed_cost, zeroed, Held, MaskedOver, ObjectBatch, PackEntry, Placement, PutOutcome,
    ReceivedRecord, RecordWriter, TensorWindows, Unpublished, MAX_CHAIN, PACKS_DIR, WINDOW_CHUNKS,
};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mdl_codec::engine::{CpuEngine, Engine};

/// Name of the repository directory inside a work directory.
pub const MDL_DIR: &str = ".mdl";

/// How to open a store.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Readers take no lock; writers own the repository, one at a time.
    pub mode: LockMode,
    /// Keep the metadata database open for the store's lifetime: for a process that owns the
    /// repository (the server, whose own readers and writers share one handle). Other
    /// processes cannot read the repository meanwhile; without it, each transaction opens the
    /// database and readers never wait for a writer's work.
    pub hold: bool,
    /// How long to wait for another process that holds the repository.
    pub wait: Duration,
    /// What this process is doing, recorded for processes that have to wait for it.
    pub purpose: String,
    /// The file system implementation (tests inject faults here).
    pub storage: Arc<dyn Storage>,
    /// Tensors the caller holds decoded, lent to every read of the store ([`Lent`]).
    pub lent: Lent,
}

/// Tensors a process holds decoded (a model's own weights at the commit it loaded), by id,
/// lent to a store's reads: a delta over one of them decodes one level against these bytes,
/// read where they lie, instead of through its base's chain — what a follower receiving the
/// next step needs to verify it. A read's result is checked against its id as always, so
/// bytes that are not what their id names fail the read; they never make it wrong.
#[derive(Clone, Default)]
pub struct Lent(pub Arc<std::collections::HashMap<mdl_format::ObjectId, LentBytes>>);

/// One tensor's bytes in [`Lent`].
pub type LentBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lent({} tensors)", self.0.len())
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            mode: LockMode::Write,
            hold: false,
            wait: Duration::from_secs(60),
            purpose: "mdl".into(),
            storage: Arc::new(RealFs),
            lent: Lent::default(),
        }
    }
}

/// An open repository store. A writer holds the repository lock for its lifetime.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    fs: Arc<dyn Storage>,
    meta: Meta,
    mode: LockMode,
    /// Where codec kernels run (the CPU unless [`Store::set_engine`] says otherwise).
    engine: Arc<dyn Engine>,
    /// Where records this store lacks are fetched from ([`source`]).
    source: Option<Arc<dyn source::RecordSource>>,
    /// What the caller lends to reads ([`OpenOptions::lent`]).
    lent: Lent,
    _lock: Option<RepoLock>,
}

/// Bytes an unprivileged writer may still put on the disk that holds `path` (`None` when the
/// file system cannot tell).
pub fn free_bytes(path: &Path) -> Option<u64> {
    let s = rustix::fs::statvfs(path).ok()?;
    Some(s.f_bavail.saturating_mul(s.f_frsize))
}

/// The size of the disk that holds `path` (`None` when the file system cannot tell).
pub fn disk_bytes(path: &Path) -> Option<u64> {
    let s = rustix::fs::statvfs(path).ok()?;
    Some(s.f_blocks.saturating_mul(s.f_frsize))
}

impl Store {
    /// Creates a new store at `dir` (the `.mdl` directory itself), with `HEAD → refs/heads/main`.
    ///
    /// The directory is assembled under a temporary name and renamed into place, so a crash
    /// never leaves a half-made repository.
    pub fn init(dir: &Path, storage: Arc<dyn Storage>) -> Result<(), StoreError> {
        if dir.exists() {
            return Err(StoreError::AlreadyExists(dir.to_path_buf()));
        }
        let parent = dir.parent().unwrap_or(Path::new("."));
        let staging = parent.join(format!(".mdl-init-{}", std::process::id()));
        let io = |op: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| StoreError::Io { op, path, source }
        };
        storage
            .create_dir_all(&staging.join("objects"))
            .map_err(io("create", &staging))?;
        let result = (|| {
            std::fs::File::create(staging.join(lock::LOCK_FILE)).map_err(io("create", &staging))?;
            meta::Meta::create(&staging.join(meta::META_FILE))?;
            storage
                .sync_dir(&staging.join("objects"))
                .map_err(io("sync", &staging))?;
            storage.sync_dir(&staging).map_err(io("sync", &staging))?;
            storage
                .rename(&staging, dir)
                .map_err(io("rename", &staging))?;
            storage.sync_dir(parent).map_err(io("sync", parent))
        })();
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        result
    }

    /// Opens the store at `dir` (the `.mdl` directory); a writer or a check takes the
    /// repository lock.
    pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Store, StoreError> {
        if !dir.join(meta::META_FILE).is_file() && !dir.join("objects").is_dir() {
            return Err(StoreError::NotARepository(dir.to_path_buf()));
        }
        let mut mode = opts.mode;
        let read_only = lock::is_read_only(dir);
        if read_only {
            if mode == LockMode::Write {
                return Err(StoreError::ReadOnly(dir.to_path_buf()));
            }
            mode = LockMode::ReadOnlyFs;
        }
        let meta_path = dir.join(meta::META_FILE);
        let acquire = |mode| RepoLock::acquire(dir, mode, opts.wait, &opts.purpose);
        let locks = matches!(mode, LockMode::Write | LockMode::Check);
        let mut lock = locks.then(|| acquire(mode)).transpose()?;
        let open = || Meta::open(&meta_path, mode, opts.hold, opts.wait);
        let meta = match open() {
            Err(StoreError::NeedsRecovery) if matches!(mode, LockMode::Read | LockMode::Check) => {
                // The last writer was killed: redb must repair the file, which a read-only
                // open cannot do. Take the repository exclusively once and let redb recover.
                drop(lock);
                let write = acquire(LockMode::Write)?;
                drop(Meta::open(&meta_path, LockMode::Write, false, opts.wait)?);
                drop(write);
                lock = locks.then(|| acquire(mode)).transpose()?;
                open()?
            }
            other => other?,
        };
        Ok(Store {
            dir: dir.to_path_buf(),
            fs: opts.storage.clone(),
            meta,
            mode,
            engine: Arc::new(CpuEngine),
            source: source::registered(dir),
            lent: opts.lent.clone(),
            _lock: lock,
        })
    }

    /// Where codec kernels run for this store's reads and for commits into it.
    pub fn engine(&self) -> &dyn Engine {
        &*self.engine
    }

    /// Runs codec kernels on `engine` from now on. Engines produce identical bytes, so this
    /// changes speed only.
    pub fn set_engine(&mut self, engine: Arc<dyn Engine>) {
        self.engine = engine;
    }

    /// The `.mdl` directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The metadata database.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Whether this store was opened for writing.
    pub fn writable(&self) -> bool {
        self.mode == LockMode::Write
    }

    /// The file system implementation in use.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.fs
    }
}
