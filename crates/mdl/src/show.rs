//! `mdl show`: a commit and its tree, file by file and tensor by tensor.

use mdl_codec::CodecTag;
use std::ops::Range;

use mdl_format::{ManifestView, PairSource};
use mdl_store::StoreError;

pub use mdl_protocol::history::{FileInfo, LossyInfo, Shown, ShownPair, TensorInfo};

use crate::log::Metrics;
use crate::lossy::betas::Betas;
use crate::{revision, view_manifest, Repository, Result};

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
        copy: word("copy"),
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
    Ok(show_page(repo, rev, 0..usize::MAX)?.0)
}

/// [`show`] with only the tensors numbered `page` (in tree then file order) described, and how
/// many there are: the manifest is read in place, so a page of a million-tensor commit holds
/// its bytes and the page, not every tensor described.
pub fn show_page(repo: &Repository, rev: &str, page: Range<usize>) -> Result<(Shown, usize)> {
    let showing = showing(repo, rev)?;
    let mut tensors = Vec::new();
    let count = showing.tensors(repo, page, |t| {
        tensors.push(t);
        Ok(())
    })?;
    let mut shown = showing.head;
    shown.tensors = tensors;
    Ok((shown, count))
}

/// A commit being shown: all that [`show`] says of it but its tensors, and its manifest's
/// bytes, from which [`Showing::tensors`] describes them one at a time.
pub struct Showing {
    /// What is shown, its `tensors` empty.
    pub head: Shown,
    manifest: Vec<u8>,
}

/// Loads the commit `rev` names to be shown (its manifest read in place and checked; every
/// tensor checked to be stored or expired).
pub fn showing(repo: &Repository, rev: &str) -> Result<Showing> {
    let id = revision::resolve(repo, rev)?;
    let c = repo.load_commit(&id)?;
    let bytes = repo.load_manifest_bytes(&c.manifest)?;
    let m = view_manifest(&c.manifest, &bytes)?;
    let meta = repo.store().meta().read()?;
    let mut expired_tensors = 0u32;
    for (_, e) in m.tensors() {
        let id = e.id();
        if meta.object(&id)?.is_none() {
            // Not in the store: expired by retention, or missing.
            meta.expired(&id)?.ok_or(StoreError::Missing(id))?;
            expired_tensors += 1;
        }
    }
    let pairs = shown_pairs(&m);
    // Every tensor priced with its moments records the commit's betas.
    let adam_betas = m
        .tensors()
        .filter(|(_, e)| e.is_lossy())
        .find_map(|(_, e)| Betas::recorded(e.exactness().lossy()?))
        .map(|b| b.describe());
    let head = Shown {
        id,
        manifest: c.manifest,
        parents: c.parents,
        author: c.author,
        time: c.time.rfc3339(),
        message: c.message,
        step: c.step,
        metrics: Metrics(c.metrics),
        metadata: m
            .files()
            .iter()
            .flat_map(|f| f.metadata())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        properties: c.properties.into_iter().collect(),
        files: m
            .files()
            .iter()
            .map(|f| FileInfo {
                path: f.path.to_string(),
                format: f.format.name().to_string(),
                raw_bytes: f.len(),
                tensor_bytes: f.tensor_bytes(),
                tensors: f.tensor_count(),
                executable: f.executable,
                note: f.note.to_string(),
                metadata: f
                    .metadata()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            })
            .collect(),
        raw_bytes: c.stats.raw_bytes,
        stored_bytes: c.stats.stored_bytes,
        tensors: Vec::new(),
        pairs,
        adam_betas,
        expired_tensors,
    };
    drop(meta);
    Ok(Showing {
        head,
        manifest: bytes,
    })
}

impl Showing {
    /// Hands `each` the description of every tensor numbered `page` (in tree then file order),
    /// its storage read from one snapshot of the index; returns how many tensors there are.
    pub fn tensors(
        &self,
        repo: &Repository,
        page: Range<usize>,
        mut each: impl FnMut(TensorInfo) -> Result<()>,
    ) -> Result<usize> {
        let m = view_manifest(&self.head.manifest, &self.manifest)?;
        let meta = repo.store().meta().read()?;
        for (n, (f, e)) in m.tensors().enumerate().skip(page.start) {
            if n >= page.end {
                break;
            }
            let id = e.id();
            // A tensor retention deleted is shown with what is known of it.
            let mut coarsened = None;
            let (codec, raw_bytes, stored_bytes, base, depth, expired) = match meta.object(&id)? {
                Some(entry) => (
                    {
                        coarsened = crate::coarsen::coarsening(repo.store(), &id, &entry)?;
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
                    let x = meta.expired(&id)?.ok_or(StoreError::Missing(id))?;
                    let why = format!("{} at {}", x.rule, x.time.rfc3339());
                    ("expired".into(), x.content_len, 0, None, 0, Some(why))
                }
            };
            let exactness = e.exactness();
            each(TensorInfo {
                file: m.files()[f].path.to_string(),
                name: e.name.to_string(),
                dtype: e.dtype().name().to_string(),
                shape: e.shape(),
                id,
                codec,
                raw_bytes,
                stored_bytes,
                base,
                depth,
                lossy: exactness.is_lossy(),
                lossy_info: exactness.lossy().map(|l| match &coarsened {
                    Some(c) => with_coarsening(lossy_info(l), c),
                    None => lossy_info(l),
                }),
                expired,
            })?;
        }
        Ok(m.tensor_count() as usize)
    }
}

/// The moment pairs of `m`, each tensor named `FILE: NAME`.
fn shown_pairs(m: &ManifestView<'_>) -> Vec<ShownPair> {
    if m.pairs().next().is_none() {
        return Vec::new();
    }
    let labels: Vec<(&str, &str)> = m
        .tensors()
        .map(|(f, e)| (m.files()[f].path, e.name))
        .collect();
    let label = |i: u32| {
        labels
            .get(i as usize)
            .map_or_else(String::new, |(f, n)| format!("{f}: {n}"))
    };
    m.pairs()
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
        .collect()
}
