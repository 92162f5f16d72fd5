//! Quantizer configurations (bins, pruning, protection, metric, domain), their text form, and
//! Adam's bias correction.

use std::fmt;
use std::str::FromStr;

/// Bin counts the search tries.
pub const BINS: [u8; 6] = [4, 6, 8, 12, 16, 32];
/// Bin counts the search tries for embeddings.
pub const EMBEDDING_BINS: [u8; 2] = [16, 32];
/// Prune fractions the search tries.
pub const PRUNE: [f64; 6] = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5];
/// Protect fractions the search tries.
pub const PROTECT: [f64; 3] = [0.0005, 0.005, 0.01];
/// Weight of a bin's frequency against its magnitude in k-means (DynaQuant's σ).
pub const SIGMA: f64 = 0.2;
/// Most centroids a configuration may ask for.
pub const MAX_BINS: u8 = 64;

/// What ranks keys for pruning (and, with moments, for protection too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Metric {
    /// |w|
    Magnitude,
    /// Mean |m·w| of the key's elements (needs the first moment).
    Sensitivity,
}

/// Where centroids are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Domain {
    /// On the values.
    Linear,
    /// On the logarithms of positive values (zeros stay exact, negative values are protected):
    /// for tensors such as Adam's `exp_avg_sq` that are positive and span decades.
    Log,
}

/// One quantizer configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantConfig {
    /// Centroids (the code table also holds 0 when anything is pruned).
    pub bins: u8,
    /// Fraction of elements set to zero.
    pub prune: f64,
    /// Fraction of elements kept exactly, by magnitude (and again by sensitivity with moments).
    pub protect: f64,
    /// Pruning rank.
    pub metric: Metric,
    /// Centroid domain.
    pub domain: Domain,
}

impl fmt::Display for QuantConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bins={} prune={} protect={} metric={} domain={}",
            self.bins,
            self.prune,
            self.protect,
            match self.metric {
                Metric::Magnitude => "magnitude",
                Metric::Sensitivity => "sensitivity",
            },
            match self.domain {
                Domain::Linear => "linear",
                Domain::Log => "log",
            }
        )
    }
}

impl FromStr for QuantConfig {
    type Err = String;
    /// Parses [`Display`](fmt::Display) output (extra `key=value` words are ignored).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut c = QuantConfig {
            bins: 0,
            prune: 0.0,
            protect: 0.0,
            metric: Metric::Magnitude,
            domain: Domain::Linear,
        };
        let mut seen = 0;
        for word in s.split_whitespace() {
            let Some((k, v)) = word.split_once('=') else {
                continue;
            };
            let bad = || format!("bad {k} in quantizer settings: {v}");
            match k {
                "bins" => c.bins = v.parse().map_err(|_| bad())?,
                "prune" => c.prune = v.parse().map_err(|_| bad())?,
                "protect" => c.protect = v.parse().map_err(|_| bad())?,
                "metric" => {
                    c.metric = match v {
                        "magnitude" => Metric::Magnitude,
                        "sensitivity" => Metric::Sensitivity,
                        _ => return Err(bad()),
                    }
                }
                "domain" => {
                    c.domain = match v {
                        "linear" => Domain::Linear,
                        "log" => Domain::Log,
                        _ => return Err(bad()),
                    }
                }
                _ => continue,
            }
            seen += 1;
        }
        if seen < 5 {
            return Err(format!("incomplete quantizer settings: {s}"));
        }
        c.validate()?;
        Ok(c)
    }
}

impl QuantConfig {
    /// Checks ranges: 1 ≤ bins ≤ [`MAX_BINS`], fractions in `[0, 1)` and together below 1.
    pub fn validate(&self) -> Result<(), String> {
        let frac = |x: f64| (0.0..1.0).contains(&x);
        if self.bins == 0 || self.bins > MAX_BINS {
            return Err(format!("bins must be 1..={MAX_BINS}, not {}", self.bins));
        }
        if !frac(self.prune) || !frac(self.protect) || self.prune + 2.0 * self.protect >= 1.0 {
            return Err(format!(
                "prune ({}) and protect ({}) must be fractions leaving something to quantize",
                self.prune, self.protect
            ));
        }
        Ok(())
    }
}

/// Default [`Correction::curvature`]: the ratio assumed between the loss's curvature and Adam's
/// second moment (`docs/CODECS.md`, "The bound").
pub const DEFAULT_CURVATURE: f64 = 16384.0;
/// Share of a tensor's mean `v̂` every element's curvature is at least (elements the data
/// rarely touches still cost).
pub const CURVATURE_FLOOR: f64 = 0.1;
/// Standard deviations of the first-order term of an error uncorrelated with the gradient.
pub const FIRST_ORDER_SPREAD: f64 = 2.0;

/// How error sums become an estimated loss change: Adam's bias corrections at the
/// checkpoint's step (`m̂ = m·c1`, `v̂ = v·c2`) and the curvature scale.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Correction {
    /// `1 / (1 − β1^t)`
    pub c1: f64,
    /// `1 / (1 − β2^t)`
    pub c2: f64,
    /// The loss's curvature per unit of `v̂`. Adam's `v` is the mean square of *minibatch*
    /// gradients, which for a likelihood loss is about the per-example Fisher (≈ the Hessian)
    /// divided by the examples (tokens) per step: so this is about that count, or more.
    pub curvature: f64,
}

impl Correction {
    /// The corrections for betas `b1`, `b2` at step `t` (t = 0 is taken as 1), with the
    /// default curvature.
    pub fn adam(b1: f64, b2: f64, t: u64) -> Correction {
        let t = t.max(1).min(i32::MAX as u64) as i32;
        Correction {
            c1: 1.0 / (1.0 - b1.powi(t)),
            c2: 1.0 / (1.0 - b2.powi(t)),
            curvature: DEFAULT_CURVATURE,
        }
    }

    /// No bias correction (the step is unknown), default curvature.
    pub fn none() -> Correction {
        Correction {
            c1: 1.0,
            c2: 1.0,
            curvature: DEFAULT_CURVATURE,
        }
    }

    /// The estimated loss change of an error `δ` from its sums over a tensor:
    ///
    /// `|Σ m̂·δ| + z·√(Σ v̂·δ²) + ½·κ·(Σ v̂·δ² + φ·mean(v̂)·Σ δ²)`
    ///
    /// — the first-order term along the training gradient (an error that undoes progress),
    /// the first-order term's spread for an error the gradient does not see (z =
    /// [`FIRST_ORDER_SPREAD`] standard deviations of a gradient whose mean square is `v̂`), and
    /// the second-order term with curvature `κ·v̂` (κ = [`Self::curvature`]), floored at
    /// `φ` = [`CURVATURE_FLOOR`] of the tensor's mean so that elements without gradient are
    /// not free. `mean_v` is the tensor's mean (uncorrected) `v`.
    pub fn loss_change(
        &self,
        sum_m_delta: f64,
        sum_v_delta2: f64,
        sum_sq_err: f64,
        mean_v: f64,
    ) -> f64 {
        let v_delta2 = self.c2 * sum_v_delta2.max(0.0);
        let floor = CURVATURE_FLOOR * self.c2 * mean_v.max(0.0) * sum_sq_err.max(0.0);
        (self.c1 * sum_m_delta).abs()
            + FIRST_ORDER_SPREAD * v_delta2.sqrt()
            + 0.5 * self.curvature * (v_delta2 + floor)
    }
}
