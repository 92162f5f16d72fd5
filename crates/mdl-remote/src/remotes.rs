//! Remotes kept in the repository's configuration as `remote.NAME.url`.

use mdl::Repository;

use crate::{Error, Result};

const REMOTE_PREFIX: &str = "remote.";
const URL_SUFFIX: &str = ".url";

/// Adds remote `name` with `url` to the repository's configuration. The URL is the caller's
/// to check: a server's ([`crate::Remote::new`]) or a repository in object storage.
pub fn add_remote(repo: &Repository, name: &str, url: &str) -> Result<()> {
    mdl::names::check_remote(name).map_err(|e| Error::Remote(e.to_string()))?;
    let key = format!("{REMOTE_PREFIX}{name}{URL_SUFFIX}");
    if !mdl::config::add(repo, &key, url)? {
        return Err(Error::Remote(format!("remote {name} already exists")));
    }
    Ok(())
}

/// The configured remotes, as (name, url).
pub fn remotes(repo: &Repository) -> Result<Vec<(String, String)>> {
    let all = mdl::config::with_prefix(repo, REMOTE_PREFIX)?;
    Ok(all
        .into_iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix(REMOTE_PREFIX)?.strip_suffix(URL_SUFFIX)?;
            Some((name.to_string(), v))
        })
        .collect())
}

/// Removes remote `name`: its URL, its token ([`mdl::credentials`]) and its remote-tracking
/// branches (`refs/remotes/NAME/…`, with their reflogs kept as for any deleted ref).
pub fn remove_remote(repo: &Repository, name: &str) -> Result<()> {
    let key = format!("{REMOTE_PREFIX}{name}{URL_SUFFIX}");
    if mdl::config::get(repo, &key)?.is_none() {
        return Err(no_remote(name));
    }
    let prefix = format!("{}{name}/", mdl::Ref::REMOTES);
    for (full, value) in mdl::refs::all_with_prefix(repo, &prefix)? {
        mdl::refs::replace(repo, &full, Some(&value), None, "remote removed")?;
    }
    mdl::credentials::set(repo, name, None)?;
    mdl::config::remove(repo, &key)?;
    Ok(())
}

/// Points remote `name` at `url` (checked by the caller, as for [`add_remote`]).
pub fn set_url(repo: &Repository, name: &str, url: &str) -> Result<()> {
    let key = format!("{REMOTE_PREFIX}{name}{URL_SUFFIX}");
    if mdl::config::get(repo, &key)?.is_none() {
        return Err(no_remote(name));
    }
    mdl::config::set_copied(repo, &key, url)?;
    Ok(())
}

/// Keeps `token` for remote `name` (`None` forgets it).
pub fn set_token(repo: &Repository, name: &str, token: Option<&str>) -> Result<()> {
    remote_url(repo, name)?;
    mdl::credentials::set(repo, name, token)?;
    Ok(())
}

fn no_remote(name: &str) -> Error {
    Error::Remote(format!(
        "no remote named {name} (mdl remote add {name} URL)"
    ))
}

/// The URL of remote `name`.
pub fn remote_url(repo: &Repository, name: &str) -> Result<String> {
    mdl::config::get(repo, &format!("{REMOTE_PREFIX}{name}{URL_SUFFIX}"))?
        .ok_or_else(|| no_remote(name))
}
