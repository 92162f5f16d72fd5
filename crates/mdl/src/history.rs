//! History walks over the commit index.

use std::collections::{BinaryHeap, HashMap, HashSet};

use mdl_format::{ObjectId, Timestamp};
use mdl_store::CommitSummary;

use crate::Repository;

/// Commits reachable from `starts`, children before parents, newer first among the ready ones.
pub(crate) fn walk(
    repo: &Repository,
    starts: &[ObjectId],
) -> crate::Result<Vec<(ObjectId, CommitSummary)>> {
    let meta = repo.store().meta().read()?;
    let mut all: HashMap<ObjectId, CommitSummary> = HashMap::new();
    let mut stack: Vec<ObjectId> = starts.to_vec();
    while let Some(id) = stack.pop() {
        if all.contains_key(&id) {
            continue;
        }
        let s = meta
            .commit(&id)?
            .ok_or(mdl_store::StoreError::Missing(id))?;
        stack.extend(s.parents.iter().copied());
        all.insert(id, s);
    }
    let mut children: HashMap<ObjectId, usize> = HashMap::new();
    for s in all.values() {
        for p in &s.parents {
            *children.entry(*p).or_default() += 1;
        }
    }
    let mut ready: BinaryHeap<(Timestamp, ObjectId)> = all
        .iter()
        .filter(|(id, _)| !children.contains_key(id))
        .map(|(id, s)| (s.time, *id))
        .collect();
    let mut out = Vec::with_capacity(all.len());
    let mut done = HashSet::new();
    while let Some((_, id)) = ready.pop() {
        if !done.insert(id) {
            continue;
        }
        let s = all[&id].clone();
        for p in &s.parents {
            let left = children.get_mut(p).expect("parent counted");
            *left -= 1;
            if *left == 0 {
                ready.push((all[p].time, *p));
            }
        }
        out.push((id, s));
    }
    Ok(out)
}
