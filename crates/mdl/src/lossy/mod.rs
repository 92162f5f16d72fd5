//! Lossy commits: which tensors are quantized, how parameters are paired with their Adam
//! moments, and the configuration search under a quality bound ε (`docs/CODECS.md`).
//!
//! Roles come from tensor names. A *pairing* names a parameter and its two moments with one `{}`
//! placeholder each: the default pairings are this project's corpus convention
//! (`model.{}` ↔ `optim.{}.exp_avg` / `optim.{}.exp_avg_sq`, and `optim.{}.master` — fp32 master
//! weights of mixed-precision training — with the same moments). Parameters with moments are
//! searched under the loss estimate of `Correction::loss_change` (`docs/CODECS.md`, "The
//! bound"), among quantizer configurations and residuals from the previous version
//! (`quant-residual`), the checkpoint's budget being
//! `ε × loss` (or `ε` without a loss) for each pairing's family of tensors; parameters without
//! moments get the cheapest configuration whose relative L2 error is at most ε; the moments
//! themselves get fixed configurations (`quant.exp_avg`, `quant.exp_avg_sq`).

pub mod betas;
mod eval;
mod order;
mod pairing;
mod quantize;
mod search;
mod settings;
pub(crate) mod sparse;

pub(crate) use eval::run_eval;
pub use pairing::Pairing;
pub(crate) use pairing::{roles, Role};
pub(crate) use quantize::{quantize, Encoded, Reference, TensorPlan};
pub(crate) use search::{plan, second_moment_step, Evaluate, PlanInput};
pub use search::{CopyEstimate, SearchSummary};
pub use settings::{
    known_keys, validate, CodecMode, LossyRequest, LossySettings, BETAS_KEY, CURVATURE_KEY,
    DEFAULT_EPSILON, DEFAULT_KEY, EMBEDDINGS_KEY, EPSILON_KEY, EXP_AVG_DROP_KEY, EXP_AVG_KEY,
    EXP_AVG_SQ_HOLD_KEY, EXP_AVG_SQ_KEY, MIN_LOSSY_ELEMENTS, MOMENTS_KEY, MOMENT_RESIDUALS_KEY,
    ROW_COL_STEPS_KEY, TIPS_KEY, TRIM_BITS_KEY,
};
pub(crate) use sparse::Sparsify;

#[cfg(test)]
mod tests {
    use super::pairing::glob;
    use super::settings::DEFAULT_MOMENTS;
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
