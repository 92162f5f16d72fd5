//! A commit assembled from the trees of commits already stored, without reading or encoding
//! their data again: how the ranks of a sharded save (the Python package's `mdl.dcp`) each
//! commit their own files, in parallel, and one of them publishes the single commit that
//! holds them all.

use std::collections::HashMap;
use std::time::Instant;

use mdl_format::{CommitStats, ObjectId, ObjectKind};

use crate::commit::{
    check_metrics, index_records, store_commit, union, CommitOptions, CommitOutcome, Target,
};
use crate::{Error, Repository, Result};

/// Commits the union of the trees of `parts` onto `opts.branch` (HEAD's branch when `None`),
/// its parent the branch's commit, as [`crate::commit::commit`] would. The parts' files keep
/// their stored records; two parts holding the same path are refused. Of `opts`, the
/// message, branch, step, metrics and author are used (nothing is encoded).
///
/// The statistics are the parts' summed (what they stored is what this checkpoint added),
/// plus the new manifest.
pub fn assemble(
    repo: &Repository,
    parts: &[ObjectId],
    opts: &CommitOptions,
) -> Result<CommitOutcome> {
    let started = Instant::now();
    let metrics = check_metrics(&opts.metrics)?;
    if parts.is_empty() {
        return Err(Error::Assemble("no commits to assemble".into()));
    }
    let store = repo.store();
    let _writer = repo.writer();
    let target = Target::of(repo, opts.branch.as_ref(), !opts.working)?;

    let mut from: HashMap<String, ObjectId> = HashMap::new();
    let mut stats = CommitStats::default();
    let mut manifests = Vec::new();
    for part in parts {
        let commit = repo.load_commit(part)?;
        let manifest = repo.load_manifest(&commit.manifest)?;
        for f in &manifest.files {
            if let Some(other) = from.insert(f.path.clone(), *part) {
                return Err(Error::Assemble(format!(
                    "{} is in both commit {} and commit {}",
                    f.path,
                    other.short(12),
                    part.short(12)
                )));
            }
        }
        stats.raw_bytes += commit.stats.raw_bytes;
        stats.stored_bytes += commit.stats.stored_bytes;
        stats.tensors += commit.stats.tensors;
        stats.new_tensors += commit.stats.new_tensors;
        stats.lossy_tensors += commit.stats.lossy_tensors;
        manifests.push(manifest);
    }
    let manifest = union(manifests)
        .map_err(|e| Error::Assemble(format!("the parts' trees do not combine: {e}")))?;

    let batch = store.batch();
    let mut added = Vec::new();
    let manifest_bytes = manifest.encode();
    let manifest_id = ObjectId::hash(&manifest_bytes);
    if store.meta().read()?.object(&manifest_id)?.is_none() {
        let out = batch.put_blob(ObjectKind::Manifest, &manifest_bytes)?;
        stats.stored_bytes += out.entry.stored_len;
        added.push((out.id, out.entry));
    }
    let branch = target.branch().to_string();
    let author = crate::commit::author_soon(opts).get();
    let commit = target.commit(manifest_id, author, opts, opts.step, metrics, stats);
    let id = store_commit(batch, &commit, &mut added)?;

    let mut w = store.meta().write()?;
    index_records(&mut w, &added)?;
    target.publish(&mut w, &id, &commit)?;
    w.commit_txn()?;
    tracing::info!(%id, parts = parts.len(), "assembled");

    Ok(crate::commit::outcome(
        id,
        branch,
        &commit.stats,
        started,
        None,
    ))
}
