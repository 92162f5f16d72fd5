//! Where a repository's storage went: what each commit added, by role (weights, optimizer
//! state, other), how deep the delta chains are, and what nothing reaches any more. The web
//! view's storage page draws it; `stats` gives the totals alone.

use std::collections::{BTreeMap, HashMap, HashSet};

use mdl_format::{Manifest, ObjectId, ObjectKind, Region, Timestamp};
use serde::Serialize;

use crate::{history, Repository, Result};

/// Bytes in binary units with one decimal (`512 B`, `1.5 MiB`), as mdl prints sizes.
pub fn human_size(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// What a stored object holds, for the storage report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A model's tensors.
    Weights,
    /// An optimizer's state: Adam moments and the like.
    Optimizer,
    /// Everything else: files stored as bytes, manifests, commits.
    Other,
}

impl Role {
    /// The three roles, in report order.
    pub const ALL: [Role; 3] = [Role::Weights, Role::Optimizer, Role::Other];

    /// The role's name as shown.
    pub fn name(self) -> &'static str {
        match self {
            Role::Weights => "weights",
            Role::Optimizer => "optimizer state",
            Role::Other => "other",
        }
    }

    /// The role of tensor `name` in file `path`: optimizer state if the manifest paired it as
    /// a moment, if its name is an optimizer state dict's (`state.K.exp_avg`, `…momentum_buffer`,
    /// under `optimizer.`), or if its file is an optimizer's; weights otherwise.
    pub fn of_tensor(path: &str, name: &str, paired_moment: bool) -> Role {
        let file = path.rsplit('/').next().unwrap_or(path);
        let optimizer = paired_moment
            || file.contains("optim")
            || name.starts_with("state.")
            || name.starts_with("optimizer.")
            || name.contains(".state.")
            || ["exp_avg", "exp_avg_sq", "momentum_buffer", "max_exp_avg_sq"]
                .iter()
                .any(|m| name.rsplit('.').next() == Some(m));
        if optimizer {
            Role::Optimizer
        } else {
            Role::Weights
        }
    }
}

/// Bytes by role, indexed like [`Role::ALL`] (by `role as usize`).
pub type ByRole = [u64; 3];

/// One commit's line of the report.
#[derive(Clone, Debug)]
pub struct CommitStorage {
    /// The commit.
    pub id: ObjectId,
    /// When it was made.
    pub time: Timestamp,
    /// Stored bytes of the objects this commit was the first (oldest) to reach, by role, as
    /// they are stored now (after compaction and gc).
    pub added: ByRole,
    /// The repository's reachable size once this commit was in, by role.
    pub total: ByRole,
}

/// The storage report of a repository.
#[derive(Clone, Debug)]
pub struct StorageReport {
    /// Every commit a ref reaches, oldest first.
    pub commits: Vec<CommitStorage>,
    /// Reachable stored bytes by role.
    pub by_role: ByRole,
    /// Tensor records by delta-chain depth: `(depth, records, stored bytes)`, shallowest first.
    pub depths: Vec<(u32, u64, u64)>,
    /// Records no ref reaches (the reflog may still: gc keeps those until the reflog expires).
    pub unreachable_objects: u64,
    /// Their stored bytes.
    pub unreachable_bytes: u64,
    /// Stored bytes of every record.
    pub stored_bytes: u64,
}

/// Builds the report: one pass over the index and one read of each reachable manifest.
pub fn report(repo: &Repository) -> Result<StorageReport> {
    let objects: HashMap<ObjectId, mdl_store::IndexEntry> =
        repo.store().meta().read()?.objects()?.into_iter().collect();
    let mut order = history::walk(repo, &history::ref_tips(repo)?)?;
    order.reverse();

    let mut seen: HashSet<ObjectId> = HashSet::new();
    let mut total: ByRole = [0; 3];
    let mut commits = Vec::with_capacity(order.len());
    let stored = |id: &ObjectId| objects.get(id).map_or(0, |e| e.stored_len);
    for (id, summary) in &order {
        let mut added: ByRole = [0; 3];
        for own in [id, &summary.manifest] {
            if seen.insert(*own) {
                added[Role::Other as usize] += stored(own);
            }
        }
        let manifest = repo.load_manifest(&summary.manifest)?;
        for (object, role) in roles(&manifest) {
            if seen.insert(object) {
                added[role as usize] += stored(&object);
            }
        }
        for (t, a) in total.iter_mut().zip(added) {
            *t += a;
        }
        commits.push(CommitStorage {
            id: *id,
            time: summary.time,
            added,
            total,
        });
    }

    let mut depths: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let (mut unreachable_objects, mut unreachable_bytes, mut stored_bytes) = (0, 0, 0);
    for (id, e) in &objects {
        stored_bytes += e.stored_len;
        if e.kind == ObjectKind::Tensor {
            let d = depths.entry(e.depth).or_default();
            d.0 += 1;
            d.1 += e.stored_len;
        }
        if !seen.contains(id) {
            unreachable_objects += 1;
            unreachable_bytes += e.stored_len;
        }
    }
    Ok(StorageReport {
        commits,
        by_role: total,
        depths: depths.into_iter().map(|(d, (n, b))| (d, n, b)).collect(),
        unreachable_objects,
        unreachable_bytes,
        stored_bytes,
    })
}

/// Every object of `m` with its role (repeats included).
fn roles(m: &Manifest) -> Vec<(ObjectId, Role)> {
    let moments: HashSet<u32> = m
        .pairs
        .iter()
        .flat_map(|p| [p.exp_avg, p.exp_avg_sq])
        .collect();
    let mut out: Vec<(ObjectId, Role)> = (0u32..)
        .zip(m.tensors())
        .map(|(index, (file, e))| {
            let paired = moments.contains(&index);
            (e.id, Role::of_tensor(&m.files[file].path, &e.name, paired))
        })
        .collect();
    for r in m.files.iter().flat_map(|f| &f.regions) {
        if let Region::Bytes { id, .. } = r {
            out.push((*id, Role::Other));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_are_told_apart_by_name_file_and_pairing() {
        let w = |p, n| Role::of_tensor(p, n, false);
        assert_eq!(w("model.safetensors", "h.0.attn.weight"), Role::Weights);
        assert_eq!(w("model.safetensors", "state.3.exp_avg"), Role::Optimizer);
        assert_eq!(w("ckpt/optimizer.safetensors", "0.weight"), Role::Optimizer);
        assert_eq!(
            w("m.safetensors", "optimizer.state.0.step"),
            Role::Optimizer
        );
        assert_eq!(w("m.safetensors", "h.0.momentum_buffer"), Role::Optimizer);
        assert_eq!(
            Role::of_tensor("m.safetensors", "m.h.0", true),
            Role::Optimizer
        );
        // A layer called "state" in a model is not an optimizer's.
        assert_eq!(
            w("m.safetensors", "encoder.statenorm.weight"),
            Role::Weights
        );
    }

    #[test]
    fn a_role_indexes_its_bytes_in_report_order() {
        for (i, role) in Role::ALL.into_iter().enumerate() {
            assert_eq!(role as usize, i, "{role:?}");
        }
    }
}
