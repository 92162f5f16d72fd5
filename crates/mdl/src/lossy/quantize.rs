//! A planned tensor encoded: the plan a search makes for a tensor, its encoding and
//! reconstruction, and the loss estimate of its measured error.

use std::sync::Arc;

use mdl_codec::engine::{Engine, ErrorStats, FloatView, Moments};
use mdl_codec::qrecord::QuantTensor;
use mdl_codec::quant::{Correction, Prepared, QuantConfig};
use mdl_codec::residual;
use mdl_format::{Lossy, ObjectId};

use super::{sparse, Sparsify};

/// How one tensor is quantized.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TensorPlan {
    pub config: QuantConfig,
    /// A code table to use instead of fitting one: the previous version's, so that elements
    /// that did not move keep their codes and the quant-delta is mostly zeros.
    pub table: Option<Arc<Vec<f64>>>,
    /// Its moments' tensor indices (sensitivity and the loss estimate).
    pub moments: Option<(usize, usize)>,
    /// The tensor's mean second moment, as the search measured it (the loss estimate).
    pub mean_v: f64,
    /// What the manifest says the tensor is.
    pub role: &'static str,
    /// The copy of the model a priced parameter belongs to (its pairing's weight pattern),
    /// which its record's loss estimate is for.
    pub copy: Option<String>,
    /// Instead of `config` and `table`: the tensor as a quantized residual from a reference.
    pub residual: Option<Residual>,
}

/// A tensor's reference for residual coding: the previous version's decoded content.
#[derive(Debug, PartialEq)]
pub(crate) struct Reference {
    pub id: ObjectId,
    /// Its chain depth (the residual record is one deeper).
    pub depth: u32,
    pub content: Arc<Vec<u8>>,
}

/// A residual plan: the reference (`None`: zeros, a `quant-uniform` record), how codes become
/// values, and the quantization step.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Residual {
    pub reference: Option<Arc<Reference>>,
    /// The piece of this commit whose stored content is the reference instead, given once that
    /// piece is stored ([`Residual::follow`]: a first moment, in units of its commit's second
    /// moment).
    pub follows: Option<usize>,
    pub mode: residual::Mode,
    pub step: f64,
    /// What the encoder drops first (moments only).
    pub sparsify: Option<Sparsify>,
    /// Log-mode codes against a prediction fitted to the tensor's view (`residual::Predictor`;
    /// second moments), instead of against the reference itself.
    pub predict: bool,
    /// Linear codes whose step has a factor per row and column (`residual::Steps`; weights
    /// with moments).
    pub factors: Option<Arc<residual::Steps>>,
    /// The tensor viewed as `(rows, cols)` (`residual::view_of`): the prediction's factors and
    /// the code classes (`residual::context_code`) go by its rows and columns.
    pub view: (usize, usize),
}

impl Residual {
    /// This plan with its reference, the content `follows` names as it was stored.
    pub(crate) fn follow(&self, reference: Reference) -> Residual {
        Residual {
            reference: Some(Arc::new(reference)),
            follows: None,
            ..self.clone()
        }
    }
}

impl TensorPlan {
    /// This plan, its residual's reference given (see [`Residual::follows`]); without one (the
    /// followed piece at the depth cap), against the reference it had beside, or quantized on
    /// its own (`config`) where it had none.
    pub(crate) fn follow(&self, reference: Option<Reference>) -> TensorPlan {
        let residual = match (&self.residual, reference) {
            (Some(r), Some(reference)) => Some(r.follow(reference)),
            (Some(r), None) if r.reference.is_some() => Some(Residual {
                follows: None,
                ..r.clone()
            }),
            _ => None,
        };
        TensorPlan {
            residual,
            ..self.clone()
        }
    }

    /// The piece whose stored content this plan's reference is, where it is this commit's.
    pub(crate) fn follows(&self) -> Option<usize> {
        self.residual.as_ref()?.follows
    }

    /// The first moment a held second moment is gated by (see [`Sparsify::Hold`]).
    pub(crate) fn first_moment(&self) -> Option<usize> {
        match self.residual.as_ref()?.sparsify? {
            Sparsify::Hold { first, .. } => Some(first),
            Sparsify::Small { .. } => None,
        }
    }
}

/// A lossily encoded tensor, its reconstruction and what the manifest records about it.
pub(crate) struct Quantized {
    pub encoded: Encoded,
    pub render: Vec<u8>,
    pub lossy: Lossy,
}

/// How a lossy tensor is stored.
pub(crate) enum Encoded {
    /// A quant-base, or a quant-delta against the previous version's codes.
    Quant(QuantTensor),
    /// A quant-residual payload against `reference`, or a quant-uniform one without.
    Residual {
        payload: Vec<u8>,
        reference: Option<Arc<Reference>>,
    },
}

/// Encodes `w` as `plan` says (`first`: the first moment of [`TensorPlan::first_moment`]).
pub(crate) fn quantize(
    engine: &dyn Engine,
    w: FloatView<'_>,
    moments: Option<Moments<'_>>,
    first: Option<FloatView<'_>>,
    plan: &TensorPlan,
    corr: Correction,
) -> Quantized {
    let (encoded, render, settings) = match &plan.residual {
        Some(r) => {
            assert!(
                r.follows.is_none(),
                "a followed piece's content is given first"
            );
            let reference = r.reference.as_ref().map(|r| &r.content[..]);
            let sparse = r
                .sparsify
                .map(|s| sparse::apply(w.dtype, w.bytes, reference, first, s));
            let values = sparse.as_deref().unwrap_or(w.bytes);
            let values = FloatView {
                dtype: w.dtype,
                bytes: values,
            };
            let (payload, render) = match r.predict {
                true => {
                    let p = residual::Predictor::fit(w.dtype, values.bytes, reference, r.view);
                    let prediction = p
                        .predict(w.dtype, reference)
                        .expect("a prediction for the reference it was fitted with");
                    let (inner, render) =
                        engine.residual_encode(values, Some(&prediction), r.mode, None, r.step);
                    (p.wrap(&inner), render)
                }
                false => {
                    let factors = r.factors.as_deref();
                    engine.residual_encode(values, reference, r.mode, factors, r.step)
                }
            };
            let payload = residual::context_code(w.dtype, payload, r.view);
            let encoded = Encoded::Residual {
                payload,
                reference: r.reference.clone(),
            };
            // `residual mode=M step=S` against a reference, `uniform step=S` against zeros
            // (always linear), then how a predicted payload's prediction was made.
            let (kind, predicted) = match (&r.reference, r.predict) {
                (Some(_), false) => ("residual", ""),
                (Some(_), true) => ("residual", " predict=sqrt-rows-cols"),
                (None, true) => ("uniform", " predict=rows-cols"),
                (None, false) => ("uniform", ""),
            };
            let mode = match (&r.reference, r.predict) {
                (None, false) => String::new(),
                _ => format!(" mode={}", r.mode.name()),
            };
            let stepped = match r.factors {
                Some(_) => " steps=rows-cols",
                None => "",
            };
            let settings = format!("{kind}{mode} step={:e}{predicted}{stepped}", r.step);
            (encoded, render, settings)
        }
        None => {
            let stats = engine.key_stats(w, moments);
            let prep = Prepared::new(&stats, w.dtype);
            let fit = prep.fit_table(
                &plan.config,
                plan.table.as_deref().map(|t| &t[..]),
                Some(corr),
            );
            let assigned = engine.assign(w, &prep.lut(&fit));
            let tensor =
                QuantTensor::new(w.dtype, prep.table_bytes(&fit.values), assigned, w.bytes);
            let mut render = vec![0u8; w.bytes.len()];
            tensor.render(&mut render);
            (
                Encoded::Quant(tensor),
                render,
                format!("quant {}", plan.config),
            )
        }
    };
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
            "{settings} sensitivity={} role={}{}",
            if moments.is_some() {
                "moments"
            } else {
                "magnitude"
            },
            plan.role,
            plan.copy
                .as_ref()
                .map(|c| format!(" copy={c}"))
                .unwrap_or_default()
        ),
        max_abs_error: err.max_abs,
        rel_error: err.rel_l2(),
        est_delta_loss: moments.map(|_| delta_loss(&err, corr, plan.mean_v)),
    };
    Quantized {
        encoded,
        render,
        lossy,
    }
}

/// The loss estimate from measured error sums (`mean_v`: the tensor's mean second moment).
pub(crate) fn delta_loss(err: &ErrorStats, corr: Correction, mean_v: f64) -> f64 {
    corr.loss_change(err.sum_m_delta, err.sum_v_delta2, err.sum_sq_err, mean_v)
}
