//! `mdl stats --lossy`: a series' stored bytes under the accountings of the papers the lossy
//! mode builds on, beside mdl's own ratio, so that figures quoted from them can be compared
//! with a repository's. DynaQuant counts the weights alone, the whole series, against fp32;
//! ExCP counts the weights and both Adam moments, against fp32, over the checkpoints after the
//! first (the ones it stores as deltas).

use std::collections::{HashMap, HashSet};

use mdl_format::{Manifest, ObjectId, Region};

pub use mdl_protocol::outcome::{Accounting, RoleBytes};

use crate::storage::Role;
use crate::{history, revision, Repository, Result};

/// What a tensor is to the accountings.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Weights,
    ExpAvg,
    ExpAvgSq,
    Other,
}

/// The accountings of HEAD's series (its history, oldest first), given every record's stored
/// length by object (what `stats` read of the index already); `None` before a first commit.
pub fn accounting(
    repo: &Repository,
    stored_lens: &HashMap<ObjectId, u64>,
) -> Result<Option<Accounting>> {
    let head = match revision::resolve(repo, "HEAD") {
        Ok(head) => head,
        // No commit yet.
        Err(crate::Error::UnknownRevision(_) | crate::Error::UnbornBranch(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut order = history::walk(repo, &[head])?;
    order.reverse();
    let stored = |id: &ObjectId| stored_lens.get(id).copied().unwrap_or(0);
    let mut seen: HashSet<ObjectId> = HashSet::new();
    let mut a = Accounting {
        commits: order.len() as u64,
        ..Accounting::default()
    };
    let (mut raw, mut all_stored) = (0u64, 0u64);
    // ExCP's sums: weights and moments of the commits after the first, in fp32 bytes.
    let (mut delta_fp32, mut delta_stored) = (0u64, 0u64);
    for (k, (id, summary)) in order.iter().enumerate() {
        raw += summary.raw_bytes;
        for own in [id, &summary.manifest] {
            if seen.insert(*own) {
                all_stored += stored(own);
            }
        }
        let manifest = repo.load_manifest(&summary.manifest)?;
        for (object, kind, elements, bytes) in kinds(&manifest) {
            let first = seen.insert(object);
            let s = if first { stored(&object) } else { 0 };
            all_stored += s;
            let role = match kind {
                Kind::Weights => &mut a.weights,
                Kind::ExpAvg => &mut a.exp_avg,
                Kind::ExpAvgSq => &mut a.exp_avg_sq,
                Kind::Other => &mut a.other,
            };
            role.elements += elements;
            role.raw_bytes += bytes;
            role.stored_bytes += s;
            if k > 0 && kind != Kind::Other {
                delta_fp32 += 4 * elements;
                delta_stored += s;
            }
        }
    }
    let ratio = |raw: u64, stored: u64| {
        if stored == 0 {
            0.0
        } else {
            raw as f64 / stored as f64
        }
    };
    a.ratio = ratio(raw, all_stored);
    a.dynaquant = ratio(4 * a.weights.elements, a.weights.stored_bytes);
    a.excp = ratio(delta_fp32, delta_stored);
    Ok(Some(a))
}

/// Every object of `m` with what it is, its elements and its bytes (repeats included).
/// Moments are the manifest's pairs' (else named `exp_avg`/`exp_avg_sq`); weights are the
/// other float tensors that are not optimizer state.
fn kinds(m: &Manifest) -> Vec<(ObjectId, Kind, u64, u64)> {
    let first: HashSet<u32> = m.pairs.iter().map(|p| p.exp_avg).collect();
    let second: HashSet<u32> = m.pairs.iter().map(|p| p.exp_avg_sq).collect();
    let mut out = Vec::new();
    for (index, (file, e)) in (0u32..).zip(m.tensors()) {
        let last = e.name.rsplit('.').next();
        let kind = if first.contains(&index) || last == Some("exp_avg") {
            Kind::ExpAvg
        } else if second.contains(&index) || last == Some("exp_avg_sq") {
            Kind::ExpAvgSq
        } else if e.header.dtype.is_float()
            && Role::of_tensor(&m.files[file].path, &e.name, false) == Role::Weights
        {
            Kind::Weights
        } else {
            Kind::Other
        };
        let elements = e.header.numel().unwrap_or(0);
        out.push((e.id, kind, elements, e.header.data_len().unwrap_or(0)));
    }
    for r in m.files.iter().flat_map(|f| &f.regions) {
        if let Region::Bytes { id, len } = r {
            out.push((*id, Kind::Other, *len, *len));
        }
    }
    out
}
