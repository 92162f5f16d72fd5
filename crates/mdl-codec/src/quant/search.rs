//! Candidate configurations for a tensor, and the allocation of a loss budget among tensors.

use super::{Domain, Metric, QuantConfig, BINS, EMBEDDING_BINS, PROTECT, PRUNE};

/// The configurations a search scores: the whole grid at a branch's first lossy commit
/// (`previous` = `None`), else the previous configuration and its neighbours one step away on
/// each knob (the delta-neighbourhood search).
pub fn candidates(
    previous: Option<&QuantConfig>,
    embedding: bool,
    moments: bool,
    domain: Domain,
) -> Vec<QuantConfig> {
    let bins: &[u8] = if embedding { &EMBEDDING_BINS } else { &BINS };
    let prune: &[f64] = if embedding { &[0.0] } else { &PRUNE };
    let metrics: &[Metric] = if moments {
        &[Metric::Magnitude, Metric::Sensitivity]
    } else {
        &[Metric::Magnitude]
    };
    let mut out = Vec::new();
    match previous {
        None => {
            for &b in bins {
                for &p in prune {
                    for &q in &PROTECT {
                        for &m in metrics {
                            // Without pruning the metric changes nothing.
                            if p == 0.0 && m != metrics[0] {
                                continue;
                            }
                            out.push(QuantConfig {
                                bins: b,
                                prune: p,
                                protect: q,
                                metric: m,
                                domain,
                            });
                        }
                    }
                }
            }
        }
        Some(prev) => {
            let step = |list: &[f64], x: f64| -> Vec<f64> {
                let i = list.iter().position(|&y| y == x);
                match i {
                    Some(i) => list[i.saturating_sub(1)..(i + 2).min(list.len())].to_vec(),
                    None => list.to_vec(),
                }
            };
            let bins_f: Vec<f64> = bins.iter().map(|&b| b as f64).collect();
            let mut base = *prev;
            base.domain = domain;
            if !bins.contains(&base.bins) {
                base.bins = bins[bins.len() / 2];
            }
            if !prune.contains(&base.prune) {
                base.prune = prune[0];
            }
            if !moments {
                base.metric = Metric::Magnitude;
            }
            out.push(base);
            for b in step(&bins_f, base.bins as f64) {
                out.push(QuantConfig {
                    bins: b as u8,
                    ..base
                });
            }
            for p in step(prune, base.prune) {
                out.push(QuantConfig { prune: p, ..base });
            }
            for q in step(&PROTECT, base.protect) {
                out.push(QuantConfig { protect: q, ..base });
            }
            for &m in metrics {
                out.push(QuantConfig { metric: m, ..base });
            }
            // Finer tables without pruning, so a tensor that has become more sensitive still
            // finds a configuration within its budget.
            for &b in bins.iter().filter(|&&b| b > base.bins) {
                out.push(QuantConfig {
                    bins: b,
                    prune: 0.0,
                    ..base
                });
            }
            let mut unique: Vec<QuantConfig> = Vec::with_capacity(out.len());
            for c in out {
                if !unique.contains(&c) {
                    unique.push(c);
                }
            }
            out = unique;
        }
    }
    out
}

/// Picks one candidate per tensor so that the summed cost stays within `budget` while the summed
/// size is smallest, by a Lagrangian sweep: each tensor takes the candidate minimising
/// `size + λ·cost`, and λ is bisected to the smallest value that meets the budget. Each tensor's
/// list must hold a zero-cost candidate (storing it losslessly), so a solution always exists.
/// `cands[t][i] = (size, cost)`; returns the chosen index per tensor.
pub fn allocate(cands: &[Vec<(f64, f64)>], budget: f64) -> Vec<usize> {
    let choose = |lambda: f64| -> (Vec<usize>, f64) {
        let mut total = 0.0;
        let picks = cands
            .iter()
            .map(|list| {
                let (i, c) = list
                    .iter()
                    .enumerate()
                    .min_by(|(_, a), (_, b)| {
                        (a.0 + lambda * a.1)
                            .total_cmp(&(b.0 + lambda * b.1))
                            .then(a.1.total_cmp(&b.1))
                    })
                    .map(|(i, c)| (i, c.1))
                    .unwrap_or((0, 0.0));
                total += c;
                i
            })
            .collect();
        (picks, total)
    };
    let (picks, cost) = choose(0.0);
    if cost <= budget {
        return picks;
    }
    // Grow λ until the budget is met, then bisect (in log space) between the last two.
    let mut hi = 1.0;
    let mut best = loop {
        let (p, c) = choose(hi);
        if c <= budget {
            break p;
        }
        if hi > 1e300 {
            // Only zero-cost candidates are left; take them.
            return cands
                .iter()
                .map(|list| {
                    list.iter()
                        .enumerate()
                        .min_by(|a, b| a.1 .1.total_cmp(&b.1 .1).then(a.1 .0.total_cmp(&b.1 .0)))
                        .map_or(0, |(i, _)| i)
                })
                .collect();
        }
        hi *= 16.0;
    };
    let mut lo = hi / 16.0;
    for _ in 0..60 {
        let mid = (lo * hi).sqrt();
        let (p, c) = choose(mid);
        if c <= budget {
            hi = mid;
            best = p;
        } else {
            lo = mid;
        }
    }
    best
}
