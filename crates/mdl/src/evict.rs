//! Removing record files a repository can fetch again ([`mdl_store::source`]): a cache's
//! eviction, least recently used first (each read stamps its file's modification time).

use std::time::SystemTime;

use mdl_format::ObjectId;

use crate::{IndexEntry, Repository, Result};

/// What [`evict`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Record files removed.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes of record files left.
    pub left: u64,
}

/// Removes record files, least recently used first, until those left take at most `limit`
/// bytes: only files the index names as they are (generation and length) and that
/// `refetchable` says can be had again.
pub fn evict(
    repo: &Repository,
    limit: u64,
    refetchable: &dyn Fn(&ObjectId, &IndexEntry) -> Result<bool>,
) -> Result<Evicted> {
    let store = repo.store();
    let mut files = Vec::new();
    let mut total = 0u64;
    for (id, generation) in store.record_files()? {
        let Ok(md) = std::fs::metadata(store.record_path(&id, generation)) else {
            continue;
        };
        total += md.len();
        let used = md.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        files.push((used, id, generation, md.len()));
    }
    let mut evicted = Evicted {
        left: total,
        ..Evicted::default()
    };
    if total <= limit {
        return Ok(evicted);
    }
    files.sort();
    let meta = store.meta().read()?;
    for (_, id, generation, len) in files {
        if evicted.left <= limit {
            break;
        }
        let Some(entry) = meta.object(&id)? else {
            continue;
        };
        // A record in a pack is not this file (and packs are not evicted).
        let named = entry.pack.is_none() && entry.generation == generation;
        if named && entry.stored_len == len && refetchable(&id, &entry)? {
            store.remove_record(&id, generation);
            evicted.files += 1;
            evicted.bytes += len;
            evicted.left -= len;
        }
    }
    tracing::info!(
        files = evicted.files,
        bytes = evicted.bytes,
        left = evicted.left,
        "evicted records"
    );
    Ok(evicted)
}
