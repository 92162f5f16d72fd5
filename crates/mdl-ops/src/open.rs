//! Reaching a repository: opening one wherever it is, making one, cloning one.

use std::path::{Path, PathBuf};

use mdl::Repository;
use mdl_remote::Remote;

use crate::peer::peer;
use crate::{Access, InBucket, Local, Location, Operation, Operations, Result, Served};

/// The repository at `location`, through the backend that reaches it. A folder that a live
/// `mdl serve` owns is reached through that server when `access.follow_server`.
pub fn open(location: &Location, access: &Access) -> Result<Box<dyn Operations>> {
    Ok(match location {
        Location::Folder(dir) => {
            let owner = access
                .follow_server
                .then(|| mdl::discover(dir))
                .flatten()
                .and_then(|root| mdl::advertised(&root));
            match owner {
                Some(ad) => {
                    tracing::info!(
                        "mdl serve (pid {}) owns this repository: forwarding to {}",
                        ad.pid,
                        ad.url
                    );
                    Box::new(Served::new(Remote::new(&ad.url, Some(ad.token))?))
                }
                None => Box::new(Local::new(dir.clone(), access.clone())),
            }
        }
        Location::Served(url) => Box::new(Served::new(Remote::new(url, access.token.clone())?)),
        Location::Bucket(loc) => Box::new(InBucket::new(loc.clone(), access.clone())),
    })
}

/// A repository just made.
#[derive(Clone, Debug)]
pub enum Initialized {
    /// In this work directory.
    Folder(PathBuf),
    /// In object storage, at this URL.
    Bucket(String),
    /// On a server, at this URL.
    Served(String),
}

/// Makes a repository at `location`: a folder (created if missing), one in object storage, or
/// one on a server that serves a folder of repositories (`mdl serve DIR`), for a token of
/// `admin` scope (`access.token`).
pub fn init(location: &Location, access: &Access) -> Result<Initialized> {
    match location {
        Location::Folder(dir) => {
            let repo = Repository::init(dir)?;
            Ok(Initialized::Folder(repo.root().to_path_buf()))
        }
        Location::Bucket(loc) => {
            mdl_bucket::init(loc)?;
            Ok(Initialized::Bucket(loc.url()))
        }
        Location::Served(url) => {
            Remote::new(url, access.token.clone())?.create()?;
            Ok(Initialized::Served(url.clone()))
        }
    }
}

/// Clones the repository at `url` into `dir` under `base`, the folder the command runs in;
/// `dir` defaults to the name the URL ends with. A clone makes a new repository, so `base`
/// must be a folder. `depth` and `since` make it shallow ([`mdl_remote::clone`]).
pub fn clone(
    url: &str,
    base: &Location,
    dir: Option<&Path>,
    access: &Access,
    (depth, since): (Option<u32>, Option<&str>),
    progress: &dyn mdl::Progress,
) -> Result<mdl_remote::CloneOutcome> {
    let Location::Folder(base) = base else {
        return Err(crate::error::unsupported(
            Operation::Clone,
            base.backend(),
            format!(
                "a clone makes a new repository; clone {0} itself (mdl clone {0} DIR), or push into it from a clone of the other",
                base.shown()
            ),
        ));
    };
    let name = match Location::url(url)? {
        Location::Bucket(loc) => loc.name().to_string(),
        // A repository in a namespace is cloned into a folder of its own name, as git does.
        Location::Served(url) => {
            let repo = mdl_client::parse_url(&url)?.1;
            repo.rsplit('/').next().unwrap_or(repo).to_string()
        }
        Location::Folder(_) => unreachable!("Location::url never answers a folder"),
    };
    let dir = base.join(dir.map_or_else(|| PathBuf::from(name), Path::to_path_buf));
    let peer = peer(url, access, None)?;
    Ok(mdl_remote::clone(
        peer.as_ref(),
        &dir,
        depth,
        since,
        progress,
    )?)
}
