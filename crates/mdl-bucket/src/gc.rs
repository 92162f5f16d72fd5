//! gc of a repository in object storage, beside writers on other machines and with no lock:
//! in two steps, a grace period apart.
//!
//! 1. **Mark**: with the packs listed *before* the refs are read, every pack older than the
//!    grace period none of whose records any ref needs (its history, manifests, tensors and
//!    delta bases) is named in `gc/pending`. From their next sync on, writers count those
//!    records as absent from the bucket, so a commit that needs one sends it again.
//! 2. **Sweep**, by a later gc once the grace period has passed since the mark: the refs are
//!    read again, and each marked pack still listed and still unneeded is deleted; then the
//!    next mark is written.
//!
//! A pack written after a gc listed the packs is never a candidate, and a writer that read the
//! bucket before the mark and names a marked record in a ref written before the sweep keeps
//! that pack (the sweep reads refs). What this cannot see: a command that read the bucket
//! before the mark and writes its ref after the sweep — one running longer than the grace
//! period, the same bound as a local gc's.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use mdl::transfer;
use mdl::{ObjectId, Repository, Timestamp};
use mdl_protocol::body::BucketGc;

use crate::layout::{self, Pending};
use crate::{Error, Replica, Result};

impl Replica {
    /// Runs one gc step on the bucket (see the module's documentation) with `grace` as the
    /// grace period. A mark not yet due is left as it is.
    pub fn gc(&mut self, repo: &Repository, grace: Duration, dry_run: bool) -> Result<BucketGc> {
        // The packs first, then the refs: the sync lists packs before it reads refs, and only
        // packs this listing names are candidates.
        self.sync(repo)?;
        let now = Timestamp::now().0;
        let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
        let mut outcome = BucketGc {
            dry_run,
            ..BucketGc::default()
        };
        if let Some((pending, _)) = &self.seen.pending {
            if !pending.packs.is_empty() && now.saturating_sub(pending.marked_ms) < grace_ms {
                outcome.marked = pending.packs.clone();
                outcome.due_ms = Some(pending.marked_ms.saturating_add(grace_ms));
                return Ok(outcome);
            }
        }
        let needed = self.needed(repo)?;
        // What each listed pack carried, read once; a pack whose contents this replica does
        // not know is never deleted.
        let mut contents = BTreeMap::new();
        for key in &self.seen.packs {
            if let Some(frames) = self.records.toc(key)? {
                contents.insert(key.clone(), frames.into_iter().map(|f| f.id).collect());
            }
        }
        // Sweep what the last mark named.
        let listed: HashSet<&String> = self.seen.packs.iter().collect();
        let marked: Vec<String> = self
            .seen
            .pending
            .iter()
            .flat_map(|(p, _)| p.packs.iter())
            .filter(|k| listed.contains(k))
            .cloned()
            .collect();
        outcome.deleted = deletable(&contents, &marked, &HashSet::new(), &needed);
        if !dry_run {
            for key in &outcome.deleted {
                self.bucket.delete(key)?;
            }
        }
        // Mark the next.
        let deleted: HashSet<&String> = outcome.deleted.iter().collect();
        let old: Vec<String> = self
            .seen
            .packs
            .iter()
            .filter(|k| !deleted.contains(k))
            .filter(|k| layout::pack_time(k).is_some_and(|t| now.saturating_sub(t) >= grace_ms))
            .cloned()
            .collect();
        outcome.marked = deletable(&contents, &old, &deleted, &needed);
        if !outcome.marked.is_empty() {
            outcome.due_ms = Some(now.saturating_add(grace_ms));
        }
        if !dry_run && (self.seen.pending.is_some() || !outcome.marked.is_empty()) {
            let next = Pending {
                marked_ms: now,
                packs: outcome.marked.clone(),
            };
            let bytes = serde_json::to_vec_pretty(&next).expect("a mark serializes");
            let written = match &self.seen.pending {
                None => self.bucket.create(layout::GC_PENDING, bytes)?,
                Some((_, version)) => self.bucket.replace(layout::GC_PENDING, bytes, version)?,
            };
            if written.is_none() {
                return Err(Error::Conflict(format!(
                    "another gc of {} ran at the same time; its mark stands: run gc again later",
                    self.bucket.url()
                )));
            }
        }
        Ok(outcome)
    }

    /// Every object some ref needs: its history and all those commits need to be whole.
    fn needed(&self, repo: &Repository) -> Result<HashSet<ObjectId>> {
        let tips: Vec<ObjectId> = self
            .seen
            .refs
            .values()
            .filter_map(|(v, _)| v.as_ref()?.target())
            .collect();
        Ok(
            transfer::plan(repo, &tips, &|_| false, &transfer::Shallow::WHOLE)?
                .into_iter()
                .map(|p| p.id)
                .collect(),
        )
    }
}

/// Those of `candidates` that can go together: every record of each is one no ref needs, or
/// one a listed pack that stays (neither a candidate nor `gone`) holds too. A pack missing
/// from `contents` (what each listed pack carried, as far as this replica knows) stays.
fn deletable(
    contents: &BTreeMap<String, Vec<ObjectId>>,
    candidates: &[String],
    gone: &HashSet<&String>,
    needed: &HashSet<ObjectId>,
) -> Vec<String> {
    let leaving: HashSet<&String> = candidates.iter().collect();
    let kept: HashSet<&ObjectId> = contents
        .iter()
        .filter(|(key, _)| !leaving.contains(key) && !gone.contains(key))
        .flat_map(|(_, ids)| ids)
        .collect();
    candidates
        .iter()
        .filter(|key| {
            contents.get(*key).is_some_and(|ids| {
                ids.iter()
                    .all(|id| !needed.contains(id) || kept.contains(id))
            })
        })
        .cloned()
        .collect()
}
