//! The DynaQuant-style quantizer: a tensor's 16-bit-key histogram ([`KeyStats`]) is partitioned
//! into protected keys (kept exactly), pruned keys (set to zero) and quantized keys, whose values
//! are clustered by weighted k-means into a few centroids. Everything after the histogram works
//! on at most 65,536 keys, so a configuration is fitted and scored without touching the tensor:
//! that is what makes a wide configuration search affordable at every commit.
//!
//! Decisions are per key: every element with the same key gets the same treatment. For bf16 and
//! f16 a key is a value; for f32 it is the value truncated to its top 16 bits (relative width
//! 2^-8), so partition fractions are met to within one key and an f32 element is assigned by
//! its truncated value.

use std::fmt;
use std::str::FromStr;

use mdl_format::Dtype;

use crate::engine::{sum, CodePairs, KeyStats, Lut};
use crate::scalar::{self, KEYS};

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

/// Adam's bias corrections at the checkpoint's step: `m̂ = m·c1`, `v̂ = v·c2`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Correction {
    /// `1 / (1 − β1^t)`
    pub c1: f64,
    /// `1 / (1 − β2^t)`
    pub c2: f64,
}

impl Correction {
    /// The corrections for betas `b1`, `b2` at step `t` (t = 0 is taken as 1).
    pub fn adam(b1: f64, b2: f64, t: u64) -> Correction {
        let t = t.max(1).min(i32::MAX as u64) as i32;
        Correction {
            c1: 1.0 / (1.0 - b1.powi(t)),
            c2: 1.0 / (1.0 - b2.powi(t)),
        }
    }
}

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
    /// `|Σ m̂·δ| + ½ Σ v̂·δ²` when moments are known.
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
            (true, Some(c)) => Some((c.c1 * m_delta).abs() + 0.5 * c.c2 * v_delta2),
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

/// A deterministic generator for k-means++ seeding (splitmix64).
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Weighted k-means in one dimension over `points` (ascending) with `weights`: k-means++ seeding
/// from a fixed seed, then Lloyd iterations; returns at most `k` centroids, ascending.
pub fn kmeans(points: &[f64], weights: &[f64], k: usize) -> Vec<f64> {
    if points.is_empty() || k == 0 {
        return Vec::new();
    }
    if points.len() <= k {
        return points.to_vec();
    }
    let mut rng = Rng(0x6d64_6c00_5155_414e);
    let pick = |scores: &[f64], rng: &mut Rng| {
        let total: f64 = scores.iter().sum();
        if total <= 0.0 {
            return None;
        }
        let mut r = rng.next_f64() * total;
        for (i, &s) in scores.iter().enumerate() {
            if r < s {
                return Some(i);
            }
            r -= s;
        }
        scores.iter().rposition(|&s| s > 0.0)
    };
    let mut centroids = vec![points[pick(weights, &mut rng).unwrap_or(0)]];
    let mut d2: Vec<f64> = points.iter().map(|&p| (p - centroids[0]).powi(2)).collect();
    while centroids.len() < k {
        let scores: Vec<f64> = d2.iter().zip(weights).map(|(d, w)| d * w).collect();
        let Some(i) = pick(&scores, &mut rng) else {
            break;
        };
        let c = points[i];
        centroids.push(c);
        for (d, &p) in d2.iter_mut().zip(points) {
            *d = d.min((p - c).powi(2));
        }
    }
    centroids.sort_by(f64::total_cmp);
    centroids.dedup();

    // Lloyd over sorted points with prefix sums: each cluster is a contiguous run between the
    // midpoints of neighbouring centroids.
    let mut pw = vec![0.0; points.len() + 1];
    let mut px = vec![0.0; points.len() + 1];
    for i in 0..points.len() {
        pw[i + 1] = pw[i] + weights[i];
        px[i + 1] = px[i] + weights[i] * points[i];
    }
    for _ in 0..100 {
        let mut next = centroids.clone();
        let mut lo = 0;
        for j in 0..centroids.len() {
            let hi = if j + 1 < centroids.len() {
                let mid = 0.5 * (centroids[j] + centroids[j + 1]);
                points.partition_point(|&p| p <= mid)
            } else {
                points.len()
            };
            let w = pw[hi] - pw[lo];
            if hi > lo && w > 0.0 {
                next[j] = (px[hi] - px[lo]) / w;
            }
            lo = hi;
        }
        next.sort_by(f64::total_cmp);
        if next == centroids {
            break;
        }
        centroids = next;
    }
    centroids.dedup();
    centroids
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{CpuEngine, Engine, FloatView, Moments};
    use crate::qrecord::QuantTensor;

    fn bf16s(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| scalar::f32_to_bf16(x).to_le_bytes())
            .collect()
    }

    fn normal(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut r = Rng(seed);
        (0..n)
            .map(|_| {
                let (a, b) = (r.next_f64().max(1e-12), r.next_f64());
                ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32 * scale
            })
            .collect()
    }

    #[test]
    fn config_text_round_trips() {
        for c in candidates(None, false, true, Domain::Linear) {
            assert_eq!(c.to_string().parse::<QuantConfig>().unwrap(), c);
        }
        assert!("bins=0 prune=0 protect=0 metric=magnitude domain=linear"
            .parse::<QuantConfig>()
            .is_err());
        assert!("bins=4".parse::<QuantConfig>().is_err());
    }

    #[test]
    fn kmeans_is_deterministic_sorted_and_bounded() {
        let pts: Vec<f64> = (0..1000).map(|i| (i as f64 / 100.0).powi(2)).collect();
        let w = vec![1.0; pts.len()];
        let a = kmeans(&pts, &w, 8);
        assert_eq!(a, kmeans(&pts, &w, 8));
        assert!(a.len() <= 8 && a.windows(2).all(|p| p[0] < p[1]));
        assert_eq!(kmeans(&pts[..3], &w[..3], 8), pts[..3].to_vec());
    }

    #[test]
    fn fit_partitions_and_estimates() {
        let w = normal(50_000, 1, 0.02);
        let m = normal(50_000, 2, 1e-3);
        let v: Vec<f32> = normal(50_000, 3, 1e-3).iter().map(|x| x * x).collect();
        let (wb, mb, vb) = (bf16s(&w), bf16s(&m), bf16s(&v));
        fn view(bytes: &[u8]) -> FloatView<'_> {
            FloatView {
                dtype: Dtype::BF16,
                bytes,
            }
        }
        let stats = CpuEngine.key_stats(
            view(&wb),
            Some(Moments {
                m: view(&mb),
                v: view(&vb),
            }),
        );
        let prep = Prepared::new(&stats, Dtype::BF16);
        let c = Correction::adam(0.9, 0.95, 100);
        let corr = Some(c);
        let mut prev_err = f64::INFINITY;
        for bins in BINS {
            let cfg = QuantConfig {
                bins,
                prune: 0.2,
                protect: 0.005,
                metric: Metric::Sensitivity,
                domain: Domain::Linear,
            };
            let fit = prep.fit(&cfg, corr);
            let e = fit.estimate;
            assert!(fit.values.len() <= bins as usize + 1);
            assert!(e.pruned as f64 <= 0.2 * 50_000.0 && e.pruned as f64 > 0.15 * 50_000.0);
            assert!(e.protected as f64 >= 0.005 * 50_000.0);
            assert!(
                e.sq_err < prev_err * 1.05,
                "{bins}: {} vs {prev_err}",
                e.sq_err
            );
            prev_err = e.sq_err;
            // The estimate's errors are the errors of the reconstruction the lookup gives.
            let a = CpuEngine.assign(view(&wb), &prep.lut(&fit));
            let q = QuantTensor::new(Dtype::BF16, prep.table_bytes(&fit.values), a, &wb);
            let mut recon = vec![0u8; wb.len()];
            q.render(&mut recon);
            let measured = CpuEngine.error_stats(
                view(&wb),
                view(&recon),
                Some(Moments {
                    m: view(&mb),
                    v: view(&vb),
                }),
            );
            assert!((measured.sum_sq_err - e.sq_err).abs() <= 1e-6 * e.sq_err.max(1e-30));
            assert_eq!(measured.max_abs, e.max_abs);
            let dl = (c.c1 * measured.sum_m_delta).abs() + 0.5 * c.c2 * measured.sum_v_delta2;
            let est = e.delta_loss.unwrap();
            assert!((dl - est).abs() <= 1e-6 * est.max(1e-30), "{dl} vs {est}");
        }
    }

    /// A fit to a given table uses exactly that table; elements that did not move keep their
    /// codes, and the delta estimate counts what the code pairs say.
    #[test]
    fn a_reused_table_keeps_codes_and_prices_the_delta() {
        let w = normal(40_000, 7, 0.02);
        // The next version: 2 % of the elements move.
        let mut w2 = w.clone();
        let mut rng = Rng(9);
        for _ in 0..800 {
            let i = (rng.next_f64() * w.len() as f64) as usize;
            w2[i] += 0.01;
        }
        let (wb, wb2) = (bf16s(&w), bf16s(&w2));
        let view = |bytes| FloatView {
            dtype: Dtype::BF16,
            bytes,
        };
        let cfg = QuantConfig {
            bins: 12,
            prune: 0.1,
            protect: 0.0005,
            metric: Metric::Magnitude,
            domain: Domain::Linear,
        };
        let s1 = CpuEngine.key_stats(view(&wb), None);
        let prep1 = Prepared::new(&s1, Dtype::BF16);
        let first = prep1.fit(&cfg, None);
        let a1 = CpuEngine.assign(view(&wb), &prep1.lut(&first));
        let s2 = CpuEngine.key_stats(view(&wb2), None);
        let prep2 = Prepared::new(&s2, Dtype::BF16);
        let reused = prep2.fit_table(&cfg, Some(&first.values), None);
        assert_eq!(reused.values, first.values);
        let lut = prep2.lut(&reused);
        let a2 = CpuEngine.assign(view(&wb2), &lut);
        let same_input = (0..w.len()).filter(|&i| wb[2 * i..2 * i + 2] == wb2[2 * i..2 * i + 2]);
        let (mut kept, mut total) = (0, 0);
        for i in same_input {
            total += 1;
            kept += (a1.codes[i] == a2.codes[i]) as usize;
        }
        // Only keys at the moved partition boundaries may change code.
        assert!(kept as f64 > 0.99 * total as f64, "{kept} of {total}");
        let bins = reused.values.len();
        let pairs = CpuEngine.code_pairs(view(&wb2), &lut, bins, &a1.codes, first.values.len());
        let mut naive = vec![0u64; first.values.len() * bins];
        for i in 0..w.len() {
            naive[a1.codes[i] as usize * bins + a2.codes[i] as usize] += 1;
        }
        assert_eq!(pairs.count, naive);
        let delta = reused.estimate.as_delta(&pairs);
        assert!(delta.bits < 0.5 * reused.estimate.bits, "{delta:?}");
        assert_eq!(delta.sq_err, reused.estimate.sq_err);
        // Codes that never change cost nothing.
        let still = CpuEngine.code_pairs(
            view(&wb),
            &prep1.lut(&first),
            first.values.len(),
            &a1.codes,
            first.values.len(),
        );
        assert_eq!(still.conditional_bits(), 0.0);
    }

    /// The quantizer's invariants on random tensors of every dtype, both domains, with and
    /// without moments: protected elements exact, pruned ones +0, every other element on the
    /// table value nearest its key, tables sorted and no larger than bins + 1.
    #[test]
    fn quantizer_invariants() {
        let mut rng = Rng(42);
        for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
            for (case, domain) in [Domain::Linear, Domain::Log, Domain::Linear]
                .into_iter()
                .enumerate()
            {
                let n = 20_000 + case * 7_777;
                let mut w: Vec<f32> = normal(n, rng.0 ^ case as u64, 0.05);
                if domain == Domain::Log {
                    w.iter_mut().for_each(|x| *x = *x * *x * 1e-3);
                    w[7] = 0.0;
                }
                w[3] = f32::INFINITY;
                w[5] = -0.0;
                let enc = |v: &[f32]| -> Vec<u8> {
                    let mut out = Vec::new();
                    for &x in v {
                        scalar::push_rounded(dtype, x as f64, &mut out);
                    }
                    out
                };
                let wb = enc(&w);
                let mb = enc(&normal(n, 7, 1e-3));
                let vb = enc(&normal(n, 8, 1e-3).iter().map(|x| x * x).collect::<Vec<_>>());
                let view = |b| FloatView { dtype, bytes: b };
                let moments = (case == 1).then(|| Moments {
                    m: view(&mb),
                    v: view(&vb),
                });
                let stats = CpuEngine.key_stats(view(&wb), moments);
                let prep = Prepared::new(&stats, dtype);
                for _ in 0..6 {
                    let cfg = QuantConfig {
                        bins: BINS[(rng.next_f64() * 6.0) as usize],
                        prune: PRUNE[(rng.next_f64() * 6.0) as usize],
                        protect: PROTECT[(rng.next_f64() * 3.0) as usize],
                        metric: if rng.next_f64() < 0.5 {
                            Metric::Magnitude
                        } else {
                            Metric::Sensitivity
                        },
                        domain,
                    };
                    let fit = prep.fit(&cfg, None);
                    assert!(fit.values.len() <= cfg.bins as usize + 1);
                    assert!(fit.values.windows(2).all(|p| p[0] < p[1]), "{cfg}");
                    let a = CpuEngine.assign(view(&wb), &prep.lut(&fit));
                    let q = QuantTensor::new(dtype, prep.table_bytes(&fit.values), a, &wb);
                    let mut out = vec![0u8; wb.len()];
                    q.render(&mut out);
                    let size = dtype.size();
                    let protected: std::collections::HashSet<u64> =
                        q.protected.iter().copied().collect();
                    let log = domain == Domain::Log;
                    for i in 0..n {
                        let (orig, got) = (&wb[i * size..][..size], &out[i * size..][..size]);
                        let k = scalar::key(dtype, &wb, i) as usize;
                        if protected.contains(&(i as u64)) {
                            assert_eq!(orig, got, "protected element {i} changed");
                            continue;
                        }
                        let y = scalar::value(dtype, &out, i);
                        if prep.is_pruned(&fit, k as u16) {
                            assert_eq!(y.to_bits(), 0.0f64.to_bits(), "pruned {i} is {y}");
                            continue;
                        }
                        let x = scalar::key_value(dtype, k as u16);
                        let dist = |t: f64| {
                            if log {
                                if t <= 0.0 || x <= 0.0 {
                                    if t == x {
                                        0.0
                                    } else {
                                        f64::INFINITY
                                    }
                                } else {
                                    (t.ln() - x.ln()).abs()
                                }
                            } else {
                                (t - x).abs()
                            }
                        };
                        let best = fit
                            .values
                            .iter()
                            .map(|&t| dist(t))
                            .fold(f64::INFINITY, f64::min);
                        assert!(
                            dist(y) <= best * (1.0 + 1e-12),
                            "{dtype:?} {cfg}: {x} → {y}, nearest is {best} away"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn allocation_meets_the_budget() {
        let cands = vec![
            vec![(100.0, 0.0), (50.0, 1.0), (20.0, 5.0)],
            vec![(100.0, 0.0), (30.0, 2.0), (10.0, 4.0)],
        ];
        let pick = allocate(&cands, 3.0);
        let cost: f64 = pick.iter().zip(&cands).map(|(&i, c)| c[i].1).sum();
        assert!(cost <= 3.0);
        assert_eq!(pick, vec![1, 1]);
        assert_eq!(allocate(&cands, 100.0), vec![2, 2]);
        assert_eq!(allocate(&cands, 0.0), vec![0, 0]);
    }
}
