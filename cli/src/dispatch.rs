//! Every command on a repository, once, whatever the backend: `mdl_ops::Operations` runs it on
//! a folder, a server or object storage; this turns the arguments into its call and its answer
//! into output.

use std::io::Write;
use std::process::ExitCode;

use anyhow::bail;
use mdl_ops::{Branches, History, Operations};
use mdl_protocol::body::{GcAnswer, GcRequest};

use crate::args::{Command, RemoteAction};
use crate::{output, progress, Cli};

/// Runs `cli`'s command on `repo`.
pub(crate) fn run(
    cli: &Cli,
    repo: &dyn Operations,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let json = cli.json;
    let on_terminal = !json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = progress::Bar::new(on_terminal);
    let transfer_bar = progress::Bar::at_once(on_terminal);
    let engine = |choice: &Option<String>| {
        choice
            .as_deref()
            .map(str::parse::<mdl::engine::EngineChoice>)
            .transpose()
    };
    match &cli.command {
        Command::Commit(args) => {
            let outcome =
                repo.commit(&args.paths, &args.options()?, engine(&args.engine)?, &bar)?;
            output::commit(out, json, &outcome)?;
            if let Some(root) = repo.maintenance_due()? {
                if std::env::var_os("MDL_NO_BACKGROUND").is_none() {
                    start_maintenance(&root);
                }
            }
        }
        Command::Maintenance { background } => {
            output::maintenance(out, json, &repo.maintenance(*background)?)?;
        }
        Command::Checkout {
            rev,
            output: path,
            force,
            sync,
            skip_expired,
            path: tree_path,
            engine: choice,
            since,
        } => {
            let opts = mdl::checkout::CheckoutOptions {
                force: *force,
                sync: *sync,
                skip_expired: *skip_expired,
                path: tree_path.clone(),
                since: since.clone(),
            };
            let outcome = repo.checkout(rev, path, &opts, engine(choice)?, &bar)?;
            output::checkout(out, json, &outcome)?;
        }
        Command::Log { rev, n, graph, all } => {
            let entries = if *all {
                repo.log_all(*n)?
            } else {
                repo.log(rev.as_deref(), *n)?
            };
            output::log(out, json, &entries, *graph)?;
        }
        Command::Show { rev } => output::show(out, json, &repo.show(rev)?)?,
        Command::Diff { a, b, changed } => output::diff(out, json, &repo.diff(a, b)?, *changed)?,
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
                output::branch_move(out, json, &repo.force_branch(name, rev.as_deref())?)?;
            } else if let Some(d) = delete.as_ref().or(force_delete.as_ref()) {
                let was = repo.delete_branch(d, force_delete.is_some())?;
                let text = format!("deleted branch {d} (was {})", was.short(12));
                output::message(out, json, &text)?;
            } else if let Some(name) = name {
                let at = repo.create_branch(name, rev.as_deref())?;
                output::message(out, json, &format!("branch {name} at {}", at.short(12)))?;
            } else {
                let which = match (all, remotes) {
                    (_, true) => Branches::Remote,
                    (true, false) => Branches::All,
                    (false, false) => Branches::Local,
                };
                output::refs(out, json, &repo.branches(which)?)?;
            }
        }
        Command::Reflog { name } => {
            let (full, lines) = repo.reflog(name.as_deref())?;
            output::reflog(out, json, &full, &lines)?;
        }
        Command::Reset { rev } => output::branch_move(out, json, &repo.reset(rev)?)?,
        Command::Merge {
            revs,
            strategy,
            weights,
            base,
            density,
            optimizer,
            message,
            branch,
            author,
        } => {
            let opts = mdl::merge::MergeOptions {
                strategy: mdl::merge::Strategy::parse(strategy, *density)
                    .map_err(anyhow::Error::msg)?,
                weights: weights.clone(),
                base: base.clone(),
                optimizer: *optimizer,
            };
            let commit = mdl::commit::CommitOptions {
                message: message.clone(),
                branch: branch.as_deref().map(mdl::RefName::new).transpose()?,
                author: author.clone(),
                ..Default::default()
            };
            output::merge(out, json, &repo.merge(revs, &opts, &commit, &bar)?)?;
        }
        Command::Switch { branch } => {
            repo.switch(branch)?;
            output::message(out, json, &format!("switched to branch {branch}"))?;
        }
        Command::Tag {
            name,
            rev,
            message,
            delete,
        } => {
            if let Some(d) = delete {
                let was = repo.delete_tag(d)?;
                let text = format!("deleted tag {d} (was {})", was.short(12));
                output::message(out, json, &text)?;
            } else if let Some(name) = name {
                let at = repo.create_tag(name, rev.as_deref(), message.as_deref())?;
                output::message(out, json, &format!("tag {name} at {}", at.short(12)))?;
            } else {
                output::refs(out, json, &repo.tags()?)?;
            }
        }
        Command::Fsck { repair } => {
            let (rebuilt, report) = if *repair {
                repo.fsck_repair()?
            } else {
                (None, repo.fsck(&transfer_bar)?)
            };
            output::fsck(out, json, rebuilt.as_ref(), &report)?;
            if !report.ok() {
                let found = report.problems.len();
                let _ = writeln!(std::io::stderr(), "error: fsck found {found} problem(s)");
                return Ok(ExitCode::from(3));
            }
        }
        Command::Config { key, value } => match (key, value) {
            (Some(k), Some(v)) => {
                let (k, v) = repo.set_config(k, v)?;
                output::message(out, json, &format!("{k} = {v}"))?;
            }
            (key, _) => {
                let mut all = repo.config()?;
                if let Some(k) = key {
                    all.retain(|(name, _, _)| name == k);
                    if all.is_empty() {
                        return Err(mdl::Error::UnknownConfig(k.clone()).into());
                    }
                }
                output::config(out, json, &all)?;
            }
        },
        Command::Compact { max_depth, dry_run } => {
            let opts = mdl::compact::CompactOptions {
                max_depth: *max_depth,
                dry_run: *dry_run,
            };
            output::compact(out, json, &repo.compact(&opts, &bar)?)?;
        }
        Command::Gc {
            prune_older_than,
            expire_reflog,
            dry_run,
        } => {
            let request = GcRequest {
                prune_older_than: prune_older_than.clone(),
                expire_reflog: expire_reflog.clone(),
                dry_run: *dry_run,
            };
            match repo.gc(&request, &bar)? {
                GcAnswer::Disk(outcome) => output::gc(out, json, &outcome)?,
                GcAnswer::Bucket(outcome) => output::bucket_gc(out, json, &outcome)?,
            }
        }
        Command::Stats { lossy } => output::stats(out, json, &repo.stats(*lossy)?)?,
        Command::Remote { action } => remote(cli, repo, action.as_ref(), out)?,
        Command::Fetch {
            remote,
            branch,
            deepen,
            depth,
        } => {
            let history = match (deepen, depth) {
                (Some(by), _) => History::Deepen(*by),
                (None, Some(n)) => History::Newest(*n),
                (None, None) => History::All,
            };
            let moved = repo.fetch(remote, branch.as_deref(), false, history, &transfer_bar)?;
            output::transfer(
                out,
                json,
                &format!("fetched from {}", moved.url),
                &moved.outcome,
            )?;
        }
        Command::Pull { remote, branch } => {
            let done = "pulled from";
            let moved = repo.fetch(remote, branch.as_deref(), true, History::All, &transfer_bar)?;
            output::transfer(out, json, &format!("{done} {}", moved.url), &moved.outcome)?;
        }
        Command::Push {
            remote,
            branch,
            force,
        } => {
            let moved = repo.push(remote, branch.as_deref(), *force, &transfer_bar)?;
            let done = format!("pushed to {}", moved.url);
            output::transfer(out, json, &done, &moved.outcome)?;
        }
        Command::Init { .. } | Command::Status | Command::Serve { .. } | Command::Clone { .. } => {
            unreachable!("main runs the commands that make, watch or serve a repository")
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `mdl remote …`: list, add, remove, re-point, keep a token.
fn remote(
    cli: &Cli,
    repo: &dyn Operations,
    action: Option<&RemoteAction>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let json = cli.json;
    match action {
        Some(RemoteAction::Add { name, url }) => {
            repo.add_remote(name, url)?;
            output::message(out, json, &format!("remote {name} = {url}"))?;
        }
        Some(RemoteAction::Remove { name }) => {
            repo.remove_remote(name)?;
            output::message(out, json, &format!("removed remote {name}"))?;
        }
        Some(RemoteAction::SetUrl { name, url }) => {
            repo.set_remote_url(name, url)?;
            output::message(out, json, &format!("remote {name} = {url}"))?;
        }
        Some(RemoteAction::SetToken { name, clear }) => {
            let token = match (clear, &cli.token) {
                (true, _) => None,
                (false, Some(t)) => Some(t.as_str()),
                (false, None) => bail!(
                    "no token to keep: give --token TOKEN or set MDL_TOKEN (--clear forgets the one kept)"
                ),
            };
            repo.set_remote_token(name, token)?;
            let said = if token.is_some() {
                "kept a token"
            } else {
                "forgot the token"
            };
            output::message(out, json, &format!("{said} for remote {name}"))?;
        }
        None => {
            let all = repo.remotes()?;
            if json {
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
    }
    Ok(())
}

/// Starts `mdl maintenance --background` on the repository at `root`, detached from this
/// process (its own process group, no terminal I/O), to do what a commit left for later while
/// the caller goes on. If it cannot start, the work stays queued for the next one.
fn start_maintenance(root: &std::path::Path) {
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
