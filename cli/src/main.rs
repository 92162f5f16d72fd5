//! The `mdl` binary: parses arguments, runs one library operation, prints human or JSON output.

use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use mdl::{LockMode, OpenOptions, Repository};

mod bucket;
mod failure;
mod output;
mod progress;
mod remote;
mod status;

#[derive(Clone, Parser)]
#[command(
    name = "mdl",
    version,
    about = "Version control for deep-learning checkpoints"
)]
struct Cli {
    /// Run as if started in DIR; a URL runs the command on a server (http://HOST:PORT/REPO) or
    /// on a repository in object storage (s3://BUCKET/PREFIX; this machine's cache of it in
    /// $MDL_CACHE_DIR, at most $MDL_CACHE_SIZE of records, default 50G).
    #[arg(short = 'C', global = true, env = "MDL_DIR", value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Bearer token for servers.
    #[arg(long, global = true, env = "MDL_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Seconds a writer waits for another writer, and any command for a publish in progress.
    #[arg(long, global = true, default_value_t = 60, value_name = "SECS")]
    wait: u64,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    /// More diagnostics on stderr.
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

impl Cli {
    /// The repository in object storage `-C` names, if it names one.
    fn bucket_url(&self) -> Option<&str> {
        self.dir
            .as_ref()
            .and_then(|d| d.to_str())
            .filter(|d| mdl_bucket::is_bucket_url(d))
    }
}

#[derive(Clone, Subcommand)]
enum Command {
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
    Show { rev: String },
    /// Compare two commits tensor by tensor: a summary, then each file and tensor.
    Diff {
        a: String,
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
    Stats,
    /// Serve this repository (every repository under --root; with -C s3://…, that one) over
    /// HTTP.
    Serve {
        /// Address to listen on (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:8080")]
        addr: String,
        /// Serve every repository directly under DIR, by directory name.
        #[arg(long, value_name = "DIR")]
        root: Option<PathBuf>,
        /// Accepted bearer tokens: lines of `name scope token` (scope read or write).
        #[arg(long, value_name = "FILE")]
        tokens: Option<PathBuf>,
        /// Reads need no token.
        #[arg(long)]
        read_public: bool,
        /// Largest upload (commit or push), e.g. 512M or 64G.
        #[arg(long, default_value = "64G", value_name = "SIZE")]
        max_body: String,
        /// Connections served at once (more wait to be accepted).
        #[arg(long, default_value_t = 512, value_name = "N")]
        max_connections: usize,
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
    },
    /// Bring a remote's branches (or BRANCH) and tags, as refs/remotes/REMOTE/BRANCH.
    Fetch {
        #[arg(default_value = "origin")]
        remote: String,
        branch: Option<String>,
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
struct CommitArgs {
    /// Files and directories; a directory's files are committed under their paths in it.
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
    #[arg(short, long, default_value = "")]
    message: String,
    /// Commit onto BRANCH (created at HEAD's commit if missing) instead of HEAD's branch.
    #[arg(short, long)]
    branch: Option<String>,
    #[arg(long)]
    step: Option<u64>,
    /// KEY=VALUE, repeatable.
    #[arg(long = "metric", value_name = "KEY=VALUE")]
    metrics: Vec<String>,
    #[arg(long)]
    author: Option<String>,
    /// Quantize float tensors under the quality bound (codec.epsilon, or --epsilon).
    #[arg(long, conflicts_with_all = ["trim_bits", "lossless"])]
    lossy: bool,
    /// Store every tensor exactly, whatever codec.default says.
    #[arg(long, conflicts_with = "trim_bits")]
    lossless: bool,
    /// Quality bound: estimated loss change as a fraction of the commit's loss (absolute
    /// without one); relative L2 error for tensors without optimizer moments.
    #[arg(long, value_name = "E")]
    epsilon: Option<f64>,
    /// Score candidate checkpoints with CMD ({} is the file); the number on its last output
    /// line is the metric (lower is better), kept within E of the original's.
    #[arg(long, value_name = "CMD")]
    eval_cmd: Option<String>,
    /// Keep K mantissa bits of float tensors (mantissa-trim).
    #[arg(long, value_name = "K")]
    trim_bits: Option<u32>,
    /// Parameter/moment pairings: WEIGHT:EXP_AVG:EXP_AVG_SQ patterns with one {} each,
    /// comma-separated (default: quant.moments).
    #[arg(long, value_name = "PATTERNS")]
    moments: Option<String>,
    /// Commit to the repository at this URL (http://HOST:PORT/REPO) instead.
    #[arg(long, value_name = "URL")]
    remote: Option<String>,
    /// Where the codec kernels run: auto (the GPU when one is usable), cpu or gpu (default:
    /// the `engine` setting). The bytes stored are the same.
    #[arg(long, value_name = "auto|cpu|gpu")]
    engine: Option<String>,
}

impl CommitArgs {
    /// The commit's options, the same whether it runs here or on a server.
    fn options(&self) -> anyhow::Result<mdl::commit::CommitOptions> {
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
        })
    }
}

#[derive(Clone, Subcommand)]
enum RemoteAction {
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

/// On SIGINT or SIGTERM, removes what the command registered (a checkout's temporary file, a
/// clone's half-made directory) and exits with 130. `mdl serve` shuts down gracefully instead.
fn clean_up_on_interrupt() {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("no interrupt handler: {e}");
            return;
        }
    };
    // The handlers are installed here, before the command starts.
    let signals = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        Ok::<_, io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    });
    let (mut int, mut term) = match signals {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("no interrupt handler: {e}");
            return;
        }
    };
    std::thread::spawn(move || {
        runtime.block_on(async {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        });
        mdl::interrupt::mark_interrupted();
        mdl::interrupt::remove_registered();
        eprintln!("interrupted");
        std::process::exit(130);
    });
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return failure::usage(e),
    };
    let filter = if cli.verbose {
        "mdl=debug,info"
    } else {
        "warn"
    };
    tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .with_target(false)
        .without_time()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MDL_LOG")
                .unwrap_or_else(|_| filter.into()),
        )
        .init();
    if !matches!(cli.command, Command::Serve { .. }) {
        clean_up_on_interrupt();
    }
    let stdout = io::stdout();
    let mut out = stdout.lock();
    match run(&cli, &mut out) {
        Ok(code) => code,
        Err(e) => {
            // Interrupted: the handler is removing this command's files (which may be why it
            // failed) and exits with 130 once they are gone; the error is not the command's.
            if mdl::interrupt::interrupted() {
                std::thread::sleep(std::time::Duration::from_secs(30));
                std::process::exit(130);
            }
            // A closed pipe (`mdl log | head`) is not a failure.
            if e.chain().any(|c| {
                c.downcast_ref::<io::Error>()
                    .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            let _ = out.flush();
            failure::report(&e, cli.json, &mut out);
            ExitCode::from(failure::exit_code(&e))
        }
    }
}

/// Chooses where `repo`'s codec kernels run (`--engine`, else the `engine` setting) and, with
/// `-v`, says which and why.
fn use_engine(cli: &Cli, repo: &mut Repository, choice: Option<&str>) -> anyhow::Result<()> {
    let choice = choice
        .map(str::parse::<mdl::engine::EngineChoice>)
        .transpose()?;
    let selected = mdl::engine::select(repo, choice)?;
    if cli.verbose {
        eprintln!("engine: {}", selected.why);
    }
    repo.set_engine(selected.engine);
    Ok(())
}

/// Starts `mdl maintenance --background` on the repository at `root`, detached from this
/// process (its own process group, no terminal I/O), to do what a commit left for later while
/// the caller goes on. If it cannot start, the work stays queued for the next one.
fn start_maintenance(root: &Path) {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let started = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .arg("-C")
            .arg(root)
            .args(["maintenance", "--background"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
    });
    if let Err(e) = started {
        tracing::warn!("cannot start `mdl maintenance` in the background: {e}");
    }
}

/// The lock a command needs: exclusive when it writes.
fn lock_mode(writes: bool) -> LockMode {
    if writes {
        LockMode::Write
    } else {
        LockMode::Read
    }
}

fn open(cli: &Cli, mode: LockMode, purpose: String) -> anyhow::Result<Repository> {
    let dir = cli.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let opts = OpenOptions {
        mode,
        wait: Duration::from_secs(cli.wait),
        purpose,
        ..OpenOptions::default()
    };
    Ok(Repository::open(&dir, &opts)?)
}

fn run(cli: &Cli, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    let purpose = format!(
        "mdl {}",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    if let Some(url) = cli.bucket_url() {
        return bucket::run(cli, url, purpose, out);
    }
    let on_terminal = !cli.json && io::stderr().is_terminal();
    let bar = progress::Bar::new(on_terminal);
    let transfer_bar = progress::Bar::at_once(on_terminal);
    if let Command::Commit(CommitArgs {
        remote: Some(url), ..
    }) = &cli.command
    {
        let remote = mdl_remote::Remote::new(url, cli.token.clone())?;
        return remote::run(cli, &remote, out);
    }
    if let (Command::Status, Some(dir)) = (&cli.command, status::local_dir(cli)) {
        return status::run(cli, &dir, purpose, out);
    }
    if !matches!(
        cli.command,
        Command::Init { .. } | Command::Serve { .. } | Command::Clone { .. }
    ) {
        if let Some(remote) = remote::server_for(cli)? {
            return remote::run(cli, &remote, out);
        }
    }
    match &cli.command {
        Command::Init { path } => {
            let base = cli.dir.clone().unwrap_or_else(|| PathBuf::from("."));
            let dir = path.as_ref().map(|d| base.join(d)).unwrap_or(base);
            let repo = Repository::init(&dir)?;
            output::init(out, cli.json, repo.root())?;
        }
        Command::Commit(args) => {
            let opts = args.options()?;
            let mut repo = open(cli, LockMode::Write, purpose)?;
            use_engine(cli, &mut repo, args.engine.as_deref())?;
            let outcome = mdl::commit::commit_paths(&repo, &args.paths, &opts, &bar)?;
            output::commit(out, cli.json, &outcome)?;
            if mdl::commit::pending_deferred(&repo)? > 0
                && std::env::var_os("MDL_NO_BACKGROUND").is_none()
            {
                start_maintenance(repo.root());
            }
        }
        Command::Maintenance { background } => {
            let mode = LockMode::Write;
            let mut repo = if *background {
                // The commit that started this one is closing; another writer at work starts
                // its own maintenance when it is done.
                let dir = cli.dir.clone().unwrap_or_else(|| PathBuf::from("."));
                let opts = OpenOptions {
                    mode,
                    wait: Duration::from_secs(5),
                    purpose,
                    ..OpenOptions::default()
                };
                match Repository::open(&dir, &opts) {
                    Err(mdl::Error::Store(mdl::StoreError::Busy { .. })) => {
                        return Ok(ExitCode::SUCCESS)
                    }
                    r => r?,
                }
            } else {
                open(cli, mode, purpose)?
            };
            use_engine(cli, &mut repo, None)?;
            let stop = || *background && mdl::commit::writer_waiting(&repo);
            let report = mdl::commit::run_deferred(&repo, None, &stop)?;
            output::maintenance(out, cli.json, &report)?;
        }
        Command::Checkout {
            rev,
            output: path,
            force,
            sync,
            skip_expired,
            path: tree_path,
            engine,
        } => {
            let mut repo = open(cli, LockMode::Read, purpose)?;
            use_engine(cli, &mut repo, engine.as_deref())?;
            let opts = mdl::checkout::CheckoutOptions {
                force: *force,
                sync: *sync,
                skip_expired: *skip_expired,
                path: tree_path.clone(),
            };
            let outcome = mdl::checkout::checkout(&repo, rev, path, &opts, &bar)?;
            output::checkout(out, cli.json, &outcome)?;
        }
        Command::Log { rev, n, graph, all } => {
            let repo = open(cli, LockMode::Read, purpose)?;
            let entries = if *all {
                mdl::log::log_all(&repo, *n)?
            } else {
                mdl::log::log(&repo, rev.as_deref(), *n)?
            };
            output::log(out, cli.json, &entries, *graph)?;
        }
        Command::Show { rev } => {
            let repo = open(cli, LockMode::Read, purpose)?;
            output::show(out, cli.json, &mdl::show::show(&repo, rev)?)?;
        }
        Command::Diff { a, b, changed } => {
            let repo = open(cli, LockMode::Read, purpose)?;
            output::diff(out, cli.json, &mdl::diff::diff(&repo, a, b)?, *changed)?;
        }
        Command::Branch {
            name,
            rev,
            delete,
            force_delete,
            force,
            all,
            remotes,
        } => {
            if let (Some(name), true) = (name, force) {
                let repo = open(cli, LockMode::Write, purpose)?;
                let moved = mdl::refs::force_branch(&repo, name, rev.as_deref())?;
                output::branch_move(out, cli.json, &moved)?;
            } else if let Some(d) = delete.as_ref().or(force_delete.as_ref()) {
                let repo = open(cli, LockMode::Write, purpose)?;
                let was = mdl::refs::delete_branch(&repo, d, force_delete.is_some())?;
                output::message(
                    out,
                    cli.json,
                    &format!("deleted branch {d} (was {})", was.short(12)),
                )?;
            } else if let Some(name) = name {
                let repo = open(cli, LockMode::Write, purpose)?;
                let at = mdl::refs::create_branch(&repo, name, rev.as_deref())?;
                output::message(out, cli.json, &format!("branch {name} at {}", at.short(12)))?;
            } else {
                let repo = open(cli, LockMode::Read, purpose)?;
                let mut listed = if *remotes {
                    Vec::new()
                } else {
                    mdl::refs::branches(&repo)?
                };
                if *all || *remotes {
                    listed.extend(mdl::refs::remote_branches(&repo)?);
                }
                output::refs(out, cli.json, &listed)?;
            }
        }
        Command::Status => anyhow::bail!("status runs on a repository folder, not a URL"),
        Command::Reflog { name } => {
            let repo = open(cli, LockMode::Read, purpose)?;
            let (full, lines) = mdl::refs::reflog(&repo, name.as_deref())?;
            output::reflog(out, cli.json, &full, &lines)?;
        }
        Command::Reset { rev } => {
            let repo = open(cli, LockMode::Write, purpose)?;
            output::branch_move(out, cli.json, &mdl::refs::reset(&repo, rev)?)?;
        }
        Command::Switch { branch } => {
            let repo = open(cli, LockMode::Write, purpose)?;
            mdl::refs::switch(&repo, branch)?;
            output::message(out, cli.json, &format!("switched to branch {branch}"))?;
        }
        Command::Tag {
            name,
            rev,
            message,
            delete,
        } => {
            if let Some(d) = delete {
                let repo = open(cli, LockMode::Write, purpose)?;
                let was = mdl::refs::delete_tag(&repo, d)?;
                output::message(
                    out,
                    cli.json,
                    &format!("deleted tag {d} (was {})", was.short(12)),
                )?;
            } else if let Some(name) = name {
                let repo = open(cli, LockMode::Write, purpose)?;
                let tagger = mdl::commit::default_author();
                let at = mdl::refs::create_tag(
                    &repo,
                    name,
                    rev.as_deref(),
                    message.as_deref(),
                    &tagger,
                )?;
                output::message(out, cli.json, &format!("tag {name} at {}", at.short(12)))?;
            } else {
                let repo = open(cli, LockMode::Read, purpose)?;
                output::refs(out, cli.json, &mdl::refs::tags(&repo)?)?;
            }
        }
        Command::Fsck { repair } => {
            let (rebuilt, report) = if *repair {
                let dir = cli.dir.clone().unwrap_or_else(|| PathBuf::from("."));
                let opts = OpenOptions {
                    mode: LockMode::Write,
                    wait: Duration::from_secs(cli.wait),
                    purpose,
                    ..OpenOptions::default()
                };
                mdl::fsck::repair(&dir, &opts)?
            } else {
                let repo = open(cli, LockMode::Check, purpose)?;
                (None, mdl::fsck::fsck_with(&repo, false, &transfer_bar)?)
            };
            output::fsck(out, cli.json, rebuilt.as_ref(), &report)?;
            if !report.ok() {
                eprintln!("error: fsck found {} problem(s)", report.problems.len());
                return Ok(ExitCode::from(3));
            }
        }
        Command::Config { key, value } => match (key, value) {
            (Some(k), Some(v)) => {
                let repo = open(cli, LockMode::Write, purpose)?;
                mdl::config::set_config(&repo, k, v)?;
                output::message(out, cli.json, &format!("{k} = {v}"))?;
            }
            (key, _) => {
                let repo = open(cli, LockMode::Read, purpose)?;
                let mut all = mdl::config::config(&repo)?;
                if let Some(k) = key {
                    all.retain(|(name, _, _)| name == k);
                    if all.is_empty() {
                        return Err(mdl::Error::UnknownConfig(k.clone()).into());
                    }
                }
                output::config(out, cli.json, &all)?;
            }
        },
        Command::Compact { max_depth, dry_run } => {
            let repo = open(cli, lock_mode(!*dry_run), purpose)?;
            let opts = mdl::compact::CompactOptions {
                max_depth: *max_depth,
                dry_run: *dry_run,
            };
            output::compact(out, cli.json, &mdl::compact::compact(&repo, &opts, &bar)?)?;
        }
        Command::Gc {
            prune_older_than,
            expire_reflog,
            dry_run,
        } => {
            let opts = mdl::gc::GcOptions::parse(
                prune_older_than.as_deref(),
                expire_reflog.as_deref(),
                *dry_run,
            )?;
            let repo = open(cli, lock_mode(!*dry_run), purpose)?;
            output::gc(out, cli.json, &mdl::gc::gc(&repo, &opts, &bar)?)?;
        }
        Command::Stats => {
            let repo = open(cli, LockMode::Read, purpose)?;
            output::stats(out, cli.json, &mdl::stats::stats(&repo)?)?;
        }
        Command::Serve { .. } => remote::serve(cli, out)?,
        Command::Remote { action } => match action {
            Some(RemoteAction::Add { name, url }) => {
                remote::check_url(url)?;
                let repo = open(cli, LockMode::Write, purpose)?;
                mdl_remote::add_remote(&repo, name, url)?;
                output::message(out, cli.json, &format!("remote {name} = {url}"))?;
            }
            Some(RemoteAction::Remove { name }) => {
                let repo = open(cli, LockMode::Write, purpose)?;
                mdl_remote::remove_remote(&repo, name)?;
                output::message(out, cli.json, &format!("removed remote {name}"))?;
            }
            Some(RemoteAction::SetUrl { name, url }) => {
                remote::check_url(url)?;
                let repo = open(cli, LockMode::Write, purpose)?;
                mdl_remote::set_url(&repo, name, url)?;
                output::message(out, cli.json, &format!("remote {name} = {url}"))?;
            }
            Some(RemoteAction::SetToken { name, clear }) => {
                let token = match (clear, &cli.token) {
                    (true, _) => None,
                    (false, Some(t)) => Some(t.as_str()),
                    (false, None) => anyhow::bail!(
                        "no token to keep: give --token TOKEN or set MDL_TOKEN (--clear forgets the one kept)"
                    ),
                };
                let repo = open(cli, LockMode::Write, purpose)?;
                mdl_remote::set_token(&repo, name, token)?;
                let said = if token.is_some() {
                    "kept a token"
                } else {
                    "forgot the token"
                };
                output::message(out, cli.json, &format!("{said} for remote {name}"))?;
            }
            None => {
                let repo = open(cli, LockMode::Read, purpose)?;
                let all = mdl_remote::remotes(&repo)?;
                if cli.json {
                    let v: Vec<_> = all
                        .iter()
                        .map(|(n, u)| serde_json::json!({"name": n, "url": u}))
                        .collect();
                    writeln!(out, "{}", serde_json::Value::Array(v))?;
                } else {
                    for (n, u) in all {
                        writeln!(out, "{n}\t{u}")?;
                    }
                }
            }
        },
        Command::Clone { url, path } => {
            let name = remote::default_name(url)?;
            let base = cli.dir.clone().unwrap_or_else(|| PathBuf::from("."));
            let dir = base.join(path.clone().unwrap_or_else(|| name.into()));
            let peer = remote::peer(cli, url)?;
            let outcome = mdl_remote::clone(peer.as_ref(), &dir, &transfer_bar)?;
            output::transfer(
                out,
                cli.json,
                &format!("cloned {url} into {}", outcome.dir.display()),
                &outcome.transfer,
            )?;
        }
        Command::Fetch { remote, branch } | Command::Pull { remote, branch } => {
            let repo = open(cli, LockMode::Write, purpose)?;
            let client = remote::named(cli, &repo, remote)?;
            // The two differ only in whether the current branch moves after.
            let pull = matches!(cli.command, Command::Pull { .. });
            let transfer = if pull {
                mdl_remote::pull
            } else {
                mdl_remote::fetch
            };
            let done = if pull { "pulled from" } else { "fetched from" };
            let outcome = transfer(
                &repo,
                remote,
                client.as_ref(),
                branch.as_deref(),
                &transfer_bar,
            )?;
            output::transfer(out, cli.json, &format!("{done} {}", client.url()), &outcome)?;
        }
        Command::Push {
            remote,
            branch,
            force,
        } => {
            let repo = open(cli, LockMode::Write, purpose)?;
            let client = remote::named(cli, &repo, remote)?;
            let outcome = mdl_remote::push(
                &repo,
                remote,
                client.as_ref(),
                branch.as_deref(),
                *force,
                &transfer_bar,
            )?;
            output::transfer(
                out,
                cli.json,
                &format!("pushed to {}", client.url()),
                &outcome,
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
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
