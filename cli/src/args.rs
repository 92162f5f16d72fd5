//! The command line: every command, its arguments and its options (clap), and the options of a
//! commit as the library takes them.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Clone, Parser)]
#[command(
    name = "mdl",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("MDL_BUILD_COMMIT"), ")"),
    about = "Version control for deep-learning checkpoints"
)]
pub(crate) struct Cli {
    /// Run as if started in DIR; a URL runs the command on a server (http://HOST:PORT/REPO) or
    /// on a repository in object storage (s3://BUCKET/PREFIX; this machine's cache of it in
    /// $MDL_CACHE_DIR, at most $MDL_CACHE_SIZE of records, default 50G).
    #[arg(short = 'C', global = true, env = "MDL_DIR", value_name = "DIR")]
    pub(crate) dir: Option<PathBuf>,
    /// Bearer token for servers.
    #[arg(long, global = true, env = "MDL_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// Seconds a writer waits for another writer, and any command for a publish in progress.
    #[arg(long, global = true, default_value_t = 60, value_name = "SECS")]
    pub(crate) wait: u64,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// More diagnostics on stderr.
    #[arg(short, long, global = true)]
    pub(crate) verbose: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

impl Cli {
    /// Where `-C` says the repository is (the current folder by default).
    pub(crate) fn location(&self) -> anyhow::Result<mdl_ops::Location> {
        let dir = self.dir.as_deref().unwrap_or(std::path::Path::new("."));
        Ok(mdl_ops::Location::parse(dir)?)
    }

    /// How this command reaches its repository.
    pub(crate) fn access(&self) -> mdl_ops::Access {
        mdl_ops::Access {
            token: self.token.clone(),
            wait: std::time::Duration::from_secs(self.wait),
            purpose: format!(
                "mdl {}",
                std::env::args().skip(1).collect::<Vec<_>>().join(" ")
            ),
            follow_server: true,
            verbose: self.verbose,
            lent: mdl::Lent::default(),
        }
    }
}

#[derive(Clone, Subcommand)]
pub(crate) enum Command {
    /// Create a repository (in DIR or the current directory).
    Init {
        #[arg(value_name = "DIR")]
        path: Option<PathBuf>,
    },
    /// Commit a checkpoint: files (safetensors, torch.save archives, anything else) and
    /// directories of them.
    Commit(CommitArgs),
    /// Write a commit's files: one file to OUTPUT, a tree into the folder OUTPUT.
    Checkout {
        rev: String,
        #[arg(short, long)]
        output: PathBuf,
        /// Overwrite OUTPUT if it exists; write a tree into a folder that is not empty.
        #[arg(long)]
        force: bool,
        /// fsync each file before renaming it into place.
        #[arg(long)]
        sync: bool,
        /// Write a thinned commit without what retention expired.
        #[arg(long)]
        skip_expired: bool,
        /// Only this file, or the files under this folder, of the commit's tree.
        #[arg(long, value_name = "PATH")]
        path: Option<String>,
        /// Where the codec kernels run: auto, cpu or gpu (default: the `engine` setting).
        #[arg(long, value_name = "auto|cpu|gpu")]
        engine: Option<String>,
        /// OUTPUT holds the files of REV2 (as checked out): only the tensors that changed
        /// are written, in place (a file whose layout changed is written whole).
        #[arg(long, value_name = "REV2")]
        since: Option<String>,
    },
    /// Show or set repository configuration (no arguments: every key with its value).
    Config {
        key: Option<String>,
        value: Option<String>,
    },
    /// Show history, newest first.
    Log {
        rev: Option<String>,
        #[arg(short = 'n', long = "max-count")]
        n: Option<usize>,
        /// Draw the history's lanes beside it.
        #[arg(long)]
        graph: bool,
        /// Every branch's, tag's and remote-tracking branch's history, not only REV's.
        #[arg(long, conflicts_with = "rev")]
        all: bool,
    },
    /// Show a commit and its tensors.
    Show {
        /// The commit (a branch, tag, id prefix, REV~N, REV^N).
        #[arg(default_value = "HEAD")]
        rev: String,
    },
    /// Compare two commits tensor by tensor: a summary, then each file and tensor.
    Diff {
        /// The older side.
        a: String,
        /// The newer side.
        #[arg(default_value = "HEAD")]
        b: String,
        /// List only what changed, was added or was removed (the summary still counts all).
        #[arg(long)]
        changed: bool,
    },
    /// List, create or delete branches.
    Branch {
        name: Option<String>,
        rev: Option<String>,
        /// Delete NAME; refused when no other branch or tag reaches its commits.
        #[arg(short = 'd', long = "delete", value_name = "NAME", conflicts_with_all = ["name", "rev", "force_delete"])]
        delete: Option<String>,
        /// Delete NAME even so (its reflog keeps its commits until gc expires it).
        #[arg(short = 'D', value_name = "NAME", conflicts_with_all = ["name", "rev"])]
        force_delete: Option<String>,
        /// Move NAME to REV (HEAD) if it exists; its reflog records where it was.
        #[arg(short = 'f', long, requires = "name")]
        force: bool,
        /// List remote-tracking branches too (REMOTE/BRANCH, as fetch and pull last saw them).
        #[arg(short = 'a', long, conflicts_with_all = ["name", "delete", "force_delete", "remotes"])]
        all: bool,
        /// List only remote-tracking branches.
        #[arg(short = 'r', long, conflicts_with_all = ["name", "delete", "force_delete"])]
        remotes: bool,
    },
    /// Point HEAD at a branch.
    Switch { branch: String },
    /// Move the current branch to REV, wherever it is (an ancestor, another branch's commit):
    /// the way out of a diverged branch. Its reflog records where it was.
    Reset { rev: String },
    /// Merge the weights of several branches or commits into one checkpoint, committed on the
    /// current branch with every merged commit as a parent: a weighted average (`linear`, a
    /// model soup), task arithmetic or TIES over a base. Float tensors are combined in fp32
    /// (fp64 for fp64) and rounded back to their dtype; identical tensors and everything that is
    /// not a float tensor are taken from the first REV as they are; the tree is the first REV's.
    /// Optimizer, scheduler and RNG state are left out unless --optimizer is given.
    Merge {
        /// The branches, tags or commits to merge (at least two), in the order of --weights.
        #[arg(required = true, num_args = 2..)]
        revs: Vec<String>,
        /// How to combine: linear (a weighted average), task-arithmetic (the base plus the
        /// weighted sum of each REV's difference from it) or ties (those differences trimmed
        /// to their largest --density, signs elected, agreeing entries averaged).
        #[arg(
            long,
            default_value = "linear",
            value_name = "linear|task-arithmetic|ties"
        )]
        strategy: String,
        /// One weight per REV, comma-separated. Default: equal weights summing to 1 for
        /// linear (which always divides by their sum), 1 each for the others.
        #[arg(long, value_delimiter = ',', value_name = "W,W,…")]
        weights: Option<Vec<f64>>,
        /// The base of task-arithmetic and ties. Default: the REVs' nearest common ancestor.
        #[arg(long, value_name = "REV")]
        base: Option<String>,
        /// The fraction of each difference's entries TIES keeps (largest magnitudes first).
        #[arg(long, default_value_t = 0.2)]
        density: f64,
        /// Merge optimizer, scheduler and RNG state too (moments averaged linearly whatever
        /// the strategy) instead of leaving those files out.
        #[arg(long)]
        optimizer: bool,
        /// Commit message (default: "merge REV, REV (STRATEGY)").
        #[arg(short, long, default_value = "")]
        message: String,
        /// Commit onto this branch instead of the current one (created if missing).
        #[arg(long)]
        branch: Option<String>,
        /// Author (default: $MDL_AUTHOR, then git's user.name and user.email, then $USER).
        #[arg(long)]
        author: Option<String>,
    },
    /// What HEAD is, its newest commit, and whether `mdl serve` owns the repository.
    Status,
    /// Where a ref pointed, newest first (HEAD's branch by default; a deleted branch's too,
    /// until gc expires its entries).
    Reflog { name: Option<String> },
    /// List, create or delete tags.
    Tag {
        name: Option<String>,
        rev: Option<String>,
        #[arg(short, long)]
        message: Option<String>,
        #[arg(short = 'd', long = "delete", value_name = "NAME", conflicts_with_all = ["name", "rev", "message"])]
        delete: Option<String>,
    },
    /// Verify every object and reference, and the metadata database (with -C s3://…, this
    /// machine's copy: records it has not read yet are fetched from the bucket to be verified).
    Fsck {
        /// Rebuild a missing or damaged meta.redb from the object records and the journal,
        /// rewrite a journal that disagrees with it, and remove leftovers of interrupted writes
        /// (never anything the index names).
        #[arg(long)]
        repair: bool,
    },
    /// Do what commits left for later: re-encode previous versions as reverse deltas against
    /// their new versions (`delta.defer`), oldest commit first. A commit that leaves such work
    /// starts `mdl maintenance --background` itself (not with MDL_NO_BACKGROUND set).
    Maintenance {
        /// Give way to other writers: exit if the repository stays in use for 5 seconds, and
        /// stop at the next tensor when a writer is waiting (what is left stays queued).
        #[arg(long)]
        background: bool,
    },
    /// Re-encode long delta chains so no tensor needs more than D decode steps (ids unchanged;
    /// with -C s3://…, in this machine's copy, which is where checkouts decode).
    Compact {
        /// Longest chain allowed afterwards [default: delta.max_depth].
        #[arg(long, value_name = "D")]
        max_depth: Option<u32>,
        /// Show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete unreachable objects and apply the retention rules (retention.*).
    Gc {
        /// Keep unreachable objects younger than this (grace period for racing commits)
        /// [default: 1h].
        #[arg(long, value_name = "DURATION")]
        prune_older_than: Option<String>,
        /// Reflog entries older than this are deleted and stop protecting what they name
        /// [default: 30d].
        #[arg(long, value_name = "DURATION")]
        expire_reflog: Option<String>,
        /// Show what would be removed; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Repository totals.
    Stats {
        /// Also HEAD's series as the lossy papers count it: mdl's ratio, DynaQuant's (the
        /// weights, against fp32) and ExCP's (weights and Adam moments after the first
        /// checkpoint, against fp32), with bits per element of each role.
        #[arg(long)]
        lossy: bool,
    },
    /// Serve this repository (every repository under --root; with -C s3://…, that one) over
    /// HTTP.
    Serve {
        /// Address to listen on (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:8080")]
        addr: String,
        /// Serve every repository directly under DIR, by directory name.
        #[arg(long, value_name = "DIR")]
        root: Option<PathBuf>,
        /// Accepted bearer tokens: lines of `name scope token` (scope read, write or admin: admin
        /// also creates repositories under --root).
        #[arg(long, value_name = "FILE")]
        tokens: Option<PathBuf>,
        /// Reads need no token.
        #[arg(long)]
        read_public: bool,
        /// Largest upload (commit or push), e.g. 512M or 64G; one that would leave less than
        /// 256 MiB (a sixteenth of a smaller disk) free on the repository's disk is refused too.
        #[arg(long, default_value = "64G", value_name = "SIZE")]
        max_body: String,
        /// huggingface_hub uploads files of at least SIZE through Xet (with hf_xet, as
        /// installed) or git LFS (without it), streamed, instead of base64 inline in the commit
        /// request; `off` sends every file inline.
        #[arg(long, value_name = "SIZE", default_value = "10M")]
        hf_lfs_from: String,
        /// Connections served at once (more wait to be accepted).
        #[arg(long, default_value_t = 512, value_name = "N")]
        max_connections: usize,
        /// Connections one client address may hold at once (one more is closed at once), so
        /// that no single client holds them all.
        #[arg(long, default_value_t = 64, value_name = "N")]
        max_connections_per_address: usize,
        /// Seconds a client has to send a request's headers (and that an idle connection is
        /// kept between requests).
        #[arg(long, default_value_t = 10, value_name = "SECS")]
        header_timeout: u64,
        /// Seconds an upload may send nothing before it is cut off (408), and a download may
        /// take nothing before its connection is closed.
        #[arg(long, default_value_t = 30, value_name = "SECS")]
        body_timeout: u64,
        /// Decoded tensors all requests together may hold at once, e.g. 4G (more wait).
        #[arg(long, default_value = "4G", value_name = "SIZE")]
        decode_memory: String,
    },
    /// List remotes, or add one: mdl remote add NAME URL.
    Remote {
        #[command(subcommand)]
        action: Option<RemoteAction>,
    },
    /// Copy a repository from a server (http://…) or object storage (s3://…): every branch
    /// and tag.
    Clone {
        url: String,
        #[arg(value_name = "DIR")]
        path: Option<PathBuf>,
        /// A shallow clone: only the last N commits of each branch and tag (`log` says where
        /// history ends; `fetch --deepen` brings more).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        depth: Option<u32>,
        /// A shallow clone: only REV (a full commit id, or a branch or tag of URL) and the
        /// commits after it.
        #[arg(long, value_name = "REV")]
        since: Option<String>,
    },
    /// Bring a remote's branches (or BRANCH) and tags, as refs/remotes/REMOTE/BRANCH.
    Fetch {
        #[arg(default_value = "origin")]
        remote: String,
        branch: Option<String>,
        /// In a shallow clone: N more commits of history behind each place it ends.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        deepen: Option<u32>,
        /// Only the newest N commits of each branch fetched: history behind them is cut here,
        /// as in a shallow clone (`log` says where; `--deepen` brings more).
        #[arg(long, value_name = "N", conflicts_with = "deepen",
              value_parser = clap::value_parser!(u32).range(1..))]
        depth: Option<u32>,
    },
    /// Fetch BRANCH (HEAD's branch) and fast-forward the local branch to it.
    Pull {
        #[arg(default_value = "origin")]
        remote: String,
        branch: Option<String>,
    },
    /// Send BRANCH (HEAD's branch) to a remote; refused unless it fast-forwards there.
    Push {
        #[arg(default_value = "origin")]
        remote: String,
        branch: Option<String>,
        /// Move the remote branch even if that drops commits there.
        #[arg(long)]
        force: bool,
    },
}

/// `mdl commit`'s arguments.
#[derive(Clone, clap::Args)]
pub(crate) struct CommitArgs {
    /// Files and directories; a directory's files are committed under their paths in it.
    #[arg(required = true, value_name = "PATH")]
    pub(crate) paths: Vec<PathBuf>,
    /// The commit message (shown by `log` and `show`).
    #[arg(short, long, default_value = "")]
    pub(crate) message: String,
    /// Commit onto BRANCH (created at HEAD's commit if missing) instead of HEAD's branch.
    #[arg(short, long)]
    pub(crate) branch: Option<String>,
    /// The training step the checkpoint was saved at (default: a Trainer folder's
    /// `trainer_state.json` `global_step`, else a safetensors file's `step` metadata); `log`
    /// shows it, and a lossy commit's estimate corrects Adam's moments for it.
    #[arg(long)]
    pub(crate) step: Option<u64>,
    /// A metric recorded with the commit, e.g. `--metric val_loss=2.31` (repeatable); `loss`,
    /// `val_loss` or `train_loss` also sets what a lossy commit's quality bound is relative to.
    #[arg(long = "metric", value_name = "KEY=VALUE")]
    pub(crate) metrics: Vec<String>,
    /// Who the commit is by (default: $MDL_AUTHOR, else git's user.name and user.email, else
    /// the login name).
    #[arg(long)]
    pub(crate) author: Option<String>,
    /// Quantize float tensors under the quality bound (codec.epsilon, or --epsilon).
    #[arg(long, conflicts_with_all = ["trim_bits", "lossless"])]
    pub(crate) lossy: bool,
    /// Store every tensor exactly, whatever codec.default says.
    #[arg(long, conflicts_with = "trim_bits")]
    pub(crate) lossless: bool,
    /// Quality bound: estimated loss change as a fraction of the commit's loss (absolute
    /// without one); relative L2 error for tensors without optimizer moments.
    #[arg(long, value_name = "E")]
    pub(crate) epsilon: Option<f64>,
    /// Score candidate checkpoints with CMD ({} is the file); the number on its last output
    /// line is the metric (lower is better), kept within E of the original's.
    #[arg(long, value_name = "CMD")]
    pub(crate) eval_cmd: Option<String>,
    /// Keep K mantissa bits of float tensors (mantissa-trim).
    #[arg(long, value_name = "K")]
    pub(crate) trim_bits: Option<u32>,
    /// Parameter/moment pairings: WEIGHT:EXP_AVG:EXP_AVG_SQ patterns with one {} each,
    /// comma-separated (default: quant.moments).
    #[arg(long, value_name = "PATTERNS")]
    pub(crate) moments: Option<String>,
    /// Commit to the repository at this URL (http://HOST:PORT/REPO) instead.
    #[arg(long, value_name = "URL")]
    pub(crate) remote: Option<String>,
    /// Where the codec kernels run: auto (the GPU when one is usable), cpu or gpu (default:
    /// the `engine` setting). The bytes stored are the same.
    #[arg(long, value_name = "auto|cpu|gpu")]
    pub(crate) engine: Option<String>,
    /// Follow symlinks that point outside a folder committed (refused by default).
    #[arg(long)]
    pub(crate) follow_links: bool,
    /// Store a file that looks like a checkpoint (*.safetensors, *.pt, *.pth, *.ckpt, a
    /// torch.save zip) but does not parse as bytes, instead of refusing it.
    #[arg(long)]
    pub(crate) as_bytes: bool,
}

impl CommitArgs {
    /// The commit's options, the same whether it runs here or on a server.
    pub(crate) fn options(&self) -> anyhow::Result<mdl::commit::CommitOptions> {
        use mdl::lossy::CodecMode;
        let mode = if self.lossy || (self.eval_cmd.is_some() && !self.lossless) {
            Some(CodecMode::Lossy)
        } else if self.lossless {
            Some(CodecMode::Lossless)
        } else if self.trim_bits.is_some() {
            Some(CodecMode::Trim)
        } else {
            None
        };
        Ok(mdl::commit::CommitOptions {
            message: self.message.clone(),
            branch: self.branch.as_deref().map(mdl::RefName::new).transpose()?,
            step: self.step,
            metrics: self
                .metrics
                .iter()
                .map(|m| parse_metric(m))
                .collect::<anyhow::Result<_>>()?,
            author: self.author.clone(),
            encode: Default::default(),
            delta: None,
            lossy: mdl::lossy::LossyRequest {
                mode,
                epsilon: self.epsilon,
                trim_bits: self.trim_bits,
                moments: self.moments.clone(),
                eval_cmd: self.eval_cmd.clone(),
            },
            // One commit a process: nothing to keep for a next one.
            warm: None,
            reading: mdl::commit::Reading {
                follow_links: self.follow_links,
                as_bytes: self.as_bytes,
            },
            // The training code is where the command runs (its git commit is recorded).
            source: std::env::current_dir().ok(),
            ..Default::default()
        })
    }
}

#[derive(Clone, Subcommand)]
pub(crate) enum RemoteAction {
    /// Add remote NAME at URL (http://HOST:PORT/REPO, or s3://BUCKET/PREFIX).
    Add { name: String, url: String },
    /// Remove remote NAME: its URL, its token and its remote-tracking branches.
    Remove { name: String },
    /// Point remote NAME at URL.
    SetUrl { name: String, url: String },
    /// Keep the token given with --token (or $MDL_TOKEN) for remote NAME, in
    /// .mdl/remote-tokens (mode 0600); fetch, pull and push send it when no --token is
    /// given. --clear forgets it.
    SetToken {
        name: String,
        #[arg(long)]
        clear: bool,
    },
}

fn parse_metric(s: &str) -> anyhow::Result<(String, f64)> {
    let (k, v) = s
        .split_once('=')
        .with_context(|| format!("invalid metric {s:?}: expected KEY=VALUE"))?;
    let v: f64 = v
        .trim()
        .parse()
        .with_context(|| format!("invalid metric {s:?}: {v:?} is not a number"))?;
    Ok((k.trim().to_string(), v))
}
