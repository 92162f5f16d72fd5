//! `mdl show`: a commit and its manifest, tensor by tensor.

use mdl_codec::CodecTag;
use mdl_format::{Exactness, ObjectId};
use mdl_store::StoreError;
use serde::Serialize;

use crate::log::Metrics;
use crate::{revision, Repository, Result};

/// One tensor of a shown commit.
#[derive(Clone, Debug, Serialize)]
pub struct TensorInfo {
    /// Name.
    pub name: String,
    /// safetensors dtype name.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Tensor object id.
    pub id: ObjectId,
    /// Codec of its record.
    pub codec: String,
    /// Bytes of data.
    pub raw_bytes: u64,
    /// Size of its record.
    pub stored_bytes: u64,
    /// Delta base of the record, if it is a delta.
    pub base: Option<ObjectId>,
    /// Decode steps to reconstruct the tensor (0 for a self-contained record).
    pub depth: u32,
    /// Whether checkout reproduces it only approximately.
    pub lossy: bool,
    /// Relative error of a lossy tensor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rel_error: Option<f64>,
}

/// A commit with its manifest (the stable `--json` form of `mdl show`).
#[derive(Clone, Debug, Serialize)]
pub struct Shown {
    /// Commit id.
    pub id: ObjectId,
    /// Manifest id.
    pub manifest: ObjectId,
    /// Parents.
    pub parents: Vec<ObjectId>,
    /// Author.
    pub author: String,
    /// RFC 3339 UTC.
    pub time: String,
    /// Message.
    pub message: String,
    /// Training step.
    pub step: Option<u64>,
    /// Metrics.
    pub metrics: Metrics,
    /// The safetensors `__metadata__`.
    pub metadata: Vec<(String, String)>,
    /// Size of the checkpoint file.
    pub raw_bytes: u64,
    /// Bytes the commit added to the store.
    pub stored_bytes: u64,
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
}

/// Loads what `mdl show REV` prints.
pub fn show(repo: &Repository, rev: &str) -> Result<Shown> {
    let id = revision::resolve(repo, rev)?;
    let c = repo.load_commit(&id)?;
    let m = repo.load_manifest(&c.manifest)?;
    let meta = repo.store().meta().read()?;
    let mut tensors = Vec::with_capacity(m.entries.len());
    for e in &m.entries {
        let entry = meta.object(&e.id)?.ok_or(StoreError::Missing(e.id))?;
        tensors.push(TensorInfo {
            name: e.name.clone(),
            dtype: e.header.dtype.name().to_string(),
            shape: e.header.shape.clone(),
            id: e.id,
            codec: CodecTag::try_from(entry.codec)
                .map(|c| c.name().to_string())
                .unwrap_or_else(|_| format!("#{}", entry.codec)),
            raw_bytes: entry.content_len,
            stored_bytes: entry.stored_len,
            base: entry.base,
            depth: entry.depth,
            lossy: e.exactness.is_lossy(),
            rel_error: match e.exactness {
                Exactness::Lossy { rel_error, .. } => Some(rel_error),
                Exactness::Lossless => None,
            },
        });
    }
    Ok(Shown {
        id,
        manifest: c.manifest,
        parents: c.parents,
        author: c.author,
        time: c.time.rfc3339(),
        message: c.message,
        step: c.step,
        metrics: Metrics(c.metrics),
        metadata: m.metadata,
        raw_bytes: c.stats.raw_bytes,
        stored_bytes: c.stats.stored_bytes,
        tensors,
    })
}
