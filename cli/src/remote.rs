//! Commands that run on a server: `mdl serve` itself, `-C URL` / `commit --remote URL`, and
//! commands forwarded to the `mdl serve` that owns the repository.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use mdl_protocol::body::GcAnswer;
use mdl_remote::{Peer, Remote};

use crate::{output, Cli, Command};

/// The server a command should run on: the URL given with `-C`, or the live `mdl serve` that
/// owns the repository here (from its advertisement in `.mdl/`).
pub fn server_for(cli: &Cli) -> anyhow::Result<Option<Remote>> {
    if let Some(url) = cli
        .dir
        .as_ref()
        .and_then(|d| d.to_str())
        .filter(|d| d.starts_with("http://"))
    {
        return Ok(Some(Remote::new(url, cli.token.clone())?));
    }
    let dir = cli.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let Some(root) = mdl::discover(&dir) else {
        return Ok(None);
    };
    let Some(ad) = mdl_server::advertised(&root.join(".mdl")) else {
        return Ok(None);
    };
    tracing::info!(
        "mdl serve (pid {}) owns this repository: forwarding to {}",
        ad.pid,
        ad.url
    );
    Ok(Some(Remote::new(&ad.url, Some(ad.token))?))
}

/// The other repository of a clone, fetch, pull or push at `url`: a server, or a repository
/// in object storage (through this machine's replica, brought up to date).
pub fn peer(cli: &Cli, url: &str) -> anyhow::Result<Box<dyn Peer>> {
    if mdl_bucket::is_bucket_url(url) {
        let loc = mdl_bucket::Location::parse(url)?;
        let wait = Duration::from_secs(cli.wait);
        Ok(Box::new(mdl_bucket::BucketPeer::open(
            &loc,
            &mdl_bucket::cache_root(),
            wait,
        )?))
    } else {
        Ok(Box::new(Remote::new(url, cli.token.clone())?))
    }
}

/// Checks a remote's URL before it is kept: a server's or one in object storage.
pub fn check_url(url: &str) -> anyhow::Result<()> {
    if mdl_bucket::is_bucket_url(url) {
        mdl_bucket::Location::parse(url)?;
    } else {
        Remote::new(url, None)?;
    }
    Ok(())
}

/// The name a clone of `url` takes by default.
pub fn default_name(url: &str) -> anyhow::Result<String> {
    Ok(if mdl_bucket::is_bucket_url(url) {
        mdl_bucket::Location::parse(url)?.name().to_string()
    } else {
        Remote::new(url, None)?.name().to_string()
    })
}

/// The other repository of a configured remote ([`peer`]), with the token kept for it
/// (`mdl remote set-token`) unless --token or $MDL_TOKEN gives one.
pub fn named(cli: &Cli, repo: &mdl::Repository, name: &str) -> anyhow::Result<Box<dyn Peer>> {
    let url = mdl_remote::remote_url(repo, name)?;
    if cli.token.is_none() {
        if let Some(token) = mdl::credentials::get(repo, name)? {
            let with = Cli {
                token: Some(token),
                ..cli.clone()
            };
            return peer(&with, &url);
        }
    }
    peer(cli, &url)
}

/// Runs a command on a server.
pub fn run(cli: &Cli, remote: &Remote, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Commit(args) => {
            if args.engine.is_some() {
                bail!("--engine chooses this machine's engine; a server compresses with its repository's `engine` setting");
            }
            let outcome = remote.commit_paths(&args.paths, &args.options()?)?;
            output::commit(out, cli.json, &outcome)?;
        }
        Command::Checkout {
            rev,
            output: path,
            force,
            sync: _,
            skip_expired,
            path: tree_path,
            engine,
        } => {
            if engine.is_some() {
                bail!("--engine chooses this machine's engine; a server decodes with its repository's `engine` setting");
            }
            if *skip_expired {
                bail!("--skip-expired does not run over HTTP; check out the thinned commit where the repository is stored");
            }
            let outcome = remote.download(rev, path, tree_path.as_deref(), *force)?;
            output::checkout(out, cli.json, &outcome)?;
        }
        Command::Log { rev, n, graph, all } => {
            let entries = match all {
                true => remote.log_all(*n)?,
                false => remote.log(rev.as_deref(), *n)?,
            };
            output::log(out, cli.json, &entries, *graph)?;
        }
        Command::Show { rev } => output::show(out, cli.json, &remote.show(rev)?)?,
        Command::Compact { max_depth, dry_run } => {
            output::compact(out, cli.json, &remote.compact(*max_depth, *dry_run)?)?
        }
        Command::Gc {
            prune_older_than,
            expire_reflog,
            dry_run,
        } => {
            let (prune, expire) = (prune_older_than.as_deref(), expire_reflog.as_deref());
            // Checked here too, so a typo fails before anything is sent.
            mdl::gc::GcOptions::parse(prune, expire, *dry_run)?;
            match remote.gc(prune, expire, *dry_run)? {
                GcAnswer::Disk(outcome) => output::gc(out, cli.json, &outcome)?,
                GcAnswer::Bucket(outcome) => output::bucket_gc(out, cli.json, &outcome)?,
            }
        }
        Command::Branch {
            name: None,
            rev: None,
            delete: None,
            force_delete: None,
            force: false,
            all: false,
            remotes: false,
        } => output::refs(out, cli.json, &remote_refs(remote, mdl::Ref::BRANCHES)?)?,
        Command::Tag {
            name: None,
            rev: None,
            message: None,
            delete: None,
        } => output::refs(out, cli.json, &remote_refs(remote, mdl::Ref::TAGS)?)?,
        Command::Branch {
            all: true | false,
            remotes: true,
            ..
        }
        | Command::Branch { all: true, .. } => bail!(
            "branch -a and -r list remote-tracking branches, which stay where the repository is; over HTTP, `mdl branch` lists its branches"
        ),
        Command::Branch {
            name: Some(name),
            rev,
            delete: None,
            force_delete: None,
            force,
            ..
        } => {
            let moved = remote.branch(name, rev.as_deref(), *force)?;
            if *force {
                output::branch_move(out, cli.json, &moved)?;
            } else {
                let at = moved.to.short(12);
                output::message(out, cli.json, &format!("branch {name} at {at}"))?;
            }
        }
        Command::Branch {
            delete, force_delete, ..
        } => {
            let Some(d) = delete.as_ref().or(force_delete.as_ref()) else {
                bail!("branch: give a name to create, or -d/-D NAME to delete");
            };
            let was = remote.delete_branch(d, force_delete.is_some())?;
            let text = format!("deleted branch {d} (was {})", was.short(12));
            output::message(out, cli.json, &text)?;
        }
        Command::Switch { branch } => {
            remote.switch(branch)?;
            output::message(out, cli.json, &format!("switched to branch {branch}"))?;
        }
        Command::Stats => output::stats(out, cli.json, &remote.stats()?)?,
        Command::Diff { a, b, changed } => {
            output::diff(out, cli.json, &remote.diff(a, b)?, *changed)?
        }
        Command::Config {
            key: Some(k),
            value: Some(v),
        } => {
            let set = remote.set_config(k, v)?;
            output::message(out, cli.json, &format!("{} = {}", set.key, set.value))?;
        }
        Command::Config { key, value: _ } => {
            let mut all = remote.config()?;
            if let Some(k) = key {
                all.retain(|(name, _, _)| name == k);
                if all.is_empty() {
                    return Err(mdl::Error::UnknownConfig(k.clone()).into());
                }
            }
            output::config(out, cli.json, &all)?;
        }
        Command::Fsck { repair: false } => {
            let report = remote.fsck()?;
            output::fsck(out, cli.json, None, &report)?;
            if !report.ok() {
                eprintln!("error: fsck found {} problem(s)", report.problems.len());
                return Ok(ExitCode::from(3));
            }
        }
        Command::Fsck { repair: true } => bail!(
            "fsck --repair may rebuild the database, which needs the repository closed: stop the `mdl serve` at {} first",
            remote.url()
        ),
        // Listed one by one, so that a new command is a decision here, not a silent refusal.
        Command::Maintenance { .. } => bail!(
            "{} serves this repository and does its maintenance after each commit itself",
            remote.url()
        ),
        Command::Init { .. }
        | Command::Reset { .. }
        | Command::Reflog { .. }
        | Command::Status
        | Command::Tag { .. }
        | Command::Serve { .. }
        | Command::Remote { .. }
        | Command::Clone { .. }
        | Command::Fetch { .. }
        | Command::Pull { .. }
        | Command::Push { .. } => bail!(
            "this command does not run over HTTP; {} serves the repository (stop `mdl serve` to run it locally)",
            remote.url()
        ),
    }
    Ok(ExitCode::SUCCESS)
}

fn remote_refs(remote: &Remote, prefix: &str) -> anyhow::Result<Vec<mdl::refs::RefInfo>> {
    let refs = remote.refs()?;
    Ok(refs
        .refs
        .iter()
        .filter_map(|r| {
            let short = r.name.strip_prefix(prefix)?;
            Some(mdl::refs::RefInfo {
                name: short.to_string(),
                target: r.target,
                current: prefix == mdl::Ref::BRANCHES && refs.head.as_deref() == Some(short),
                message: r.message.clone(),
            })
        })
        .collect())
}

/// Parses a size such as `512M`, `64G` or a plain byte count.
fn parse_size(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (digits, shift) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 30),
        Some('T' | 't') => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .with_context(|| format!("invalid size {s:?}: expected a number with K, M, G or T"))?;
    n.checked_mul(1u64 << shift)
        .with_context(|| format!("size {s:?} is too large"))
}

/// `mdl serve`: binds, prints where it listens, and serves until SIGINT or SIGTERM.
pub fn serve(cli: &Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    let Command::Serve {
        addr,
        root,
        tokens,
        read_public,
        max_body,
        max_connections,
        header_timeout,
        body_timeout,
        decode_memory,
    } = &cli.command
    else {
        unreachable!("serve runs the serve command");
    };
    let repos = match (root, cli.bucket_url()) {
        (Some(_), Some(_)) => {
            bail!("--root serves the repositories in a folder; -C s3://… serves one repository in object storage")
        }
        (None, Some(url)) => {
            let location = mdl_bucket::Location::parse(url)?;
            mdl_server::Repos::Bucket {
                name: location.name().to_string(),
                location,
                cache: mdl_bucket::cache_root(),
            }
        }
        (Some(r), None) => {
            let base = cli.dir.clone().unwrap_or_else(|| PathBuf::from("."));
            let r = std::path::absolute(base.join(r))?;
            if !r.is_dir() {
                bail!("--root {}: not a directory", r.display());
            }
            mdl_server::Repos::Root(r)
        }
        (None, None) => {
            let dir = cli.dir.clone().unwrap_or_else(|| PathBuf::from("."));
            let path =
                mdl::discover(&dir).ok_or_else(|| mdl::StoreError::NotARepository(dir.clone()))?;
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .filter(|n| mdl_server::valid_repo_name(n))
                .with_context(|| {
                    format!(
                        "{}: the directory's name is not a valid repository name (letters, digits, '-', '_', '.')",
                        path.display()
                    )
                })?
                .to_string();
            mdl_server::Repos::One { name, path }
        }
    };
    let tokens_file = tokens.as_deref();
    let tokens = match tokens {
        Some(p) => mdl_server::Tokens::load(p).map_err(anyhow::Error::msg)?,
        None => mdl_server::Tokens::default(),
    };
    mdl::budget::set_limit(parse_size(decode_memory)?);
    let config = mdl_server::Config {
        repos,
        tokens,
        read_public: *read_public,
        max_body: parse_size(max_body)?,
        wait: Duration::from_secs(cli.wait),
        limits: mdl_server::Limits {
            max_connections: *max_connections,
            header_timeout: Duration::from_secs(*header_timeout),
            body_timeout: Duration::from_secs(*body_timeout),
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        let host = if local.ip().is_unspecified() {
            format!("127.0.0.1:{}", local.port())
        } else {
            local.to_string()
        };
        let base = format!("http://{host}");
        let state =
            mdl_server::State::new(config, Some(base.clone())).map_err(anyhow::Error::msg)?;
        let names = {
            let state = state.clone();
            tokio::task::spawn_blocking(move || state.open_all()).await??
        };
        if cli.json {
            // One line, written once the server listens: a script reads it and goes on.
            let doc = serde_json::json!({
                "url": base,
                "repositories": names
                    .iter()
                    .map(|n| serde_json::json!({"name": n, "url": format!("{base}/{n}")}))
                    .collect::<Vec<_>>(),
                "web": format!("{base}/ui/"),
                "read_public": *read_public,
            });
            writeln!(out, "{doc}")?;
        } else {
            writeln!(out, "listening on {base}")?;
            for n in &names {
                writeln!(out, "serving {base}/{n}")?;
            }
            writeln!(out, "{}", access(tokens_file, *read_public))?;
            let sign_in = if *read_public {
                ""
            } else {
                " (sign in with a token: read scope is enough)"
            };
            writeln!(out, "web view: {base}/ui/{sign_in}")?;
        }
        out.flush()?;
        mdl_server::serve(state, listener).await?;
        anyhow::Ok(())
    })
}

/// Who may connect to `mdl serve`, and how to let others in: printed when it starts.
fn access(tokens: Option<&std::path::Path>, read_public: bool) -> String {
    let owner = "mdl commands run in a served repository's folder (the owner token in its .mdl/serve.json, readable by you alone)";
    match (tokens, read_public) {
        (Some(f), true) => format!(
            "access: anyone may read; writes need a write token from {} (clients pass --token or set MDL_TOKEN), or come from {owner}",
            f.display()
        ),
        (Some(f), false) => format!(
            "access: tokens from {} (clients pass --token or set MDL_TOKEN), and {owner}",
            f.display()
        ),
        (None, true) => format!(
            "access: anyone may read; only {owner} may write (--tokens FILE grants others tokens)"
        ),
        (None, false) => format!(
            "access: only {owner}; --read-public lets anyone read, --tokens FILE grants tokens (docs/HTTP_API.md)"
        ),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("512").unwrap(), 512);
        assert_eq!(super::parse_size("2K").unwrap(), 2048);
        assert_eq!(super::parse_size("64G").unwrap(), 64 << 30);
        assert!(super::parse_size("lots").is_err());
        assert!(super::parse_size("99999999999T").is_err());
    }
}
