//! Commands on a repository in object storage (`-C s3://BUCKET/PREFIX`): each runs on this
//! machine's replica (`mdl_bucket::Replica`), brought up to date from the bucket first, and
//! what it changed is published before its output is printed — so an output names only what
//! the bucket holds.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use mdl_bucket::{Location, Replica};

use crate::{output, Cli, Command};

/// Runs `cli`'s command on the repository at `url`; `purpose` is what the replica's lock says
/// this process is doing.
pub fn run(cli: &Cli, url: &str, purpose: String, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    let loc = Location::parse(url)?;
    match &cli.command {
        Command::Gc {
            prune_older_than,
            expire_reflog,
            dry_run,
        } => {
            if expire_reflog.is_some() {
                return Err(mdl_bucket::Error::Unsupported(format!(
                    "--expire-reflog does not apply to {url}: a repository in object storage keeps no reflog"
                ))
                .into());
            }
            let opts = mdl::gc::GcOptions::parse(prune_older_than.as_deref(), None, *dry_run)?;
            let wait = Duration::from_secs(cli.wait);
            let mut replica = Replica::open(&loc, &mdl_bucket::cache_root(), wait)?;
            let repo = replica.repository(wait)?;
            let outcome = replica.gc(&repo, opts.prune_older_than, opts.dry_run)?;
            replica.trim(&repo)?;
            output::bucket_gc(out, cli.json, &outcome)?;
            report(cli, &replica);
            return Ok(ExitCode::SUCCESS);
        }
        Command::Fsck { repair: true } => {
            // This machine's copy, repaired before anything else opens it (its database may be
            // what is damaged), then brought up to date. A copy not made yet is made first.
            let wait = Duration::from_secs(cli.wait);
            let root = Replica::root_of(&loc, &mdl_bucket::cache_root());
            if !root.join(".mdl").exists() {
                Replica::open(&loc, &mdl_bucket::cache_root(), wait)?;
            }
            let local = Cli {
                dir: Some(root),
                ..cli.clone()
            };
            let mut buffered = Vec::new();
            let code = crate::run(&local, &mut buffered)?;
            Replica::open(&loc, &mdl_bucket::cache_root(), wait)?;
            out.write_all(&buffered)?;
            return Ok(code);
        }
        Command::Serve { .. } => {
            crate::remote::serve(cli, out)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Clone { .. } => {
            return Err(mdl_bucket::Error::Unsupported(format!(
                "mdl -C {url} clone: a clone makes a new repository; clone {url} itself (mdl clone {url} DIR), or push into it from a clone of the other"
            ))
            .into())
        }
        _ => {}
    }
    let wait = Duration::from_secs(cli.wait);
    let mut replica = Replica::open(&loc, &mdl_bucket::cache_root(), wait)?;
    let local = Cli {
        dir: Some(replica.root()),
        ..cli.clone()
    };
    if let Command::Commit(args) = &cli.command {
        let opts = args.options()?;
        let mut repo = crate::open(&local, mdl::LockMode::Write, purpose)?;
        crate::use_engine(cli, &mut repo, args.engine.as_deref())?;
        let bar = crate::progress::Bar::new(!cli.json && std::io::stderr().is_terminal());
        let mut outcome = mdl::commit::commit_paths(&repo, &args.paths, &opts, &bar)?;
        let published = replica.publish(&repo)?;
        if let Some((_, new)) = published.replayed.last() {
            outcome.id = *new;
        }
        replica.trim(&repo)?;
        output::commit(out, cli.json, &outcome)?;
        report(cli, &replica);
        return Ok(ExitCode::SUCCESS);
    }
    let mut buffered = Vec::new();
    let code = crate::run(&local, &mut buffered)?;
    let repo = replica.repository(wait)?;
    // History fetched or pulled from elsewhere keeps its ids: a lost race is refused, never
    // replayed. Tracking refs (refs/remotes/) stay this machine's; remotes are settings, so
    // every machine shares them.
    let moves_history = matches!(
        cli.command,
        Command::Fetch { .. }
            | Command::Pull { .. }
            | Command::Push { .. }
            | Command::Remote { .. }
    );
    if moves_history {
        replica.publish_exact(&repo)?;
    } else {
        replica.publish(&repo)?;
    }
    replica.trim(&repo)?;
    out.write_all(&buffered)?;
    report(cli, &replica);
    Ok(code)
}

/// With `-v`, the requests the command made.
fn report(cli: &Cli, replica: &Replica) {
    if cli.verbose {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &replica.bucket().counts;
        eprintln!(
            "{}: {} PUTs, {} GETs, {} LISTs, {} bytes up, {} bytes down",
            replica.bucket().url(),
            c.puts.load(Relaxed),
            c.gets.load(Relaxed),
            c.lists.load(Relaxed),
            c.bytes_up.load(Relaxed),
            c.bytes_down.load(Relaxed)
        );
    }
}
