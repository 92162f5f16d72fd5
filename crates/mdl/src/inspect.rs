//! Read-only views of what a repository stores, below commits and checkpoints: the index of
//! objects (codec, delta base, chain depth, record generation), each object's record file and
//! its bytes. For diagnosing a repository and for tests that check how something was stored;
//! nothing here changes anything.

use std::path::PathBuf;

use mdl_format::ObjectId;
use mdl_store::{IndexEntry, StoreError};

use crate::{Repository, Result};

/// Every indexed object with its index entry.
pub fn objects(repo: &Repository) -> Result<Vec<(ObjectId, IndexEntry)>> {
    Ok(repo.store().meta().read()?.objects()?)
}

/// Object `id`'s index entry, if it is indexed.
pub fn object(repo: &Repository, id: &ObjectId) -> Result<Option<IndexEntry>> {
    Ok(repo.store().meta().read()?.object(id)?)
}

fn indexed(repo: &Repository, id: &ObjectId) -> Result<IndexEntry> {
    Ok(object(repo, id)?.ok_or(StoreError::Missing(*id))?)
}

/// The file that holds object `id`'s record: its loose record file, or the pack it is in
/// (at `entry.pack`'s offset; [`record`] reads the record alone).
pub fn record_path(repo: &Repository, id: &ObjectId) -> Result<PathBuf> {
    let entry = indexed(repo, id)?;
    Ok(match entry.pack {
        Some(p) => repo.store().pack_path(p.pack),
        None => repo.store().record_path(id, entry.generation),
    })
}

/// Object `id`'s record, as stored (header, payload, trailer).
pub fn record(repo: &Repository, id: &ObjectId) -> Result<Vec<u8>> {
    let entry = indexed(repo, id)?;
    Ok(repo.store().read_record(id, &entry)?)
}

/// Object `id`'s content, decoded and verified against its id.
pub fn content(repo: &Repository, id: &ObjectId) -> Result<Vec<u8>> {
    Ok(repo.store().read_object_vec(id)?)
}
