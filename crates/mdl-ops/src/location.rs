//! Where a repository is, from the text a user gives (`-C`, `init`, `clone`, a remote's URL),
//! and the backend that reaches it.

use std::path::{Path, PathBuf};

use crate::{Backend, Error, Result};

/// A place mdl keeps repositories.
#[derive(Clone, Debug)]
pub enum Location {
    /// A folder on this machine.
    Folder(PathBuf),
    /// A repository behind `mdl serve`: `http(s)://HOST:PORT/REPO`.
    Served(String),
    /// A repository in object storage: `s3://BUCKET/PREFIX`.
    Bucket(mdl_bucket::Location),
}

impl Location {
    /// Reads `text`: a URL of a scheme mdl speaks, else a folder. A URL of any other scheme is
    /// refused, never taken for a folder's name.
    pub fn parse(text: &Path) -> Result<Location> {
        let Some(s) = text.to_str() else {
            return Ok(Location::Folder(text.to_path_buf()));
        };
        match scheme(s) {
            None => Ok(Location::Folder(text.to_path_buf())),
            Some("s3") => Ok(Location::Bucket(mdl_bucket::Location::parse(s)?)),
            Some("http" | "https") => {
                mdl_client::parse_url(s)?;
                Ok(Location::Served(s.to_string()))
            }
            Some(other) => Err(Error::Location(format!(
                "{other}:// is not a place mdl keeps repositories: name a folder, s3://BUCKET/PREFIX or http://HOST:PORT/REPO"
            ))),
        }
    }

    /// Reads `text` as the URL of another repository (a remote, a clone's source, `commit
    /// --remote`): a server's or one in object storage, never a folder.
    pub fn url(text: &str) -> Result<Location> {
        match Location::parse(Path::new(text))? {
            Location::Folder(_) => Err(mdl_client::Error::BadUrl(text.to_string()).into()),
            url => Ok(url),
        }
    }

    /// The backend that reaches it (a folder's may turn out to be served: see
    /// [`crate::open`]).
    pub fn backend(&self) -> Backend {
        match self {
            Location::Folder(_) => Backend::Local,
            Location::Served(_) => Backend::Served,
            Location::Bucket(_) => Backend::Bucket,
        }
    }

    /// How a user would write it.
    pub fn shown(&self) -> String {
        match self {
            Location::Folder(dir) => dir.display().to_string(),
            Location::Served(url) => url.clone(),
            Location::Bucket(loc) => loc.url(),
        }
    }
}

/// The scheme of `s` when it is a URL (`scheme://…`, the scheme a letter then letters, digits,
/// `+`, `-` or `.`).
fn scheme(s: &str) -> Option<&str> {
    let (scheme, _) = s.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}
