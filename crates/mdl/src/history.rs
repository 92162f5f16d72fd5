//! History walks over the commit index.

use std::collections::{BinaryHeap, HashMap, HashSet};

use mdl_format::{ObjectId, Timestamp};
use mdl_store::CommitSummary;

use crate::Repository;

/// The commits every branch, tag and remote-tracking branch points at, each once.
pub(crate) fn ref_tips(repo: &Repository) -> crate::Result<Vec<ObjectId>> {
    let meta = repo.store().meta().read()?;
    let mut tips: Vec<ObjectId> = meta
        .refs("refs/")?
        .into_iter()
        .filter_map(|(_, v)| v.target())
        .collect();
    tips.sort();
    tips.dedup();
    Ok(tips)
}

/// Commits reachable from `starts`, children before parents, newer first among the ready ones.
/// The walk stops where history was cut (a shallow clone's oldest commits).
pub(crate) fn walk(
    repo: &Repository,
    starts: &[ObjectId],
) -> crate::Result<Vec<(ObjectId, CommitSummary)>> {
    let meta = repo.store().meta().read()?;
    let cut: HashSet<ObjectId> = meta.shallow()?.into_iter().collect();
    let mut all: HashMap<ObjectId, CommitSummary> = HashMap::new();
    let mut stack: Vec<ObjectId> = starts.to_vec();
    while let Some(id) = stack.pop() {
        if all.contains_key(&id) {
            continue;
        }
        let s = meta
            .commit(&id)?
            .ok_or(mdl_store::StoreError::Missing(id))?;
        if !cut.contains(&id) {
            stack.extend(s.parents.iter().copied());
        }
        all.insert(id, s);
    }
    Ok(in_order(all))
}

/// `all` ordered children before parents, newer first among the ready ones; parents outside
/// `all` are not waited for.
pub(crate) fn in_order(
    mut all: HashMap<ObjectId, CommitSummary>,
) -> Vec<(ObjectId, CommitSummary)> {
    let mut children: HashMap<ObjectId, usize> = HashMap::new();
    for s in all.values() {
        for p in s.parents.iter().filter(|p| all.contains_key(p)) {
            *children.entry(*p).or_default() += 1;
        }
    }
    let mut ready: BinaryHeap<(Timestamp, ObjectId)> = all
        .iter()
        .filter(|(id, _)| !children.contains_key(id))
        .map(|(id, s)| (s.time, *id))
        .collect();
    let mut out = Vec::with_capacity(all.len());
    while let Some((_, id)) = ready.pop() {
        let Some(s) = all.remove(&id) else { continue };
        for p in &s.parents {
            let Some(left) = children.get_mut(p) else {
                continue;
            };
            *left -= 1;
            if *left == 0 {
                ready.push((all[p].time, *p));
            }
        }
        out.push((id, s));
    }
    out
}

/// The commits reachable from `tip` and from none of `others`: what would become unreachable
/// if `tip`'s ref went.
pub(crate) fn only_from(
    repo: &Repository,
    tip: &ObjectId,
    others: &[ObjectId],
) -> crate::Result<Vec<ObjectId>> {
    let meta = repo.store().meta().read()?;
    let mut reached: HashSet<ObjectId> = HashSet::new();
    let mut stack: Vec<ObjectId> = others.to_vec();
    while let Some(id) = stack.pop() {
        if reached.insert(id) {
            if let Some(s) = meta.commit(&id)? {
                stack.extend(s.parents);
            }
        }
    }
    let mut only = Vec::new();
    let mut stack = vec![*tip];
    while let Some(id) = stack.pop() {
        if reached.insert(id) {
            only.push(id);
            if let Some(s) = meta.commit(&id)? {
                stack.extend(s.parents);
            }
        }
    }
    Ok(only)
}

/// Commits more than `keep` first-parent steps behind some branch tip and within `keep` steps
/// of none, neither tagged nor a tip: what the retention rules (`retention.keep_last`,
/// `retention.coarsen_after`) act on.
pub(crate) fn behind_tips(
    meta: &mdl_store::meta::MetaRead,
    keep: u64,
) -> crate::Result<HashSet<ObjectId>> {
    let mut full = HashSet::new();
    let mut old = HashSet::new();
    for (_, v) in meta.refs(mdl_format::Ref::TAGS)? {
        full.extend(v.target());
    }
    for (_, v) in meta.refs(mdl_format::Ref::BRANCHES)? {
        let Some(mut at) = v.target() else { continue };
        let mut steps = 0u64;
        loop {
            if steps < keep.max(1) {
                full.insert(at);
            } else {
                old.insert(at);
            }
            steps += 1;
            match meta.commit(&at)?.and_then(|s| s.parents.first().copied()) {
                Some(p) => at = p,
                None => break,
            }
        }
    }
    Ok(old.difference(&full).copied().collect())
}

/// A retention rule's setting: a count of commits of at least 1, or the word `off` for a rule
/// that does nothing; `expected` says so in the error.
pub(crate) struct CountSetting {
    pub key: &'static str,
    pub off: &'static str,
    pub expected: &'static str,
}

impl CountSetting {
    /// Parses a value of the setting.
    pub(crate) fn parse(&self, v: &str) -> crate::Result<Option<u64>> {
        if v == self.off {
            return Ok(None);
        }
        v.parse::<u64>()
            .ok()
            .filter(|&n| n >= 1)
            .map(Some)
            .ok_or_else(|| crate::Error::InvalidConfig {
                key: self.key.into(),
                value: v.into(),
                expected: self.expected,
            })
    }

    /// The repository's value (`None` when unset or off).
    pub(crate) fn configured(&self, repo: &crate::Repository) -> crate::Result<Option<u64>> {
        let value = repo.store().meta().read()?.config(self.key)?;
        value.map_or(Ok(None), |v| self.parse(&v))
    }
}

/// Moves branch `branch` (a full ref name) from `onto`'s position to a copy of commit `id` whose
/// only parent is `onto`: the same checkpoint, message and metrics, recorded after `onto` —
/// what a commit that lost a race for the branch becomes, as if it had started after the
/// winner (a repository in object storage, `mdl-bucket`). The branch must be at `onto`.
/// Returns the new commit's id.
pub fn replay(
    repo: &Repository,
    id: &ObjectId,
    onto: &ObjectId,
    branch: &str,
) -> crate::Result<ObjectId> {
    use mdl_format::ObjectKind;
    use mdl_store::RefValue;

    let _writer = repo.writer();
    let mut commit = repo.load_commit(id)?;
    commit.parents = vec![*onto];
    let store = repo.store();
    let batch = store.batch();
    let out = batch.put_blob(ObjectKind::Commit, &commit.encode())?;
    batch.finish()?;
    let mut w = store.meta().write()?;
    w.put_object(&out.id, &out.entry)?;
    w.put_commit(&out.id, &CommitSummary::of(&commit))?;
    let summary = commit.message.lines().next().unwrap_or("");
    w.update_ref(
        branch,
        Some(&RefValue::Direct(*onto)),
        Some(&RefValue::Direct(out.id)),
        &format!("commit (replayed onto {}): {summary}", onto.short(12)),
    )?;
    w.commit_txn()?;
    Ok(out.id)
}
