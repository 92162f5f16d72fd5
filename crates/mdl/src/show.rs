//! `mdl show`: a commit and its tree, file by file and tensor by tensor.

use mdl_codec::CodecTag;
use mdl_format::{ObjectId, PairSource};
use mdl_store::StoreError;
use serde::{Deserialize, Serialize};

use crate::log::Metrics;
use crate::{revision, Repository, Result};

/// One file of a shown commit.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FileInfo {
    /// Its path in the tree.
    pub path: String,
    /// How it was split: `safetensors`, `torch` or `bytes`.
    pub format: String,
    /// Its size.
    pub raw_bytes: u64,
    /// How many of its bytes are tensors.
    pub tensor_bytes: u64,
    /// How many tensors it holds.
    pub tensors: u32,
    /// Whether checkout marks it executable.
    #[serde(default)]
    pub executable: bool,
    /// Why a file that looked splittable was stored as bytes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// A safetensors file's `__metadata__`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metadata: Vec<(String, String)>,
}

/// A parameter and its Adam moments, as the manifest records them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShownPair {
    /// The parameter, `FILE: NAME`.
    pub param: String,
    /// Its `exp_avg`.
    pub exp_avg: String,
    /// Its `exp_avg_sq`.
    pub exp_avg_sq: String,
    /// How they were paired: `names` (the `lossy.moments` patterns), `optimizer_order` or
    /// `client`.
    pub source: String,
}

/// One tensor of a shown commit.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TensorInfo {
    /// The file it is in.
    #[serde(default)]
    pub file: String,
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
    /// How a lossy tensor was made and what it cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lossy_info: Option<LossyInfo>,
    /// Set when a retention rule deleted the tensor: which rule, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired: Option<String>,
}

/// A lossy tensor's settings and measured errors.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LossyInfo {
    /// The settings as recorded (`quant bins=… prune=… …` or `trim bits=…`).
    pub settings: String,
    /// Code table size requested (quant).
    pub bins: Option<u32>,
    /// Fraction pruned to zero (quant).
    pub prune: Option<f64>,
    /// Fraction kept exactly (quant).
    pub protect: Option<f64>,
    /// Pruning metric (quant).
    pub metric: Option<String>,
    /// Sensitivity source: `moments` or `magnitude` (quant).
    pub sensitivity: Option<String>,
    /// Mantissa bits kept (trim).
    pub trim_bits: Option<u32>,
    /// Largest absolute error.
    pub max_abs_error: f64,
    /// Relative L2 error.
    pub rel_error: f64,
    /// Estimated loss change, when moments were known.
    pub est_delta_loss: Option<f64>,
    /// Retention re-encoded it more coarsely after the commit (`retention.coarsen_after`);
    /// the errors above include what that added.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub coarsened: bool,
}

impl LossyInfo {
    fn new(l: &mdl_format::Lossy) -> LossyInfo {
        let word = |key: &str| {
            l.settings
                .split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
                .map(str::to_string)
        };
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

    /// The errors once a coarsened record's own are added.
    fn coarsened(mut self, c: &mdl_format::record::Coarsened) -> LossyInfo {
        (self.max_abs_error, self.rel_error) =
            crate::coarsen::combined_errors(self.max_abs_error, self.rel_error, c);
        self.coarsened = true;
        self
    }
}

/// A commit with its manifest (the stable `--json` form of `mdl show`).
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    /// The safetensors `__metadata__` of its files, in tree order.
    pub metadata: Vec<(String, String)>,
    /// Size of the checkpoint's files.
    pub raw_bytes: u64,
    /// Bytes the commit added to the store.
    pub stored_bytes: u64,
    /// Files in path order.
    #[serde(default)]
    pub files: Vec<FileInfo>,
    /// Tensors in tree and file order.
    pub tensors: Vec<TensorInfo>,
    /// Parameters paired with their moments (the others' lossy settings say
    /// `sensitivity=magnitude`).
    #[serde(default)]
    pub pairs: Vec<ShownPair>,
    /// How many tensors retention expired (a thinned commit when non-zero).
    #[serde(default)]
    pub expired_tensors: u32,
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
                Some(c) => LossyInfo::new(l).coarsened(c),
                None => LossyInfo::new(l),
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
        expired_tensors,
    })
}
