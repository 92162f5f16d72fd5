use std::path::PathBuf;

use mdl_format::safetensors::SafetensorsError;
use mdl_format::{FormatError, RefNameError};
use mdl_store::StoreError;

/// Everything that can go wrong in an mdl operation. Messages are one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The repository store failed (I/O, corruption, lock, read-only).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The input file could not be read.
    #[error("cannot read {}: {source}", shown(path))]
    Input {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file being committed was written while the commit read it.
    #[error(
        "{} changed while it was being committed; nothing was recorded (write each \
         checkpoint to a new file, or to a temporary one renamed over it, or let the commit \
         finish before writing it again)",
        shown(path)
    )]
    Changed {
        /// The file.
        path: PathBuf,
    },
    /// The input file is not a valid safetensors file.
    #[error("{}: {}", shown(path), not_safetensors(source, found))]
    InvalidInput {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: SafetensorsError,
        /// What the file is instead, when its first bytes say (`a zip archive`, `JSON text`).
        found: Option<&'static str>,
    },
    /// A file whose name or first bytes say it is a `torch.save` checkpoint does not parse as
    /// one (a truncated archive); `--as-bytes` stores such files as bytes.
    #[error("{}: {why}", shown(path))]
    DamagedCheckpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong, in a sentence that ends with what to do.
        why: String,
    },
    /// A commit over one of the repository's limits (`limits.*`).
    #[error("{0}")]
    TooLarge(String),
    /// Commits cannot be assembled into one ([`crate::assemble`]).
    #[error("cannot assemble a commit: {0}")]
    Assemble(String),
    /// Commits cannot be merged as asked ([`crate::merge`]).
    #[error("cannot merge: {0}")]
    Merge(String),
    /// A commit run in the background ([`crate::background`]) failed: its error, kept whole
    /// so that callers can still tell what kind of failure it was.
    #[error("background commit failed: {0}")]
    Background(Failure),
    /// A revision names nothing.
    #[error("unknown revision {0:?}")]
    UnknownRevision(String),
    /// A name that is no branch, tag or commit, in a repository whose branches are elsewhere
    /// (a new repository's run committed to a branch of its own: `main~2` names nothing).
    #[error("unknown revision {rev:?}: the branches are {}", branches.join(", "))]
    NotABranchHere {
        /// What was typed.
        rev: String,
        /// The branches, HEAD's marked.
        branches: Vec<String>,
    },
    /// A revision that is no branch or tag and too short to be an id prefix.
    #[error("unknown revision {0:?}: not a branch or tag, and an id prefix needs at least {min} hex digits", min = mdl_format::IdPrefix::MIN_LEN)]
    ShortIdPrefix(String),
    /// An id prefix matches several commits.
    #[error("ambiguous revision {rev:?}: matches {}", candidates.join(", "))]
    AmbiguousRevision {
        /// What was typed.
        rev: String,
        /// Short ids of the matching commits.
        candidates: Vec<String>,
    },
    /// A revision walks past the root (`main~99`) or asks for a parent a commit does not
    /// have (`HEAD^3`).
    #[error("revision {rev:?}: {why}")]
    NoSuchAncestor {
        /// What was typed.
        rev: String,
        /// Which commit lacks which parent.
        why: String,
    },
    /// A branch that has no commits yet.
    #[error("branch {0} has no commits yet")]
    UnbornBranch(String),
    /// A branch or tag name breaks the naming rules.
    #[error(transparent)]
    InvalidName(#[from] RefNameError),
    /// Creating a branch or tag that exists.
    #[error("{kind} {name} already exists")]
    RefExists {
        /// "branch" or "tag".
        kind: &'static str,
        /// The name.
        name: String,
    },
    /// Naming a branch or tag that does not exist.
    #[error("no {kind} named {name}")]
    NoSuchRef {
        /// "branch" or "tag".
        kind: &'static str,
        /// The name.
        name: String,
    },
    /// Deleting a branch whose commits nothing else reaches, without `force`.
    #[error("branch {name} has {} that no other branch or tag reaches; delete it anyway with -D (its reflog keeps them until gc expires it)", if *commits == 1 { "1 commit".to_string() } else { format!("{commits} commits") })]
    UnmergedBranch {
        /// The branch.
        name: String,
        /// How many commits would become unreachable.
        commits: usize,
    },
    /// Deleting the branch HEAD points at.
    #[error("cannot delete branch {0}: it is the current branch (mdl switch to another first)")]
    DeleteCurrentBranch(String),
    /// `checkout` would overwrite a file.
    #[error("{} exists; use --force to overwrite it", .0.display())]
    OutputExists(PathBuf),
    /// `checkout --path` names nothing in the commit's tree.
    #[error("no file or folder {path:?} in commit {commit}")]
    NoSuchPath {
        /// The path asked for.
        path: String,
        /// The commit (short id).
        commit: String,
    },
    /// An output path inside `.mdl/`, where it could replace the repository's own files.
    #[error("{} is inside the repository's .mdl directory; write the checkpoint elsewhere", .0.display())]
    OutputInRepository(PathBuf),
    /// Writing the output file failed.
    #[error("cannot write {}: {source}", path.display())]
    Output {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A metric was malformed.
    #[error("invalid metric {0:?}: expected KEY=NUMBER with a unique, non-empty KEY")]
    InvalidMetric(String),
    /// A configuration value is not allowed.
    #[error("invalid value {value:?} for {key}: expected {expected}")]
    InvalidConfig {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What is allowed.
        expected: &'static str,
    },
    /// `--eval-cmd` failed or printed no number.
    #[error("evaluation command {cmd:?} failed: {why}")]
    EvalCommand {
        /// The command as given.
        cmd: String,
        /// What went wrong.
        why: String,
    },
    /// A configuration key mdl does not know.
    #[error("unknown configuration key {0:?} (mdl config lists the keys)")]
    UnknownConfig(String),
    /// A stored object could not be parsed.
    #[error("object {id} is corrupt: {source}")]
    Corrupt {
        /// The object.
        id: mdl_format::ObjectId,
        /// What is wrong.
        source: FormatError,
    },
    /// A codec failed to encode a tensor being stored: a fault of the encoder (or of the
    /// engine it ran on), not damage to anything stored; nothing was published.
    #[error("cannot encode tensor {id}: {source}")]
    Encode {
        /// The tensor.
        id: mdl_format::ObjectId,
        /// What the codec reported.
        source: FormatError,
    },
    /// An object has the wrong kind for where it is referenced.
    #[error("object {id} is a {found}, expected a {expected}")]
    WrongKind {
        /// The object.
        id: mdl_format::ObjectId,
        /// What the reference requires.
        expected: &'static str,
        /// What it is.
        found: &'static str,
    },
    /// A pack stream or ref update from another repository was refused.
    #[error("transfer refused: {0}")]
    BadTransfer(String),
    /// A pack stream ended, or its connection failed, before its end: what arrived whole was
    /// verified and kept (indexed, named by no ref), and the start of the record it ended
    /// inside, so the same transfer again sends only the rest.
    #[error("transfer cut off: {why} ({kept} objects that arrived whole were verified and kept{}: run the command again to go on from there)", started_note(*started))]
    TransferCut {
        /// What ended it.
        why: String,
        /// Objects kept.
        kept: u64,
        /// Bytes kept of the record it ended inside.
        started: u64,
    },
    /// A pack's record is a delta of one the pack did not send first: the sender re-encoded it
    /// (a deferred re-encode, compaction) after the transfer was planned. What arrived before
    /// stays; planning again sends the rest in an order that holds.
    #[error("transfer refused: {id} is a delta of {base}, which was not sent first")]
    BaseNotSent {
        /// The record.
        id: mdl_format::ObjectId,
        /// Its base.
        base: mdl_format::ObjectId,
    },
    /// A fetched pack's record is longer than the plan said: the sender re-encoded it after
    /// planning (a compaction), or means harm. Planning again sends it as it is now; a record
    /// is never read past its planned length.
    #[error("transfer refused: the record of {id} is {sent} bytes, {planned} were planned")]
    PlanChanged {
        /// The record.
        id: mdl_format::ObjectId,
        /// Its length in the plan.
        planned: u64,
        /// The length it was sent with.
        sent: u64,
    },
    /// Publishing a commit (a pack's manifests and commits, or a ref update) found part of what
    /// it needs gone: another transfer counted an object as present and gc removed it since.
    /// Nothing was published; sending the objects again succeeds.
    #[error("cannot publish: {0} is not in the repository (removed by gc during the transfer?); send it again")]
    Incomplete(String),
    /// A branch update that would drop commits.
    #[error(
        "{name}: {new} does not descend from {old} (not a fast-forward; fetch and merge, or force)"
    )]
    NotFastForward {
        /// The ref.
        name: String,
        /// Its current value.
        old: mdl_format::ObjectId,
        /// The proposed value.
        new: mdl_format::ObjectId,
    },
    /// Checking out a commit whose tensors a retention rule deleted.
    #[error("commit {commit} is thinned: {} expired by retention ({}{}); --skip-expired writes the checkpoint without them", tensors.len(), tensors.iter().take(3).cloned().collect::<Vec<_>>().join(", "), if tensors.len() > 3 { ", …" } else { "" })]
    Expired {
        /// The commit (short id).
        commit: String,
        /// Names of the expired tensors.
        tensors: Vec<String>,
    },
    /// `--engine gpu` (or `engine = gpu`) on a machine where the GPU engine cannot start.
    #[error("no GPU engine: {0} (use --engine cpu or auto)")]
    GpuUnavailable(String),
    /// A duration argument or setting is malformed.
    #[error("invalid duration {0:?}: expected a number with a unit, e.g. 0s, 90m, 1h, 30d, 2w")]
    InvalidDuration(String),
}

/// A path as a message shows it: as it is, or quoted with its control characters escaped
/// (a file name holding a newline or an escape sequence must not reach a terminal raw).
pub(crate) fn shown(path: &std::path::Path) -> String {
    let s = path.to_string_lossy();
    if s.chars().any(char::is_control) {
        format!("{s:?}")
    } else {
        s.into_owned()
    }
}

/// Why a file is not safetensors, for [`Error::InvalidInput`]: what it is, when known.
pub fn not_safetensors(source: &SafetensorsError, found: &Option<&'static str>) -> String {
    match found {
        Some(what) => format!("not a safetensors file: it is {what}"),
        None => format!("invalid safetensors file: {source}"),
    }
}

/// Why a background commit failed ([`crate::background`]): the storing side's own error.
pub type Failure = std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>;

/// `e` as a [`Failure`].
pub fn failure(e: impl std::error::Error + Send + Sync + 'static) -> Failure {
    std::sync::Arc::new(e)
}

/// What a [`Error::TransferCut`] says of the record it ended inside.
fn started_note(started: u64) -> String {
    match started {
        0 => String::new(),
        n => format!(", and the first {n} bytes of the one it ended inside"),
    }
}
