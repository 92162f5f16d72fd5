//! `mdl serve`: one repository (a folder, or one in object storage) or every one under
//! `--root`, over HTTP, until SIGINT or SIGTERM.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::{Cli, Command};

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
pub(crate) fn run(cli: &Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    let Command::Serve {
        addr,
        root,
        tokens,
        read_public,
        max_body,
        hf_lfs_from,
        max_connections,
        max_connections_per_address,
        header_timeout,
        body_timeout,
        decode_memory,
    } = &cli.command
    else {
        unreachable!("serve runs the serve command");
    };
    let bucket = match cli.location()? {
        mdl_ops::Location::Bucket(loc) => Some(loc),
        mdl_ops::Location::Served(url) => {
            bail!("{url} is served already: mdl serve serves a folder, --root DIR or s3://BUCKET/PREFIX")
        }
        mdl_ops::Location::Folder(_) => None,
    };
    let repos = match (root, bucket) {
        (Some(_), Some(_)) => {
            bail!("--root serves the repositories in a folder; -C s3://… serves one repository in object storage")
        }
        (None, Some(location)) => mdl_server::Repos::Bucket {
            name: location.name().to_string(),
            location,
            cache: mdl_bucket::cache_root(),
        },
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
        hf_lfs_from: match hf_lfs_from.as_str() {
            "off" => None,
            size => Some(parse_size(size)?),
        },
        wait: Duration::from_secs(cli.wait),
        limits: mdl_server::Limits {
            max_connections: *max_connections,
            max_per_address: *max_connections_per_address,
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
        let serving = mdl_server::serve(state.clone(), listener)?;
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
            if *read_public {
                writeln!(out, "web view: {base}/ui/")?;
            } else {
                let link = mdl_server::sign_in_path(&state).map_err(anyhow::Error::msg)?;
                writeln!(
                    out,
                    "web view: {base}/ui/ (sign in with a token, or open {base}{link} once within ten minutes)"
                )?;
            }
        }
        out.flush()?;
        serving.await?;
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
