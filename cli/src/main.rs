//! The `mdl` binary: parses arguments, runs one library operation, prints human or JSON output.

use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use mdl::{LockMode, OpenOptions, Repository};

mod args;
mod bucket;
mod failure;
mod init;
mod output;
mod progress;
mod remote;
mod status;

use args::{Cli, Command, CommitArgs, RemoteAction};

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
    if !matches!(cli.command, Command::Serve { .. }) {
        keep_freed_memory();
    }
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

/// Lets glibc's allocator keep the memory a command frees for its next allocations instead of
/// returning it to the kernel: a commit or checkout frees and allocates window-sized buffers
/// tensor after tensor, and memory handed back is page-faulted and zeroed again when taken.
/// For short-lived commands only (`mdl serve` keeps the defaults).
fn keep_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters; called before any thread is started.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
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
    if let Command::Init { path } = &cli.command {
        init::run(cli, path.as_ref(), out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(url) = cli.bucket_url() {
        return bucket::run(cli, url, purpose, out);
    }
    // Never a folder name: a URL of a scheme mdl does not speak.
    if let Some(scheme) = cli
        .dir
        .as_ref()
        .and_then(|d| d.to_str())
        .and_then(init::scheme)
    {
        if !matches!(scheme, "http" | "s3") {
            anyhow::bail!(init::unsupported(scheme));
        }
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
    if !matches!(cli.command, Command::Serve { .. } | Command::Clone { .. }) {
        if let Some(remote) = remote::server_for(cli)? {
            return remote::run(cli, &remote, out);
        }
    }
    match &cli.command {
        Command::Init { .. } => unreachable!("handled above"),
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
