//! One interface over a repository wherever it is ([`Operations`]): implemented once for a
//! folder on this machine ([`Local`]), once for a repository behind `mdl serve` ([`Served`],
//! over HTTP) and once for a repository in object storage ([`InBucket`], through this machine's
//! replica). The CLI and the Python package open a location with [`open`] and call the same
//! methods whatever it is; an operation a backend cannot do answers [`Error::Unsupported`],
//! which says what to do instead.
//!
//! Adding a command: one method here (with its [`Operation`]), one implementation in each of
//! `local.rs`, `served.rs` and `bucket.rs`, then the CLI's argument and output.

mod bucket;
mod error;
mod local;
mod location;
mod open;
mod operation;
mod peer;
mod served;

use std::path::{Path, PathBuf};
use std::time::Duration;

use mdl::checkout::{CheckoutOptions, CheckoutOutcome};
use mdl::commit::{CommitOptions, CommitOutcome, DeferredReport, Staged};
use mdl::compact::{CompactOptions, CompactOutcome};
use mdl::engine::EngineChoice;
use mdl::fsck::{FsckReport, Rebuilt};
use mdl::log::LogEntry;
use mdl::merge::{MergeOptions, MergeOutcome};
use mdl::refs::{BranchMove, RefInfo, ReflogLine};
use mdl::{ObjectId, Progress};
use mdl_protocol::body::{GcAnswer, GcRequest};
use mdl_remote::TransferOutcome;

pub use bucket::InBucket;
pub use error::{code_of, Error, Result};
pub use local::Local;
pub use location::Location;
pub use open::{clone, init, open, Initialized};
pub use operation::{Backend, Operation};
pub use served::Served;

/// How a command reaches its repository.
#[derive(Clone, Debug)]
pub struct Access {
    /// The bearer token for a server (`--token`, `$MDL_TOKEN`); a remote's kept token is used
    /// when this is `None`.
    pub token: Option<String>,
    /// How long to wait for another process holding the repository.
    pub wait: Duration,
    /// What the lock says this process is doing.
    pub purpose: String,
    /// Whether a folder that a live `mdl serve` owns is reached through that server (the
    /// CLI), or opened here like any other (the Python package: since the server holds the
    /// lock only while it changes the repository, a training loop commits directly).
    pub follow_server: bool,
    /// With `-v`: say on stderr which codec engine was chosen and why.
    pub verbose: bool,
    /// Tensors the caller holds decoded, lent to the reads of a repository on this machine
    /// ([`mdl::Lent`]: a fetch verifies deltas over them against these bytes).
    pub lent: mdl::Lent,
}

impl Default for Access {
    fn default() -> Access {
        Access {
            token: None,
            wait: Duration::from_secs(60),
            purpose: format!("mdl (pid {})", std::process::id()),
            follow_server: true,
            verbose: false,
            lent: mdl::Lent::default(),
        }
    }
}

/// Which branches a listing names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Branches {
    /// The repository's own (`mdl branch`).
    Local,
    /// Remote-tracking branches only (`mdl branch -r`).
    Remote,
    /// Both (`mdl branch -a`).
    All,
}

/// A fetch, pull or push, with the other repository's URL.
#[derive(Debug)]
pub struct Transferred {
    /// Where the other repository is.
    pub url: String,
    /// What moved.
    pub outcome: TransferOutcome,
}

/// How much history a fetch takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum History {
    /// Every commit behind the fetched ones that this repository lacks (as far as a shallow
    /// clone's history goes).
    #[default]
    All,
    /// First this many more commits behind each place a shallow clone's history ends
    /// (`fetch --deepen N`).
    Deepen(u32),
    /// At most the newest this many commits of each branch fetched; history behind them is cut
    /// here as in a shallow clone (`fetch --depth N`: a follower that wants the newest weights,
    /// not the steps between).
    Newest(u32),
}

/// Every operation on a repository, whatever the backend.
pub trait Operations: Send + Sync {
    /// Which kind of backend this is.
    fn backend(&self) -> Backend;
    /// The folder or URL, as a user would name it.
    fn location(&self) -> String;

    /// Commits files and folders (`mdl commit`); `engine` overrides the `engine` setting on
    /// this machine. Where the repository is stored by this process, the files are read here
    /// and stored as [`Self::commit_staged`] stores them.
    fn commit(
        &self,
        paths: &[PathBuf],
        opts: &CommitOptions,
        engine: Option<EngineChoice>,
        progress: &dyn Progress,
    ) -> Result<CommitOutcome> {
        let staged = Staged::read(paths, opts.reading)?;
        self.commit_staged(staged, opts, engine, progress)
    }
    /// Commits what this process staged (a live state's buffers, files copied aside, already
    /// read files): only where this process can store it, on this machine or in object
    /// storage; a served repository refuses it.
    fn commit_staged(
        &self,
        staged: Staged,
        opts: &CommitOptions,
        engine: Option<EngineChoice>,
        progress: &dyn Progress,
    ) -> Result<CommitOutcome>;
    /// Writes a commit's files (`mdl checkout`).
    fn checkout(
        &self,
        rev: &str,
        out: &Path,
        opts: &CheckoutOptions,
        engine: Option<EngineChoice>,
        progress: &dyn Progress,
    ) -> Result<CheckoutOutcome>;
    /// After a commit through this handle that left re-encodes queued, the folder whose
    /// background `mdl maintenance` should do them now (asked once).
    fn maintenance_due(&self) -> Result<Option<PathBuf>>;
    /// Works the queue of deferred re-encodes (`mdl maintenance`); `background` yields to any
    /// other writer.
    fn maintenance(&self, background: bool) -> Result<DeferredReport>;

    /// History from `rev` (HEAD when `None`), newest first.
    fn log(&self, rev: Option<&str>, limit: Option<usize>) -> Result<Vec<LogEntry>>;
    /// History of every branch and tag, newest first.
    fn log_all(&self, limit: Option<usize>) -> Result<Vec<LogEntry>>;
    /// A commit with its files and tensors.
    fn show(&self, rev: &str) -> Result<mdl::show::Shown>;
    /// What changed from `a` to `b`.
    fn diff(&self, a: &str, b: &str) -> Result<mdl::diff::Diff>;

    /// Branches (`current` marks HEAD's).
    fn branches(&self, which: Branches) -> Result<Vec<RefInfo>>;
    /// Creates branch `name` at `rev` (HEAD's commit when `None`).
    fn create_branch(&self, name: &str, rev: Option<&str>) -> Result<ObjectId>;
    /// Creates or moves branch `name` (`branch --force`).
    fn force_branch(&self, name: &str, rev: Option<&str>) -> Result<BranchMove>;
    /// Deletes branch `name` (unless `force`, only when its commits stay reachable); the
    /// commit it named.
    fn delete_branch(&self, name: &str, force: bool) -> Result<ObjectId>;
    /// Tags.
    fn tags(&self) -> Result<Vec<RefInfo>>;
    /// Creates tag `name` at `rev`, annotated when `message` is given.
    fn create_tag(&self, name: &str, rev: Option<&str>, message: Option<&str>) -> Result<ObjectId>;
    /// Deletes tag `name`; the commit it named.
    fn delete_tag(&self, name: &str) -> Result<ObjectId>;
    /// Points HEAD at branch `name`.
    fn switch(&self, name: &str) -> Result<()>;
    /// Moves the current branch to `rev`.
    fn reset(&self, rev: &str) -> Result<BranchMove>;
    /// Merges the commits `revs` tensor by tensor into a new commit on `commit.branch` (the
    /// current branch when `None`), every merged commit a parent (`mdl merge`).
    fn merge(
        &self,
        revs: &[String],
        opts: &MergeOptions,
        commit: &CommitOptions,
        progress: &dyn Progress,
    ) -> Result<MergeOutcome>;
    /// A ref's history (HEAD's branch when `None`): its full name and entries.
    fn reflog(&self, name: Option<&str>) -> Result<(String, Vec<ReflogLine>)>;

    /// Every setting: key, value, whether it is the default.
    fn config(&self) -> Result<Vec<(String, String, bool)>>;
    /// Changes one setting; the key and value as kept.
    fn set_config(&self, key: &str, value: &str) -> Result<(String, String)>;

    /// Removes what nothing reaches (`mdl gc`).
    fn gc(&self, request: &GcRequest, progress: &dyn Progress) -> Result<GcAnswer>;
    /// Shortens delta chains (`mdl compact`).
    fn compact(&self, opts: &CompactOptions, progress: &dyn Progress) -> Result<CompactOutcome>;
    /// Checks everything (`mdl fsck`).
    fn fsck(&self, progress: &dyn Progress) -> Result<FsckReport>;
    /// Checks and repairs (`mdl fsck --repair`): the database rebuilt when it was damaged.
    fn fsck_repair(&self) -> Result<(Option<Rebuilt>, FsckReport)>;
    /// Totals (`mdl stats`); with `lossy`, HEAD's series under the lossy papers' accountings
    /// too (`mdl stats --lossy`).
    fn stats(&self, lossy: bool) -> Result<mdl::stats::Stats>;

    /// The configured remotes: name and URL.
    fn remotes(&self) -> Result<Vec<(String, String)>>;
    /// Adds remote `name` at `url`.
    fn add_remote(&self, name: &str, url: &str) -> Result<()>;
    /// Removes remote `name` and its tracking branches.
    fn remove_remote(&self, name: &str) -> Result<()>;
    /// Points remote `name` at `url`.
    fn set_remote_url(&self, name: &str, url: &str) -> Result<()>;
    /// Keeps (or with `None` forgets) a token for remote `name`.
    fn set_remote_token(&self, name: &str, token: Option<&str>) -> Result<()>;
    /// Fetches from remote `name` (`pull`: and moves the current branch after), taking the
    /// history `history` says.
    fn fetch(
        &self,
        name: &str,
        branch: Option<&str>,
        pull: bool,
        history: History,
        progress: &dyn Progress,
    ) -> Result<Transferred>;
    /// Waits until branch `branch` of remote `name` no longer points at `from`, at most
    /// `timeout` (a served remote holds the request until it moves): where it points then,
    /// `None` if it did not move in time.
    fn wait_remote_branch(
        &self,
        name: &str,
        branch: &str,
        from: Option<ObjectId>,
        timeout: Duration,
    ) -> Result<Option<ObjectId>>;
    /// Pushes to remote `name`.
    fn push(
        &self,
        name: &str,
        branch: Option<&str>,
        force: bool,
        progress: &dyn Progress,
    ) -> Result<Transferred>;
}
