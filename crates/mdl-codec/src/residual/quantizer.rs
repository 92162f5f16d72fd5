//! The quantizer of `quant-residual`: the three modes, a mode and step ready to code elements
//! ([`Quantizer`]: an element's code and the decoder's value for it), and the tables a device
//! kernel takes ([`device_quantizer`]).

use mdl_format::Dtype;

use super::{MAX_MOMENT_STEPS, MAX_STEPS, ZERO};
use crate::scalar;

/// How codes become values, given the reference value `r` of the element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// `r + q·step`: a weight and its previous version.
    Linear = 0,
    /// `r · 2^(q·step)`: a positive tensor spanning decades (Adam's `exp_avg_sq`) and its
    /// previous version; the factors come from the stored `2^step` by repeated multiplication,
    /// so every machine computes the same values.
    Log = 1,
    /// `q · step · √r`: Adam's `exp_avg` in the optimizer's own units, against a second moment
    /// (the same commit's, or the previous one's), whose square root scales each element's
    /// step.
    Scaled = 2,
}

impl Mode {
    pub(super) fn from_u8(b: u8) -> Option<Mode> {
        match b {
            0 => Some(Mode::Linear),
            1 => Some(Mode::Log),
            2 => Some(Mode::Scaled),
            _ => None,
        }
    }

    /// The name `mdl show` prints.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Linear => "linear",
            Mode::Log => "log",
            Mode::Scaled => "scaled",
        }
    }
}

/// Evaluates `$body` once for each [`Mode`] with `$m` bound to `$mode` as a constant, so the
/// quantizer's per-element `match` on its mode folds away (as [`scalar::for_dtype`] does for
/// the dtype).
macro_rules! for_mode {
    ($mode:expr, $m:ident => $body:expr) => {
        match $mode {
            Mode::Linear => {
                const $m: Mode = Mode::Linear;
                $body
            }
            Mode::Log => {
                const $m: Mode = Mode::Log;
                $body
            }
            Mode::Scaled => {
                const $m: Mode = Mode::Scaled;
                $body
            }
        }
    };
}
pub(super) use for_mode;

/// A mode and step, ready to code elements.
pub(super) struct Quantizer {
    mode: Mode,
    /// `step` (Linear, Scaled) or `2^step` (Log): the value the payload stores.
    pub(super) param: f64,
    /// `1 / param`: a code is chosen by multiplying with it (the decoder never divides).
    pub(super) inverse: f64,
    /// `log2(param)`: what a log-mode code's first guess divides by.
    log_param: f64,
    /// Log: `2^(q·step)` for `q` = −[`MAX_MOMENT_STEPS`] … [`MAX_MOMENT_STEPS`].
    pub(super) factors: Vec<f64>,
    /// Log: the ratios `x / r` at which the code steps up (see [`log_thresholds`]).
    pub(super) thresholds: Vec<f64>,
}

impl Quantizer {
    /// From the value a payload stores (`None` when it cannot serve).
    pub(super) fn new(mode: Mode, param: f64) -> Option<Quantizer> {
        if !(param.is_finite() && param > 0.0) || (mode == Mode::Log && param <= 1.0) {
            return None;
        }
        let mut factors = Vec::new();
        if mode == Mode::Log {
            let m = MAX_MOMENT_STEPS as usize;
            factors = vec![1.0; 2 * m + 1];
            for q in 1..=m {
                factors[m + q] = factors[m + q - 1] * param;
                factors[m - q] = factors[m - q + 1] / param;
            }
        }
        let thresholds = match mode {
            Mode::Log => log_thresholds(param, &factors),
            _ => Vec::new(),
        };
        Some(Quantizer {
            mode,
            param,
            inverse: 1.0 / param,
            log_param: param.log2(),
            factors,
            thresholds,
        })
    }

    /// For a step (in log2 units for [`Mode::Log`]).
    pub(super) fn with_step(mode: Mode, step: f64) -> Option<Quantizer> {
        match mode {
            Mode::Log => Quantizer::new(mode, step.exp2()),
            _ => Quantizer::new(mode, step),
        }
    }

    /// One element's code and reconstruction (`None`: kept exactly). `mode` is the quantizer's
    /// own: callers pass it (and `dtype`) as constants, see [`for_mode`]. `gain`: the
    /// element's step factor and its inverse in linear mode (`(1, 1)` but in a stepped
    /// payload, [`super::Steps`]); the other modes ignore it.
    #[inline(always)]
    pub(super) fn code(
        &self,
        mode: Mode,
        dtype: Dtype,
        x: f64,
        r: f64,
        gain: (f64, f64),
    ) -> Option<(u16, f64)> {
        debug_assert_eq!(mode, self.mode);
        if !x.is_finite() || !r.is_finite() {
            return None;
        }
        let q = match mode {
            // The code only has to be near; the value below is the decoder's.
            Mode::Linear => round((x - r) * self.inverse * gain.1),
            Mode::Log => {
                if x == 0.0 {
                    return Some((ZERO, 0.0));
                }
                if x < 0.0 || r <= 0.0 {
                    return None;
                }
                log_code(x / r, self.log_param, &self.thresholds)
            }
            Mode::Scaled => {
                if r < 0.0 {
                    return None;
                }
                if x == 0.0 {
                    // Code 0 rebuilds +0 here: the entropy coder's sparse form takes runs of it.
                    return Some((0, 0.0));
                }
                if r == 0.0 {
                    return None;
                }
                round(x / (self.param * r.sqrt()))
            }
        };
        let max = match mode {
            Mode::Linear => MAX_STEPS,
            _ => MAX_MOMENT_STEPS,
        };
        if q.is_nan() || q.abs() > max as f64 {
            return None;
        }
        let c = zigzag(q as i64);
        let y = scalar::rounded(dtype, self.value(mode, r, c, gain.0));
        y.is_finite().then_some((c, y))
    }

    /// The decoder's value for reference `r` and a code other than [`EXACT`](super::EXACT), before it is
    /// rounded to the dtype; `gain`: the element's step factor in linear mode (1 but in a
    /// stepped payload).
    #[inline(always)]
    pub(super) fn value(&self, mode: Mode, r: f64, c: u16, gain: f64) -> f64 {
        if c == ZERO {
            return 0.0;
        }
        let q = unzigzag(c);
        match mode {
            Mode::Linear => r + q as f64 * (self.param * gain),
            Mode::Log => r * self.factors[(q + MAX_MOMENT_STEPS) as usize],
            Mode::Scaled => q as f64 * self.param * r.sqrt(),
        }
    }
}

/// The ratios at which a log-mode code steps up: entry `j` is `2^((j − 127 + ½)·step)`, for
/// `j` = 0 … 253, each one product of a factor (`2^(q·step)`, built by multiplication) and
/// `√(2^step)`. Correctly rounded operations only, so every engine (the GPU's included) builds
/// the same table from the stored `2^step`.
fn log_thresholds(param: f64, factors: &[f64]) -> Vec<f64> {
    let half = param.sqrt();
    let below = factors[0] / param;
    std::iter::once(below)
        .chain(factors.iter().copied())
        .map(|f| f * half)
        .collect()
}

/// The log-mode step count of a ratio `x / r`: −127 plus how many thresholds it reaches, so
/// ±127 (beyond [`MAX_MOMENT_STEPS`]) mean "keep exactly". The logarithm only guesses; the
/// comparisons with the table decide, so the code does not depend on a `log2` that differs
/// between machines in its last bits.
#[inline(always)]
pub(super) fn log_code(ratio: f64, log_param: f64, thresholds: &[f64]) -> f64 {
    let top = MAX_MOMENT_STEPS + 1;
    let guess = round(ratio.log2() / log_param);
    let mut q = if guess.is_nan() {
        0
    } else {
        guess.clamp(-top as f64, top as f64) as i64
    };
    let t = |q: i64| thresholds[(q + top) as usize];
    while q > -top && ratio < t(q - 1) {
        q -= 1;
    }
    while q < top && ratio >= t(q) {
        q += 1;
    }
    q as f64
}

/// `t` rounded half away from zero, as `f64::round` does, without its library call on the
/// baseline x86-64 target (this is the search's innermost operation).
#[inline(always)]
pub(super) fn round(t: f64) -> f64 {
    let a = t.abs();
    // Beyond 2^52 (and for NaN) every value is already whole.
    if a.is_nan() || a >= 4_503_599_627_370_496.0 {
        return t.round();
    }
    // Signed conversions: one instruction each way on x86-64 (`a` is below 2^52 here), where
    // unsigned ones take a sequence.
    let whole = a as i64 as f64;
    // Exact: `a − whole` is the fraction, representable below 2^52. Without a branch: which
    // way a residual rounds is a coin toss the predictor cannot learn.
    let up = f64::from(u8::from(a - whole >= 0.5));
    (whole + up).copysign(t)
}

#[inline]
fn zigzag(q: i64) -> u16 {
    ((q << 1) ^ (q >> 63)) as u16
}

#[inline]
pub(super) fn unzigzag(c: u16) -> i64 {
    let c = c as i64;
    (c >> 1) ^ -(c & 1)
}

/// Whether `step` can serve as a quantization step of `mode`.
pub fn valid_step(mode: Mode, step: f64) -> bool {
    Quantizer::with_step(mode, step).is_some()
}

/// Doubles in [`device_quantizer`]'s table.
pub const DEVICE_QUANTIZER: usize = 510;

/// The quantizer of `mode` at `step` as a device kernel takes it (`None`: not a valid step):
/// the stored parameter, its inverse, its `log2` (a guess's divisor only), then in log mode
/// the factors `2^(q·step)` for `q` = −126 … 126 and the thresholds of [`log_code`], zeros
/// after. Built here, so the device computes with the very table the CPU does.
pub fn device_quantizer(mode: Mode, step: f64) -> Option<Vec<f64>> {
    Quantizer::with_step(mode, step).map(|q| q.device_table())
}

impl Quantizer {
    /// This quantizer as [`device_quantizer`] lays it out.
    pub(super) fn device_table(&self) -> Vec<f64> {
        let mut table = vec![self.param, self.inverse, self.log_param];
        table.extend_from_slice(&self.factors);
        table.extend_from_slice(&self.thresholds);
        table.resize(DEVICE_QUANTIZER, 0.0);
        table
    }
}
