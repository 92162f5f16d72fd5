//! `mdl show`: a commit and its tree, file by file and tensor by tensor.

use mdl_codec::CodecTag;
use mdl_format::PairSource;
use mdl_store::StoreError;

pub use mdl_protocol::history::{FileInfo, LossyInfo, Shown, ShownPair, TensorInfo};

use crate::log::Metrics;
use crate::lossy::betas::Betas;
use crate::{revision, Repository, Result};

/// What `mdl show` says of a lossy tensor record.
fn lossy_info(l: &mdl_format::Lossy) -> LossyInfo {
    let word = |key: &str| l.setting(key).map(str::to_string);
    LossyInfo {
        settings: l.settings.clone(),
        bins: word("bins").and_then(|v| v.parse().ok()),
        prune: word("prune").and_then(|v| v.parse().ok()),
        protect: word("protect").and_then(|v| v.parse().ok()),
        metric: word("metric"),
        sensitivity: word("sensitivity"),
        trim_bits: word("bits").and_then(|v| v.parse().ok()),
        max_abs_error: l.max_abs_error,
        rel_error: l.rel_error,
        est_delta_loss: l.est_delta_loss,
        coarsened: false,
    }
}

/// `info` once a coarsened record's own errors are added.
fn with_coarsening(mut info: LossyInfo, c: &mdl_format::record::Coarsened) -> LossyInfo {
    (info.max_abs_error, info.rel_error) =
        crate::coarsen::combined_errors(info.max_abs_error, info.rel_error, c);
    info.coarsened = true;
    info
}

/// Loads what `mdl show REV` prints.
pub fn show(repo: &Repository, rev: &str) -> Result<Shown> {
    let id = revision::resolve(repo, rev)?;
    let c = repo.load_commit(&id)?;
    let m = repo.load_manifest(&c.manifest)?;
    let meta = repo.store().meta().read()?;
    let mut tensors = Vec::new();
    for (f, e) in m.tensors() {
        // A tensor retention deleted is shown with what is known of it.
        let mut coarsened = None;
        let (codec, raw_bytes, stored_bytes, base, depth, expired) = match meta.object(&e.id)? {
            Some(entry) => (
                {
                    coarsened = crate::coarsen::coarsening(repo.store(), &e.id, &entry)?;

                    CodecTag::try_from(entry.codec)
                        .map(|c| c.name().to_string())
                        .unwrap_or_else(|_| format!("#{}", entry.codec))
                },
                entry.content_len,
                entry.stored_len,
                entry.base,
                entry.depth,
                None,
            ),
            None => {
                let x = meta.expired(&e.id)?.ok_or(StoreError::Missing(e.id))?;
                let why = format!("{} at {}", x.rule, x.time.rfc3339());
                ("expired".into(), x.content_len, 0, None, 0, Some(why))
            }
        };
        tensors.push(TensorInfo {
            file: m.files[f].path.clone(),
            name: e.name.clone(),
            dtype: e.header.dtype.name().to_string(),
            shape: e.header.shape.clone(),
            id: e.id,
            codec,
            raw_bytes,
            stored_bytes,
            base,
            depth,
            lossy: e.exactness.is_lossy(),
            lossy_info: e.exactness.lossy().map(|l| match &coarsened {
                Some(c) => with_coarsening(lossy_info(l), c),
                None => lossy_info(l),
            }),
            expired,
        });
    }
    let expired_tensors = tensors.iter().filter(|t| t.expired.is_some()).count() as u32;
    let label = |i: u32| {
        tensors
            .get(i as usize)
            .map_or_else(String::new, |t| format!("{}: {}", t.file, t.name))
    };
    let pairs = m
        .pairs
        .iter()
        .map(|p| ShownPair {
            param: label(p.param),
            exp_avg: label(p.exp_avg),
            exp_avg_sq: label(p.exp_avg_sq),
            source: match p.source {
                PairSource::Names => "names",
                PairSource::OptimizerOrder => "optimizer_order",
                PairSource::Client => "client",
            }
            .to_string(),
        })
        .collect();
    // Every tensor priced with its moments records the commit's betas.
    let adam_betas = m
        .tensors()
        .filter_map(|(_, e)| Betas::recorded(e.exactness.lossy()?))
        .next()
        .map(|b| b.describe());
    Ok(Shown {
        id,
        manifest: c.manifest,
        parents: c.parents,
        author: c.author,
        time: c.time.rfc3339(),
        message: c.message,
        step: c.step,
        metrics: Metrics(c.metrics),
        metadata: m.files.iter().flat_map(|f| f.metadata.clone()).collect(),
        properties: c.properties.into_iter().collect(),
        files: m
            .files
            .iter()
            .map(|f| FileInfo {
                path: f.path.clone(),
                format: f.format.name().to_string(),
                raw_bytes: f.len(),
                tensor_bytes: f.tensors().map(|e| e.header.data_len().unwrap_or(0)).sum(),
                tensors: f.tensors().count() as u32,
                executable: f.executable,
                note: f.note.clone(),
                metadata: f.metadata.clone(),
            })
            .collect(),
        raw_bytes: c.stats.raw_bytes,
        stored_bytes: c.stats.stored_bytes,
        tensors,
        pairs,
        adam_betas,
        expired_tensors,
    })
}
