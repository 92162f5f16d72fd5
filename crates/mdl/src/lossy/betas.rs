//! Adam's betas for a lossy commit's quality estimate: which values, and where they came from.
//!
//! The estimate corrects Adam's moments for their bias at the checkpoint's step (`m̂ = m / (1 −
//! β1^t)`, `v̂ = v / (1 − β2^t)`), and early in training that correction is large: at step 20,
//! β2 = 0.999 makes `v̂` 32 times what β2 = 0.95 makes it. So the values are taken, in order,
//! from the configuration (`quant.adam_betas B1,B2`), from the checkpoint itself (an optimizer's
//! `param_groups`, a Trainer's arguments, a live state's `mdl-state.json`, safetensors metadata;
//! see `Input::recorded_betas`), from the second moments' own decay between the parent's
//! version and this one (β2 only, [`infer_beta2`]), and last from PyTorch's defaults.

use mdl_codec::scalar;
use mdl_format::{Dtype, Exactness, Lossy};

/// PyTorch's (and optax's) defaults: what is assumed when nothing says otherwise.
pub const DEFAULT: (f64, f64) = (0.9, 0.999);

/// Where a commit's betas came from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// `quant.adam_betas` set to values.
    Config,
    /// Recorded by the checkpoint, in the file at this tree path.
    Checkpoint(String),
    /// β2 read off the second moments' decay since the parent's step (β1 the default).
    Inferred {
        /// The parent's step.
        since: u64,
    },
    /// Nothing said otherwise.
    Default,
}

/// The betas a commit's estimate used.
#[derive(Clone, Debug, PartialEq)]
pub struct Betas {
    /// `(β1, β2)`.
    pub values: (f64, f64),
    /// Where they came from.
    pub source: Source,
}

impl Default for Betas {
    /// PyTorch's, when nothing says otherwise.
    fn default() -> Betas {
        Betas {
            values: DEFAULT,
            source: Source::Default,
        }
    }
}

impl Betas {
    /// The words a priced tensor's lossy settings record: `betas=B1,B2 betas_from=SOURCE`
    /// (`config`, `checkpoint:PATH` with `%` and spaces escaped, `inferred:STEP`, `default`).
    pub fn words(&self) -> String {
        let from = match &self.source {
            Source::Config => "config".to_string(),
            Source::Checkpoint(path) => {
                format!(
                    "checkpoint:{}",
                    path.replace('%', "%25").replace(' ', "%20")
                )
            }
            Source::Inferred { since } => format!("inferred:{since}"),
            Source::Default => "default".to_string(),
        };
        format!(
            "betas={},{} betas_from={from}",
            self.values.0, self.values.1
        )
    }

    /// What a lossy tensor's settings words record (`None` where it recorded none: it was not
    /// priced with moments, or it was committed before betas were recorded).
    pub fn recorded(lossy: &Lossy) -> Option<Betas> {
        let (b1, b2) = lossy.setting("betas")?.split_once(',')?;
        let values = (b1.parse().ok()?, b2.parse().ok()?);
        let from = lossy.setting("betas_from")?;
        let source = match from.split_once(':') {
            Some(("checkpoint", path)) => {
                Source::Checkpoint(path.replace("%20", " ").replace("%25", "%"))
            }
            Some(("inferred", since)) => Source::Inferred {
                since: since.parse().ok()?,
            },
            _ if from == "config" => Source::Config,
            _ if from == "default" => Source::Default,
            _ => return None,
        };
        Some(Betas { values, source })
    }

    /// `0.9,0.95 (recorded in optimizer.pt)`: what `mdl show` and a commit print.
    pub fn describe(&self) -> String {
        let from = match &self.source {
            Source::Config => "set by quant.adam_betas".to_string(),
            Source::Checkpoint(path) => format!("recorded in {path}"),
            Source::Inferred { since } => {
                format!("β2 inferred from exp_avg_sq's decay since step {since}")
            }
            Source::Default => "PyTorch's defaults: nothing recorded them".to_string(),
        };
        // Six decimals, trailing zeros dropped: an inferred β2 is not known to more.
        let shown = |x: f64| {
            let s = format!("{x:.6}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        };
        format!("{},{} ({from})", shown(self.values.0), shown(self.values.1))
    }
}

/// What is known of how far a previous version's decoded `exp_avg_sq` may be from the tensor it
/// was committed as: every committed element `v` satisfies `v ≥ r / factor` and `v ≥ r − abs`
/// for its decoded value `r`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bound {
    /// Relative: at most this factor too large (1 for an exact record).
    pub factor: f64,
    /// Absolute: at most this much too large.
    pub abs: f64,
}

impl Bound {
    /// The bound a record's manifest entry gives: exact for a lossless record; for a log-domain
    /// residual (`residual mode=log step=S`) a factor of `2^(S/2)` (plus rounding to the
    /// dtype); otherwise the recorded largest absolute error.
    pub fn of(exactness: &Exactness, dtype: Dtype) -> Bound {
        let Some(l) = exactness.lossy() else {
            return Bound {
                factor: 1.0,
                abs: 0.0,
            };
        };
        // A log-domain residual, from a previous version or from a prediction: every element
        // within half a step of what was committed.
        let log_step = (l.setting("mode") == Some("log"))
            .then(|| l.setting("step")?.parse::<f64>().ok())
            .flatten()
            .filter(|s| s.is_finite() && *s > 0.0);
        // Half a unit in the last place of the dtype, relative.
        let ulp = match dtype {
            Dtype::F32 => f64::from(f32::EPSILON),
            _ => 1.0 / 128.0,
        };
        Bound {
            factor: log_step.map_or(f64::INFINITY, |s| (s / 2.0).exp2() * (1.0 + ulp)),
            abs: l.max_abs_error,
        }
    }

    /// The least the committed value can have been, for a decoded `r`.
    fn least(&self, r: f64) -> f64 {
        (r / self.factor).max(r - self.abs)
    }
}

/// One second moment as committed now and its parent's version as decoded.
pub struct Decay<'a> {
    /// The dtype of both.
    pub dtype: Dtype,
    /// This commit's bytes.
    pub current: &'a [u8],
    /// The parent's version, decoded.
    pub previous: &'a [u8],
    /// How far `previous` may be from what was committed.
    pub bound: Bound,
}

/// The smallest β2 taken from a decay: below it the moments are not taken for one optimizer's
/// decay (Adam's β2 is 0.95 to 0.9999 in practice), but for a reset or replaced optimizer, whose
/// fresh second moments can be far below the old ones.
const LEAST_BETA2: f64 = 0.9;

/// β2, from one second moment `steps` optimizer steps apart. Adam's update `v ← β2·v + (1 −
/// β2)·g²` never lets an element fall below `β2` times its previous value, so across `k` steps
/// `v_now / v_before ≥ β2^k` for every element, with equality where the gradients were zero: the
/// smallest ratio bounds `β2^k` from above, and taking each previous value at the least it can
/// have been ([`Bound`]) keeps it an upper bound on data decoded lossily. A larger β2 makes the
/// bias-corrected `v̂` larger, the estimate's safe side. `None` when the bound says nothing (no
/// element decayed) or says the moments are not one optimizer's decay (β2 under
/// [`LEAST_BETA2`]). The optimizer rounds `v` to its dtype at every step, so only elements in the
/// dtype's normal range are compared (a subnormal's rounding is not relative), and the bound is
/// raised by one unit roundoff per step. Where it can mislead: an optimizer reset between the
/// two commits whose fresh moments all happen to lie within `β2^k` of the old ones.
pub fn infer_beta2(d: &Decay<'_>, steps: u64) -> Option<f64> {
    if steps == 0 {
        return None;
    }
    // The dtype's smallest normal value and unit roundoff.
    let (normal, roundoff) = match d.dtype {
        Dtype::F16 => (2f64.powi(-14), 2f64.powi(-11)),
        Dtype::BF16 => (2f64.powi(-126), 2f64.powi(-8)),
        _ => (2f64.powi(-126), 2f64.powi(-24)),
    };
    let least = (0..d.current.len() / d.dtype.size())
        .filter_map(|i| {
            let now = scalar::value(d.dtype, d.current, i);
            let before = d.bound.least(scalar::value(d.dtype, d.previous, i));
            (now.is_finite() && now >= normal && before.is_finite() && before >= normal)
                .then(|| now / before)
        })
        .fold(f64::INFINITY, f64::min);
    if least >= 1.0 {
        return None;
    }
    let beta2 = (least.powf(1.0 / steps as f64) * (1.0 + roundoff)).min(1.0 - f64::EPSILON);
    (beta2 >= LEAST_BETA2).then_some(beta2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Adam's second moment after `k` steps of gradients `g` (zero for a share of elements).
    fn decayed(v: &[f32], k: u32, beta2: f32, g: impl Fn(usize) -> f32) -> Vec<f32> {
        v.iter()
            .enumerate()
            .map(|(i, &x)| (0..k).fold(x, |x, _| beta2 * x + (1.0 - beta2) * g(i) * g(i)))
            .collect()
    }

    /// A second moment now and before, as `infer_beta2` takes it (the bytes leak: a test's).
    fn decay(now: &[f32], before: &[f32], bound: Bound) -> Decay<'static> {
        Decay {
            dtype: Dtype::F32,
            current: Box::leak(f32s(now).into_boxed_slice()),
            previous: Box::leak(f32s(before).into_boxed_slice()),
            bound,
        }
    }

    #[test]
    fn beta2_is_bounded_from_above_by_the_second_moments_decay() {
        let before: Vec<f32> = (0..20_000)
            .map(|i| 1e-6 * (1.0 + (i % 97) as f32))
            .collect();
        // One element in ten saw no gradient in the 20 steps.
        let grad = |i: usize| {
            if i.is_multiple_of(10) {
                0.0
            } else {
                1e-3 * (i % 7) as f32
            }
        };
        let after = decayed(&before, 20, 0.95, grad);
        let exact = Bound {
            factor: 1.0,
            abs: 0.0,
        };
        let b = infer_beta2(&decay(&after, &before, exact), 20).unwrap();
        assert!((0.9499..0.9502).contains(&b), "{b}");

        // Decoded within half an octave: still an upper bound, and close.
        let rough: Vec<f32> = before
            .iter()
            .enumerate()
            .map(|(i, &x)| x * [0.75f32, 1.0, 1.4][i % 3])
            .collect();
        let half_octave = Bound {
            factor: 0.5f64.exp2() * (1.0 + 1e-6),
            abs: f64::INFINITY,
        };
        let b = infer_beta2(&decay(&after, &rough, half_octave), 20).unwrap();
        assert!((0.95..0.97).contains(&b), "{b}");
        // Ignoring how it was decoded would have guessed too small a β2.
        let wrong = infer_beta2(&decay(&after, &rough, exact), 20).unwrap();
        assert!(wrong < 0.95, "{wrong}");

        // Subnormal second moments (a row the data left long ago) round coarsely: their ratio
        // says nothing of β2 and is not taken.
        let (mut tiny_before, mut tiny_after) = (before.clone(), after.clone());
        for i in 0..100 {
            tiny_before[i * 7] = 1e-44;
            tiny_after[i * 7] = 2.8e-45;
        }
        let b = infer_beta2(&decay(&tiny_after, &tiny_before, exact), 20).unwrap();
        assert!((0.9499..0.9502).contains(&b), "{b}");

        // A replaced optimizer: fresh moments from 20 steps, some elements' gradients tiny
        // (their ratio says β2 < 0.9, so nothing is inferred).
        let fresh = decayed(&vec![0.0; before.len()], 20, 0.95, |i| {
            if i.is_multiple_of(10) {
                1e-7
            } else {
                1e-3
            }
        });
        assert_eq!(infer_beta2(&decay(&fresh, &before, exact), 20), None);
        assert_eq!(infer_beta2(&decay(&after, &before, exact), 0), None);
        assert_eq!(infer_beta2(&decay(&before, &before, exact), 20), None);
    }

    #[test]
    fn betas_round_trip_through_settings_words() {
        for source in [
            Source::Config,
            Source::Checkpoint("run 1/100%/optimizer.pt".into()),
            Source::Inferred { since: 40 },
            Source::Default,
        ] {
            let b = Betas {
                values: (0.9, 0.95),
                source,
            };
            let lossy = |settings: String| Lossy {
                settings,
                max_abs_error: 0.0,
                rel_error: 0.0,
                est_delta_loss: None,
            };
            let settings = format!("residual mode=linear step=1e-3 {} role=param", b.words());
            assert_eq!(Betas::recorded(&lossy(settings)), Some(b));
            assert_eq!(Betas::recorded(&lossy("quant bins=8".into())), None);
        }
    }
}
