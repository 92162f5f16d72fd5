//! What an operation did, on the wire and in `mdl --json`: a commit (with its lossy search), a
//! checkout, a compaction, a gc (with its coarsening), an fsck and the repository's totals.

use std::path::PathBuf;

use mdl_format::ObjectId;
use serde::{Deserialize, Serialize};

/// What a commit did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CommitOutcome {
    /// The new commit.
    pub id: ObjectId,
    /// The branch it is on (short name).
    pub branch: String,
    /// Size of the committed files.
    pub raw_bytes: u64,
    /// Bytes of records added to the store.
    pub stored_bytes: u64,
    /// `raw_bytes / stored_bytes` (infinite when nothing new was stored; JSON null then).
    #[serde(deserialize_with = "null_is_infinite")]
    pub ratio: f64,
    /// Wall time.
    pub seconds: f64,
    /// Tensors in the checkpoint.
    pub tensors: u32,
    /// Tensors not already stored.
    pub new_tensors: u32,
    /// Tensors stored lossily.
    pub lossy_tensors: u32,
    /// The configuration search, for a lossy commit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchSummary>,
}

/// Reads a ratio that JSON wrote as null (serde_json writes non-finite numbers so).
fn null_is_infinite<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

/// The outcome of the configuration search for one checkpoint.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SearchSummary {
    /// The commit's loss budget (`ε × loss` or `ε`): what every priced parameter's estimate
    /// together may spend, whatever copy of the model it belongs to.
    pub budget: f64,
    /// The loss the budget is relative to, when known.
    pub loss: Option<f64>,
    /// Estimated loss change of the chosen configurations, summed over every priced
    /// parameter (at most `budget`).
    pub est_delta_loss: f64,
    /// That sum by copy of the model (the weights of one pairing pattern: `model.{}`, a mixed-
    /// precision run's `optim.{}.master`), when parameters were priced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<CopyEstimate>,
    /// Configurations scored.
    pub scored: usize,
    /// Tensors searched from the whole grid (a branch's first lossy commit) or from the
    /// previous configuration's neighbourhood.
    pub guided: usize,
    /// Tensors searched in a neighbourhood.
    pub neighbourhood: usize,
    /// Quantized tensors.
    pub quantized: usize,
    /// Parameters kept lossless because no configuration fitted the budget.
    pub kept_exact: usize,
    /// Parameters quantized under the loss estimate (with their moments).
    #[serde(default)]
    pub priced: usize,
    /// Parameters quantized under the relative-error rule alone (no moments, or all-zero ones:
    /// each within ε relative L2 error, which bounds no loss).
    #[serde(default)]
    pub relative: usize,
    /// Candidate checkpoints scored by `--eval-cmd`.
    pub evaluations: usize,
    /// Adam's betas the estimate used and where they came from (`0.9,0.95 (recorded in
    /// optimizer.pt)`), when parameters were priced with their moments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adam_betas: Option<String>,
}

/// One copy of the model's share of a lossy commit's estimated loss change.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CopyEstimate {
    /// The copy: its pairing's weight pattern (`model.{}`), `by-order` for parameters paired
    /// with their moments by the optimizer's order, `client` for pairs the Python client gave.
    pub copy: String,
    /// Parameters of it priced.
    pub priced: usize,
    /// Their estimated loss change, summed.
    pub est_delta_loss: f64,
}

/// What a checkout wrote.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CheckoutOutcome {
    /// The commit written.
    pub id: ObjectId,
    /// The output file or folder.
    pub path: PathBuf,
    /// Bytes written.
    pub bytes: u64,
    /// Files written.
    #[serde(default = "one")]
    pub files: u32,
    /// Whether some tensors are lossy reconstructions (written in their original dtypes).
    pub lossy: bool,
    /// How many.
    pub lossy_tensors: u32,
    /// What retention expired and was left out (`skip_expired`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

fn one() -> u32 {
    1
}

/// Options of a compaction.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CompactOptions {
    /// Longest chain allowed afterwards (default: `delta.max_depth`).
    pub max_depth: Option<u32>,
    /// Plan and report, change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// What a compaction did (or, with `dry_run`, would do).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CompactOutcome {
    /// The cap applied.
    pub max_depth: u32,
    /// Nothing was changed.
    pub dry_run: bool,
    /// Tensors given self-contained records.
    pub reencoded: u64,
    /// Stored bytes of all tensor records before.
    pub bytes_before: u64,
    /// After (estimated with `dry_run`: a new base is assumed to cost what its chain's base
    /// costs).
    pub bytes_after: u64,
    /// Longest chain (decode steps) before.
    pub longest_before: u32,
    /// After.
    pub longest_after: u32,
    /// Mean chain depth over the tensors of branch tips, before.
    pub tip_depth_before: f64,
    /// After.
    pub tip_depth_after: f64,
    /// Tensors a concurrent change re-encoded or removed before compaction reached them
    /// (left as they were).
    pub skipped: u64,
}

/// What a gc removed (or, with `dry_run`, would remove).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GcOutcome {
    /// Nothing was changed.
    pub dry_run: bool,
    /// Unreachable commits deleted.
    pub commits: u64,
    /// Unreachable manifests deleted.
    pub manifests: u64,
    /// Unreachable tensors deleted.
    pub tensors: u64,
    /// Tensors deleted by retention (recorded as expired).
    pub expired: u64,
    /// Commits thinned by retention in this run.
    pub thinned_commits: u64,
    /// Kept tensors re-encoded because their delta base was deleted.
    pub reencoded: u64,
    /// Unreachable objects kept because they are younger than the grace period, or because a
    /// commit that young names them.
    pub kept_young: u64,
    /// Reflog entries deleted.
    pub reflog_expired: u64,
    /// Leftover files removed: unindexed records, temporaries, abandoned uploads.
    pub leftover_files: u64,
    /// Bytes freed on disk (records and leftovers).
    pub bytes_freed: u64,
    /// Moments of commits behind the tips re-encoded more coarsely (`retention.coarsen_after`).
    #[serde(default)]
    pub coarsened: Coarsening,
}

/// What a coarsening pass did (or, dry, would do).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Coarsening {
    /// Moment tensors re-encoded.
    pub tensors: u64,
    /// Their records' bytes before.
    pub bytes_before: u64,
    /// Their records' bytes after (0 in a dry run).
    pub bytes_after: u64,
}

/// What fsck found.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FsckReport {
    /// Objects decoded and verified.
    pub objects_checked: u64,
    /// Commits reachable from refs.
    pub commits_reachable: u64,
    /// Problems: anything here means the repository is damaged.
    pub problems: Vec<String>,
    /// Record files no index entry names (left by interrupted commits; harmless, `gc` removes).
    pub unindexed_records: u64,
    /// Temporary files left by interrupted writes (harmless).
    pub temp_files: Vec<PathBuf>,
    /// Tensors that reachable commits name and a retention rule deleted on purpose (expected,
    /// not problems).
    pub expired: u64,
    /// Longest delta chain (decode steps).
    pub longest_chain: u32,
    /// Reachable commits where history was cut on purpose (a shallow clone): their parents
    /// are not here, and that is not a problem.
    #[serde(default)]
    pub cut: u64,
    /// Leftover files `--repair` removed.
    pub repaired: Vec<PathBuf>,
    /// `meta.redb` failed redb's integrity check (`--repair` rebuilds it).
    pub database_damaged: bool,
    /// The journal disagreed with `meta.redb` (`--repair` rewrites it from the database).
    pub journal_differs: bool,
}

impl FsckReport {
    /// Whether the repository is sound.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Repository totals (the stable `--json` form of `mdl stats`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stats {
    /// Commits.
    pub commits: u64,
    /// Objects in the index (tensors, manifests, commits).
    pub objects: u64,
    /// Bytes of all committed checkpoint files together.
    pub raw_bytes: u64,
    /// Bytes of all records.
    pub stored_bytes: u64,
    /// `raw_bytes / stored_bytes`.
    pub ratio: f64,
    /// Commits whose reverse re-encodes are still queued (`delta.defer`): until `mdl maintenance`
    /// (or the background run a commit starts) has done them, `stored_bytes` is larger than it
    /// will be.
    #[serde(default)]
    pub pending_reencodes: u64,
    /// Bytes of decoded chain ends kept beside the records (`.mdl/tips`: a lossy commit's
    /// residual tensors, so that the next commit and a checkout of it do not decode their
    /// chains); not counted in `stored_bytes`, and made again by the next lossy commit.
    #[serde(default)]
    pub tips_bytes: u64,
    /// HEAD's series under the lossy papers' accountings (`mdl stats --lossy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lossy: Option<Accounting>,
}

/// A series' stored bytes counted as the papers mdl's lossy mode builds on count them (`mdl
/// stats --lossy`): HEAD's history, oldest first, each object counted once, at the first
/// commit that names it, with the bytes of its record as stored (a delta its delta).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Accounting {
    /// Commits in the series.
    pub commits: u64,
    /// The model's weights: every copy (a mixed-precision run's bf16 weights and its fp32
    /// master alike), float tensors that are not optimizer state.
    pub weights: RoleBytes,
    /// Adam's first moments.
    pub exp_avg: RoleBytes,
    /// Adam's second moments.
    pub exp_avg_sq: RoleBytes,
    /// Everything else: other tensors, files stored as bytes.
    pub other: RoleBytes,
    /// mdl's own: every byte of every checkpoint over every stored byte they reach (manifests
    /// and commits included).
    pub ratio: f64,
    /// DynaQuant's: the weights alone, the whole series, against fp32 (4 bytes an element).
    pub dynaquant: f64,
    /// ExCP's: the weights and both moments against fp32, over the commits after the first
    /// (the checkpoints stored as deltas).
    pub excp: f64,
}

/// Elements, checkpoint bytes and stored bytes of one role over a series.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RoleBytes {
    /// Elements of every checkpoint's tensors of this role (for bytes: their length).
    pub elements: u64,
    /// Their bytes in the checkpoints, in their own dtypes.
    pub raw_bytes: u64,
    /// Stored bytes of the records they first name.
    pub stored_bytes: u64,
}
