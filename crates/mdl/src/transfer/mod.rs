//! Moving history between repositories (push, fetch, clone): which objects to send, a pack
//! stream of their records, receiving one with every object verified, and ref updates by
//! compare-and-swap with a fast-forward check.
//!
//! Records travel as they are stored (deltas included), so a push costs what the store costs;
//! a fetch may take a tensor stored whole as a delta against the version it holds instead
//! (`derived.rs`).
//! The receiver re-hashes every object before its index names it, publishing tensors in layers
//! so a delta's base is always indexed (and verified) before the delta; manifests and commits
//! are published last, in one transaction, once everything they name is present. A refused
//! transfer changes no ref and leaves nothing behind; an interrupted one (killed) leaves at most
//! verified, unreferenced tensors and unindexed records, for gc. Refs received are moved in one
//! transaction, once every commit they name is whole here ([`update_refs`]).

use std::collections::{HashMap, HashSet};

use mdl_format::{ObjectId, ObjectKind, Ref};
use mdl_store::meta::MetaRead;
use mdl_store::{IndexEntry, RefValue, StoreError};

pub use mdl_protocol::transfer::{PlannedObject, Received, RefUpdate, Shallow};

use crate::{history, Error, Repository, Result};

mod added;
mod derived;
mod frame;
mod pack;
mod partial;
mod publish;
mod receive;
mod single;
mod toc;
pub use added::Added;
pub use derived::{
    derive_against, derived_record, is_kept, reanchor, records_made, usable_bases, MAX_DERIVED,
};
pub use pack::{write_pack, write_pack_against, PackWriter};
pub use partial::Partial;
pub(crate) use partial::DIR as PARTIAL_DIR;
pub use receive::{
    receive_expected, receive_indexed, receive_pack, receive_planned, Expect, Receipt,
};
pub use single::{read_commit, read_manifest, read_tensor_header};
pub use toc::{encode_toc, read_toc, Frame, FrameRecord, Toc, TOC_FOOTER};

/// Why a pack was refused.
fn bad_pack(why: impl Into<String>) -> Error {
    Error::BadTransfer(why.into())
}

/// First bytes of a pack stream.
pub const PACK_MAGIC: &[u8; 8] = b"MDLPACK1";

/// Whether the repository has `id`, as an object or as a record of its expiry.
fn has_object(meta: &MetaRead, id: &ObjectId) -> Result<bool> {
    Ok(meta.object(id)?.is_some() || meta.expired(id)?.is_some())
}

/// Those of `ids` the repository does not hold, in order: what another repository must send.
/// A tensor retention expired here counts as not held: the sender sends its record when it has
/// it (a commit that stores the same content again), else an expired frame, which changes
/// nothing here.
pub fn missing(repo: &Repository, ids: &[ObjectId]) -> Result<Vec<ObjectId>> {
    let meta = repo.store().meta().read()?;
    let mut out = Vec::new();
    for id in ids {
        if meta.object(id)?.is_none() {
            out.push(*id);
        }
    }
    Ok(out)
}

/// Those of `ids` the repository knows neither as objects nor as expired tensors: what it
/// cannot send, even as an expired frame.
pub fn unknown(repo: &Repository, ids: &[ObjectId]) -> Result<Vec<ObjectId>> {
    let meta = repo.store().meta().read()?;
    let mut out = Vec::new();
    for id in ids {
        if !has_object(&meta, id)? {
            out.push(*id);
        }
    }
    Ok(out)
}

/// Every commit the repository holds.
pub fn commits(repo: &Repository) -> Result<Vec<ObjectId>> {
    let meta = repo.store().meta().read()?;
    Ok(meta.commits()?.into_iter().map(|(id, _)| id).collect())
}

/// Whether the repository holds commit `id`.
pub fn has_commit(repo: &Repository, id: &ObjectId) -> Result<bool> {
    Ok(repo.store().meta().read()?.commit(id)?.is_some())
}

/// The pack of `ids` ([`write_pack`]) in a temporary file under `.mdl/incoming` (removed when
/// dropped), ready to upload.
pub fn spool_pack(repo: &Repository, ids: &[ObjectId]) -> Result<tempfile::NamedTempFile> {
    let mut tmp = repo.store().incoming_file(".push-")?;
    let path = tmp.path().to_path_buf();
    let mut w = std::io::BufWriter::with_capacity(1 << 20, tmp.as_file_mut());
    pack::write_frames(repo, ids, &mut w)?;
    std::io::Write::flush(&mut w).map_err(|source| Error::Output { path, source })?;
    drop(w);
    Ok(tmp)
}

/// Objects that a repository holding the commits `has_commit` accepts lacks to hold `want`
/// too (and their history, as far as `limit` takes it), in an order a receiver can import
/// them: tensors with every delta base before its dependents, then manifests, then commits
/// parents first, those whose history is cut there marked so.
#[tracing::instrument(name = "transfer.plan", skip_all, fields(want = want.len()))]
pub fn plan(
    repo: &Repository,
    want: &[ObjectId],
    has_commit: &dyn Fn(&ObjectId) -> bool,
    limit: &Shallow,
) -> Result<Vec<PlannedObject>> {
    // New commits, parents first. The walk stops at the commits the other side has: a
    // shallow receiver's history is not closed under ancestry.
    let commits = crate::shallow::select(repo, want, has_commit, limit)?;
    let meta = repo.store().meta().read()?;
    let mut tensors: HashMap<ObjectId, IndexEntry> = HashMap::new();
    let mut expired: HashSet<ObjectId> = HashSet::new();
    let mut manifests = Vec::new();
    for (_, summary, _) in &commits {
        let manifest = repo.load_manifest(&summary.manifest)?;
        let entry = meta
            .object(&summary.manifest)?
            .ok_or(StoreError::Missing(summary.manifest))?;
        manifests.push(PlannedObject {
            id: summary.manifest,
            size: entry.stored_len,
            expired: false,
            against: None,
            cut: false,
        });
        for (object, _) in manifest.objects() {
            // The object and its whole delta chain.
            let mut next = Some(object);
            while let Some(id) = next {
                if tensors.contains_key(&id) {
                    break;
                }
                let Some(entry) = meta.object(&id)? else {
                    // Retention deleted it; the commit travels thinned.
                    if id == object && meta.expired(&id)?.is_some() {
                        expired.insert(id);
                        break;
                    }
                    return Err(StoreError::Missing(id).into());
                };
                next = entry.base;
                tensors.insert(id, entry);
            }
        }
    }
    let mut tensors: Vec<(ObjectId, IndexEntry)> = tensors.into_iter().collect();
    tensors.sort_by_key(|(id, e)| (e.depth, *id));
    let mut expired: Vec<ObjectId> = expired.into_iter().collect();
    expired.sort();
    let mut out: Vec<PlannedObject> = expired
        .into_iter()
        .map(|id| PlannedObject {
            id,
            size: 0,
            expired: true,
            against: None,
            cut: false,
        })
        .chain(tensors.into_iter().map(|(id, e)| PlannedObject {
            id,
            size: e.stored_len,
            expired: false,
            against: None,
            cut: false,
        }))
        .collect();
    let mut listed: HashSet<ObjectId> = out.iter().map(|p| p.id).collect();
    out.extend(manifests.into_iter().filter(|m| listed.insert(m.id)));
    for (id, _, cut) in &commits {
        let entry = meta.object(id)?.ok_or(StoreError::Missing(*id))?;
        out.push(PlannedObject {
            id: *id,
            size: entry.stored_len,
            expired: false,
            against: None,
            cut: *cut,
        });
    }
    Ok(out)
}

/// Commits reachable from any ref, as far as the commit index goes: gc keeps them and all they
/// name, so a check of what a ref update publishes can stop there.
fn referenced(meta: &MetaRead) -> Result<HashSet<ObjectId>> {
    let mut seen = HashSet::new();
    let mut stack: Vec<ObjectId> = meta
        .refs("")?
        .iter()
        .filter_map(|(_, v)| v.target())
        .collect();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        if let Some(s) = meta.commit(&id)? {
            stack.extend(s.parents);
        }
    }
    Ok(seen)
}

/// Fails with [`Error::Incomplete`] unless `tip` and its ancestors outside `known` are whole:
/// each commit indexed, its manifest, every tensor the manifest names (or its record of
/// expiry) and every tensor's delta chain; history ends at the commits marked cut. The
/// commits found whole join `known`.
fn check_complete(
    repo: &Repository,
    meta: &MetaRead,
    tip: &ObjectId,
    known: &mut HashSet<ObjectId>,
    cut: &HashSet<ObjectId>,
) -> Result<()> {
    let has = |id: &ObjectId, kind: ObjectKind| -> Result<Option<IndexEntry>> {
        Ok(meta.object(id)?.filter(|e| e.kind == kind))
    };
    let mut stack = vec![*tip];
    let mut seen = HashSet::new();
    let mut manifests = HashSet::new();
    let mut tensors = HashSet::new();
    while let Some(id) = stack.pop() {
        if known.contains(&id) || !seen.insert(id) {
            continue;
        }
        let summary = match (meta.commit(&id)?, has(&id, ObjectKind::Commit)?) {
            (Some(s), Some(_)) => s,
            _ => return Err(Error::Incomplete(format!("commit {id}"))),
        };
        if !cut.contains(&id) {
            stack.extend(summary.parents.iter().copied());
        }
        if !manifests.insert(summary.manifest) {
            continue;
        }
        if has(&summary.manifest, ObjectKind::Manifest)?.is_none() {
            return Err(Error::Incomplete(format!(
                "manifest {} of commit {id}",
                summary.manifest
            )));
        }
        for (object, _) in repo.load_manifest(&summary.manifest)?.objects() {
            let mut next = Some(object);
            while let Some(t) = next.filter(|t| tensors.insert(*t)) {
                next = match has(&t, ObjectKind::Tensor)? {
                    Some(entry) => entry.base,
                    None if t == object && meta.expired(&t)?.is_some() => None,
                    None => return Err(Error::Incomplete(format!("object {t} of commit {id}"))),
                };
            }
        }
    }
    known.extend(seen);
    Ok(())
}

/// Validates a full ref name that another repository may change or send
/// ([`mdl_format::names::check_ref`]): `refs/heads/NAME` or `refs/tags/NAME` with a valid NAME.
/// Whether it is a branch or a tag.
pub fn check_ref_name(name: &str) -> Result<&'static str> {
    match mdl_format::names::check_ref(name) {
        Ok(Ref::Branch(_)) => Ok("branch"),
        Ok(_) => Ok("tag"),
        Err(e) => Err(Error::BadTransfer(e.to_string())),
    }
}

/// Applies a [`RefUpdate`]: the new commit must be present and whole (its history, manifests,
/// tensors and delta bases; [`Error::Incomplete`] otherwise), a branch may
/// only move forward unless forced, a tag is only created unless forced, and the change is a
/// compare-and-swap against `old` (a concurrent change fails with [`StoreError::RefConflict`]).
#[tracing::instrument(name = "transfer.update_ref", skip_all, fields(name = %update.name))]
pub fn update_ref(repo: &Repository, update: &RefUpdate, message: &str) -> Result<()> {
    let kind = check_ref_name(&update.name)?;
    // The write transaction is taken first: until it commits no deletion can, so the new
    // commit stays as whole as it is checked to be here.
    let mut w = repo.store().meta().write()?;
    let meta = repo.store().meta().read()?;
    if let Some(new) = &update.new {
        let cut = meta.shallow()?.into_iter().collect();
        check_complete(repo, &meta, new, &mut referenced(&meta)?, &cut)?;
    }
    let current = meta.get_ref(&update.name)?;
    drop(meta);
    if let (Some(old), Some(new), false) = (&update.old, &update.new, update.force) {
        if kind == "tag" && old != new {
            return Err(Error::RefExists {
                kind: "tag",
                name: update.name.clone(),
            });
        }
        if !is_ancestor(repo, old, new)? {
            return Err(Error::NotFastForward {
                name: update.name.clone(),
                old: *old,
                new: *new,
            });
        }
    }
    // The expected value as stored: annotated tags keep their annotation.
    let expected = match (&update.old, &current) {
        (None, _) => None,
        (Some(old), Some(v)) if v.target() == Some(*old) => Some(v.clone()),
        (Some(old), _) => Some(RefValue::Direct(*old)),
    };
    let new = update.new.map(RefValue::Direct);
    w.update_ref(&update.name, expected.as_ref(), new.as_ref(), message)?;
    w.commit_txn()?;
    Ok(())
}

/// Room kept free on the disk besides what a transfer brings: the index grows too, and the
/// rest of the machine needs its disk.
const SPARE_ROOM: u64 = 256 << 20;

/// Refuses to receive `bytes` (what a peer plans to send) onto a disk without room for them:
/// a peer's plan bounds what it may send ([`Expect::Planned`]), and this bounds the plan.
pub fn check_room(repo: &Repository, bytes: u64) -> Result<()> {
    match mdl_store::free_bytes(repo.store().dir()) {
        Some(free) if bytes.saturating_add(SPARE_ROOM) > free => Err(Error::BadTransfer(format!(
            "the other repository plans to send {bytes} bytes; the disk holding this one has {free} free"
        ))),
        _ => Ok(()),
    }
}

/// One ref change of [`update_refs`]: `name` (a full name) from `old` (`None`: must not exist)
/// to `new`.
#[derive(Clone, Debug)]
pub struct RefChange {
    /// The full ref name.
    pub name: String,
    /// Its value now, as last read.
    pub old: Option<RefValue>,
    /// Its new value.
    pub new: RefValue,
}

/// Moves every ref of `changes` in one transaction, each by compare-and-swap, once every commit
/// they name is whole in the repository (its history, manifests, tensors and delta bases:
/// [`Error::Incomplete`] otherwise, and no ref moves). What a fetch, pull or clone does with
/// the refs a server sent.
pub fn update_refs(repo: &Repository, changes: &[RefChange], message: &str) -> Result<()> {
    if changes.is_empty() {
        return Ok(());
    }
    // The write transaction is taken first: until it commits no deletion can.
    let mut w = repo.store().meta().write()?;
    let meta = repo.store().meta().read()?;
    let mut known = referenced(&meta)?;
    let cut = meta.shallow()?.into_iter().collect();
    for c in changes {
        if let Some(target) = c.new.target() {
            check_complete(repo, &meta, &target, &mut known, &cut)?;
        }
    }
    drop(meta);
    for c in changes {
        w.update_ref(&c.name, c.old.as_ref(), Some(&c.new), message)?;
    }
    w.commit_txn()?;
    Ok(())
}

/// Whether `ancestor` is `descendant` or one of its ancestors.
pub fn is_ancestor(repo: &Repository, ancestor: &ObjectId, descendant: &ObjectId) -> Result<bool> {
    let meta = repo.store().meta().read()?;
    let mut seen = HashSet::new();
    let mut stack = vec![*descendant];
    while let Some(id) = stack.pop() {
        if id == *ancestor {
            return Ok(true);
        }
        if !seen.insert(id) {
            continue;
        }
        if let Some(s) = meta.commit(&id)? {
            stack.extend(s.parents);
        }
    }
    Ok(false)
}

/// Every commit reachable from `tips` (the tips included), children before parents.
pub fn reachable_commits(repo: &Repository, tips: &[ObjectId]) -> Result<Vec<ObjectId>> {
    Ok(history::walk(repo, tips)?
        .into_iter()
        .map(|(id, _)| id)
        .collect())
}
