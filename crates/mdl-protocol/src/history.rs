//! What a repository's history looks like on the wire, and in `mdl --json`: the log, one
//! commit shown, two commits compared, a branch moved and a reflog. The library builds these;
//! the server sends them as they serialize and the client reads them back.

use std::collections::BTreeMap;

use mdl_format::{ObjectId, Timestamp};
use serde::{Deserialize, Serialize};

/// One commit as `mdl log` shows it (and its stable `--json` form).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LogEntry {
    /// Commit id.
    pub id: ObjectId,
    /// Parent ids.
    pub parents: Vec<ObjectId>,
    /// Commit time, RFC 3339 UTC.
    pub time: String,
    /// Author.
    pub author: String,
    /// Message.
    pub message: String,
    /// Training step.
    pub step: Option<u64>,
    /// Metrics, as a name → value object.
    pub metrics: Metrics,
    /// Checkpoint size.
    pub raw_bytes: u64,
    /// Bytes this commit added to the store.
    pub stored_bytes: u64,
    /// Tensors stored lossily (0 for a lossless commit).
    pub lossy_tensors: u32,
    /// Branches and tags pointing here.
    pub refs: Vec<String>,
    /// Tensors a retention rule expired (a thinned commit when non-zero).
    #[serde(default)]
    pub expired_tensors: u32,
    /// How the commit was made: a merge's strategy (`merge.*`), the training code's git
    /// commit (`source.*`); see `Commit::properties`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
    /// History is cut here: its parents are not in this repository (a shallow clone).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut: bool,
    #[serde(skip)]
    /// Commit time (from `time` when read back from JSON).
    pub timestamp: Timestamp,
}

/// Metrics as an ordered list, serialised as a JSON object `{name: value}`.
#[derive(Clone, Debug, Default)]
pub struct Metrics(pub Vec<(String, f64)>);

impl<'de> Deserialize<'de> for Metrics {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let map = <BTreeMap<String, f64>>::deserialize(d)?;
        Ok(Metrics(map.into_iter().collect()))
    }
}

impl Serialize for Metrics {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

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
    /// The copy of the model that estimate is for (its pairing's weight pattern, `model.{}`
    /// or a mixed-precision run's `optim.{}.master`), recorded since one budget is shared by
    /// the copies (before, absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy: Option<String>,
    /// Retention re-encoded it more coarsely after the commit (`retention.coarsen_after`);
    /// the errors above include what that added.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub coarsened: bool,
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
    /// How the commit was made (`Commit::properties`), sorted by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
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
    /// Adam's betas the lossy estimate used and where they came from (`0.9,0.95 (recorded in
    /// optimizer.pt)`), when tensors were priced with their moments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adam_betas: Option<String>,
    /// How many tensors retention expired (a thinned commit when non-zero).
    #[serde(default)]
    pub expired_tensors: u32,
}

/// How a tensor differs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Same object in both.
    Unchanged,
    /// Different bytes; for floats of equal dtype and shape, `‖b − a‖ / ‖a‖`.
    Changed {
        /// Relative L2 norm of the change (`null` for non-float or reshaped tensors).
        rel_l2: Option<f64>,
        /// dtype or shape differs.
        reshaped: bool,
    },
    /// Only in B.
    Added,
    /// Only in A.
    Removed,
}

/// One tensor's line of a diff.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TensorDiff {
    /// The file it is in (in B for an added tensor, else in A).
    pub file: String,
    /// Tensor name.
    pub name: String,
    /// What happened to it.
    #[serde(flatten)]
    pub change: Change,
}

/// What happened to a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileChange {
    /// The same bytes in both.
    Unchanged,
    /// Different bytes.
    Changed,
    /// Only in B.
    Added,
    /// Only in A.
    Removed,
}

/// One file's line of a diff.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FileDiff {
    /// Its path.
    pub path: String,
    /// What happened to it.
    pub change: FileChange,
    /// Its size in A (absent when added).
    pub bytes_a: Option<u64>,
    /// Its size in B (absent when removed).
    pub bytes_b: Option<u64>,
}

/// Two commits compared file by file and tensor by tensor.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Diff {
    /// Every file of either tree, in path order.
    pub files: Vec<FileDiff>,
    /// Every tensor of A in tree order, then B's new ones. A tensor is matched by file and
    /// name, or by name alone where B has it once (a re-sharded checkpoint).
    pub tensors: Vec<TensorDiff>,
}

/// Where a branch was moved ([`reset`], [`force_branch`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchMove {
    /// The branch's short name.
    pub branch: String,
    /// Where it was (`None`: it did not exist, or had no commits yet).
    pub from: Option<ObjectId>,
    /// Where it is now.
    pub to: ObjectId,
}

/// One entry of a ref's reflog, as [`reflog`] lists it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReflogLine {
    /// Where the ref pointed before (`None`: it was created).
    pub old: Option<ObjectId>,
    /// Where it pointed after (`None`: it was deleted).
    pub new: Option<ObjectId>,
    /// When, in milliseconds since the Unix epoch.
    pub time_ms: i64,
    /// What moved it (`commit: step 1200`, `reset: moving to main~2`, `deleted`).
    pub message: String,
}
