use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use mdl_format::{Commit, Manifest, ObjectId, ObjectKind};
use mdl_protocol::body::Advertisement;
use mdl_store::meta::HEAD;
use mdl_store::{RealFs, RefValue, Store, StoreError, MDL_DIR};

use crate::{Error, Result};

pub use mdl_store::OpenOptions;

use crate::advertised::ADVERTISEMENT;

/// An open mdl repository: a work directory with `.mdl/` in it.
#[derive(Debug)]
pub struct Repository {
    root: PathBuf,
    store: Store,
    /// Serialises writers inside this process (the lock file keeps other processes out).
    writer: Mutex<()>,
}

impl Repository {
    /// Creates a repository in `dir` (created if missing) and opens it.
    // `dir` is the user's work folder; its `.mdl` is made by the store.
    #[allow(clippy::disallowed_methods)]
    pub fn init(dir: &Path) -> Result<Repository> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Output {
            path: dir.to_path_buf(),
            source,
        })?;
        Store::init(&dir.join(MDL_DIR), Arc::new(RealFs))?;
        Repository::open(dir, &OpenOptions::default())
    }

    /// Runs codec kernels on `engine` from now on (see [`crate::engine::select`]).
    pub fn set_engine(&mut self, engine: std::sync::Arc<dyn mdl_codec::engine::Engine>) {
        self.store.set_engine(engine);
    }

    /// Opens the repository whose work directory is `dir` or its nearest ancestor with `.mdl`.
    pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Repository> {
        let root = discover(dir).ok_or_else(|| StoreError::NotARepository(dir.to_path_buf()))?;
        let store = Store::open(&root.join(MDL_DIR), opts)?;
        // An advertisement left by a server that died is stale; a writer removes it. (A live
        // server holds no lock while idle: other processes write beside it.)
        if store.writable() && crate::advertised::stale(&root) {
            store.remove_file(ADVERTISEMENT);
        }
        Ok(Repository {
            root,
            store,
            writer: Mutex::new(()),
        })
    }

    /// The work directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The underlying store (the library's own: other crates call its operations).
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// A number that moves with every change to the repository's database, where this process
    /// is the only one that can change it (it holds the repository for writing, as the server
    /// does); `None` otherwise. What was read from the repository after it was taken stays true
    /// while it stays the same.
    pub fn generation(&self) -> Option<u64> {
        self.store.meta().generation()
    }

    /// Exclusive right to change the repository within this process: a commit holds it from
    /// its first index read to its ref update; compaction and gc take it only to publish each
    /// step, so commits go on between their steps. Readers never need it.
    pub fn writer(&self) -> MutexGuard<'_, ()> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the repository holds object `id` (a record, not only the note that it expired).
    pub fn has_object(&self, id: &ObjectId) -> Result<bool> {
        Ok(self.store.meta().read()?.object(id)?.is_some())
    }

    /// Whether the repository's database failed while open (a full disk): it must be opened
    /// again before it is used.
    pub fn failed(&self) -> bool {
        self.store.meta().failed()
    }

    /// Replaces `.mdl/serve.json` (owner-readable only: it holds a write token) with `ad`,
    /// atomically: how `mdl serve` tells commands run here that it owns the repository.
    pub fn advertise(&self, ad: &Advertisement) -> Result<()> {
        let bytes = serde_json::to_vec(ad).expect("an advertisement serialises");
        self.store.replace_file(ADVERTISEMENT, &bytes, 0o600)?;
        Ok(())
    }

    /// Removes `.mdl/serve.json`.
    pub fn withdraw_advertisement(&self) {
        self.store.remove_file(ADVERTISEMENT);
    }

    /// An exclusive temporary file under `.mdl/incoming` for an upload being received
    /// (removed when dropped; gc removes one a killed process left).
    pub fn incoming_file(&self, prefix: &str) -> Result<tempfile::NamedTempFile> {
        Ok(self.store.incoming_file(prefix)?)
    }

    /// `.mdl/incoming/` itself (created if missing), for uploads a server keeps between
    /// requests under names of its own (staged LFS objects).
    pub fn incoming_path(&self) -> Result<PathBuf> {
        Ok(self.store.incoming()?)
    }

    /// `.mdl/incoming/` of the repository whose work folder is `root`, found without opening
    /// it (where a background commit's private copies of its files go; see
    /// [`crate::commit::Staged::copied`]).
    pub fn incoming_of(root: &Path) -> PathBuf {
        root.join(mdl_store::MDL_DIR).join(mdl_store::INCOMING_DIR)
    }

    /// Removes what killed processes left in `.mdl/incoming/` (temporaries nobody claims; see
    /// [`mdl_store::sweep_abandoned`]): a server does so when it opens the repository.
    /// Returns the paths removed.
    pub fn sweep_incoming(&self) -> Vec<PathBuf> {
        self.store.sweep_incoming()
    }

    /// A temporary folder in `.mdl/incoming/` (see [`mdl_store::Store::incoming_dir`]).
    pub fn incoming_dir(&self, prefix: &str) -> Result<mdl_store::IncomingDir> {
        Ok(self.store.incoming_dir(prefix)?)
    }

    /// Reads and parses a commit object.
    pub fn load_commit(&self, id: &ObjectId) -> Result<Commit> {
        let bytes = self.load_kind(id, ObjectKind::Commit)?;
        Commit::decode(&bytes).map_err(|source| Error::Corrupt { id: *id, source })
    }

    /// The decoded length of commit `id`'s manifest: what a reader charges a memory budget
    /// by before decoding it.
    pub fn manifest_len(&self, id: &ObjectId) -> Result<u64> {
        let manifest = self.load_commit(id)?.manifest;
        let entry = self.store.meta().read()?.object(&manifest)?;
        Ok(entry.ok_or(StoreError::Missing(manifest))?.content_len)
    }

    /// The decoded length of manifest `id`; `None` when the repository has no such object or it
    /// is not a manifest.
    pub fn manifest_object_len(&self, id: &ObjectId) -> Result<Option<u64>> {
        let entry = self.store.meta().read()?.object(id)?;
        Ok(entry
            .filter(|e| e.kind == ObjectKind::Manifest)
            .map(|e| e.content_len))
    }

    /// Reads and parses a manifest object.
    pub fn load_manifest(&self, id: &ObjectId) -> Result<Manifest> {
        let bytes = self.load_kind(id, ObjectKind::Manifest)?;
        Manifest::decode(&bytes).map_err(|source| Error::Corrupt { id: *id, source })
    }

    /// A manifest object's encoded bytes, to be read in place with [`view_manifest`] (a reader
    /// that walks a large tree without decoding it whole).
    pub fn load_manifest_bytes(&self, id: &ObjectId) -> Result<Vec<u8>> {
        self.load_kind(id, ObjectKind::Manifest)
    }

    fn load_kind(&self, id: &ObjectId, kind: ObjectKind) -> Result<Vec<u8>> {
        let entry = self
            .store
            .meta()
            .read()?
            .object(id)?
            .ok_or(StoreError::Missing(*id))?;
        if entry.kind != kind {
            return Err(Error::WrongKind {
                id: *id,
                expected: kind.name(),
                found: entry.kind.name(),
            });
        }
        let mut out = Vec::new();
        out.try_reserve_exact(entry.content_len as usize)
            .map_err(|_| StoreError::OutOfMemory(entry.content_len))?;
        self.store.read_object(id, &entry, &mut out)?;
        Ok(out)
    }

    /// The full ref name HEAD points at (`refs/heads/main`).
    pub fn head_branch(&self) -> Result<String> {
        match self.store.meta().read()?.get_ref(HEAD)? {
            Some(RefValue::Symbolic(name)) => Ok(name),
            _ => Err(StoreError::Malformed("HEAD (not a symbolic ref)").into()),
        }
    }
}

/// The manifest `id`'s bytes ([`Repository::load_manifest_bytes`]), checked and read in place.
pub fn view_manifest<'a>(id: &ObjectId, bytes: &'a [u8]) -> Result<mdl_format::ManifestView<'a>> {
    mdl_format::ManifestView::parse(bytes).map_err(|source| Error::Corrupt { id: *id, source })
}

/// Finds the nearest directory at or above `start` that holds `.mdl/` (with its database, or
/// at least its objects: a repository whose database was lost is still one, to be repaired).
pub fn discover(start: &Path) -> Option<PathBuf> {
    let start = std::path::absolute(start).ok()?;
    start
        .ancestors()
        .find(|d| {
            let mdl = d.join(MDL_DIR);
            mdl.join(mdl_store::meta::META_FILE).is_file() || mdl.join("objects").is_dir()
        })
        .map(Path::to_path_buf)
}
