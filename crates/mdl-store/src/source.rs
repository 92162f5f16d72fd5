//! Records kept somewhere besides the repository's own folder. A repository whose index names
//! records it has no file for — a machine's copy of a repository in object storage, which
//! indexes a pack's records before it downloads them and evicts those it has not read lately —
//! registers a [`RecordSource`] for its `.mdl` folder. A store opened on that folder fetches a
//! record it lacks from the source the first time it is read, with the rest of its delta chain
//! in the same request, checks it against the index and its checksum, and keeps it as an
//! ordinary record file. Record files of such a store are a cache: each read stamps the file's
//! modification time, so the cache can drop the least recently used first.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use mdl_format::record;
use mdl_format::ObjectId;

use crate::objects::{RecordFile, TEMP_PREFIX};
use crate::{IndexEntry, Store, StoreError, MAX_CHAIN};

/// Where the records a repository lacks are.
pub trait RecordSource: Send + Sync + std::fmt::Debug {
    /// The stored bytes (header through checksum) of each of `ids`, in that order; `None` for
    /// one the source does not hold. `Err` is a sentence saying why the source failed.
    fn fetch(&self, ids: &[ObjectId]) -> Result<Vec<Option<Vec<u8>>>, String>;
}

/// The sources registered in this process, by `.mdl` folder.
static SOURCES: Mutex<Vec<(PathBuf, Arc<dyn RecordSource>)>> = Mutex::new(Vec::new());

fn key(dir: &Path) -> PathBuf {
    dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf())
}

/// Makes `source` where stores opened on the `.mdl` folder `dir` from now on fetch the records
/// they lack (replacing one registered before).
pub fn register(dir: &Path, source: Arc<dyn RecordSource>) {
    let dir = key(dir);
    let mut sources = SOURCES.lock().unwrap_or_else(|p| p.into_inner());
    sources.retain(|(d, _)| *d != dir);
    sources.push((dir, source));
}

/// The source registered for the `.mdl` folder `dir`.
pub(crate) fn registered(dir: &Path) -> Option<Arc<dyn RecordSource>> {
    let dir = key(dir);
    let sources = SOURCES.lock().unwrap_or_else(|p| p.into_inner());
    sources
        .iter()
        .find(|(d, _)| *d == dir)
        .map(|(_, s)| s.clone())
}

impl Store {
    /// Whether records this store lacks come from a [`RecordSource`].
    pub fn fetches_records(&self) -> bool {
        self.source.is_some()
    }

    /// Fetches, at once, those records of `ids` and of their delta chains that are indexed but
    /// have no file, where a source is registered (nothing otherwise): for a reader about to
    /// read many objects. Records the source does not hold stay missing.
    pub fn fetch(&self, ids: &[ObjectId]) -> Result<(), StoreError> {
        let Some(source) = &self.source else {
            return Ok(());
        };
        let mut want: Vec<(ObjectId, IndexEntry)> = Vec::new();
        {
            let meta = self.meta().read()?;
            let mut seen = std::collections::HashSet::new();
            for id in ids {
                let mut next = Some(*id);
                let mut steps = 0;
                while let Some(id) = next.take() {
                    if !seen.insert(id) || steps > MAX_CHAIN {
                        break;
                    }
                    steps += 1;
                    let Some(entry) = meta.object(&id)? else {
                        break;
                    };
                    if !self.record_path(&id, entry.generation).is_file() {
                        want.push((id, entry));
                    }
                    next = entry.base;
                }
            }
        }
        if want.is_empty() {
            return Ok(());
        }
        let asked: Vec<ObjectId> = want.iter().map(|(id, _)| *id).collect();
        let got = source
            .fetch(&asked)
            .map_err(|why| StoreError::Fetch { id: asked[0], why })?;
        for ((id, entry), bytes) in want.iter().zip(got) {
            if let Some(bytes) = bytes {
                self.install(id, entry, &bytes)?;
            }
        }
        tracing::debug!(records = want.len(), "fetched");
        Ok(())
    }

    /// Writes a fetched record where the index says it is, once it agrees with its entry:
    /// length, checksum, kind, codec, base and content length. The file is made durable
    /// before its name appears (a crash leaves no torn record under it); its directory is
    /// not, since a record lost that way is fetched again.
    fn install(&self, id: &ObjectId, entry: &IndexEntry, bytes: &[u8]) -> Result<(), StoreError> {
        let wrong = |source| StoreError::Fetch {
            id: *id,
            why: format!("the record fetched is not the one indexed: {source}"),
        };
        if bytes.len() as u64 != entry.stored_len {
            return Err(wrong(mdl_format::FormatError::invalid(
                "record",
                "its length differs from the index's",
            )));
        }
        let (header, payload, trailer) = record::decode(bytes).map_err(wrong)?;
        let codec = mdl_codec::CodecTag::try_from(header.codec).map_err(wrong)?;
        crate::objects::agrees_with_index(
            &header,
            &trailer,
            Some(payload.len() as u64),
            entry,
            codec,
        )
        .map_err(wrong)?;
        let path = self.record_path(id, entry.generation);
        let dir = path.parent().expect("a record path has a parent");
        self.fs
            .create_dir_all(dir)
            .map_err(StoreError::io("create", dir))?;
        let tmp = dir.join(format!(
            "{TEMP_PREFIX}fetch-{}-{}",
            std::process::id(),
            crate::objects::next_temp()
        ));
        let written = (|| {
            let mut f = self.fs.create_new(&tmp)?;
            f.write_all(bytes)?;
            f.flush()?;
            drop(f);
            self.fs.sync_file(&tmp)?;
            self.fs.rename(&tmp, &path)
        })();
        if let Err(e) = written {
            let _ = self.fs.remove_file(&tmp);
            return Err(StoreError::io("write", &tmp)(e));
        }
        Ok(())
    }

    /// Opens `id`'s record file; where a source is registered, one that is missing is
    /// fetched first (again, should another thread's eviction take it before it is open),
    /// and one opened is stamped as just used.
    pub(crate) fn open_record_file(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
    ) -> Result<RecordFile, StoreError> {
        if let Some(p) = &entry.pack {
            // Packs are never fetched from a source nor evicted: they hold what this
            // repository received.
            let path = self.pack_path(p.pack);
            return std::fs::File::open(&path)
                .and_then(|f| RecordFile::range(f, path.clone(), p.offset, entry.stored_len))
                .map_err(StoreError::record_io(id, "open", &path));
        }
        let path = self.record_path(id, entry.generation);
        let fetches = if self.source.is_some() { 2 } else { 0 };
        let mut opened = std::fs::File::open(&path);
        for _ in 0..fetches {
            match &opened {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.fetch(&[*id])?;
                    opened = std::fs::File::open(&path);
                }
                _ => break,
            }
        }
        let file = opened.map_err(StoreError::record_io(id, "open", &path))?;
        if self.source.is_some() {
            // Best effort: a stamp that fails only makes the record an earlier candidate.
            let _ = file.set_modified(SystemTime::now());
        }
        RecordFile::whole(file, path.clone()).map_err(StoreError::record_io(id, "stat", &path))
    }
}
