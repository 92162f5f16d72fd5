//! The commit's one loss budget shared among the scored parameters: which candidate each
//! takes, and each copy of the model's share (docs/DECISIONS.md, "One loss budget per
//! commit").

use std::collections::BTreeMap;

use mdl_codec::quant;

use super::{CopyEstimate, PlanInput, Scored, SearchSummary};

impl PlanInput<'_> {
    /// Each scored tensor's pick (an index into its candidates; `None`: lossless) under the
    /// budget scaled by `scale`, with the summary's budget and totals.
    pub(super) fn picks(
        &self,
        scored: &[Scored],
        scale: f64,
        summary: &mut SearchSummary,
    ) -> Vec<Option<usize>> {
        let budget = self.settings.epsilon * scale * self.loss.map_or(1.0, f64::abs);
        summary.budget = budget;
        summary.loss = self.loss;
        summary.est_delta_loss = 0.0;
        summary.kept_exact = 0;
        summary.relative = 0;
        summary.priced = 0;
        summary.copies.clear();
        let mut picks: Vec<Option<usize>> = vec![None; scored.len()];
        // Every priced parameter, whichever copy of the model it belongs to, shares the one
        // budget: a mixed-precision run's bf16 weights and fp32 master copy are not given one
        // each (docs/DECISIONS.md, "One loss budget per commit").
        let mut priced = Vec::new();
        for (k, s) in scored.iter().enumerate() {
            match s.family {
                Some(_) if s.moments.is_some() => priced.push(k),
                _ => {
                    // No moments: the cheapest configuration within ε relative L2 error.
                    picks[k] = s
                        .cands
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| c.estimate.rel_l2 <= self.settings.epsilon * scale)
                        .min_by(|(_, a), (_, b)| a.estimate.bits.total_cmp(&b.estimate.bits))
                        .filter(|(_, c)| c.estimate.bits < s.lossless_bits)
                        .map(|(j, _)| j);
                    match picks[k] {
                        Some(_) => summary.relative += 1,
                        None => summary.kept_exact += 1,
                    }
                }
            }
        }
        let lists: Vec<Vec<(f64, f64)>> = priced
            .iter()
            .map(|&k| {
                let s = &scored[k];
                let mut l: Vec<(f64, f64)> = s
                    .cands
                    .iter()
                    .map(|c| {
                        let e = &c.estimate;
                        (e.bits, e.delta_loss.unwrap_or(f64::INFINITY))
                    })
                    .collect();
                l.push((s.lossless_bits, 0.0));
                l
            })
            .collect();
        let chosen = quant::allocate(&lists, budget);
        let mut copies: BTreeMap<usize, CopyEstimate> = BTreeMap::new();
        for ((&k, &p), list) in priced.iter().zip(&chosen).zip(&lists) {
            summary.est_delta_loss += list[p].1;
            if p < scored[k].cands.len() {
                picks[k] = Some(p);
                summary.priced += 1;
                let family = scored[k].family.expect("a priced parameter has a family");
                let copy = copies.entry(family).or_insert_with(|| CopyEstimate {
                    copy: self.copy_name(family),
                    ..CopyEstimate::default()
                });
                copy.priced += 1;
                copy.est_delta_loss += list[p].1;
            } else {
                summary.kept_exact += 1;
            }
        }
        summary.copies = copies.into_values().collect();
        picks
    }

    /// The copy of the model that parameters of pairing `family` make up, as records and
    /// summaries name it: the pairing's weight pattern (`model.{}`), `by-order` for parameters
    /// the optimizer's order paired, `client` for pairs the Python client gave.
    pub(super) fn copy_name(&self, family: usize) -> String {
        let pairings = &self.settings.pairings;
        match pairings.get(family) {
            // A record's settings are words: a pattern keeps no whitespace there.
            Some(p) => p.weight.split_whitespace().collect::<Vec<_>>().join("_"),
            None if family == pairings.len() => "by-order".into(),
            None => "client".into(),
        }
    }
}
