//! `mdl init`, wherever the repository is to be: a folder (`mdl init DIR`, `mdl -C DIR init`),
//! or object storage (`mdl init s3://BUCKET/PREFIX`, `mdl -C s3://… init`). A served
//! repository is created on its server's machine; any other `scheme://` is refused, never
//! taken for a folder name.

use std::io::Write;
use std::path::PathBuf;

use anyhow::bail;
use mdl::Repository;

use crate::{output, Cli};

/// Creates the repository that `cli`'s `-C` and `init`'s `path` name.
pub fn run(cli: &Cli, path: Option<&PathBuf>, out: &mut dyn Write) -> anyhow::Result<()> {
    let dir = cli.dir.as_ref().and_then(|d| d.to_str());
    let arg = path.and_then(|p| p.to_str());
    match (dir.filter(|d| scheme(d).is_some()), arg) {
        (Some(url), Some(_)) => {
            bail!("mdl -C {url} init takes no folder: the repository is {url} itself")
        }
        (Some(url), None) => return at_url(cli, url, out),
        (None, Some(url)) if scheme(url).is_some() => return at_url(cli, url, out),
        _ => {}
    }
    let base = cli.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let dir = path.map(|d| base.join(d)).unwrap_or(base);
    let repo = Repository::init(&dir)?;
    output::init(out, cli.json, repo.root())?;
    Ok(())
}

fn at_url(cli: &Cli, url: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    if mdl_bucket::is_bucket_url(url) {
        let loc = mdl_bucket::Location::parse(url)?;
        mdl_bucket::init(&loc)?;
        if cli.json {
            writeln!(
                out,
                "{}",
                serde_json::json!({ "path": loc.url(), "branch": "main" })
            )?;
        } else {
            writeln!(out, "initialized empty mdl repository in {}", loc.url())?;
        }
        return Ok(());
    }
    match scheme(url) {
        Some("http" | "https") => bail!(
            "a server does not create repositories: run `mdl init DIR` on its machine, in the folder `mdl serve` serves, and it is served as {url}"
        ),
        Some(other) => bail!(unsupported(other)),
        None => unreachable!("called with URLs only"),
    }
}

/// The scheme of `s` when it is a URL (`scheme://…`, the scheme a letter then letters, digits,
/// `+`, `-` or `.`).
pub fn scheme(s: &str) -> Option<&str> {
    let (scheme, _) = s.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

/// The error for a `-C` or `init` URL of a scheme mdl does not speak.
pub fn unsupported(scheme: &str) -> String {
    format!(
        "{scheme}:// is not a place mdl keeps repositories: name a folder, s3://BUCKET/PREFIX or http://HOST:PORT/REPO"
    )
}
