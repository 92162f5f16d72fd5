//! A commit's planning phase: for a lossy commit, the configuration search that decides how
//! each tensor is quantized, against the parent's versions and within the quality budget.

use std::collections::HashMap;
use std::sync::Arc;

use mdl_codec::quant::Correction;
use mdl_format::ObjectId;
use rayon::prelude::*;

mod eval;

use super::store::{previous_content, previous_object};
use crate::input::Input;
use crate::lossy::betas::{self, Betas};
use crate::lossy::{self, CodecMode, LossySettings, Role, SearchSummary, TensorPlan};
use crate::policy::{DeltaMode, DeltaPolicy};
use crate::previous::Previous;
use crate::warm::WarmTensors;
use crate::{Repository, Result};
use eval::evaluate_candidate;

/// What a commit's phases share once the parent and the settings are known.
pub(super) struct Planning<'a> {
    pub(super) repo: &'a Repository,
    pub(super) input: &'a Input,
    /// Which tensors are parameters and which their moments (a 16-bit copy stored as its
    /// master's cast is neither: it is not priced).
    pub(super) roles: &'a [lossy::Role],
    /// Each piece's master where it is stored as the master's cast.
    pub(super) casts: &'a [Option<usize>],
    pub(super) settings: &'a LossySettings,
    /// The parent's version of each tensor, by name.
    pub(super) previous: &'a Previous<'a>,
    pub(super) policy: DeltaPolicy,
    pub(super) warm: Option<&'a WarmTensors>,
    pub(super) correction: Correction,
    /// The betas `correction` was made with (a lossy commit's).
    pub(super) betas: Option<Betas>,
    /// Previous versions already decoded (by [`adam_betas`]), by object: the plans take their
    /// references from here instead of decoding them again.
    pub(super) decoded: HashMap<ObjectId, Arc<Vec<u8>>>,
    pub(super) metrics: &'a [(String, f64)],
}

/// The optimizer's bias correction at `step` (none without a step) for `betas`, with the
/// configured curvature.
pub(super) fn correction(settings: &LossySettings, betas: &Betas, step: Option<u64>) -> Correction {
    Correction {
        curvature: settings.curvature,
        ..match step {
            Some(t) => Correction::adam(betas.values.0, betas.values.1, t),
            None => Correction::none(),
        }
    }
}

/// Previous versions decoded while planning, by object.
pub(super) type Decoded = HashMap<ObjectId, Arc<Vec<u8>>>;

/// A previous second moment, decoded, and the bound on β2 its decay gives (if any).
type Bounded = (ObjectId, Arc<Vec<u8>>, Option<f64>);

/// The betas a lossy commit's estimate uses (`lossy/betas.rs`): configured, else recorded by
/// the checkpoint, else β2 inferred from the second moments' decay since the parent commit's
/// step, else PyTorch's defaults; with the previous second moments the inference decoded, which
/// the plans then use as their references (each decoded once).
pub(super) fn adam_betas(
    p: &Planning<'_>,
    step: Option<u64>,
    parent_step: Option<u64>,
) -> Result<(Betas, Decoded)> {
    if let Some(values) = p.settings.betas {
        let source = betas::Source::Config;
        return Ok((Betas { values, source }, Decoded::new()));
    }
    if let Some((values, path)) = p.input.recorded_betas() {
        let source = betas::Source::Checkpoint(path);
        return Ok((Betas { values, source }, Decoded::new()));
    }
    let Some((t, since)) = step.zip(parent_step).filter(|(t, since)| t > since) else {
        return Ok((Betas::default(), Decoded::new()));
    };
    let store = p.repo.store();
    // Each previous second moment decoded (in parallel, as the plans would) and bounded alone.
    let seconds: Vec<usize> = (0..p.roles.len())
        .filter(|&i| p.roles[i] == Role::SecondMoment)
        .collect();
    let bounded = seconds
        .par_iter()
        .map(|&i| -> Result<Option<Bounded>> {
            let found = previous_object(&store.meta().read()?, p.previous, p.input, i)?;
            let Some((id, entry, _)) = found else {
                return Ok(None);
            };
            let piece = &p.input.pieces[i];
            let file = &p.input.files[piece.file].tree_path;
            let Some(prev) = p.previous.get(file, &piece.name) else {
                return Ok(None);
            };
            let content = previous_content(store, p.warm, &id, &entry)?;
            let decay = betas::Decay {
                dtype: piece.header.dtype,
                current: p.input.view(i).bytes,
                previous: &content,
                bound: betas::Bound::of(&prev.exactness, piece.header.dtype),
            };
            let b2 = betas::infer_beta2(&decay, t - since);
            Ok(Some((id, content, b2)))
        })
        .collect::<Result<Vec<_>>>()?;
    // Every tensor's bound holds, so the tightest is taken; a tensor whose own bound says
    // nothing (no decay, or not one optimizer's) leaves the others to decide.
    let bounded: Vec<Bounded> = bounded.into_iter().flatten().collect();
    let least = bounded.iter().filter_map(|b| b.2).reduce(f64::min);
    let decoded = bounded
        .into_iter()
        .map(|(id, content, _)| (id, content))
        .collect();
    let betas = match least {
        Some(b2) => Betas {
            values: (betas::DEFAULT.0, b2),
            source: betas::Source::Inferred { since },
        },
        None => Betas::default(),
    };
    Ok((betas, decoded))
}

/// Each tensor's lossy plan (`None`: stored exactly) and the search's summary; a commit that is
/// not lossy plans nothing.
pub(super) fn lossy_plans(
    p: &Planning<'_>,
) -> Result<(Vec<Option<TensorPlan>>, Option<SearchSummary>)> {
    let Planning {
        repo,
        input,
        settings,
        previous,
        policy,
        warm,
        correction,
        ..
    } = *p;
    if settings.mode != CodecMode::Lossy {
        return Ok((Vec::new(), None));
    }
    let store = repo.store();
    let engine = store.engine();
    // Each lookup's read transaction ends before the decode: a transaction held across
    // parallel work would keep this process's own publish waiting.
    let previous_quant = |i: usize| -> Result<Option<_>> {
        let found = previous_object(&store.meta().read()?, previous, input, i)?;
        match found {
            Some((id, entry, true)) => Ok(Some(store.load_quant(&id, &entry)?)),
            _ => Ok(None),
        }
    };
    // Residual coding takes the previous version's decoded content as its reference, while
    // the chain through it stays within the policy's depth.
    let reference = |i: usize| -> Result<Option<lossy::Reference>> {
        if policy.mode == DeltaMode::Off {
            return Ok(None);
        }
        let found = {
            let meta = store.meta().read()?;
            previous_object(&meta, previous, input, i)?
        };
        let Some((id, entry, _)) = found else {
            return Ok(None);
        };
        if entry.depth + 1 > policy.max_depth {
            return Ok(None);
        }
        Ok(Some(lossy::Reference {
            id,
            depth: entry.depth,
            content: match p.decoded.get(&id) {
                Some(content) => content.clone(),
                None => previous_content(store, warm, &id, &entry)?,
            },
        }))
    };
    let plan_input = lossy::PlanInput {
        engine,
        input,
        roles: p.roles,
        settings,
        previous,
        previous_quant: &previous_quant,
        reference: &reference,
        correction,
        second_moment_step: lossy::second_moment_step(
            p.betas.as_ref().map_or(betas::DEFAULT.1, |b| b.values.1),
        ),
        loss: loss_of(p.metrics, input),
    };
    let evaluate = |plans: Option<&[Option<TensorPlan>]>| {
        evaluate_candidate(repo, input, engine, correction, settings, p.casts, plans)
    };
    let eval: Option<lossy::Evaluate<'_>> = settings.eval_cmd.as_ref().map(|_| &evaluate as _);
    let (plans, summary) = lossy::plan(&plan_input, eval)?;
    Ok((plans, Some(summary)))
}

/// Names of the loss the quality bound is relative to, in order of preference.
const LOSS_NAMES: [&str; 3] = ["loss", "val_loss", "train_loss"];

/// The checkpoint's loss: a commit metric named `loss`, `val_loss` or `train_loss`, else the
/// same key in the checkpoint's metadata.
fn loss_of(metrics: &[(String, f64)], input: &Input) -> Option<f64> {
    LOSS_NAMES.iter().find_map(|name| {
        metrics
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
            .or_else(|| input.metadata_value(name))
            .filter(|v: &f64| v.is_finite())
    })
}
