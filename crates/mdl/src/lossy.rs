//! Lossy commits: which tensors are quantized, how parameters are paired with their Adam
//! moments, and the configuration search under a quality bound ε (`docs/CODECS.md`).
//!
//! Roles come from tensor names. A *pairing* names a parameter and its two moments with one `{}`
//! placeholder each: the default pairings are this project's corpus convention
//! (`model.{}` ↔ `optim.{}.exp_avg` / `optim.{}.exp_avg_sq`, and `optim.{}.master` — fp32 master
//! weights of mixed-precision training — with the same moments). Parameters with moments are
//! searched under the loss estimate `|Σ m̂·δ| + ½ Σ v̂·δ²`, the checkpoint's budget being
//! `ε × loss` (or `ε` without a loss) for each pairing's family of tensors; parameters without
//! moments get the cheapest configuration whose relative L2 error is at most ε; the moments
//! themselves get fixed configurations (`quant.exp_avg`, `quant.exp_avg_sq`).

use std::collections::HashMap;
use std::sync::Arc;

use mdl_codec::engine::{Engine, ErrorStats, FloatView, Moments};
use mdl_codec::qrecord::QuantTensor;
use mdl_codec::quant::{self, Correction, Domain, Estimate, Fit, Prepared, QuantConfig};
use mdl_codec::scalar::{self, lossy_supported};
use mdl_format::safetensors::Layout;

use crate::input::Input;
use mdl_format::{Entry, Lossy};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// `codec.default`: what a commit does without `--lossy`/`--trim-bits`.
pub const DEFAULT_KEY: &str = "codec.default";
/// `codec.epsilon`: the quality bound.
pub const EPSILON_KEY: &str = "codec.epsilon";
/// `codec.trim_bits`: mantissa bits kept by `trim`.
pub const TRIM_BITS_KEY: &str = "codec.trim_bits";
/// `quant.moments`: parameter/moment pairings.
pub const MOMENTS_KEY: &str = "quant.moments";
/// `quant.embeddings`: name patterns of embedding tensors.
pub const EMBEDDINGS_KEY: &str = "quant.embeddings";
/// `quant.adam_betas`: Adam's β1,β2 for the bias corrections.
pub const BETAS_KEY: &str = "quant.adam_betas";
/// `quant.exp_avg`: the first moments' quantizer configuration.
pub const EXP_AVG_KEY: &str = "quant.exp_avg";
/// `quant.exp_avg_sq`: the second moments' quantizer configuration.
pub const EXP_AVG_SQ_KEY: &str = "quant.exp_avg_sq";

/// Default ε (calibrated on the corpus: `docs/BENCHMARKS.md`).
pub const DEFAULT_EPSILON: f64 = 0.0005;
const DEFAULT_MOMENTS: &str = "model.{}:optim.{}.exp_avg:optim.{}.exp_avg_sq,\
                               optim.{}.master:optim.{}.exp_avg:optim.{}.exp_avg_sq";
const DEFAULT_EMBEDDINGS: &str = "*wte*,*embed*";
const DEFAULT_EXP_AVG: &str = "bins=8 prune=0.5 protect=0.0005 metric=magnitude domain=linear";
const DEFAULT_EXP_AVG_SQ: &str = "bins=16 prune=0 protect=0.0005 metric=magnitude domain=log";

/// Tensors with fewer elements stay lossless: their tables would outweigh the gain, and they are
/// mostly norms and biases, which are sensitive.
pub const MIN_LOSSY_ELEMENTS: u64 = 256;

/// What commits do with float tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodecMode {
    /// Store exactly.
    Lossless,
    /// Quantize (quant-base / quant-delta) under ε.
    Lossy,
    /// Mantissa-trim to `codec.trim_bits`.
    Trim,
}

impl std::str::FromStr for CodecMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "lossless" => Ok(CodecMode::Lossless),
            "lossy" => Ok(CodecMode::Lossy),
            "trim" => Ok(CodecMode::Trim),
            _ => Err(invalid(DEFAULT_KEY, s, "lossless, lossy or trim")),
        }
    }
}

impl std::fmt::Display for CodecMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CodecMode::Lossless => "lossless",
            CodecMode::Lossy => "lossy",
            CodecMode::Trim => "trim",
        })
    }
}

fn invalid(key: &str, value: &str, expected: &'static str) -> Error {
    Error::InvalidConfig {
        key: key.into(),
        value: value.into(),
        expected,
    }
}

/// A parameter and its moments, each a name pattern with one `{}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pairing {
    /// The parameter's pattern.
    pub weight: String,
    /// The first moment's pattern.
    pub m: String,
    /// The second moment's pattern.
    pub v: String,
}

impl Pairing {
    /// Parses `W:M:V[,W:M:V…]`.
    pub fn parse_list(s: &str) -> Result<Vec<Pairing>> {
        let bad = || {
            invalid(
                MOMENTS_KEY,
                s,
                "comma-separated WEIGHT:EXP_AVG:EXP_AVG_SQ patterns, each with one {}",
            )
        };
        s.split(',')
            .map(|p| {
                let parts: Vec<&str> = p.trim().split(':').collect();
                if parts.len() != 3 || parts.iter().any(|x| x.matches("{}").count() != 1) {
                    return Err(bad());
                }
                Ok(Pairing {
                    weight: parts[0].into(),
                    m: parts[1].into(),
                    v: parts[2].into(),
                })
            })
            .collect()
    }

    /// The `{}` part of `name` if it matches `pattern`.
    pub(crate) fn capture<'n>(pattern: &str, name: &'n str) -> Option<&'n str> {
        let (pre, post) = pattern.split_once("{}")?;
        let rest = name.strip_prefix(pre)?.strip_suffix(post)?;
        (!rest.is_empty()).then_some(rest)
    }
}

/// Whether `name` matches a glob with `*` wildcards.
fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let mut rest = name;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
    }
    true
}

/// The lossy settings of one commit: repository configuration with command-line overrides.
#[derive(Clone, Debug)]
pub struct LossySettings {
    /// What happens to float tensors.
    pub mode: CodecMode,
    /// Quality bound.
    pub epsilon: f64,
    /// Mantissa bits kept in trim mode.
    pub trim_bits: u32,
    /// Parameter/moment pairings.
    pub pairings: Vec<Pairing>,
    /// Embedding name globs.
    pub embeddings: Vec<String>,
    /// Adam's betas.
    pub betas: (f64, f64),
    /// First moments' configuration (`None`: stored exactly).
    pub exp_avg: Option<QuantConfig>,
    /// Second moments' configuration (`None`: stored exactly).
    pub exp_avg_sq: Option<QuantConfig>,
    /// A command scoring candidate checkpoints (`{}` is the file), lower is better.
    pub eval_cmd: Option<String>,
}

/// Command-line overrides of the repository's lossy settings.
#[derive(Clone, Debug, Default)]
pub struct LossyRequest {
    /// `--lossy` / `--trim-bits` / `--lossless`.
    pub mode: Option<CodecMode>,
    /// `--epsilon`.
    pub epsilon: Option<f64>,
    /// `--trim-bits`.
    pub trim_bits: Option<u32>,
    /// `--moments`.
    pub moments: Option<String>,
    /// `--eval-cmd`.
    pub eval_cmd: Option<String>,
}

fn parse_epsilon(v: &str) -> Result<f64> {
    v.parse::<f64>()
        .ok()
        .filter(|e| e.is_finite() && *e > 0.0 && *e < 1.0)
        .ok_or_else(|| invalid(EPSILON_KEY, v, "a number between 0 and 1 (exclusive)"))
}

fn parse_trim_bits(v: &str) -> Result<u32> {
    v.parse::<u32>()
        .ok()
        .filter(|b| *b <= 22)
        .ok_or_else(|| invalid(TRIM_BITS_KEY, v, "a whole number from 0 to 22"))
}

fn parse_betas(v: &str) -> Result<(f64, f64)> {
    let bad = || invalid(BETAS_KEY, v, "BETA1,BETA2 with each in [0, 1)");
    let (a, b) = v.split_once(',').ok_or_else(bad)?;
    let p = |x: &str| {
        x.trim()
            .parse::<f64>()
            .ok()
            .filter(|y| (0.0..1.0).contains(y))
    };
    Ok((p(a).ok_or_else(bad)?, p(b).ok_or_else(bad)?))
}

fn parse_config(key: &str, v: &str) -> Result<Option<QuantConfig>> {
    if v == "off" {
        return Ok(None);
    }
    v.parse::<QuantConfig>().map(Some).map_err(|_| {
        invalid(
            key,
            v,
            "off, or bins=N prune=F protect=F metric=magnitude|sensitivity domain=linear|log",
        )
    })
}

/// Checks a value for one of this module's configuration keys; `None` for other keys.
pub fn validate(key: &str, value: &str) -> Option<Result<()>> {
    Some(match key {
        DEFAULT_KEY => value.parse::<CodecMode>().map(drop),
        EPSILON_KEY => parse_epsilon(value).map(drop),
        TRIM_BITS_KEY => parse_trim_bits(value).map(drop),
        MOMENTS_KEY => Pairing::parse_list(value).map(drop),
        EMBEDDINGS_KEY => Ok(()),
        BETAS_KEY => parse_betas(value).map(drop),
        EXP_AVG_KEY | EXP_AVG_SQ_KEY => parse_config(key, value).map(drop),
        _ => return None,
    })
}

/// This module's configuration keys with their defaults.
pub fn known_keys() -> Vec<(&'static str, String)> {
    vec![
        (DEFAULT_KEY, "lossless".into()),
        (EPSILON_KEY, DEFAULT_EPSILON.to_string()),
        (TRIM_BITS_KEY, "7".into()),
        (MOMENTS_KEY, DEFAULT_MOMENTS.replace(' ', "")),
        (EMBEDDINGS_KEY, DEFAULT_EMBEDDINGS.into()),
        (BETAS_KEY, "0.9,0.999".into()),
        (EXP_AVG_KEY, DEFAULT_EXP_AVG.into()),
        (EXP_AVG_SQ_KEY, DEFAULT_EXP_AVG_SQ.into()),
    ]
}

impl LossySettings {
    /// The repository's settings under `req`'s overrides.
    pub fn resolve(store: &mdl_store::Store, req: &LossyRequest) -> Result<LossySettings> {
        let meta = store.meta().read()?;
        let get = |key: &str| -> Result<String> {
            Ok(match meta.config(key)? {
                Some(v) => v,
                None => known_keys()
                    .into_iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, d)| d)
                    .unwrap_or_default(),
            })
        };
        let mode = match req.mode {
            Some(m) => m,
            None => get(DEFAULT_KEY)?.parse()?,
        };
        let epsilon = match req.epsilon {
            Some(e) => parse_epsilon(&e.to_string())?,
            None => parse_epsilon(&get(EPSILON_KEY)?)?,
        };
        let trim_bits = match req.trim_bits {
            Some(b) => parse_trim_bits(&b.to_string())?,
            None => parse_trim_bits(&get(TRIM_BITS_KEY)?)?,
        };
        let pairings = match &req.moments {
            Some(p) => Pairing::parse_list(p)?,
            None => Pairing::parse_list(&get(MOMENTS_KEY)?)?,
        };
        Ok(LossySettings {
            mode,
            epsilon,
            trim_bits,
            pairings,
            embeddings: get(EMBEDDINGS_KEY)?
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            betas: parse_betas(&get(BETAS_KEY)?)?,
            exp_avg: parse_config(EXP_AVG_KEY, &get(EXP_AVG_KEY)?)?,
            exp_avg_sq: parse_config(EXP_AVG_SQ_KEY, &get(EXP_AVG_SQ_KEY)?)?,
            eval_cmd: req.eval_cmd.clone(),
        })
    }
}

/// What a tensor is, for the lossy codecs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// A parameter; `family` is its pairing's index (its loss budget), `moments` the indices
    /// of its `exp_avg` and `exp_avg_sq` tensors.
    Param {
        family: Option<usize>,
        moments: Option<(usize, usize)>,
        embedding: bool,
    },
    /// Some parameter's `exp_avg`.
    FirstMoment,
    /// Some parameter's `exp_avg_sq`.
    SecondMoment,
    /// Stays lossless (not a float the quantizer takes, or too small).
    Exact,
}

/// Each tensor's role, from names, dtypes and shapes.
pub(crate) fn roles(layout: &Layout, s: &LossySettings) -> Vec<Role> {
    let by_name: HashMap<&str, usize> = layout
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let eligible = |i: usize| {
        let t = &layout.tensors[i];
        lossy_supported(t.header.dtype) && t.header.numel().unwrap_or(0) >= MIN_LOSSY_ELEMENTS
    };
    let mut roles = vec![Role::Exact; layout.tensors.len()];
    // Moments first: a name matching a moment pattern is a moment even if it also looks like
    // a parameter.
    for (i, t) in layout.tensors.iter().enumerate() {
        if !eligible(i) {
            continue;
        }
        for p in &s.pairings {
            if Pairing::capture(&p.m, &t.name).is_some() {
                roles[i] = Role::FirstMoment;
            } else if Pairing::capture(&p.v, &t.name).is_some() {
                roles[i] = Role::SecondMoment;
            }
        }
    }
    for (i, t) in layout.tensors.iter().enumerate() {
        if !eligible(i) || roles[i] != Role::Exact {
            continue;
        }
        let embedding = s.embeddings.iter().any(|g| glob(g, &t.name));
        let mut role = Role::Param {
            family: None,
            moments: None,
            embedding,
        };
        for (f, p) in s.pairings.iter().enumerate() {
            let Some(x) = Pairing::capture(&p.weight, &t.name) else {
                continue;
            };
            let (mn, vn) = (p.m.replace("{}", x), p.v.replace("{}", x));
            if let (Some(&mi), Some(&vi)) = (by_name.get(mn.as_str()), by_name.get(vn.as_str())) {
                let same = |j: usize| layout.tensors[j].header.shape == t.header.shape;
                if same(mi) && same(vi) && eligible(mi) && eligible(vi) {
                    role = Role::Param {
                        family: Some(f),
                        moments: Some((mi, vi)),
                        embedding,
                    };
                    break;
                }
            }
        }
        roles[i] = role;
    }
    roles
}

/// How one tensor is quantized.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TensorPlan {
    pub config: QuantConfig,
    /// A code table to use instead of fitting one: the previous version's, so that elements
    /// that did not move keep their codes and the quant-delta is mostly zeros.
    pub table: Option<Arc<Vec<f64>>>,
    /// Its moments' tensor indices (sensitivity and the loss estimate).
    pub moments: Option<(usize, usize)>,
    /// What the manifest says the tensor is.
    pub role: &'static str,
}

/// The outcome of the configuration search for one checkpoint.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SearchSummary {
    /// Loss budget per family (`ε × loss` or `ε`).
    pub budget: f64,
    /// The loss the budget is relative to, when known.
    pub loss: Option<f64>,
    /// Estimated loss change of the chosen configurations, per family, summed.
    pub est_delta_loss: f64,
    /// Configurations scored.
    pub scored: usize,
    /// Tensors searched from the whole grid (a branch's first lossy commit) or from the
    /// previous configuration's neighbourhood.
    pub guided: usize,
    /// Tensors searched in a neighbourhood.
    pub neighbourhood: usize,
    /// Quantized tensors.
    pub quantized: usize,
    /// Parameters kept lossless because no configuration fitted the budget.
    pub kept_exact: usize,
    /// Candidate checkpoints scored by `--eval-cmd`.
    pub evaluations: usize,
}

/// The data a plan is made from.
pub(crate) struct PlanInput<'a> {
    pub engine: &'a dyn Engine,
    pub input: &'a Input,
    pub roles: &'a [Role],
    pub settings: &'a LossySettings,
    pub previous: &'a HashMap<&'a str, &'a Entry>,
    /// The previous version of tensor `i` when it is a quantized object a quant-delta can
    /// refer to.
    pub previous_quant: &'a PreviousQuant<'a>,
    pub correction: Correction,
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
}

/// One parameter's scored candidates.
struct Scored {
    index: usize,
    family: Option<usize>,
    moments: Option<(usize, usize)>,
    lossless_bits: f64,
    cands: Vec<Candidate>,
}

impl PlanInput<'_> {
    /// The configuration recorded for tensor `i` in the parent's manifest, if it was quantized.
    fn previous_config(&self, i: usize) -> Option<QuantConfig> {
        self.previous
            .get(self.input.layout.tensors[i].name.as_str())
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

    /// Scores every parameter's candidates (the expensive part, done once per commit).
    fn score(&self, summary: &mut SearchSummary) -> Result<Vec<Scored>> {
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
                let t = &self.input.layout.tensors[i];
                let previous = self.previous_config(i);
                let view = self.input.view(i);
                let stats = self.engine.key_stats(view, self.input.moments(moments));
                let prep = Prepared::new(&stats, t.header.dtype);
                let configs = quant::candidates(
                    previous.as_ref(),
                    embedding,
                    moments.is_some(),
                    Domain::Linear,
                );
                // In a neighbourhood search the first candidate is the previous configuration:
                // it is priced as a delta against the previous codes (what it will be stored
                // as), and scored once more with the previous table.
                let reuse = match previous {
                    Some(_) => self.previous_table(i, &configs[0])?,
                    None => None,
                };
                let corr = Some(self.correction);
                let mut cands: Vec<Candidate> = configs
                    .par_iter()
                    .enumerate()
                    .map(|(j, c)| {
                        let fit = prep.fit(c, corr);
                        let estimate = match &reuse {
                            Some((_, prev)) if j == 0 => {
                                self.delta_estimate(view, &prep, &fit, prev)
                            }
                            _ => fit.estimate,
                        };
                        Candidate {
                            config: *c,
                            estimate,
                            table: None,
                        }
                    })
                    .collect();
                if let Some((table, prev)) = reuse {
                    let reused = prep.fit_table(&configs[0], Some(&table), corr);
                    cands.push(Candidate {
                        config: configs[0],
                        estimate: self.delta_estimate(view, &prep, &reused, &prev),
                        table: Some(Arc::new(table)),
                    });
                }
                Ok((
                    Scored {
                        index: i,
                        family,
                        moments,
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
        moments
            .par_iter()
            .map(|&(i, config, role)| {
                let mut plan = TensorPlan {
                    config,
                    table: None,
                    moments: None,
                    role,
                };
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
        let budget = self.settings.epsilon * scale * self.loss.map_or(1.0, f64::abs);
        summary.budget = budget;
        summary.loss = self.loss;
        summary.est_delta_loss = 0.0;
        summary.kept_exact = 0;
        let mut plans: Vec<Option<TensorPlan>> = vec![None; self.roles.len()];
        let mut families: HashMap<usize, Vec<&Scored>> = HashMap::new();
        for s in scored {
            match s.family {
                Some(f) if s.moments.is_some() => families.entry(f).or_default().push(s),
                _ => {
                    // No moments: the cheapest configuration within ε relative L2 error.
                    let best = s
                        .cands
                        .iter()
                        .filter(|c| c.estimate.rel_l2 <= self.settings.epsilon * scale)
                        .min_by(|a, b| a.estimate.bits.total_cmp(&b.estimate.bits))
                        .filter(|c| c.estimate.bits < s.lossless_bits);
                    match best {
                        Some(c) => {
                            plans[s.index] = Some(TensorPlan {
                                config: c.config,
                                table: c.table.clone(),
                                moments: None,
                                role: "param",
                            })
                        }
                        None => summary.kept_exact += 1,
                    }
                }
            }
        }
        let mut fams: Vec<_> = families.into_iter().collect();
        fams.sort_by_key(|(f, _)| *f);
        for (_, members) in fams {
            let lists: Vec<Vec<(f64, f64)>> = members
                .iter()
                .map(|s| {
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
            let picks = quant::allocate(&lists, budget);
            for ((s, &p), list) in members.iter().zip(&picks).zip(&lists) {
                summary.est_delta_loss += list[p].1;
                if p < s.cands.len() {
                    plans[s.index] = Some(TensorPlan {
                        config: s.cands[p].config,
                        table: s.cands[p].table.clone(),
                        moments: s.moments,
                        role: "param",
                    });
                } else {
                    summary.kept_exact += 1;
                }
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
    let scored = input.score(&mut summary)?;
    let moments = input.moment_plans()?;
    let Some(evaluate) = evaluate else {
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

/// A quantized tensor, its reconstruction and what the manifest records about it.
pub(crate) struct Quantized {
    pub tensor: QuantTensor,
    pub render: Vec<u8>,
    pub lossy: Lossy,
}

/// Quantizes `w` as `plan` says.
pub(crate) fn quantize(
    engine: &dyn Engine,
    w: FloatView<'_>,
    moments: Option<Moments<'_>>,
    plan: &TensorPlan,
    corr: Correction,
) -> Quantized {
    let stats = engine.key_stats(w, moments);
    let prep = Prepared::new(&stats, w.dtype);
    let fit = prep.fit_table(
        &plan.config,
        plan.table.as_deref().map(|t| &t[..]),
        Some(corr),
    );
    let assigned = engine.assign(w, &prep.lut(&fit));
    let tensor = QuantTensor::new(w.dtype, prep.table_bytes(&fit.values), assigned, w.bytes);
    let mut render = vec![0u8; w.bytes.len()];
    tensor.render(&mut render);
    let err = engine.error_stats(
        w,
        FloatView {
            dtype: w.dtype,
            bytes: &render,
        },
        moments,
    );
    let lossy = Lossy {
        settings: format!(
            "quant {} sensitivity={} role={}",
            plan.config,
            if moments.is_some() {
                "moments"
            } else {
                "magnitude"
            },
            plan.role
        ),
        max_abs_error: err.max_abs,
        rel_error: err.rel_l2(),
        est_delta_loss: moments.map(|_| delta_loss(&err, corr)),
    };
    Quantized {
        tensor,
        render,
        lossy,
    }
}

/// Runs `--eval-cmd` on `file` (`{}` in the command is replaced by the quoted path, which is
/// appended when there is no `{}`) and reads the number on the last line of its output.
pub(crate) fn run_eval(cmd: &str, file: &std::path::Path) -> Result<f64> {
    let quoted = format!("'{}'", file.display().to_string().replace('\'', "'\\''"));
    let line = if cmd.contains("{}") {
        cmd.replace("{}", &quoted)
    } else {
        format!("{cmd} {quoted}")
    };
    let fail = |why: String| Error::EvalCommand {
        cmd: cmd.to_string(),
        why,
    };
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&line)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        return Err(fail(format!("it exited with {}", out.status)));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| fail("it printed nothing".into()))?;
    last.split_whitespace()
        .rev()
        .find_map(|w| w.parse::<f64>().ok().filter(|x| x.is_finite()))
        .ok_or_else(|| fail(format!("no number on its last line {last:?}")))
}

/// The loss estimate from measured error sums.
pub(crate) fn delta_loss(err: &ErrorStats, corr: Correction) -> f64 {
    (corr.c1 * err.sum_m_delta).abs() + 0.5 * corr.c2 * err.sum_v_delta2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_and_globs() {
        let p = Pairing::parse_list(DEFAULT_MOMENTS).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(Pairing::capture(&p[0].weight, "model.h.0.w"), Some("h.0.w"));
        assert_eq!(Pairing::capture(&p[1].weight, "optim.h.master"), Some("h"));
        assert_eq!(Pairing::capture(&p[0].weight, "model."), None);
        assert!(Pairing::parse_list("a:b").is_err());
        assert!(Pairing::parse_list("a{}:b{}:c").is_err());
        assert!(glob("*wte*", "model.wte.weight"));
        assert!(glob("*embed*", "embed"));
        assert!(!glob("*wte*", "model.wpe.weight"));
        assert!(glob("a*b*c", "axxbyyc") && !glob("a*b*c", "axxbyy"));
        for (k, v) in known_keys() {
            assert!(validate(k, &v).unwrap().is_ok(), "{k}={v}");
        }
        assert!(validate(EPSILON_KEY, "0").unwrap().is_err());
        assert!(validate(BETAS_KEY, "0.9").unwrap().is_err());
        assert!(validate(EXP_AVG_KEY, "bins=300").unwrap().is_err());
        assert!(validate(EXP_AVG_KEY, "off").unwrap().is_ok());
        assert!(validate("delta.mode", "x").is_none());
    }
}
