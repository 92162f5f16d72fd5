//! Deferred reverse deltas (`delta.defer`): a reverse-mode commit stores its new tensors whole
//! and queues itself in the index (`meta`'s pending table, in the publish transaction); later,
//! [`run_deferred`] re-encodes the parent's versions of those tensors as deltas against them,
//! exactly as the commit would have, and publishes the new records with the queue entry's
//! removal in one transaction (a run stopped part-way publishes the tensors it finished, and
//! the entry stays for the rest). The queue is worked oldest first, so the repository ends in
//! the same state whoever works it and whenever (right after each commit, after several, or
//! in pieces).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mdl_codec::engine::Kept;
use mdl_codec::float;
use mdl_codec::huffman::CHUNK_LOG2;
use mdl_codec::{CodecTag, SMALL_DELTA};
use mdl_format::{Entry, ObjectId, Region};
use mdl_store::meta::MetaRead;
use mdl_store::{IndexEntry, ObjectBatch, Store};
use serde::{Deserialize, Serialize};

use super::phase::Phase;
use super::store::coder::Coder;
use super::store::content::Content;
use super::store::reverse::Reverse;
use super::store::{previous_content, reverse_allowed};
use crate::policy::{DeltaMode, DeltaPolicy};
use crate::previous::Previous;
use crate::rewrite::{publish_rewrite, Rewrite};
use crate::warm::WarmTensors;
use crate::{per_tensor, Repository, Result, BIG_TENSOR};

/// What [`run_deferred`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeferredReport {
    /// Commits whose deferred re-encodes were worked.
    pub commits: u64,
    /// Previous versions re-encoded as reverse deltas.
    pub rewritten: u64,
    /// Record bytes the re-encodes saved.
    pub saved_bytes: u64,
    /// Commits still queued (when `stop` ended the work early).
    pub pending: u64,
}

/// Works the queue of deferred re-encodes, oldest commit first, until it is empty or `stop`
/// says to stop (asked before each tensor). Each commit's re-encodes are published in one
/// transaction with its removal from the queue; a commit stopped part-way publishes the
/// re-encodes it finished and stays queued, and the next run takes up its other tensors (a
/// tensor re-encoded is no longer a whole version, so it is not paired again). A failure
/// leaves the repository as it was (the records written taken back; a crash leaves them
/// unindexed, for gc to sweep). `warm` is the last commit's tensors, where the caller kept them.
pub fn run_deferred(
    repo: &Repository,
    warm: Option<&WarmTensors>,
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<DeferredReport> {
    let store = repo.store();
    let mut report = DeferredReport::default();
    let held = Held {
        warm,
        carried: WarmTensors::new(CARRIED_BYTES),
        carry: AtomicBool::new(false),
    };
    while !stop() {
        let _writer = repo.writer();
        let (first, queued) = {
            let meta = store.meta().read()?;
            (meta.pending_first()?, meta.pending_count()?)
        };
        let Some((seq, commit)) = first else {
            break;
        };
        // Only a commit queued behind this one reads what is carried; a long-lived committer
        // (which gives its `warm` cache) keeps to that cache's memory.
        held.carry
            .store(warm.is_none() && queued > 1, Ordering::Relaxed);
        let policy = DeltaPolicy::from_store(store)?;
        let batch = store.batch();
        let unpublished = batch.unpublished();
        held.carried.begin();
        let reencoding = Phase::start("re-encode");
        let Worked {
            rewrites,
            tried,
            complete,
        } = reencode_parent(repo, &batch, &policy, &commit, &held, stop)?;
        drop(reencoding);
        if rewrites.is_empty() && tried.is_empty() && !complete {
            break;
        }
        let _publishing = Phase::start("publish re-encodes");
        batch.finish()?;
        let mut w = store.meta().write()?;
        for r in &rewrites {
            publish_rewrite(&mut w, r)?;
        }
        if complete {
            w.remove_pending(seq, &commit)?;
        } else {
            for prev in &tried {
                w.mark_tried(&commit, prev)?;
            }
        }
        w.commit_txn()?;
        unpublished.published();
        held.carried.publish();
        for r in &rewrites {
            store.remove_record(&r.id, r.old.generation);
        }
        report.commits += u64::from(complete);
        report.rewritten += rewrites.len() as u64;
        report.saved_bytes += rewrites
            .iter()
            .map(|r| r.old.stored_len.saturating_sub(r.new.stored_len))
            .sum::<u64>();
        tracing::info!(%commit, rewritten = rewrites.len(), complete, "deferred re-encode");
        if !complete {
            break;
        }
    }
    report.pending = store.meta().read()?.pending_count()?;
    Ok(report)
}

/// How many commits' deferred re-encodes are queued.
pub fn pending_deferred(repo: &Repository) -> Result<u64> {
    Ok(repo.store().meta().read()?.pending_count()?)
}

/// Whether another process is waiting to write the repository: what background work that
/// gives way to writers asks between its steps.
pub fn writer_waiting(repo: &Repository) -> bool {
    mdl_store::writer_waiting(repo.store().dir())
}

/// Bytes of decoded new versions a run keeps for the next queued commit, which re-encodes
/// them as its previous versions (each generation; two are held while a commit is worked).
const CARRIED_BYTES: u64 = 512 << 20;

/// The decoded versions a run reads before the store: the caller's last commit's, and the new
/// versions of the queued commit worked before (the previous versions of the next one), so a
/// series worked in one run is decoded once, not twice.
struct Held<'w> {
    warm: Option<&'w WarmTensors>,
    carried: WarmTensors,
    /// Whether the new versions decoded now are kept (another commit is queued).
    carry: AtomicBool,
}

impl Held<'_> {
    /// The content of object `id`, if it is held in memory (carried, or the caller's).
    fn kept(&self, id: &ObjectId) -> Option<Arc<Vec<u8>>> {
        self.carried
            .get(id)
            .or_else(|| self.warm.and_then(|w| w.get(id)))
    }

    /// The content of object `id` (index entry `entry`), kept or decoded.
    fn content(&self, store: &Store, id: &ObjectId, entry: &IndexEntry) -> Result<Arc<Vec<u8>>> {
        match self.kept(id) {
            Some(kept) => Ok(kept),
            None => previous_content(store, None, id, entry),
        }
    }
}

/// What a run did of one queued commit's re-encodes.
struct Worked {
    rewrites: Vec<Rewrite>,
    /// Previous versions tried without a rewrite (the re-encode did not pay).
    tried: Vec<ObjectId>,
    /// Whether every pair was worked (`false` when `stop` said to stop before the last).
    complete: bool,
}

impl Default for Worked {
    /// Nothing to do: complete.
    fn default() -> Self {
        Worked {
            rewrites: Vec::new(),
            tried: Vec::new(),
            complete: true,
        }
    }
}

/// One tensor of a queued commit and its parent's version, to be re-encoded against it.
struct Pair<'m> {
    new: &'m Entry,
    new_entry: IndexEntry,
    prev: ObjectId,
    prev_entry: IndexEntry,
}

/// Re-encodes, into `batch`, the previous versions of `commit`'s tensors that a reverse-mode
/// commit would have re-encoded against them; nothing when the commit or its parent is gone.
/// Pairs an earlier stopped run tried are not tried again.
fn reencode_parent(
    repo: &Repository,
    batch: &ObjectBatch<'_>,
    policy: &DeltaPolicy,
    commit: &ObjectId,
    held: &Held<'_>,
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<Worked> {
    let store = repo.store();
    if policy.mode != DeltaMode::Reverse {
        return Ok(Worked::default());
    }
    let (record, parent) = {
        let meta = store.meta().read()?;
        if meta.object(commit)?.is_none() {
            return Ok(Worked::default());
        }
        let record = repo.load_commit(commit)?;
        match record.parents.first() {
            Some(p) if meta.object(p)?.is_some() => (record.manifest, *p),
            _ => return Ok(Worked::default()),
        }
    };
    let manifest = repo.load_manifest(&record)?;
    let parent_manifest = repo.load_manifest(&repo.load_commit(&parent)?.manifest)?;
    let previous = Previous::of(Some(&parent_manifest));
    // The pairs, in manifest order; a previous version is re-encoded once, against the first
    // tensor that names it.
    let mut pairs = Vec::new();
    let mut claimed = HashSet::new();
    {
        let meta = store.meta().read()?;
        for file in &manifest.files {
            for region in &file.regions {
                let Region::Tensor(new) = region else {
                    continue;
                };
                if let Some(pair) = pair_of(repo, &meta, policy, &previous, &file.path, new)? {
                    if claimed.insert(pair.prev) && !meta.tried(commit, &pair.prev)? {
                        pairs.push(pair);
                    }
                }
            }
        }
    }
    let coder = Coder {
        repo,
        batch,
        engine: store.engine(),
    };
    // Each tensor's outcome, or `None` for one not started once `stop` said to stop.
    let stopped = AtomicBool::new(false);
    let done = per_tensor(
        &pairs,
        |p| p.new_entry.content_len,
        |p| {
            if stopped.load(Ordering::Relaxed) || stop() {
                stopped.store(true, Ordering::Relaxed);
                return Ok(None);
            }
            reencode(&coder, p, held).map(Some)
        },
    )?;
    let mut worked = Worked {
        complete: done.iter().all(Option::is_some),
        ..Worked::default()
    };
    for (pair, outcome) in pairs.iter().zip(done) {
        match outcome {
            Some(Some(rewrite)) => worked.rewrites.push(rewrite),
            Some(None) => worked.tried.push(pair.prev),
            None => {}
        }
    }
    Ok(worked)
}

/// Element chunks a tensor has at least for [`sample_may_pay`] to judge it from its first one.
const SAMPLED_CHUNKS: usize = 8;

/// Whether the re-encode of `p` is worth decoding both versions for: false when their first
/// 32 Ki elements already say that no delta codes smaller than the planes as they are — the
/// judgement [`Coder::write_reverse`] makes on the same elements before it counts the rest, so
/// the outcome is the same (no rewrite), without decoding the tensors (a training series'
/// first moments, about a third of its bytes, end so). Only the first element chunk of each
/// record is decoded, unverified (nothing is written on it); versions held in memory are read
/// there. Tensors under [`SAMPLED_CHUNKS`] chunks are decoded whole without asking: there the
/// chunk is most of the tensor (every tensor of the corpus' small model).
fn sample_may_pay(coder: &Coder<'_>, p: &Pair<'_>, held: &Held<'_>) -> Result<bool> {
    let store = coder.repo.store();
    let dtype = p.new.header.dtype;
    let len = p.new_entry.content_len as usize;
    let Some(n) = float::delta_sample_bytes(dtype, len) else {
        return Ok(true);
    };
    // A record's head is a whole chunk of elements: worth decoding first only where that is a
    // small part of the tensor (a tensor that pays is then decoded whole as well).
    if len < (SAMPLED_CHUNKS << CHUNK_LOG2) * dtype.size() {
        return Ok(true);
    }
    // Both versions in memory: the re-encode reaches the same judgement as cheaply itself.
    let (prev_kept, new_kept) = (held.kept(&p.prev), held.kept(&p.new.id));
    if prev_kept.is_some() && new_kept.is_some() {
        return Ok(true);
    }
    // A version in memory whole, or the head of its record.
    let head = |kept: Option<Arc<Vec<u8>>>, id: &ObjectId, entry: &IndexEntry| match kept {
        Some(kept) => Ok::<_, crate::Error>(kept),
        None => Ok(Arc::new(store.tensor_head(id, entry, n)?)),
    };
    let (prev, new) = (
        head(prev_kept, &p.prev, &p.prev_entry)?,
        head(new_kept, &p.new.id, &p.new_entry)?,
    );
    if prev.len() < n || new.len() < n {
        return Ok(true);
    }
    let judged = float::delta_to_count_on_sample(coder.engine, dtype, &prev[..n], &new[..n])
        .map_err(|source| crate::Error::Encode { id: p.prev, source })?;
    Ok(judged != float::ToCount::Nothing)
}

/// The pair of tensor `new` (of file `path`) with its previous version, if a reverse-mode
/// commit would have tried re-encoding that one against it: a float tensor stored exactly and
/// whole, a previous version of the same header that is stored exactly and self-contained, and
/// a chain the policy lets grow.
fn pair_of<'m>(
    repo: &Repository,
    meta: &MetaRead,
    policy: &DeltaPolicy,
    previous: &Previous<'_>,
    path: &str,
    new: &'m Entry,
) -> Result<Option<Pair<'m>>> {
    let header = &new.header;
    if !float::supports(header.dtype) {
        return Ok(None);
    }
    let Some(prev) = previous.get(path, &new.name) else {
        return Ok(None);
    };
    if prev.header != *header || prev.id == new.id {
        return Ok(None);
    }
    let (Some(new_entry), Some(prev_entry)) = (meta.object(&new.id)?, meta.object(&prev.id)?)
    else {
        return Ok(None);
    };
    let exact = |e: &IndexEntry| {
        matches!(
            CodecTag::try_from(e.codec),
            Ok(CodecTag::FloatSplit | CodecTag::MantissaTrim | CodecTag::Raw | CodecTag::Zstd)
        )
    };
    if new_entry.content_len < SMALL_DELTA
        || !exact(&new_entry)
        || new_entry.base.is_some()
        || !exact(&prev_entry)
    {
        return Ok(None);
    }
    if !reverse_allowed(repo.store(), meta, policy, &prev.id, &prev_entry)? {
        return Ok(None);
    }
    Ok(Some(Pair {
        new,
        new_entry,
        prev: prev.id,
        prev_entry,
    }))
}

/// Re-encodes one previous version against its new one, when that pays (the commit's rule).
fn reencode(coder: &Coder<'_>, p: &Pair<'_>, held: &Held<'_>) -> Result<Option<Rewrite>> {
    let store = coder.repo.store();
    let header = &p.new.header;
    if !sample_may_pay(coder, p, held)? {
        return Ok(None);
    }
    // Large tensors a window at a time, as a commit reads them; the rest in memory.
    let windowed = p.new_entry.content_len >= BIG_TENSOR;
    let (new_bytes, prev_bytes) = match windowed {
        true => (None, None),
        false => {
            let new = held.content(store, &p.new.id, &p.new_entry)?;
            if held.carry.load(Ordering::Relaxed) {
                // The next queued commit re-encodes this version against its own.
                held.carried.offer(p.new.id, new.clone(), Kept::nothing());
            }
            (
                Some(new),
                Some(held.content(store, &p.prev, &p.prev_entry)?),
            )
        }
    };
    let data = match &new_bytes {
        Some(b) => Content::Memory(b.as_slice()),
        None => Content::Stored {
            store,
            id: p.new.id,
            entry: p.new_entry,
        },
    };
    let base = match &prev_bytes {
        Some(b) => Content::Memory(b.as_slice()),
        None => Content::Stored {
            store,
            id: p.prev,
            entry: p.prev_entry,
        },
    };
    let reverse = Reverse {
        prev: p.prev,
        prev_entry: p.prev_entry,
        prev_data: &base,
        new: p.new.id,
        new_depth: p.new_entry.depth,
        data: &data,
    };
    let Some(entry) = coder.write_reverse(header, &reverse)? else {
        return Ok(None);
    };
    Ok(Some(Rewrite {
        id: p.prev,
        old: p.prev_entry,
        new: entry,
    }))
}
