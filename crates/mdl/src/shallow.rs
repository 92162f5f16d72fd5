//! Shallow history: a repository may hold a series' newest commits without their ancestors
//! (`mdl clone --depth N`, `--since REV`). The commits whose parents it lacks on purpose are
//! recorded as *cut* (journaled, so an index rebuilt from the records keeps them): walks stop
//! there, `log` says so, completeness checks and fsck take them as ends of history, and
//! `fetch --deepen N` asks for their parents. A parent missing from a commit that is not cut
//! is still damage.
//!
//! What a transfer takes is chosen here too ([`select`]): the commits a wanted one reaches, as
//! far as a [`Shallow`] limit allows, stopping at what the receiver holds and at this
//! repository's own cut; each commit whose parents neither travel nor are held is sent as cut.

use std::collections::{HashMap, HashSet, VecDeque};

use mdl_format::ObjectId;
use mdl_store::CommitSummary;

pub use mdl_protocol::transfer::Shallow;

use crate::{history, Error, Repository, Result};

/// The commits whose parents this repository does not hold, on purpose.
pub fn cut(repo: &Repository) -> Result<HashSet<ObjectId>> {
    Ok(repo.store().meta().read()?.shallow()?.into_iter().collect())
}

/// What `fetch --deepen` asks for: the parents of the cut commits that this repository lacks,
/// each once.
pub fn parents_beyond(repo: &Repository) -> Result<Vec<ObjectId>> {
    let meta = repo.store().meta().read()?;
    let mut out = Vec::new();
    for id in meta.shallow()? {
        let Some(s) = meta.commit(&id)? else { continue };
        for p in s.parents {
            if meta.commit(&p)?.is_none() && !out.contains(&p) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// The commits a transfer of `want` sends to a repository that holds the commits `held`
/// accepts, within `limit`, parents first; each with whether it is cut (a parent of it
/// neither travels nor is held).
pub(crate) fn select(
    repo: &Repository,
    want: &[ObjectId],
    held: &dyn Fn(&ObjectId) -> bool,
    limit: &Shallow,
) -> Result<Vec<(ObjectId, CommitSummary, bool)>> {
    if limit.depth == Some(0) {
        return Err(Error::BadTransfer(
            "a depth of 0 takes no commit; --depth is at least 1".into(),
        ));
    }
    let meta = repo.store().meta().read()?;
    let own_cut: HashSet<ObjectId> = meta.shallow()?.into_iter().collect();
    // `since`'s ancestors stay behind; it itself travels.
    let mut behind: HashSet<ObjectId> = HashSet::new();
    if let Some(since) = limit.since {
        let s = meta
            .commit(&since)?
            .ok_or_else(|| Error::BadTransfer(format!("--since: no commit {since}")))?;
        let mut stack = match own_cut.contains(&since) {
            true => Vec::new(),
            false => s.parents,
        };
        while let Some(id) = stack.pop() {
            if !behind.insert(id) {
                continue;
            }
            if let (Some(s), false) = (meta.commit(&id)?, own_cut.contains(&id)) {
                stack.extend(s.parents);
            }
        }
    }
    // Breadth first, so that each commit is reached first by its shortest path from a wanted
    // one: its depth.
    let mut taken: HashMap<ObjectId, CommitSummary> = HashMap::new();
    let mut queue: VecDeque<(ObjectId, u32)> = want.iter().map(|id| (*id, 0)).collect();
    while let Some((id, steps)) = queue.pop_front() {
        if taken.contains_key(&id) || held(&id) || behind.contains(&id) {
            continue;
        }
        let s = meta
            .commit(&id)?
            .ok_or(mdl_store::StoreError::Missing(id))?;
        let deeper = limit.depth.is_none_or(|d| steps + 1 < d);
        if deeper && !own_cut.contains(&id) {
            queue.extend(s.parents.iter().map(|p| (*p, steps + 1)));
        }
        taken.insert(id, s);
    }
    let cut_at: HashSet<ObjectId> = taken
        .iter()
        .filter(|(_, s)| s.parents.iter().any(|p| !taken.contains_key(p) && !held(p)))
        .map(|(id, _)| *id)
        .collect();
    Ok(history::in_order(taken)
        .into_iter()
        .rev()
        .map(|(id, s)| {
            let cut = cut_at.contains(&id);
            (id, s, cut)
        })
        .collect())
}
