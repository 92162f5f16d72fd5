//! `mdl compact`: bound the delta chains by giving some tensors self-contained records again.
//!
//! Ids never change, only records and the physical index: every commit, tag and remote stays
//! valid, and a checkout is bit-identical before and after (quantized tensors are rebuilt from
//! their codes, not re-quantized).
//!
//! Which tensors become bases: the deepest tensor over the cap is fixed by re-encoding one
//! tensor on its chain within the cap's reach; among those, the one that saves the most restore
//! work (decode steps × bytes, over everything that decodes through it, counted four times for
//! tensors of branch tips, which are what gets checked out) per stored byte added. This repeats
//! until no tensor is deeper than the cap. Each chain is then re-encoded and published in its own
//! step: the repository's writer is held for one chain at a time, so commits go on in between,
//! and readers are never blocked (a read that finds a record just replaced starts again).

use std::collections::{HashMap, HashSet};

use mdl_format::{ObjectId, ObjectKind, Ref};
use mdl_store::IndexEntry;

pub use mdl_protocol::outcome::{CompactOptions, CompactOutcome};

use crate::policy::DeltaPolicy;
use crate::rewrite::reencode_group;
use crate::{Progress, Repository, Result};

/// How much more a decode step of a branch tip's tensor counts than one of an older tensor.
const TIP_WEIGHT: u64 = 4;

/// One tensor of the delta forest.
struct Node {
    entry: IndexEntry,
    children: Vec<ObjectId>,
    depth: u32,
    weight: u64,
}

/// Compacts every tensor chain of the repository to at most `max_depth` decode steps.
#[tracing::instrument(name = "compact", skip_all, fields(max_depth = ?opts.max_depth, dry_run = opts.dry_run))]
pub fn compact(
    repo: &Repository,
    opts: &CompactOptions,
    progress: &dyn Progress,
) -> Result<CompactOutcome> {
    let store = repo.store();
    let cap = match opts.max_depth {
        Some(d) => d,
        None => DeltaPolicy::from_store(store)?.max_depth,
    };
    let tips = tip_tensors(repo)?;
    let mut nodes: HashMap<ObjectId, Node> = store
        .meta()
        .read()?
        .objects()?
        .into_iter()
        .filter(|(_, e)| e.kind == ObjectKind::Tensor)
        .map(|(id, entry)| {
            let weight = if tips.contains(&id) { TIP_WEIGHT } else { 1 };
            let node = Node {
                entry,
                children: Vec::new(),
                depth: entry.depth,
                weight: weight * entry.content_len.max(1),
            };
            (id, node)
        })
        .collect();
    let links: Vec<(ObjectId, ObjectId)> = nodes
        .iter()
        .filter_map(|(id, n)| n.entry.base.map(|b| (b, *id)))
        .collect();
    for (base, id) in links {
        if let Some(b) = nodes.get_mut(&base) {
            b.children.push(id);
        }
    }

    let mut out = CompactOutcome {
        max_depth: cap,
        dry_run: opts.dry_run,
        bytes_before: nodes.values().map(|n| n.entry.stored_len).sum(),
        longest_before: nodes.values().map(|n| n.depth).max().unwrap_or(0),
        tip_depth_before: mean_depth(&nodes, &tips),
        ..Default::default()
    };
    let cuts = plan_cuts(&mut nodes, cap);
    out.longest_after = nodes.values().map(|n| n.depth).max().unwrap_or(0);
    out.tip_depth_after = mean_depth(&nodes, &tips);

    // Group the cuts by the base their chain ends at: one publishing step per chain.
    let mut by_root: HashMap<ObjectId, Vec<ObjectId>> = HashMap::new();
    for id in &cuts {
        by_root.entry(root_of(&nodes, id)).or_default().push(*id);
    }
    if opts.dry_run {
        let estimate: i64 = cuts
            .iter()
            .map(|id| {
                let root = &nodes[&root_of(&nodes, id)];
                root.entry.stored_len as i64 - nodes[id].entry.stored_len as i64
            })
            .sum();
        out.reencoded = cuts.len() as u64;
        out.bytes_after = (out.bytes_before as i64 + estimate).max(0) as u64;
        return Ok(out);
    }

    let mut delta: i64 = 0;
    progress.start_count("compacting", cuts.len() as u64);
    let mut groups: Vec<Vec<ObjectId>> = by_root.into_values().collect();
    groups.sort();
    for group in groups {
        let (done, skipped, bytes) = reencode_group(repo, &group)?;
        out.reencoded += done;
        out.skipped += skipped;
        delta += bytes;
        progress.advance(group.len() as u64);
    }
    progress.finish();
    out.bytes_after = (out.bytes_before as i64 + delta).max(0) as u64;
    tracing::info!(
        reencoded = out.reencoded,
        longest = out.longest_after,
        "compacted"
    );
    Ok(out)
}

/// Chooses the tensors to make self-contained so that no depth exceeds `cap`, updating the
/// nodes' depths as if it were done.
fn plan_cuts(nodes: &mut HashMap<ObjectId, Node>, cap: u32) -> Vec<ObjectId> {
    let mut cuts = Vec::new();
    // Deepest first: fixing a deep tensor usually fixes the shallower ones below the same cut.
    let mut order: Vec<ObjectId> = nodes
        .iter()
        .filter(|(_, n)| n.depth > cap)
        .map(|(id, _)| *id)
        .collect();
    order.sort_by_key(|id| (std::cmp::Reverse(nodes[id].depth), *id));
    for x in order {
        let d = nodes[&x].depth;
        if d <= cap {
            continue;
        }
        // Candidates: x and its bases down to depth d - cap (cutting any of them brings x within
        // the cap), never a chain's self-contained end.
        let lowest = (d - cap).max(1);
        let mut best: Option<(f64, ObjectId)> = None;
        let mut at = x;
        loop {
            let n = &nodes[&at];
            if n.depth < lowest {
                break;
            }
            let root = &nodes[&root_of(nodes, &at)];
            let added = (root.entry.stored_len as i64 - n.entry.stored_len as i64).max(1) as f64;
            let saved = subtree_weight(nodes, &at) as f64 * n.depth as f64;
            let score = saved / added;
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, at));
            }
            match n.entry.base {
                Some(b) if nodes.contains_key(&b) => at = b,
                _ => break,
            }
        }
        let Some((_, cut)) = best else { continue };
        let shift = nodes[&cut].depth;
        let mut stack = vec![cut];
        while let Some(id) = stack.pop() {
            let n = nodes.get_mut(&id).expect("node");
            n.depth -= shift.min(n.depth);
            stack.extend(n.children.iter().copied());
        }
        // Planned as self-contained: later candidates stop here.
        nodes.get_mut(&cut).expect("node").entry.base = None;
        cuts.push(cut);
    }
    cuts
}

/// Restore weight of `id` and everything decoding through it.
fn subtree_weight(nodes: &HashMap<ObjectId, Node>, id: &ObjectId) -> u64 {
    let mut total = 0;
    let mut stack = vec![*id];
    let mut seen = HashSet::new();
    while let Some(i) = stack.pop() {
        if !seen.insert(i) {
            continue;
        }
        if let Some(n) = nodes.get(&i) {
            total += n.weight;
            stack.extend(n.children.iter().copied());
        }
    }
    total
}

/// The self-contained end of `id`'s chain (as planned so far).
fn root_of(nodes: &HashMap<ObjectId, Node>, id: &ObjectId) -> ObjectId {
    let mut at = *id;
    for _ in 0..mdl_store::MAX_CHAIN {
        match nodes.get(&at).and_then(|n| n.entry.base) {
            Some(b) if nodes.contains_key(&b) => at = b,
            _ => break,
        }
    }
    at
}

fn mean_depth(nodes: &HashMap<ObjectId, Node>, tips: &HashSet<ObjectId>) -> f64 {
    let depths: Vec<u32> = tips
        .iter()
        .filter_map(|t| nodes.get(t).map(|n| n.depth))
        .collect();
    if depths.is_empty() {
        0.0
    } else {
        depths.iter().map(|&d| d as f64).sum::<f64>() / depths.len() as f64
    }
}

/// Tensors of the commits that branches point at.
fn tip_tensors(repo: &Repository) -> Result<HashSet<ObjectId>> {
    let mut out = HashSet::new();
    let refs = repo.store().meta().read()?.refs(Ref::BRANCHES)?;
    for (_, v) in refs {
        if let Some(c) = v.target() {
            let commit = repo.load_commit(&c)?;
            out.extend(
                repo.load_manifest(&commit.manifest)?
                    .objects()
                    .map(|(id, _)| id),
            );
        }
    }
    Ok(out)
}
