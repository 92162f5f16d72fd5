//! The other repository of a clone, fetch, pull or push, from its URL.

use mdl::Repository;
use mdl_remote::{Peer, Remote};

use crate::{Access, Location, Result};

/// The other repository of a clone, fetch, pull or push at `url`: a server (waited for as
/// `repo`'s `remote.*` settings and the environment say), or a repository in object storage
/// (through this machine's replica, brought up to date).
pub(crate) fn peer(url: &str, access: &Access, repo: Option<&Repository>) -> Result<Box<dyn Peer>> {
    Ok(match Location::url(url)? {
        Location::Bucket(loc) => Box::new(mdl_bucket::BucketPeer::open(
            &loc,
            &mdl_bucket::cache_root(),
            access.wait,
        )?),
        Location::Served(url) => Box::new(Remote::with_deadlines(
            &url,
            access.token.clone(),
            mdl::config::deadlines(repo)?,
        )?),
        Location::Folder(_) => unreachable!("Location::url never answers a folder"),
    })
}

/// The other repository of remote `name` of `repo` ([`peer`]), with the token kept for it
/// (`mdl remote set-token`) unless the access gives one.
pub(crate) fn named(repo: &Repository, name: &str, access: &Access) -> Result<Box<dyn Peer>> {
    let url = mdl_remote::remote_url(repo, name)?;
    if access.token.is_none() {
        if let Some(token) = mdl::credentials::get(repo, name)? {
            let with = Access {
                token: Some(token),
                ..access.clone()
            };
            return peer(&url, &with, Some(repo));
        }
    }
    peer(&url, access, Some(repo))
}
