//! The lossy settings of a commit: configuration keys, their defaults and checks, and the
//! command line's overrides.

use mdl_codec::quant::{self, QuantConfig};

use super::Pairing;
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
/// `quant.adam_betas`: Adam's β1,β2 for the bias corrections, or `auto` (the default: as the
/// checkpoint records them, else inferred, else PyTorch's; `lossy/betas.rs`).
pub const BETAS_KEY: &str = "quant.adam_betas";
/// `quant.exp_avg`: the first moments' quantizer configuration.
pub const EXP_AVG_KEY: &str = "quant.exp_avg";
/// `quant.exp_avg_sq`: the second moments' quantizer configuration.
pub const EXP_AVG_SQ_KEY: &str = "quant.exp_avg_sq";
/// Whether moments with a previous version are coded as residuals from it (`on`, `off`).
pub const MOMENT_RESIDUALS_KEY: &str = "quant.moment_residuals";
/// First moments at most this many times their tensor's mean magnitude are stored as zero
/// (`0`: none dropped).
pub const EXP_AVG_DROP_KEY: &str = "quant.exp_avg_drop";
/// Where a first moment is dropped, its second moment keeps its previous value while within
/// this many octaves of it (`0`: never held).
pub const EXP_AVG_SQ_HOLD_KEY: &str = "quant.exp_avg_sq_hold";
/// The loss's curvature per unit of Adam's `v̂` (`docs/CODECS.md`, "The bound").
pub const CURVATURE_KEY: &str = "quant.curvature";
/// Whether lossy commits keep their residual tensors decoded in `.mdl/tips` (on or off).
pub const TIPS_KEY: &str = "quant.tips";
/// Whether a weight with moments has a quantization step per row and column, following the
/// curvature its error is charged with (`on`, `off`; `residual::Steps`).
pub const ROW_COL_STEPS_KEY: &str = "quant.row_col_steps";

/// Default ε (calibrated on the corpus: `docs/BENCHMARKS.md`).
pub const DEFAULT_EPSILON: f64 = 0.0005;
pub(super) const DEFAULT_MOMENTS: &str = "model.{}:optim.{}.exp_avg:optim.{}.exp_avg_sq,\
                               optim.{}.master:optim.{}.exp_avg:optim.{}.exp_avg_sq";
/// ExCP's rule (`docs/BENCHMARKS.md`, "Moments dropped at commit time").
const DEFAULT_EXP_AVG_DROP: f64 = 0.0;
const DEFAULT_EXP_AVG_SQ_HOLD: f64 = 2.0;
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

pub(super) fn invalid(key: &str, value: &str, expected: &'static str) -> Error {
    Error::InvalidConfig {
        key: key.into(),
        value: value.into(),
        expected,
    }
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
    /// Adam's betas as configured (`None`: `auto`).
    pub betas: Option<(f64, f64)>,
    /// Curvature per unit of `v̂` (`quant.curvature`).
    pub curvature: f64,
    /// Moments with a previous version are residuals from it (`quant.moment_residuals`).
    pub moment_residuals: bool,
    /// First moments dropped below this many times their mean magnitude (`quant.exp_avg_drop`).
    pub exp_avg_drop: f64,
    /// Octaves a held second moment may be off by (`quant.exp_avg_sq_hold`).
    pub exp_avg_sq_hold: f64,
    /// First moments' configuration (`None`: stored exactly).
    pub exp_avg: Option<QuantConfig>,
    /// Second moments' configuration (`None`: stored exactly).
    pub exp_avg_sq: Option<QuantConfig>,
    /// A command scoring candidate checkpoints (`{}` is the file), lower is better.
    pub eval_cmd: Option<String>,
    /// Residual tensors kept decoded in `.mdl/tips` (`quant.tips`).
    pub tips: bool,
    /// Weights with moments get a step per row and column (`quant.row_col_steps`).
    pub row_col_steps: bool,
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

fn parse_betas(v: &str) -> Result<Option<(f64, f64)>> {
    if v == "auto" {
        return Ok(None);
    }
    let bad = || invalid(BETAS_KEY, v, "auto, or BETA1,BETA2 with each in [0, 1)");
    let (a, b) = v.split_once(',').ok_or_else(bad)?;
    let p = |x: &str| {
        x.trim()
            .parse::<f64>()
            .ok()
            .filter(|y| (0.0..1.0).contains(y))
    };
    Ok(Some((p(a).ok_or_else(bad)?, p(b).ok_or_else(bad)?)))
}

fn parse_curvature(v: &str) -> Result<f64> {
    v.parse::<f64>()
        .ok()
        .filter(|c| c.is_finite() && *c >= 1.0)
        .ok_or_else(|| invalid(CURVATURE_KEY, v, "a number of at least 1"))
}

fn parse_drop(v: &str) -> Result<f64> {
    v.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && (0.0..=16.0).contains(f))
        .ok_or_else(|| invalid(EXP_AVG_DROP_KEY, v, "a number from 0 (keep all) to 16"))
}

fn parse_hold(v: &str) -> Result<f64> {
    v.parse::<f64>()
        .ok()
        .filter(|o| o.is_finite() && (0.0..=4.0).contains(o))
        .ok_or_else(|| invalid(EXP_AVG_SQ_HOLD_KEY, v, "octaves from 0 (never hold) to 4"))
}

fn parse_switch(key: &str, v: &str) -> Result<bool> {
    match v {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(invalid(key, v, "on or off")),
    }
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
        CURVATURE_KEY => parse_curvature(value).map(drop),
        MOMENT_RESIDUALS_KEY | TIPS_KEY | ROW_COL_STEPS_KEY => parse_switch(key, value).map(drop),
        EXP_AVG_DROP_KEY => parse_drop(value).map(drop),
        EXP_AVG_SQ_HOLD_KEY => parse_hold(value).map(drop),
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
        (BETAS_KEY, "auto".into()),
        (CURVATURE_KEY, quant::DEFAULT_CURVATURE.to_string()),
        (MOMENT_RESIDUALS_KEY, "on".into()),
        (TIPS_KEY, "on".into()),
        (ROW_COL_STEPS_KEY, "on".into()),
        (EXP_AVG_DROP_KEY, DEFAULT_EXP_AVG_DROP.to_string()),
        (EXP_AVG_SQ_HOLD_KEY, DEFAULT_EXP_AVG_SQ_HOLD.to_string()),
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
            curvature: parse_curvature(&get(CURVATURE_KEY)?)?,
            moment_residuals: parse_switch(MOMENT_RESIDUALS_KEY, &get(MOMENT_RESIDUALS_KEY)?)?,
            tips: parse_switch(TIPS_KEY, &get(TIPS_KEY)?)?,
            row_col_steps: parse_switch(ROW_COL_STEPS_KEY, &get(ROW_COL_STEPS_KEY)?)?,
            exp_avg_drop: parse_drop(&get(EXP_AVG_DROP_KEY)?)?,
            exp_avg_sq_hold: parse_hold(&get(EXP_AVG_SQ_HOLD_KEY)?)?,
            exp_avg: parse_config(EXP_AVG_KEY, &get(EXP_AVG_KEY)?)?,
            exp_avg_sq: parse_config(EXP_AVG_SQ_KEY, &get(EXP_AVG_SQ_KEY)?)?,
            eval_cmd: req.eval_cmd.clone(),
        })
    }
}
