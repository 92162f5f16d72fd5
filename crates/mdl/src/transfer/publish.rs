//! Publishing what a received pack wrote: each layer of tensor records verified by decoding it
//! a window at a time, then indexed; the manifests and commits checked against everything they
//! name, then indexed in one transaction.

use std::collections::{HashMap, HashSet};

use mdl_format::{Commit, Manifest, ObjectId, ObjectKind};
use mdl_store::meta::MetaWrite;
use mdl_store::{CommitSummary, Expired, IndexEntry, StoreError};

use super::bad_pack;
use crate::{per_tensor, Error, Repository, Result};

/// Decoded bytes of one layer kept for the next, at most this many (and a quarter of the decode
/// budget): a chain arrives a level a layer (its newest version first), so each delta decodes
/// one level against what the layer before it held instead of its whole chain again.
const HOLD: u64 = 512 << 20;

/// Tensors of the layer verified last, decoded, under the reservation that holds them.
#[derive(Default)]
pub(super) struct Verified {
    held: HashMap<ObjectId, Vec<u8>>,
    reserved: Vec<mdl_store::budget::Reservation>,
    /// The buffers of the layer before those, by length, for the next layer to decode into (a
    /// chain's levels have one length): memory written already, not zeroed and faulted in
    /// again; under the reservation that held them.
    spare: HashMap<u64, Vec<Vec<u8>>>,
    _spare_reserved: Vec<mdl_store::budget::Reservation>,
}

impl Verified {
    /// Lets go of what is held; the buffers that held it (those no reader shares), by length.
    fn take_buffers(&mut self) -> HashMap<u64, Vec<Vec<u8>>> {
        let mut spare: HashMap<u64, Vec<Vec<u8>>> = HashMap::new();
        for (_, data) in std::mem::take(&mut self.held) {
            spare.entry(data.len() as u64).or_default().push(data);
        }
        spare
    }
}

/// Verifies a layer of written tensor records by decoding them (a window at a time where that
/// holds less; against `verified`'s bytes where it holds a record's base), then indexes them.
/// `verified` then holds what this layer kept decoded (where `more` layers may follow: the last
/// keeps nothing). The records of expiry that indexing them replaced, for a roll-back.
pub(super) fn publish_tensors(
    repo: &Repository,
    batch: mdl_store::ObjectBatch<'_>,
    layer: &mut Vec<(ObjectId, IndexEntry)>,
    verified: &mut Verified,
    more: bool,
) -> Result<Vec<(ObjectId, Expired)>> {
    if layer.is_empty() {
        batch.finish()?;
        return Ok(Vec::new());
    }
    // The records are made durable while they are verified (both must be done before the
    // index names them): the disk's wait overlaps the decoding.
    let (synced, checked) = std::thread::scope(|s| {
        let sync = s.spawn(move || batch.finish());
        let checked = verify_layer(repo, layer, verified, more);
        let synced = sync
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (synced, checked)
    });
    checked?;
    synced?;
    let store = repo.store();
    // Checked inside the write transaction: no deletion can commit between check and publish.
    let mut w = store.meta().write()?;
    for (id, e) in layer.iter() {
        if let Some(base) = &e.base {
            if w.object(base)?.is_none() {
                return Err(Error::Incomplete(format!(
                    "delta base {base} of tensor {id}"
                )));
            }
        }
    }
    let mut unexpired = Vec::new();
    for (id, e) in layer.iter() {
        unexpired.extend(index_tensor(&mut w, id, e)?.map(|x| (*id, x)));
    }
    w.commit_txn()?;
    layer.clear();
    Ok(unexpired)
}

/// Decodes and hashes every tensor of `layer` (see [`publish_tensors`]); `verified` then holds
/// what this layer kept decoded.
fn verify_layer(
    repo: &Repository,
    layer: &[(ObjectId, IndexEntry)],
    verified: &mut Verified,
    more: bool,
) -> Result<()> {
    let store = repo.store();
    let limit = mdl_store::budget::limit();
    let hold_cap = if more { HOLD.min(limit / 4) } else { 0 };
    let (mut next_held, mut next_reserved) = (HashMap::new(), Vec::new());
    let spare = std::sync::Mutex::new(std::mem::take(&mut verified.spare));
    let mut kept = 0u64;
    // Verified in batches that fit the process's decode budget (a server shares it among its
    // requests; a batch is reserved whole before it decodes).
    let cap = limit.min(1 << 30);
    let mut start = 0;
    while start < layer.len() {
        let (mut end, mut cost, mut keeping) = (start, 0u64, 0u64);
        let mut keep = Vec::new();
        while end < layer.len() {
            let e = &layer[end].1;
            let hold = kept + keeping + e.content_len <= hold_cap;
            let c = mdl_store::windowed_cost(e) + if hold { e.content_len } else { 0 };
            if end > start && cost.saturating_add(c) > cap {
                break;
            }
            keeping += if hold { e.content_len } else { 0 };
            keep.push(hold);
            cost = cost.saturating_add(c);
            end += 1;
        }
        let mut reserved = mdl_store::budget::reserve(cost);
        let items: Vec<_> = layer[start..end].iter().zip(keep).collect();
        let held: mdl_store::Held<'_> = verified
            .held
            .iter()
            .map(|(id, data)| (*id, data.as_slice()))
            .collect();
        let held = &held;
        let spare = &spare;
        let decoded = per_tensor(
            &items,
            |((_, e), _)| e.content_len,
            |((id, e), keep)| -> Result<Option<Vec<u8>>> {
                let mut windows = store.held_windows(id, e, held)?;
                if *keep {
                    let mut spare = spare.lock().unwrap_or_else(|p| p.into_inner());
                    let reused = spare.get_mut(&e.content_len).and_then(Vec::pop);
                    drop(spare);
                    let mut out = match reused {
                        Some(out) => out,
                        None => mdl_store::zeroed(e.content_len)?,
                    };
                    while let Some((at, n)) = windows.next_window() {
                        windows.next_into(&mut out[at as usize..at as usize + n])?;
                    }
                    windows.finish()?;
                    return Ok(Some(out));
                }
                // Whichever holds less: a window of every level of its chain, or the tensor
                // decoded whole (a deep chain of a small tensor) — what its cost reserved. A
                // delta over bytes held decoded (the layer before, or lent by the caller) is
                // one level whatever its depth: windows, against those bytes.
                let over_held = e
                    .base
                    .is_some_and(|b| held.contains_key(&b) || store.lends(&b));
                if over_held || mdl_store::windowed_cost(e) < mdl_store::budget::decode_cost(e) {
                    windows.for_each(&mut Vec::new(), |_, _| Ok(()))?;
                } else {
                    drop(windows);
                    store.load_tensor(id, e)?;
                }
                Ok(None)
            },
        )?;
        for (((id, _), _), out) in items.iter().zip(decoded) {
            if let Some(out) = out {
                next_held.insert(*id, out);
            }
        }
        next_reserved.push(reserved.split_off(keeping));
        kept += keeping;
        start = end;
    }
    drop(spare);
    *verified = Verified {
        spare: verified.take_buffers(),
        _spare_reserved: std::mem::take(&mut verified.reserved),
        held: next_held,
        reserved: next_reserved,
    };
    Ok(())
}

/// Names a tensor's record in the index, as a dependent of its base; the record of its expiry
/// it replaces, if any.
pub(super) fn index_tensor(
    w: &mut MetaWrite<'_>,
    id: &ObjectId,
    e: &IndexEntry,
) -> Result<Option<Expired>> {
    w.put_object(id, e)?;
    if let Some(base) = &e.base {
        w.add_dependent(base, id)?;
    }
    // Stored again: no longer expired here.
    let expired = w.expired(id)?;
    if expired.is_some() {
        w.remove_expired(id)?;
    }
    Ok(expired)
}

/// What [`publish_tail`] indexed.
#[derive(Default)]
pub(super) struct Tail {
    /// The commits.
    pub commits: Vec<ObjectId>,
    /// The tensors recorded as expired.
    pub expired: Vec<ObjectId>,
    /// Commits marked cut: received without their parents.
    pub cut: Vec<ObjectId>,
    /// Commits marked cut before, whose parents are all here now: no longer cut.
    pub joined: Vec<ObjectId>,
}

/// Verifies the received manifests and commits and what they name, then indexes them all in
/// one transaction, with the expiry of the tensors `expired` lists that a received manifest
/// names. A commit may lack a parent only if `cut` names it: it is marked cut. Commits marked
/// cut before whose parents came lose the mark.
pub(super) fn publish_tail(
    repo: &Repository,
    tail: &[(ObjectId, IndexEntry)],
    expired: &HashMap<ObjectId, Expired>,
    cut: &HashSet<ObjectId>,
) -> Result<Tail> {
    if tail.is_empty() {
        return Ok(Tail::default());
    }
    let store = repo.store();
    // Everything below is checked while this write transaction is open: redb has one writer,
    // so no deletion (gc) can commit between the checks and the publishing.
    let mut w = store.meta().write()?;
    let meta = store.meta().read()?;
    let incoming: HashMap<ObjectId, ObjectKind> = tail.iter().map(|(i, e)| (*i, e.kind)).collect();
    let present = |id: &ObjectId, kind: ObjectKind| -> Result<bool> {
        Ok(incoming.get(id) == Some(&kind) || meta.object(id)?.is_some_and(|e| e.kind == kind))
    };
    let mut out = Tail::default();
    let mut commits = Vec::new();
    let mut newly_expired: Vec<(ObjectId, &Expired)> = Vec::new();
    for (id, entry) in tail {
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(entry.content_len as usize)
            .map_err(|_| StoreError::OutOfMemory(entry.content_len))?;
        store.read_object(id, entry, &mut bytes)?;
        let corrupt = |source| Error::Corrupt { id: *id, source };
        match entry.kind {
            ObjectKind::Manifest => {
                let manifest = Manifest::decode(&bytes).map_err(corrupt)?;
                for (object, header) in manifest.objects() {
                    if present(&object, ObjectKind::Tensor)? || meta.expired(&object)?.is_some() {
                        continue;
                    }
                    match expired.get(&object) {
                        Some(x) if Some(x.content_len) == header.data_len() => {
                            newly_expired.push((object, x));
                        }
                        Some(_) => {
                            return Err(bad_pack(format!(
                                "expired tensor {object} has the wrong size"
                            )))
                        }
                        None => {
                            return Err(Error::Incomplete(format!(
                                "object {object} of manifest {id}"
                            )))
                        }
                    }
                }
            }
            ObjectKind::Commit => {
                let commit = Commit::decode(&bytes).map_err(corrupt)?;
                if !present(&commit.manifest, ObjectKind::Manifest)? {
                    return Err(Error::Incomplete(format!(
                        "manifest {} of commit {id}",
                        commit.manifest
                    )));
                }
                let mut whole = true;
                for p in &commit.parents {
                    if !present(p, ObjectKind::Commit)? {
                        if !cut.contains(id) {
                            return Err(Error::Incomplete(format!("parent {p} of commit {id}")));
                        }
                        whole = false;
                    }
                }
                if !whole {
                    out.cut.push(*id);
                }
                commits.push((*id, commit));
            }
            ObjectKind::Tensor => unreachable!("tensors are published in layers"),
        }
    }
    for id in meta.shallow()? {
        let Some(s) = meta.commit(&id)? else { continue };
        let mut whole = true;
        for p in &s.parents {
            whole &= present(p, ObjectKind::Commit)?;
        }
        if whole {
            out.joined.push(id);
        }
    }
    drop(meta);
    for (id, e) in tail {
        w.put_object(id, e)?;
    }
    for (id, c) in &commits {
        w.put_commit(id, &CommitSummary::of(c))?;
    }
    for id in &out.cut {
        w.set_shallow(id, true)?;
    }
    for id in &out.joined {
        w.set_shallow(id, false)?;
    }
    newly_expired.sort_by_key(|(id, _)| *id);
    newly_expired.dedup_by_key(|(id, _)| *id);
    for (id, x) in &newly_expired {
        w.put_expired(id, x)?;
    }
    w.commit_txn()?;
    out.commits = commits.into_iter().map(|(id, _)| id).collect();
    out.expired = newly_expired.into_iter().map(|(id, _)| id).collect();
    Ok(out)
}
