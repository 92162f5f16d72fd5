//! The configuration search under the quality bound: which tensors are quantized and how.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use mdl_codec::engine::{Engine, FloatView};
use mdl_codec::qrecord::QuantTensor;
use mdl_codec::quant::{
    self, Correction, Domain, Estimate, Fit, Prepared, QuantConfig, CURVATURE_FLOOR,
};
use mdl_codec::{residual, scalar};
use rayon::prelude::*;

pub use mdl_protocol::outcome::{CopyEstimate, SearchSummary};

use super::quantize::{Reference, Residual, TensorPlan};
use super::{sparse, LossySettings, Role, Sparsify};
use crate::input::Input;
use crate::previous::Previous;
use crate::Result;

mod budget;

/// `exp_avg_sq` against its previous version (or its row and column factors): the step in
/// octaves for an optimizer whose β2 is `beta2`. Two octaves (every element within a factor
/// of 2, so Adam's step size within ±41 %) where the second moment forgets within about 25
/// steps (β2 ≤ 0.96): measured with β2 = 0.95, nine restores ended +0.25 % / +0.19 % above the
/// unbroken runs against +0.21 % / +0.16 % at one octave, for 15–20 % smaller series. One
/// octave (±19 %) for a longer memory, where an error in `v` steers the resumed run for
/// longer and restores were not measured (docs/BENCHMARKS.md, docs/DECISIONS.md).
pub(crate) fn second_moment_step(beta2: f64) -> f64 {
    if beta2 <= 0.96 {
        2.0
    } else {
        1.0
    }
}
/// `exp_avg` in units of the square root of its commit's `exp_avg_sq` (Adam's own units: an
/// update is `m/√v`); values within a quarter unit round to zero.
const FIRST_MOMENT_SCALED_STEP: f64 = 0.5;
/// A moment is a residual only when at most this share of its elements would be kept exactly.
const MOMENT_EXACT_LIMIT: f64 = 0.01;

/// Residual steps are first measured on every this-many-th block of elements
/// ([`PlanInput::refine`] measures the chosen ones again on all of them).
const SAMPLE_EVERY: usize = 8;
/// Tensors smaller than this many sampled blocks are measured whole.
const SAMPLED_BLOCKS: usize = 4;

/// A sampled candidate of about a pick's size (or more) that loses at least this many times
/// what the pick loses is not measured exactly: its list is out of the running.
const OUTCLASSED: f64 = 4.0;

/// Whether sampled estimate `c` is out of the running against the pick `p` (see
/// [`OUTCLASSED`]): it codes in at least 90 % of the pick's bits and loses [`OUTCLASSED`] times
/// as much or more — its estimated loss change where both have one, else its relative error.
fn outclassed(c: &Estimate, p: &Estimate) -> bool {
    let (lc, lp) = match (c.delta_loss, p.delta_loss) {
        (Some(lc), Some(lp)) => (lc, lp),
        _ => (c.rel_l2, p.rel_l2),
    };
    c.bits >= 0.9 * p.bits && lp > 0.0 && lc >= OUTCLASSED * lp
}

/// Loads the reference of tensor `i` for residual coding, when it has one.
pub(crate) type LoadReference<'a> = dyn Fn(usize) -> Result<Option<Reference>> + Sync + 'a;

/// Residual steps tried, as powers of √2 times the RMS of the tensor's movement: from 4× (most
/// codes 0: the movement mostly dropped) down to 1/32 (about 7 bits a moved element).
const RESIDUAL_STEPS: &[i32] = &[-10, -9, -8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4];
/// Uniform quantization steps tried (no reference), as powers of √2 times the tensor's RMS:
/// relative errors from about 10 % down to 0.03 %, in half-octave steps (a tensor without
/// moments takes the coarsest within ε, so a grid of whole octaves left it up to a bit an
/// element finer than it needed).
const UNIFORM_STEPS: &[i32] = &[
    -24, -23, -22, -21, -20, -19, -18, -17, -16, -15, -14, -13, -12, -11, -10, -9, -8, -7, -6, -5,
    -4,
];

/// The data a plan is made from.
pub(crate) struct PlanInput<'a> {
    pub engine: &'a dyn Engine,
    pub input: &'a Input,
    pub roles: &'a [Role],
    pub settings: &'a LossySettings,
    pub previous: &'a Previous<'a>,
    /// The previous version of tensor `i` when it is a quantized object a quant-delta can
    /// refer to.
    pub previous_quant: &'a PreviousQuant<'a>,
    /// The reference of tensor `i` for residual coding.
    pub reference: &'a LoadReference<'a>,
    pub correction: Correction,
    /// The step of second moments' log residuals, in octaves ([`second_moment_step`]).
    pub second_moment_step: f64,
    pub loss: Option<f64>,
}

/// Loads the previous version of tensor `i` when it is quantized (see [`PlanInput`]).
pub(crate) type PreviousQuant<'a> = dyn Fn(usize) -> Result<Option<QuantTensor>> + Sync + 'a;

/// A moment keeps its previous code table only while the table's squared error stays within
/// this factor of a fresh fit's (moments have no loss estimate to trade against).
const MOMENT_REUSE_TOLERANCE: f64 = 1.25;

/// One scored configuration.
#[derive(Clone, Debug)]
struct Candidate {
    config: QuantConfig,
    estimate: Estimate,
    table: Option<Arc<Vec<f64>>>,
    residual: Option<Residual>,
    /// Estimated from a sample of the elements (see [`PlanInput::refine`]).
    sampled: bool,
}

impl Candidate {
    fn plan(&self, moments: Option<(usize, usize)>, mean_v: f64) -> TensorPlan {
        TensorPlan {
            config: self.config,
            table: self.table.clone(),
            moments,
            mean_v,
            role: "param",
            copy: None,
            residual: self.residual.clone(),
        }
    }
}

/// One parameter's scored candidates.
struct Scored {
    index: usize,
    family: Option<usize>,
    moments: Option<(usize, usize)>,
    /// The tensor's mean second moment (the loss estimate's curvature).
    mean_v: f64,
    lossless_bits: f64,
    cands: Vec<Candidate>,
}

impl PlanInput<'_> {
    /// The configuration recorded for tensor `i` in the parent's manifest, if it was quantized.
    fn previous_config(&self, i: usize) -> Option<QuantConfig> {
        let p = &self.input.pieces[i];
        self.previous
            .get(&self.input.files[p.file].tree_path, &p.name)
            .and_then(|e| e.exactness.lossy())
            .and_then(|l| l.settings.strip_prefix("quant "))
            .and_then(|s| s.parse::<QuantConfig>().ok())
    }

    /// The previous version's code table and codes, when it is quantized and its table can
    /// serve `cfg` (no more non-zero values than `cfg.bins`).
    fn previous_table(
        &self,
        i: usize,
        cfg: &QuantConfig,
    ) -> Result<Option<(Vec<f64>, QuantTensor)>> {
        let Some(prev) = (self.previous_quant)(i)? else {
            return Ok(None);
        };
        let values: Vec<f64> = (0..prev.bins())
            .map(|j| scalar::value(prev.dtype, &prev.table, j))
            .collect();
        let sorted = values.windows(2).all(|w| w[0] < w[1]);
        let nonzero = values.iter().filter(|&&v| v != 0.0).count();
        let usable = sorted && nonzero <= cfg.bins as usize && values.iter().all(|v| v.is_finite());
        Ok(usable.then_some((values, prev)))
    }

    /// `fit`'s estimate when its codes are stored as a quant-delta against `prev`'s (one pass
    /// counting code pairs).
    fn delta_estimate(
        &self,
        view: FloatView<'_>,
        prep: &Prepared<'_>,
        fit: &Fit,
        prev: &QuantTensor,
    ) -> Estimate {
        let pairs = self.engine.code_pairs(
            view,
            &prep.lut(fit),
            fit.values.len(),
            &prev.codes,
            prev.bins(),
        );
        fit.estimate.as_delta(&pairs)
    }

    /// Scores every parameter's candidates (the expensive part, done once per commit); residual
    /// steps are measured on every `every`-th block of large tensors (`1`: on every element).
    fn score(&self, every: usize, summary: &mut SearchSummary) -> Result<Vec<Scored>> {
        let params: Vec<usize> = (0..self.roles.len())
            .filter(|&i| matches!(self.roles[i], Role::Param { .. }))
            .collect();
        let scored: Vec<(Scored, bool)> = params
            .par_iter()
            .map(|&i| {
                let Role::Param {
                    family,
                    moments,
                    embedding,
                } = self.roles[i]
                else {
                    unreachable!()
                };
                let t = &self.input.pieces[i];
                let previous = self.previous_config(i);
                let view = self.input.view(i);
                // With a previous version to take residuals from, the code-table quantizer is
                // not tried: on every series measured a residual was smaller at the same
                // estimate (docs/BENCHMARKS.md), and its fits were a fifth of a commit's time.
                // Then the key statistics the fits need are not counted either, only the mean
                // second moment.
                let reference = (self.reference)(i)?.map(Arc::new);
                // The search reads the tensor, its moments and its reference several times (a
                // distance and a measure with and without the reference): an engine on a
                // device keeps them there for the tensor's search instead of copying them over
                // for each call.
                let ms = self.input.moments(moments);
                let mut read = vec![view.bytes];
                read.extend(reference.as_ref().map(|r| &r.content[..]));
                read.extend(ms.iter().flat_map(|m| [m.m.bytes, m.v.bytes]));
                let _kept: Vec<_> = read.into_iter().map(|b| self.engine.keep(b)).collect();
                let stats = match reference {
                    Some(_) => None,
                    None => Some(self.engine.key_stats(view, ms)),
                };
                let prep = stats.as_ref().map(|s| Prepared::new(s, t.header.dtype));
                let mean_v = match (&prep, ms) {
                    (Some(p), _) => p.mean_v(),
                    (None, Some(m)) => self.engine.mean_second_moment(view, m),
                    (None, None) => 0.0,
                };
                // All-zero moments (a checkpoint saved before its first step, a fresh
                // optimizer) say nothing about the loss: such a parameter is treated as one
                // without moments.
                let (family, moments) = if moments.is_some() && mean_v == 0.0 {
                    (None, None)
                } else {
                    (family, moments)
                };
                let configs = quant::candidates(
                    previous.as_ref(),
                    embedding,
                    moments.is_some(),
                    Domain::Linear,
                );
                // In a neighbourhood search the first candidate is the previous configuration:
                // it is priced as a delta against the previous codes (what it will be stored
                // as), and scored once more with the previous table.
                let reuse = match (previous, &prep) {
                    (Some(_), Some(_)) => self.previous_table(i, &configs[0])?,
                    _ => None,
                };
                let corr = Some(self.correction);
                let mut cands: Vec<Candidate> = match &prep {
                    None => Vec::new(),
                    Some(prep) => configs
                        .par_iter()
                        .enumerate()
                        .map(|(j, c)| {
                            let fit = prep.fit(c, corr);
                            let estimate = match &reuse {
                                Some((_, prev)) if j == 0 => {
                                    self.delta_estimate(view, prep, &fit, prev)
                                }
                                _ => fit.estimate,
                            };
                            Candidate {
                                config: *c,
                                estimate,
                                table: None,
                                residual: None,
                                sampled: false,
                            }
                        })
                        .collect(),
                };
                // With moments, each element's step follows the curvature the estimate
                // charges its error with (`residual::Steps`).
                let factors = ms
                    .filter(|_| moments.is_some() && self.settings.row_col_steps)
                    .and_then(|m| {
                        let shape = &t.header.shape;
                        let view = residual::view_of(shape);
                        residual::Steps::fit(m.v.dtype, m.v.bytes, view, CURVATURE_FLOOR)
                    })
                    .map(Arc::new);
                let steps = |reference: &Option<Arc<Reference>>| {
                    let candidates = self.residual_steps(i, reference);
                    self.residual_candidates(
                        i,
                        configs[0],
                        (reference.clone(), factors.clone()),
                        moments,
                        mean_v,
                        &candidates,
                        every,
                    )
                };
                cands.extend(steps(&None));
                if reference.is_some() {
                    cands.extend(steps(&reference));
                }
                if let (Some((table, prev)), Some(prep)) = (reuse, &prep) {
                    let reused = prep.fit_table(&configs[0], Some(&table), corr);
                    cands.push(Candidate {
                        config: configs[0],
                        estimate: self.delta_estimate(view, prep, &reused, &prev),
                        table: Some(Arc::new(table)),
                        residual: None,
                        sampled: false,
                    });
                }
                Ok((
                    Scored {
                        index: i,
                        family,
                        moments,
                        mean_v,
                        lossless_bits: t.len as f64 * 8.0 * 0.85,
                        cands,
                    },
                    previous.is_some(),
                ))
            })
            .collect::<Result<_>>()?;
        for (s, neighbourhood) in &scored {
            summary.scored += s.cands.len();
            if *neighbourhood {
                summary.neighbourhood += 1;
            } else {
                summary.guided += 1;
            }
        }
        Ok(scored.into_iter().map(|(s, _)| s).collect())
    }

    /// The steps tensor `i` is tried at: around the RMS of its movement from `reference`, or
    /// without one (`quant-uniform`) around its own RMS.
    fn residual_steps(&self, i: usize, reference: &Option<Arc<Reference>>) -> Vec<f64> {
        let view = self.input.view(i);
        let content = reference.as_ref().map(|r| &r.content[..]);
        let steps = match content {
            Some(_) => RESIDUAL_STEPS,
            None => UNIFORM_STEPS,
        };
        let n = (view.bytes.len() / view.dtype.size()).max(1) as f64;
        let rms = (self.engine.residual_distance(view, content) / n).sqrt();
        if !(rms > 0.0 && rms.is_finite()) {
            return Vec::new();
        }
        steps
            .iter()
            .map(|&k| rms * 2f64.powf(k as f64 / 2.0))
            .filter(|&step| residual::valid_step(residual::Mode::Linear, step))
            .collect()
    }

    /// Tensor `i` as residuals from `reference` (`None`: `quant-uniform`) at `steps`, each
    /// element's step times its factor in `factors` when there are any, measured on every
    /// `every`-th block when the tensor is large enough for a sample to speak for it.
    /// `mean_v`: the tensor's mean second moment, for the estimate.
    #[allow(clippy::too_many_arguments)]
    fn residual_candidates(
        &self,
        i: usize,
        config: QuantConfig,
        (reference, factors): (Option<Arc<Reference>>, Option<Arc<residual::Steps>>),
        moments: Option<(usize, usize)>,
        mean_v: f64,
        steps: &[f64],
        every: usize,
    ) -> Vec<Candidate> {
        let view = self.input.view(i);
        let moments = self.input.moments(moments);
        let linear = residual::Mode::Linear;
        let content = reference.as_ref().map(|r| &r.content[..]);
        let n = view.bytes.len() / view.dtype.size();
        let every = if n >= SAMPLED_BLOCKS * residual::BLOCK * every {
            every
        } else {
            1
        };
        let f = factors.as_deref();
        let stats = self
            .engine
            .residual_measure(view, content, moments, linear, f, steps, every);
        steps
            .iter()
            .zip(stats)
            .map(|(&step, st)| {
                let st = match every {
                    1 => st,
                    _ => {
                        let measured = st.codes.total().max(1) as f64;
                        st.scaled(n as f64 / measured)
                    }
                };
                let e = &st.err;
                let delta_loss = moments.map(|_| {
                    self.correction
                        .loss_change(e.sum_m_delta, e.sum_v_delta2, e.sum_sq_err, mean_v)
                });
                let bits = st.bits(view.dtype);
                Candidate {
                    config,
                    estimate: Estimate {
                        bits,
                        code_bits: bits,
                        sq_err: e.sum_sq_err,
                        rel_l2: e.rel_l2(),
                        max_abs: e.max_abs,
                        delta_loss,
                        protected: st.exact,
                        pruned: 0,
                    },
                    table: None,
                    residual: Some(Residual {
                        reference: reference.clone(),
                        follows: None,
                        mode: linear,
                        step,
                        sparsify: None,
                        predict: false,
                        factors: factors.clone(),
                        view: residual::view_of(&self.input.pieces[i].header.shape),
                    }),
                    sampled: every > 1,
                }
            })
            .collect()
    }

    /// Replaces sampled estimates by exact ones where it matters: the budget is allocated on
    /// the sampled estimates, then each tensor keeps, of each step list, only the candidates
    /// around the size it was given (the pick and its neighbours), measured again on every
    /// element. The final allocation then sees exact estimates only, so the recorded loss
    /// change is what the budget was checked against. A list whose candidate of the pick's size
    /// is [`outclassed`] by the pick from the other list is not measured again (with a previous
    /// version, the uniform list nearly always is: its exact passes were 3 of about 10).
    fn refine(&self, scored: &mut [Scored]) {
        let picks = self.picks(scored, 1.0, &mut SearchSummary::default());
        scored.par_iter_mut().zip(picks).for_each(|(s, pick)| {
            let size = pick.map_or(s.lossless_bits, |p| s.cands[p].estimate.bits);
            // The list the pick is from (`None`: kept exactly, or a code-table candidate).
            let picked = pick.and_then(|p| {
                let c = &s.cands[p];
                Some((c.residual.as_ref()?.reference.is_some(), c.estimate))
            });
            let sampled = std::mem::take(&mut s.cands);
            let (sampled, exact): (Vec<Candidate>, Vec<Candidate>) =
                sampled.into_iter().partition(|c| c.sampled);
            s.cands = exact;
            // One list per reference (uniform, residual), each in step order.
            for with_reference in [false, true] {
                let list: Vec<&Candidate> = sampled
                    .iter()
                    .filter(|c| {
                        c.residual.as_ref().is_some_and(|r| r.reference.is_some()) == with_reference
                    })
                    .collect();
                let Some(nearest) = (0..list.len()).min_by(|&a, &b| {
                    let gap = |j: usize| (list[j].estimate.bits - size).abs();
                    gap(a).total_cmp(&gap(b))
                }) else {
                    continue;
                };
                // The other list's candidate of the pick's size losing far more than the pick:
                // that list is out of the running, and is not measured again.
                if let Some((from, p)) = &picked {
                    if *from != with_reference && outclassed(&list[nearest].estimate, p) {
                        continue;
                    }
                }
                let around = &list[nearest.saturating_sub(1)..(nearest + 2).min(list.len())];
                let residual = around[0].residual.as_ref().expect("a residual candidate");
                let steps: Vec<f64> = around
                    .iter()
                    .filter_map(|c| c.residual.as_ref().map(|r| r.step))
                    .collect();
                s.cands.extend(self.residual_candidates(
                    s.index,
                    around[0].config,
                    (residual.reference.clone(), residual.factors.clone()),
                    s.moments,
                    s.mean_v,
                    &steps,
                    1,
                ));
            }
        });
    }

    /// The plans of the moments (fixed configurations): each keeps its previous version's
    /// table when that makes a smaller delta and costs little accuracy
    /// ([`MOMENT_REUSE_TOLERANCE`]).
    fn moment_plans(&self) -> Result<Vec<(usize, TensorPlan)>> {
        let moments: Vec<(usize, QuantConfig, &'static str)> = self
            .roles
            .iter()
            .enumerate()
            .filter_map(|(i, role)| {
                let (config, role) = match role {
                    Role::FirstMoment => (self.settings.exp_avg, "exp_avg"),
                    Role::SecondMoment => (self.settings.exp_avg_sq, "exp_avg_sq"),
                    _ => return None,
                };
                config.map(|c| (i, c, role))
            })
            .collect();
        // Each first moment's second moment and back, from the parameters' pairings.
        let pairs: Vec<(usize, usize)> = self
            .roles
            .iter()
            .filter_map(|r| match r {
                Role::Param {
                    moments: Some((m, v)),
                    ..
                } => Some((*m, *v)),
                _ => None,
            })
            .collect();
        let second_of: HashMap<usize, usize> = pairs.iter().copied().collect();
        let first_of: HashMap<usize, usize> = pairs.iter().map(|&(m, v)| (v, m)).collect();
        // Below these magnitudes a first moment is dropped (`quant.exp_avg_drop`).
        let drop = self.settings.exp_avg_drop;
        let thresholds: HashMap<usize, f64> = match drop > 0.0 {
            true => pairs
                .par_iter()
                .map(|&(m, _)| {
                    let view = self.input.view(m);
                    (m, sparse::small_threshold(view.dtype, view.bytes, drop))
                })
                .collect(),
            false => HashMap::new(),
        };
        let sparsify_of = |i: usize| match self.roles[i] {
            Role::SecondMoment => {
                let first = *first_of.get(&i)?;
                let octaves = self.settings.exp_avg_sq_hold;
                (octaves > 0.0).then_some(())?;
                Some(Sparsify::Hold {
                    first,
                    threshold: *thresholds.get(&first)?,
                    octaves,
                })
            }
            _ => Some(Sparsify::Small {
                threshold: *thresholds.get(&i)?,
            }),
        };
        // With a previous version: `exp_avg_sq` as a log residual from it; `exp_avg` in units of
        // its commit's second moment, or where that is at the depth cap of its previous
        // version. Each reference is decoded once, though a second moment's serves its first
        // moment too.
        let pieces = &self.input.pieces;
        let residual_of = |i: usize| {
            let (source, mode, step) = match self.roles[i] {
                Role::SecondMoment => (Some(i), residual::Mode::Log, self.second_moment_step),
                _ => (
                    second_of.get(&i).copied(),
                    residual::Mode::Scaled,
                    FIRST_MOMENT_SCALED_STEP,
                ),
            };
            let source = source.filter(|&s| {
                self.settings.moment_residuals && pieces[s].header == pieces[i].header
            });
            (source, mode, step)
        };
        let role_is_second = |i: usize| self.roles[i] == Role::SecondMoment;
        // The second moments planned here: every one of them is stored lossily.
        let planned: HashSet<usize> = moments.iter().map(|m| m.0).collect();
        let view_of = |i: usize| residual::view_of(&pieces[i].header.shape);
        let mut sources: Vec<usize> = moments.iter().filter_map(|m| residual_of(m.0).0).collect();
        sources.sort_unstable();
        sources.dedup();
        let references: HashMap<usize, Arc<Reference>> = sources
            .par_iter()
            .map(|&s| Ok((self.reference)(s)?.map(|r| (s, Arc::new(r)))))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .collect();
        moments
            .par_iter()
            .map(|&(i, config, role)| {
                let mut plan = TensorPlan {
                    config,
                    table: None,
                    moments: None,
                    mean_v: 0.0,
                    role,
                    copy: None,
                    residual: None,
                };
                let (source, mode, step) = residual_of(i);
                // A reference that cannot scale most elements (an optimizer's first step after
                // zero moments) leaves the tensor to the quantizer. Counted on a sample: a
                // tensor near the limit is a residual either way, the limit only keeps out
                // those a reference cannot serve at all.
                let serves = |content: &[u8]| {
                    let st = self.engine.residual_measure(
                        self.input.view(i),
                        Some(content),
                        None,
                        mode,
                        None,
                        &[step],
                        SAMPLE_EVERY,
                    );
                    let st = st.into_iter().next().unwrap_or_default();
                    (st.exact as f64) <= MOMENT_EXACT_LIMIT * st.codes.total() as f64
                };
                // A first moment is coded in units of this commit's second moment as stored
                // (the store gives the reference), or where that is at the depth cap, of its
                // previous version's.
                let first = self.roles[i] == Role::FirstMoment;
                let current = second_of.get(&i).copied().filter(|&v| {
                    first
                        && role_is_second(v)
                        && planned.contains(&v)
                        && self.settings.moment_residuals
                        && pieces[v].header == pieces[i].header
                        && serves(self.input.view(v).bytes)
                });
                // Beside this commit's unit the previous one is a fallback for the depth cap
                // only, taken unchecked: the check is a measure, and elements it cannot scale
                // are kept exactly, which costs bytes, not correctness.
                let previous = source
                    .and_then(|s| references.get(&s))
                    .filter(|r| current.is_some() || serves(&r.content));
                if previous.is_some() || current.is_some() {
                    let sparsify = sparsify_of(i);
                    // A held second moment keeps its reference's value exactly, which only
                    // codes against the reference itself do.
                    let held = matches!(sparsify, Some(Sparsify::Hold { .. }));
                    plan.residual = Some(Residual {
                        reference: previous.cloned(),
                        follows: current,
                        mode,
                        step,
                        sparsify,
                        // Second moments are coded against a prediction
                        // (`residual::Predictor`).
                        predict: role_is_second(i) && !held,
                        factors: None,
                        view: view_of(i),
                    });
                    return Ok((i, plan));
                }
                // A second moment without a reference to take residuals from is coded against
                // its own row and column factors (`residual::Predictor`) at the same step.
                if role_is_second(i) && self.settings.moment_residuals {
                    plan.residual = Some(Residual {
                        reference: None,
                        follows: None,
                        mode: residual::Mode::Log,
                        step: self.second_moment_step,
                        sparsify: None,
                        predict: true,
                        factors: None,
                        view: view_of(i),
                    });
                    return Ok((i, plan));
                }
                if self.previous_config(i) != Some(config) {
                    return Ok((i, plan));
                }
                let Some((table, prev)) = self.previous_table(i, &config)? else {
                    return Ok((i, plan));
                };
                let view = self.input.view(i);
                let stats = self.engine.key_stats(view, None);
                let prep = Prepared::new(&stats, view.dtype);
                let fresh = prep.fit(&config, None);
                let reused = prep.fit_table(&config, Some(&table), None);
                let fe = self.delta_estimate(view, &prep, &fresh, &prev);
                let re = self.delta_estimate(view, &prep, &reused, &prev);
                if re.bits < fe.bits && re.sq_err <= fe.sq_err * MOMENT_REUSE_TOLERANCE {
                    plan.table = Some(Arc::new(table));
                }
                Ok((i, plan))
            })
            .collect()
    }

    /// Chooses configurations from scored candidates under the budget scaled by `scale`.
    fn choose(
        &self,
        scored: &[Scored],
        moment_plans: &[(usize, TensorPlan)],
        scale: f64,
        summary: &mut SearchSummary,
    ) -> Vec<Option<TensorPlan>> {
        let picks = self.picks(scored, scale, summary);
        let mut plans: Vec<Option<TensorPlan>> = vec![None; self.roles.len()];
        for (s, pick) in scored.iter().zip(picks) {
            if let Some(p) = pick {
                let moments = s.moments.filter(|_| s.family.is_some());
                let mut plan = s.cands[p].plan(moments, s.mean_v);
                plan.copy = moments.and(s.family).map(|f| self.copy_name(f));
                plans[s.index] = Some(plan);
            }
        }
        for (i, plan) in moment_plans {
            plans[*i] = Some(plan.clone());
        }
        summary.quantized = plans.iter().flatten().count();
        plans
    }
}

/// Scores a candidate checkpoint: the committed file (`None`) or one with these plans applied.
pub(crate) type Evaluate<'a> = &'a dyn Fn(Option<&[Option<TensorPlan>]>) -> Result<f64>;

/// Chooses how every tensor of a checkpoint is quantized (`None`: stored losslessly). With an
/// evaluation command, candidate checkpoints at several budgets are scored by `evaluate`
/// (given the plans, it returns the command's number) and the loosest one whose metric stays
/// within ε of the original's is taken.
pub(crate) fn plan(
    input: &PlanInput<'_>,
    evaluate: Option<Evaluate<'_>>,
) -> Result<(Vec<Option<TensorPlan>>, SearchSummary)> {
    let mut summary = SearchSummary::default();
    // With an evaluation command the budget is scaled, and every scale needs exact estimates.
    let every = match evaluate {
        Some(_) => 1,
        None => SAMPLE_EVERY,
    };
    let mut scored = input.score(every, &mut summary)?;
    let moments = input.moment_plans()?;
    let Some(evaluate) = evaluate else {
        input.refine(&mut scored);
        let plans = input.choose(&scored, &moments, 1.0, &mut summary);
        return Ok((plans, summary));
    };
    let reference = evaluate(None)?;
    summary.evaluations += 1;
    let limit = reference + input.settings.epsilon * reference.abs();
    // From a loose budget down: the first candidate the user's metric accepts.
    for scale in [64.0, 16.0, 4.0, 1.0, 0.25, 1.0 / 16.0] {
        let plans = input.choose(&scored, &moments, scale, &mut summary);
        let score = evaluate(Some(&plans))?;
        summary.evaluations += 1;
        if score <= limit {
            return Ok((plans, summary));
        }
    }
    // Nothing passed: only the moments are quantized.
    let mut plans = input.choose(&scored, &moments, 0.0, &mut summary);
    for p in plans.iter_mut() {
        if p.as_ref().is_some_and(|t| t.role == "param") {
            *p = None;
        }
    }
    Ok((plans, summary))
}
