//! [`Records`]: where in the bucket each record a replica knows of is — the packs it applied
//! or sent and their tables of contents — and fetching records from there by byte range: the
//! [`mdl::source::RecordSource`] of a replica, whose record files are a cache.

// The tables of contents are this crate's cache files, not a repository's `.mdl`.
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use mdl::transfer::{self, Frame, Toc};
use mdl::ObjectId;

use crate::client::Bucket;
use crate::{layout, Error, Result};

/// The packs applied to the replica (or sent by it), one key a line.
pub(crate) const APPLIED: &str = "packs";
/// A file per pack applied or sent, named as the pack: its table of contents
/// ([`transfer::encode_toc`]). The packs still in the bucket, less those a gc marked, tell
/// what the bucket holds; the replica may hold more (what a killed command made and never
/// published, what gc deleted).
pub(crate) const TOCS: &str = "tocs";

/// Where a record is: its pack, and its bytes there.
#[derive(Clone, Debug)]
struct Place {
    pack: Arc<str>,
    range: Range<u64>,
}

/// The places of the records of a replica's packs, read from their tables when first needed.
#[derive(Debug)]
pub(crate) struct Records {
    bucket: Arc<Bucket>,
    /// The replica's cache folder.
    dir: PathBuf,
    /// Each record's places, newest pack first; `None` until first needed.
    places: Mutex<Option<HashMap<ObjectId, Vec<Place>>>>,
    /// Whether record files may have been added since [`Self::take_grown`] last said.
    grown: AtomicBool,
}

impl Records {
    pub(crate) fn new(bucket: Arc<Bucket>, dir: &Path) -> Records {
        Records {
            bucket,
            dir: dir.to_path_buf(),
            places: Mutex::new(None),
            grown: AtomicBool::new(true),
        }
    }

    /// Where the table of contents of pack `key` is kept.
    fn toc_path(&self, key: &str) -> PathBuf {
        let name = key.strip_prefix(layout::PACKS).unwrap_or(key);
        self.dir.join(TOCS).join(name)
    }

    /// The table of contents of pack `key`, if this replica applied or sent it.
    pub(crate) fn toc(&self, key: &str) -> Result<Option<Vec<Frame>>> {
        let path = self.toc_path(key);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(Error::Cache { path, source }),
        };
        match transfer::read_toc(&bytes, bytes.len() as u64) {
            Ok(Toc::Frames(frames)) => Ok(Some(frames)),
            // A write cut short: as if the pack were not applied (it is applied again).
            _ => Ok(None),
        }
    }

    /// The keys of the packs applied or sent, oldest first. Without the tables of contents
    /// folder there are none (a cache an older mdl made: every pack is applied again).
    pub(crate) fn applied(&self) -> Result<Vec<String>> {
        if !self.dir.join(TOCS).is_dir() {
            return Ok(Vec::new());
        }
        let path = self.dir.join(APPLIED);
        match std::fs::read_to_string(&path) {
            Ok(s) => Ok(s.lines().map(str::to_string).collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(Error::Cache { path, source }),
        }
    }

    /// Records that pack `key` holds `frames`: its table first, synced, so a pack never counts
    /// as applied without it.
    pub(crate) fn add(&self, key: &str, frames: &[Frame]) -> Result<()> {
        use std::io::Write;
        let cache = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Cache { path, source }
        };
        let dir = self.dir.join(TOCS);
        std::fs::create_dir_all(&dir).map_err(cache(&dir))?;
        let path = self.toc_path(key);
        // Synced before the pack is listed: a power loss must not leave a pack counted as
        // applied whose records this replica cannot locate.
        std::fs::File::create(&path)
            .and_then(|mut f| {
                f.write_all(&transfer::encode_toc(frames, 0))?;
                f.sync_data()
            })
            .map_err(cache(&path))?;
        let path = self.dir.join(APPLIED);
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "{key}"))
            .map_err(cache(&path))?;
        if let Some(places) = self
            .places
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            insert(places, key, frames);
        }
        self.grown.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Whether record files may have been added (fetched, or with a pack applied or sent)
    /// since the last call; the first call says yes.
    pub(crate) fn take_grown(&self) -> bool {
        self.grown.swap(false, Ordering::Relaxed)
    }

    /// The length of the record of `id` in its newest pack, as far as this replica knows.
    pub(crate) fn len_of(&self, id: &ObjectId) -> Result<Option<u64>> {
        let mut places = self.places.lock().unwrap_or_else(|p| p.into_inner());
        let places = self.loaded(&mut places)?;
        Ok(places
            .get(id)
            .and_then(|p| p.first())
            .map(|p| p.range.end - p.range.start))
    }

    fn loaded<'a>(
        &self,
        places: &'a mut Option<HashMap<ObjectId, Vec<Place>>>,
    ) -> Result<&'a mut HashMap<ObjectId, Vec<Place>>> {
        if places.is_none() {
            let mut map = HashMap::new();
            for key in self.applied()? {
                if let Some(frames) = self.toc(&key)? {
                    insert(&mut map, &key, &frames);
                }
            }
            *places = Some(map);
        }
        Ok(places.as_mut().expect("loaded"))
    }

    /// The records `ids`, each from its newest pack, or from an older one if that pack is
    /// gone (a gc deleted it).
    fn get(&self, ids: &[ObjectId]) -> Result<Vec<Option<Vec<u8>>>> {
        let places: HashMap<ObjectId, Vec<Place>> = {
            let mut guard = self.places.lock().unwrap_or_else(|p| p.into_inner());
            let all = self.loaded(&mut guard)?;
            ids.iter()
                .filter_map(|id| Some((*id, all.get(id)?.clone())))
                .collect()
        };
        let mut out: Vec<Option<Vec<u8>>> = vec![None; ids.len()];
        // Which place of each record to try next.
        let mut next: Vec<usize> = vec![0; ids.len()];
        loop {
            let mut by_pack: HashMap<Arc<str>, Vec<usize>> = HashMap::new();
            for (i, id) in ids.iter().enumerate() {
                if out[i].is_some() {
                    continue;
                }
                if let Some(place) = places.get(id).and_then(|p| p.get(next[i])) {
                    by_pack.entry(place.pack.clone()).or_default().push(i);
                }
            }
            if by_pack.is_empty() {
                if out.iter().any(Option::is_some) {
                    self.grown.store(true, Ordering::Relaxed);
                }
                return Ok(out);
            }
            let batches: Vec<(Arc<str>, Vec<usize>)> = by_pack.into_iter().collect();
            let wanted: Vec<(String, Vec<Range<u64>>)> = batches
                .iter()
                .map(|(pack, which)| {
                    let ranges = which
                        .iter()
                        .map(|&i| places[&ids[i]][next[i]].range.clone())
                        .collect();
                    (pack.to_string(), ranges)
                })
                .collect();
            let got = self.bucket.get_ranges(&wanted)?;
            for ((_, which), got) in batches.iter().zip(got) {
                match got {
                    Some(parts) => {
                        for (&i, bytes) in which.iter().zip(parts) {
                            out[i] = Some(bytes.to_vec());
                        }
                    }
                    None => which.iter().for_each(|&i| next[i] += 1),
                }
            }
        }
    }
}

/// Adds the records of pack `key` to `places`, before those of older packs.
fn insert(places: &mut HashMap<ObjectId, Vec<Place>>, key: &str, frames: &[Frame]) {
    let pack: Arc<str> = Arc::from(key);
    for f in frames.iter().filter(|f| f.record.is_some()) {
        let place = Place {
            pack: pack.clone(),
            range: f.offset..f.offset + f.len,
        };
        places.entry(f.id).or_default().insert(0, place);
    }
}

impl mdl::source::RecordSource for Records {
    fn fetch(&self, ids: &[ObjectId]) -> std::result::Result<Vec<Option<Vec<u8>>>, String> {
        self.get(ids).map_err(|e| e.to_string())
    }
}
