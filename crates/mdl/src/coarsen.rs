//! Retention's coarsening rule (`retention.coarsen_after = N`, applied by `mdl gc`): the
//! first moments (`exp_avg`) of commits more than N first-parent steps behind every branch tip
//! (not tagged, not a tip) keep only their large elements ([`KEEP_ABOVE_MEAN`]). Such commits
//! are resumed rarely; they stay resumable, with a first moment that costs a fraction of what
//! it did and the second moment as committed.
//!
//! Commit and manifest ids never change: a coarsened record keeps its object's id and names
//! the hash of what it now decodes to, and the error it adds to the content the id names
//! (`docs/FORMAT.md`, record flag bit 1). `mdl show` reports the committed error plus that.
//!
//! What is coarsened: the `exp_avg` of a recorded pair that is lossy, stored as a
//! `quant-residual` record in Adam's units (against its parameter's previous `exp_avg_sq`),
//! not already coarsened, and named by no commit that stays fine — and only together with
//! every record that decodes through it (a residual is taken against its base's decoded
//! content, so a base whose content changes takes its dependents along; one with a dependent
//! outside the set is left alone). The tip, and everything the tip decodes through, is
//! therefore never touched. `exp_avg_sq` is not coarsened: each commit's is a residual against
//! the previous one, so the whole chain up to the tip decodes through it. Records are
//! re-encoded base first, each against its base's content as it will decode afterwards; each
//! is decoded again before it is written; the switch is one index transaction under the
//! repository's writer (a crash before it leaves unindexed records, which gc sweeps).

use std::collections::{HashMap, HashSet};

use mdl_codec::engine::FloatView;
use mdl_codec::{residual, CodecTag};
use mdl_format::record::{self, Coarsened};
use mdl_format::{ObjectId, TensorHasher, TensorHeader};
use mdl_store::meta::MetaRead;
use mdl_store::{IndexEntry, Placement};

pub use mdl_protocol::outcome::Coarsening;

use crate::history::{self, CountSetting};
use crate::lossy::sparse::{self, Sparsify};
use crate::rewrite::{publish_all, Rewrite};
use crate::{Error, Progress, Repository, Result};

/// Configuration key of the coarsening rule.
pub const COARSEN_AFTER_KEY: &str = "retention.coarsen_after";

/// A coarsened `exp_avg` keeps the elements whose magnitude exceeds this many times the
/// tensor's mean magnitude (ExCP's rule; about an eighth of the elements on the corpus) and
/// is zero elsewhere; its `exp_avg_sq`, which the next commit's residuals build on, is kept
/// as committed, so Adam keeps an estimate of `v` wherever `m` was dropped.
pub const KEEP_ABOVE_MEAN: f64 = 2.0;

/// `retention.coarsen_after`: commits this many steps behind every tip are coarsened.
pub(crate) const COARSEN_AFTER: CountSetting = CountSetting {
    key: COARSEN_AFTER_KEY,
    off: "never",
    expected: "never, or a whole number of commits (at least 1)",
};

/// Applies the rule (`keep`: commits within this many steps of a tip stay as committed;
/// `thin`: `retention.keep_last`, whose commits lose their moments anyway). Holds the
/// repository's writer throughout: a commit made meanwhile could otherwise take a residual
/// against content that is about to change.
pub(crate) fn coarsen(
    repo: &Repository,
    keep: u64,
    thin: Option<u64>,
    dry_run: bool,
    progress: &dyn Progress,
) -> Result<Coarsening> {
    let store = repo.store();
    let _writer = repo.writer();
    let plan = plan(repo, &store.meta().read()?, keep, thin)?;
    let mut out = Coarsening {
        tensors: plan.len() as u64,
        bytes_before: plan.iter().map(|(_, e)| e.stored_len).sum(),
        bytes_after: 0,
    };
    if dry_run || plan.is_empty() {
        return Ok(out);
    }
    progress.start_count("coarsening", plan.len() as u64);
    let batch = store.batch();
    // New content of re-encoded objects that others in the plan decode through.
    let bases: HashSet<ObjectId> = plan.iter().filter_map(|(_, e)| e.base).collect();
    let mut coarse: HashMap<ObjectId, Vec<u8>> = HashMap::new();
    let mut rewrites = Vec::with_capacity(plan.len());
    for (id, entry) in &plan {
        let (new_entry, content) = reencode(repo, &batch, id, entry, &coarse)?;
        out.bytes_after += new_entry.stored_len;
        if bases.contains(id) {
            coarse.insert(*id, content);
        }
        rewrites.push(Rewrite {
            id: *id,
            old: *entry,
            new: new_entry,
        });
        progress.advance(1);
    }
    batch.finish()?;
    publish_all(store, &rewrites)?;
    progress.finish();
    Ok(out)
}

/// The records to coarsen, bases before what decodes through them.
fn plan(
    repo: &Repository,
    meta: &MetaRead,
    keep: u64,
    thin: Option<u64>,
) -> Result<Vec<(ObjectId, IndexEntry)>> {
    let mut old = history::behind_tips(meta, keep)?;
    if let Some(t) = thin {
        for c in history::behind_tips(meta, t)? {
            old.remove(&c);
        }
    }
    if old.is_empty() {
        return Ok(Vec::new());
    }
    let mut fine = HashSet::new();
    let mut moments = HashSet::new();
    for (id, summary) in meta.commits()? {
        if meta.object(&summary.manifest)?.is_none() {
            continue;
        }
        let m = repo.load_manifest(&summary.manifest)?;
        let tensors: Vec<_> = m.tensors().map(|(_, e)| e).collect();
        let mut paired = HashSet::new();
        if old.contains(&id) {
            for p in &m.pairs {
                // Adam's units: the settings the commit recorded say so (`reencode` checks the
                // record itself).
                if let Some(e) = tensors.get(p.exp_avg as usize) {
                    let scaled = e
                        .exactness
                        .lossy()
                        .is_some_and(|l| l.setting("mode") == Some("scaled"));
                    if scaled {
                        paired.insert(e.id);
                    }
                }
            }
        }
        for e in &tensors {
            if !paired.contains(&e.id) {
                fine.insert(e.id);
            }
        }
        moments.extend(paired);
    }
    let mut set: HashMap<ObjectId, IndexEntry> = HashMap::new();
    for id in moments.difference(&fine) {
        let Some(entry) = meta.object(id)? else {
            continue;
        };
        if entry.codec == CodecTag::QuantResidual as u8
            && coarsening(repo.store(), id, &entry)?.is_none()
        {
            set.insert(*id, entry);
        }
    }
    // Only what takes every dependent along.
    loop {
        let mut leave = Vec::new();
        for id in set.keys() {
            if meta.dependents(id)?.iter().any(|d| !set.contains_key(d)) {
                leave.push(*id);
            }
        }
        if leave.is_empty() {
            break;
        }
        for id in leave {
            set.remove(&id);
        }
    }
    let mut out: Vec<(ObjectId, IndexEntry)> = set.into_iter().collect();
    out.sort_by_key(|(id, e)| (e.depth, *id));
    Ok(out)
}

/// Writes `id`'s coarser record (the next generation, same base) into `batch`; returns its
/// index entry and what it decodes to.
fn reencode(
    repo: &Repository,
    batch: &mdl_store::ObjectBatch<'_>,
    id: &ObjectId,
    entry: &IndexEntry,
    coarse: &HashMap<ObjectId, Vec<u8>>,
) -> Result<(IndexEntry, Vec<u8>)> {
    let store = repo.store();
    let corrupt = |source| Error::Corrupt { id: *id, source };
    let (header, payload, _) = {
        let bytes = store.read_record(id, entry)?;
        let (h, p, t) = record::decode(&bytes).map_err(corrupt)?;
        (h, p.to_vec(), t)
    };
    let tensor = TensorHeader::from_canonical(&header.prefix).map_err(corrupt)?;
    let base_id = entry.base.ok_or_else(|| {
        corrupt(mdl_format::FormatError::invalid(
            "quant-residual",
            "record has no base",
        ))
    })?;
    let (mode, step) = residual::mode_and_step(&payload).map_err(corrupt)?;
    // The content the id names, and the reference as it will decode once this pass is done.
    let current = store.load_tensor(id, entry)?;
    let reference = match coarse.get(&base_id) {
        Some(b) => b.clone(),
        None => {
            let b = store
                .meta()
                .read()?
                .object(&base_id)?
                .ok_or(mdl_store::StoreError::Missing(base_id))?;
            store.load_tensor(&base_id, &b)?
        }
    };
    if mode != residual::Mode::Scaled {
        return Err(corrupt(mdl_format::FormatError::invalid(
            "quant-residual",
            "only exp_avg records in Adam's units are coarsened",
        )));
    }
    // Same step, so every kept element keeps its code exactly; the pruned ones code as zero.
    let threshold = sparse::small_threshold(tensor.dtype, &current, KEEP_ABOVE_MEAN);
    let pruned = sparse::apply(
        tensor.dtype,
        &current,
        None,
        None,
        Sparsify::Small { threshold },
    );
    let (new_payload, content) =
        residual::encode(tensor.dtype, &pruned, Some(&reference), mode, step);
    let view_of = residual::view_of(&tensor.shape);
    let new_payload = residual::context_code(tensor.dtype, new_payload, view_of);
    // What a reader will get: decoded again, not taken from the encoder's word.
    let mut decoded = vec![0u8; current.len()];
    residual::decode(tensor.dtype, &new_payload, Some(&reference), &mut decoded)
        .map_err(corrupt)?;
    if decoded != content {
        return Err(corrupt(mdl_format::FormatError::invalid(
            "quant-residual",
            "a coarsened payload does not decode to what it was encoded from",
        )));
    }
    let view = |bytes| FloatView {
        dtype: tensor.dtype,
        bytes,
    };
    let err = store
        .engine()
        .error_stats(view(&current), view(&decoded), None);
    // An all-zero tensor has no relative error to speak of: one that moved is unbounded.
    let rel = if err.sum_sq == 0.0 && err.sum_sq_err > 0.0 {
        f64::MAX
    } else {
        err.rel_l2()
    };
    let mut hasher = TensorHasher::new(&header.prefix);
    hasher.update(&decoded);
    let coarsened = Coarsened {
        content: hasher.finalize(),
        max_abs_error: finite(err.max_abs),
        rel_error: finite(rel),
    };
    let placement = Placement {
        generation: entry.generation + 1,
        base: entry.base,
        depth: entry.depth,
    };
    let put = batch.put_coarsened(
        id,
        &tensor,
        CodecTag::QuantResidual,
        placement,
        Some(coarsened),
        &[&new_payload],
    )?;
    Ok((put.entry, decoded))
}

/// An error measure as a record may hold it (the elements kept exactly are the non-finite
/// ones, so a sum over the rest is finite; this only guards the record format's rule).
fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        f64::MAX
    }
}

/// The errors a lossy tensor's reader may rely on: those its manifest recorded against the
/// committed tensor, plus those a coarsened record adds against that reconstruction (the
/// triangle inequality; the relative error is rescaled from the reconstruction's norm to the
/// committed one's, which is at most `1 + rel` times smaller).
pub fn combined_errors(max_abs: f64, rel: f64, c: &Coarsened) -> (f64, f64) {
    (max_abs + c.max_abs_error, rel + c.rel_error * (1.0 + rel))
}

/// What a coarsened record of `id` (stored as `entry`) says of itself; `None` for any other
/// record. Only quant-residual records are coarsened, so others are not opened.
pub(crate) fn coarsening(
    store: &mdl_store::Store,
    id: &ObjectId,
    entry: &IndexEntry,
) -> Result<Option<Coarsened>> {
    if entry.codec != CodecTag::QuantResidual as u8 {
        return Ok(None);
    }
    Ok(store.record_header(id, entry)?.coarsened)
}

/// Gives a coarsened object its committed content back, because a new commit names it with
/// exactly that content (`data`, which hashes to `id`): what decodes through the coarse
/// record is made self-contained first (keeping its own content), then `id` gets a lossless
/// record, in one index transaction. `entry` is its index entry now, `header` its tensor
/// header; the caller holds the repository's writer.
pub(crate) fn restore(
    repo: &Repository,
    id: &ObjectId,
    entry: IndexEntry,
    header: &TensorHeader,
    data: &[u8],
) -> Result<()> {
    let store = repo.store();
    let batch = store.batch();
    let mut rewrites = Vec::new();
    let meta = store.meta().read()?;
    for d in meta.dependents(id)? {
        if let Some(e) = meta.object(&d)? {
            rewrites.push(crate::rewrite::encode_whole(store, &batch, &d, &e)?);
        }
    }
    drop(meta);
    let placement = Placement {
        generation: entry.generation + 1,
        base: None,
        depth: 0,
    };
    let put = batch.put_tensor_at(id, header, data, &Default::default(), placement)?;
    rewrites.push(Rewrite {
        id: *id,
        old: entry,
        new: put.entry,
    });
    batch.finish()?;
    publish_all(store, &rewrites)?;
    Ok(())
}
