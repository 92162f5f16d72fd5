//! Packs once their records go: a pack (`mdl_store`'s `packs/`, what a transfer received)
//! whose records the index no longer names is a leftover, removed by gc like an unindexed
//! record file; one that the index names only a small part of — its other records deleted by
//! gc or re-encoded by maintenance, each re-encode writing a loose record — would keep the
//! rest of its bytes on disk for as long as that part lives, so gc moves that part out into
//! loose record files first and removes the pack.

use std::collections::HashMap;
use std::path::PathBuf;

use mdl_format::ObjectId;
use mdl_store::meta::MetaRead;
use mdl_store::{IndexEntry, Store};

use crate::{Repository, Result};

/// A pack whose live records take less than this share of it is unpacked by gc.
const UNPACK_BELOW: f64 = 0.5;

/// What the index names of each pack: its records there, with their entries.
pub(crate) fn named(meta: &MetaRead) -> Result<HashMap<u64, Vec<(ObjectId, IndexEntry)>>> {
    let mut out: HashMap<u64, Vec<(ObjectId, IndexEntry)>> = HashMap::new();
    for (id, e) in meta.objects()? {
        if let Some(p) = e.pack {
            out.entry(p.pack).or_default().push((id, e));
        }
    }
    Ok(out)
}

/// The packs in `store` of which the index names no record.
pub(crate) fn unnamed(store: &Store, meta: &MetaRead) -> Result<Vec<PathBuf>> {
    let named = named(meta)?;
    Ok(store
        .pack_files()?
        .into_iter()
        .filter(|(n, _)| !named.contains_key(n))
        .map(|(_, path)| path)
        .collect())
}

/// What unpacking did: packs removed, and the bytes that freed.
#[derive(Default)]
pub(crate) struct Unpacked {
    pub(crate) packs: u64,
    pub(crate) bytes_freed: u64,
}

/// Moves the records the index names in each mostly unnamed pack out into loose record files
/// (written and made durable first, then named in the index in one transaction), then removes
/// those packs. For a caller holding the repository's writer (gc): no other write can name a
/// record in a pack meanwhile. A reader that looked up a packed entry before finds the pack
/// gone and reads the index again ([`Store`]'s reads do).
pub(crate) fn unpack_sparse(repo: &Repository) -> Result<Unpacked> {
    let store = repo.store();
    let named = named(&store.meta().read()?)?;
    let mut sparse = Vec::new();
    for (pack, path) in store.pack_files()? {
        let Some(live) = named.get(&pack) else {
            continue;
        };
        let Ok(md) = std::fs::metadata(&path) else {
            continue;
        };
        let live_bytes: u64 = live.iter().map(|(_, e)| e.stored_len).sum();
        if (live_bytes as f64) < UNPACK_BELOW * md.len() as f64 {
            sparse.push((pack, md.len(), live));
        }
    }
    let mut out = Unpacked::default();
    if sparse.is_empty() {
        return Ok(out);
    }
    let batch = store.batch();
    let unpublished = batch.unpublished();
    let mut moved = Vec::new();
    for (_, _, live) in &sparse {
        for (id, e) in live.iter() {
            let record = store.read_record(id, e)?;
            let put = batch.put_record(id, &record, e.depth)?;
            moved.push((*id, *e, put.entry));
        }
    }
    batch.finish()?;
    let mut w = store.meta().write()?;
    for (id, old, new) in &moved {
        // Named as it was read (the caller holds the writer; checked all the same).
        if w.object(id)? == Some(*old) {
            let entry = IndexEntry {
                generation: new.generation,
                pack: None,
                ..*old
            };
            w.put_object(id, &entry)?;
        }
    }
    w.commit_txn()?;
    unpublished.published();
    let meta = store.meta().read()?;
    let still = self::named(&meta)?;
    for (pack, len, live) in &sparse {
        if !still.contains_key(pack) {
            store.remove_pack(*pack);
            out.packs += 1;
            let kept: u64 = live.iter().map(|(_, e)| e.stored_len).sum();
            out.bytes_freed += len.saturating_sub(kept);
        }
    }
    Ok(out)
}
