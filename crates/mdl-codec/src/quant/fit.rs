//! Fitting a configuration to a tensor's key histogram, and what the fit is estimated to cost.

use mdl_format::Dtype;

use super::{kmeans, Correction, Domain, Metric, QuantConfig, SIGMA};
use crate::engine::{sum, CodePairs, KeyStats, Lut};
use crate::scalar::{self, KEYS};

/// What a configuration is expected to cost, from the key sums alone.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// Estimated encoded size in bits (order-0 entropy of the codes, table, protected list).
    pub bits: f64,
    /// The codes' share of `bits`.
    pub code_bits: f64,
    /// Σ δ² over the tensor.
    pub sq_err: f64,
    /// Relative L2 error.
    pub rel_l2: f64,
    /// Largest |δ| over quantized and pruned keys (exact for 16-bit floats; for f32 within a
    /// key's width).
    pub max_abs: f64,
    /// The estimated loss change ([`Correction::loss_change`]) when moments are known.
    pub delta_loss: Option<f64>,
    /// Elements kept exactly.
    pub protected: u64,
    /// Elements set to zero.
    pub pruned: u64,
}

/// A configuration fitted to a tensor's statistics: its code table and key lookup.
#[derive(Clone, Debug)]
pub struct Fit {
    /// The configuration.
    pub config: QuantConfig,
    /// Code table values, ascending.
    pub values: Vec<f64>,
    /// Per present key of the statistics it was fitted to (in their order): its code, whether it
    /// is protected and whether it is pruned (its elements become zero). [`Prepared::lut`] turns
    /// them into the engine's lookup.
    code: Vec<u8>,
    protect: Vec<bool>,
    pruned: Vec<bool>,
    /// Expected cost.
    pub estimate: Estimate,
}

/// A tensor's keys prepared for fitting many configurations: present keys, their values and
/// their orders by magnitude and sensitivity.
pub struct Prepared<'a> {
    stats: &'a KeyStats,
    dtype: Dtype,
    /// Positions (in `stats.keys`) of the keys with finite values, by ascending value.
    by_value: Vec<u32>,
    /// Such positions by descending magnitude.
    by_magnitude: Vec<u32>,
    /// Such positions by descending mean sensitivity (empty without moments).
    by_sensitivity: Vec<u32>,
    /// Representative value per present key (mean of its elements for f32).
    value: Vec<f64>,
}

// Positions index several parallel per-key tables at once (counts, sums, values, classes).
#[allow(clippy::needless_range_loop)]
impl<'a> Prepared<'a> {
    /// Prepares `stats` of a `dtype` tensor.
    pub fn new(stats: &'a KeyStats, dtype: Dtype) -> Prepared<'a> {
        let value: Vec<f64> = (0..stats.keys.len())
            .map(|p| {
                let kv = scalar::key_value(dtype, stats.keys[p]);
                if dtype == Dtype::F32 && kv.is_finite() {
                    stats.sums[p][sum::W] / stats.count[p] as f64
                } else {
                    kv
                }
            })
            .collect();
        let mut by_value: Vec<u32> = (0..value.len() as u32)
            .filter(|&p| value[p as usize].is_finite())
            .collect();
        by_value.sort_by(|&a, &b| value[a as usize].total_cmp(&value[b as usize]));
        let mut by_magnitude = by_value.clone();
        by_magnitude.sort_by(|&a, &b| {
            value[b as usize]
                .abs()
                .total_cmp(&value[a as usize].abs())
                .then(a.cmp(&b))
        });
        let mut by_sensitivity = Vec::new();
        if stats.moments {
            let mean = |p: u32| stats.sums[p as usize][sum::SENS] / stats.count[p as usize] as f64;
            by_sensitivity = by_value.clone();
            by_sensitivity.sort_by(|&a, &b| mean(b).total_cmp(&mean(a)).then(a.cmp(&b)));
        }
        Prepared {
            stats,
            dtype,
            by_value,
            by_magnitude,
            by_sensitivity,
            value,
        }
    }

    /// The key → code lookup the engine assigns by, for a fit of these statistics.
    pub fn lut(&self, fit: &Fit) -> Lut {
        let mut lut = Lut {
            code: vec![0u8; KEYS],
            protect: vec![false; KEYS],
        };
        for (p, &k) in self.stats.keys.iter().enumerate() {
            lut.code[k as usize] = fit.code[p];
            lut.protect[k as usize] = fit.protect[p];
        }
        lut
    }

    /// Whether `fit` (of these statistics) prunes `key`'s elements to zero.
    pub fn is_pruned(&self, fit: &Fit, key: u16) -> bool {
        self.stats
            .keys
            .binary_search(&key)
            .is_ok_and(|p| fit.pruned[p])
    }

    /// Whether the statistics carry moments.
    pub fn has_moments(&self) -> bool {
        self.stats.moments
    }

    /// Fits `cfg`; the estimate's `delta_loss` uses `corr` when the statistics have moments.
    pub fn fit(&self, cfg: &QuantConfig, corr: Option<Correction>) -> Fit {
        self.fit_table(cfg, None, corr)
    }

    /// Fits `cfg` with the code table fixed to `table` (values of the tensor's dtype, ascending,
    /// at most `cfg.bins` of them besides zero — a previous version's table, so that unchanged
    /// elements keep their codes) instead of one found by k-means. The partition into protected,
    /// pruned and quantized keys is `cfg`'s as usual; zero joins the table when something is
    /// pruned.
    pub fn fit_table(
        &self,
        cfg: &QuantConfig,
        table: Option<&[f64]>,
        corr: Option<Correction>,
    ) -> Fit {
        let stats = self.stats;
        let n = stats.n as f64;
        #[derive(Clone, Copy, PartialEq)]
        enum Class {
            Quant,
            Protect,
            Prune,
            Zero,
        }
        let keys = &stats.keys;
        let mut class = vec![Class::Quant; keys.len()];
        let log = cfg.domain == Domain::Log;
        let mut always_protected = 0u64;
        // Non-finite elements are always kept exactly; so are negative ones in the log domain,
        // where zeros are exact too.
        for k in 0..keys.len() {
            let v = self.value[k];
            if !v.is_finite() || (log && v < 0.0) {
                class[k] = Class::Protect;
                always_protected += stats.count[k];
            } else if log && v == 0.0 {
                class[k] = Class::Zero;
            }
        }
        let mut protected = always_protected;
        let limit = cfg.protect * n;
        let take = |order: &[u32], class: &mut [Class]| {
            let mut taken = 0u64;
            for &k in order {
                if taken as f64 >= limit {
                    break;
                }
                let k = k as usize;
                if class[k] == Class::Quant {
                    class[k] = Class::Protect;
                    taken += stats.count[k];
                }
            }
            taken
        };
        protected += take(&self.by_magnitude, &mut class);
        if stats.moments {
            protected += take(&self.by_sensitivity, &mut class);
        }
        let mut pruned = 0u64;
        let prune_limit = cfg.prune * n;
        if prune_limit > 0.0 {
            let order: Box<dyn Iterator<Item = &u32>> = match cfg.metric {
                Metric::Sensitivity if stats.moments => Box::new(self.by_sensitivity.iter().rev()),
                _ => Box::new(self.by_magnitude.iter().rev()),
            };
            for &k in order {
                let k = k as usize;
                if class[k] != Class::Quant {
                    continue;
                }
                if (pruned + stats.count[k]) as f64 > prune_limit {
                    break;
                }
                class[k] = Class::Prune;
                pruned += stats.count[k];
            }
        }

        let mut values = match table {
            Some(t) => t.to_vec(),
            None => {
                let quant: Vec<bool> = class.iter().map(|c| *c == Class::Quant).collect();
                self.centroids(cfg, &quant)
            }
        };
        if pruned > 0 || class.contains(&Class::Zero) || values.is_empty() {
            values.push(0.0);
        }
        values.sort_by(f64::total_cmp);
        values.dedup_by(|a, b| a == b);

        // Key → code.
        let zero = values.iter().position(|&v| v == 0.0);
        let protect: Vec<bool> = class.iter().map(|c| *c == Class::Protect).collect();
        let code: Vec<u8> = (0..keys.len())
            .map(|k| match class[k] {
                Class::Prune | Class::Zero => zero.unwrap_or(0) as u8,
                _ if !self.value[k].is_finite() => 0,
                // By the key's own value (for f32, the truncated one), so an element's code
                // depends on its key alone.
                _ => nearest(&values, scalar::key_value(self.dtype, keys[k]), log) as u8,
            })
            .collect();

        // Expected errors and size from the key sums.
        let mut hist = vec![0u64; values.len()];
        let (mut sq_err, mut m_delta, mut v_delta2, mut max_abs) = (0.0, 0.0, 0.0, 0.0f64);
        for k in 0..keys.len() {
            let c = stats.count[k];
            hist[code[k] as usize] += c;
            if protect[k] {
                continue;
            }
            let s = &stats.sums[k];
            let q = values[code[k] as usize];
            sq_err += (c as f64 * q * q - 2.0 * q * s[sum::W] + s[sum::W2]).max(0.0);
            m_delta += q * s[sum::M] - s[sum::MW];
            v_delta2 += (q * q * s[sum::V] - 2.0 * q * s[sum::VW] + s[sum::VW2]).max(0.0);
            max_abs = max_abs.max((q - self.value[k]).abs());
        }
        let total_sq: f64 = stats.sums.iter().map(|s| s[sum::W2]).sum();
        let entropy: f64 = hist
            .iter()
            .filter(|&&h| h > 0)
            .map(|&h| {
                let p = h as f64 / n;
                -(h as f64) * p.log2()
            })
            .sum();
        let esize = self.dtype.size() as f64;
        let bits =
            entropy + values.len() as f64 * esize * 8.0 + protected as f64 * (esize + 2.0) * 8.0;
        let delta_loss = match (stats.moments, corr) {
            (true, Some(c)) => Some(c.loss_change(m_delta, v_delta2, sq_err, self.mean_v())),
            _ => None,
        };
        Fit {
            config: *cfg,
            values,
            code,
            protect,
            pruned: class.iter().map(|c| *c == Class::Prune).collect(),
            estimate: Estimate {
                bits,
                code_bits: entropy,
                sq_err,
                rel_l2: if total_sq > 0.0 {
                    (sq_err / total_sq).sqrt()
                } else {
                    sq_err.sqrt()
                },
                max_abs,
                delta_loss,
                protected,
                pruned,
            },
        }
    }

    /// The tensor's mean second moment (0 without moments).
    pub fn mean_v(&self) -> f64 {
        self.stats.mean_v()
    }

    /// Centroids by weighted k-means over the keys marked in `quant`, in the domain's
    /// coordinates, rounded to the dtype.
    fn centroids(&self, cfg: &QuantConfig, quant: &[bool]) -> Vec<f64> {
        let stats = self.stats;
        let log = cfg.domain == Domain::Log;
        let to_domain = |x: f64| if log { x.ln() } else { x };
        let quant: Vec<u32> = self
            .by_value
            .iter()
            .copied()
            .filter(|&p| quant[p as usize])
            .collect();
        let points: Vec<f64> = quant
            .iter()
            .map(|&k| to_domain(self.value[k as usize]))
            .collect();
        let (csum, xsum) = quant.iter().fold((0.0, 0.0), |(c, x), &k| {
            (
                c + stats.count[k as usize] as f64,
                x + self.value[k as usize].abs() * stats.count[k as usize] as f64,
            )
        });
        let weights: Vec<f64> = quant
            .iter()
            .map(|&k| {
                let c = stats.count[k as usize] as f64 / csum;
                if log || xsum == 0.0 {
                    c
                } else {
                    SIGMA * c + (1.0 - SIGMA) * self.value[k as usize].abs() / xsum
                }
            })
            .collect();
        kmeans(&points, &weights, cfg.bins as usize)
            .iter()
            .map(|&c| scalar::rounded(self.dtype, if log { c.exp() } else { c }))
            .filter(|v| v.is_finite())
            .collect()
    }

    /// The code table as little-endian values of the tensor's dtype.
    pub fn table_bytes(&self, values: &[f64]) -> Vec<u8> {
        let mut out = Vec::with_capacity(values.len() * self.dtype.size());
        for &v in values {
            scalar::push_rounded(self.dtype, v, &mut out);
        }
        out
    }
}

impl Estimate {
    /// The estimate when the codes are stored as a quant-delta whose base codes and these codes
    /// were counted in `pairs` (from [`Engine::code_pairs`](crate::engine::Engine::code_pairs)):
    /// the codes cost their conditional entropy given the base's code, which is what the
    /// grouped delta's per-group symbols cost before run-length coding.
    pub fn as_delta(&self, pairs: &CodePairs) -> Estimate {
        let code_bits = pairs.conditional_bits();
        Estimate {
            bits: self.bits - self.code_bits + code_bits,
            code_bits,
            ..*self
        }
    }
}

/// Index of the table value nearest to `x` (in the log domain: nearest logarithm among the
/// positive values; the zero entry only for `x == 0`).
fn nearest(values: &[f64], x: f64, log: bool) -> usize {
    let i = values.partition_point(|&v| v < x);
    let dist = |j: usize| {
        let v = values[j];
        if log {
            if v <= 0.0 {
                if x == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                (v.ln() - x.ln()).abs()
            }
        } else {
            (v - x).abs()
        }
    };
    let mut best = i.min(values.len() - 1);
    for j in [i.saturating_sub(1), i, i + 1] {
        if j < values.len() && dist(j) < dist(best) {
            best = j;
        }
    }
    best
}
