//! `clone`: a whole repository from another (a [`Peer`]), assembled beside its target and
//! renamed.

use std::path::{Path, PathBuf};

use mdl::transfer::{RefChange, Shallow};
use mdl::{ObjectId, Ref, RefName, RefValue, Repository};
use mdl_protocol::body::Refs;

use crate::fetch::fetch_refs;
use crate::remotes::add_remote;
use crate::{Error, Moved, Peer, Result, TransferOutcome};

/// What a clone made.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CloneOutcome {
    /// The new repository's work directory.
    pub dir: PathBuf,
    /// The transfer.
    pub transfer: TransferOutcome,
    /// The branch HEAD points at.
    pub head: Option<String>,
}

/// Clones `remote` into `dir` (which must not exist or be empty): every branch and tag,
/// `origin` (its URL) as its remote, HEAD on its HEAD branch. The clone is assembled in a
/// hidden directory beside `dir` and renamed into place when complete, so a failed or
/// interrupted clone leaves `dir` as it was; what a killed clone left beside it is removed by
/// the next clone into the same place. A clone whose transfer was cut off keeps what arrived
/// whole (verified) in that hidden directory, and the next clone of the same URL into the same
/// place goes on from there: only the rest is sent. `depth` (the last N commits of each
/// branch and tag) or `since` (a commit, or a branch or tag of the remote, and what came after
/// it) make it a shallow clone of HEAD's branch and the tags among the commits it takes: the
/// commits where its history ends are marked cut.
// The clone is a whole new repository assembled in a staging folder beside `dir`: renaming it
// into place, or removing it after a failure, moves a folder no store owns yet.
#[allow(clippy::disallowed_methods)]
pub fn clone(
    remote: &dyn Peer,
    dir: &Path,
    depth: Option<u32>,
    since: Option<&str>,
    progress: &dyn mdl::Progress,
) -> Result<CloneOutcome> {
    let url = remote.url();
    if dir.exists()
        && std::fs::read_dir(dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(Error::Remote(format!(
            "{} exists and is not empty",
            dir.display()
        )));
    }
    let staging = staging_dir(dir)?;
    let resumed = sweep_stale_staging(dir, url, &staging);
    let _interrupted = mdl::interrupt::register(&staging);
    let result = (|| {
        let repo = match resumed {
            true => Repository::open(&staging, &mdl::OpenOptions::default())?,
            false => {
                let repo = Repository::init(&staging)?;
                add_remote(&repo, "origin", url)?;
                repo
            }
        };
        let refs = remote.refs()?;
        let limit = Shallow {
            depth,
            since: since.map(|rev| since_commit(&refs, url, rev)).transpose()?,
        };
        // A shallow clone takes HEAD's branch alone (each other branch could bring a whole
        // checkpoint of its own).
        let only = match limit.is_whole() {
            true => None,
            false => refs.head.as_deref(),
        };
        // A refused clone removes its whole staging folder: what it added goes with it.
        let (mut transfer, mut changes, _added) =
            fetch_refs(&repo, "origin", remote, &refs, only, &limit, progress)?;
        for r in &refs.refs {
            let wanted = only.is_none_or(|b| r.name.strip_prefix(Ref::BRANCHES) == Some(b));
            if let (Some(Ref::Branch(_)), true) = (Ref::parse(&r.name), wanted) {
                changes.push(RefChange {
                    name: r.name.clone(),
                    old: None,
                    new: RefValue::Direct(r.target),
                });
                transfer.moved.push(Moved {
                    name: r.name.clone(),
                    old: None,
                    new: r.target,
                });
            }
        }
        mdl::transfer::update_refs(&repo, &changes, &format!("clone {url}"))?;
        let head = refs
            .head
            .clone()
            .filter(|h| RefName::new(h).is_ok_and(|n| refs.get(&Ref::branch(&n).full()).is_some()));
        if let Some(h) = &head {
            mdl::refs::switch(&repo, h)?;
        }
        Ok((transfer, head))
    })();
    let done = result.and_then(|(transfer, head)| {
        // An empty `dir` is replaced by the finished clone (rename replaces an empty
        // directory).
        std::fs::rename(&staging, dir).map_err(|source| mdl::Error::Output {
            path: dir.to_path_buf(),
            source,
        })?;
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        Ok(CloneOutcome {
            dir,
            transfer,
            head,
        })
    });
    match &done {
        Err(Error::Local(mdl::Error::TransferCut { .. })) => {}
        Err(_) => {
            let _ = std::fs::remove_dir_all(&staging);
        }
        Ok(_) => {}
    }
    done
}

/// The commit `rev` names: a full commit id, or a branch or tag the remote lists.
fn since_commit(refs: &Refs, url: &str, rev: &str) -> Result<ObjectId> {
    if let Ok(id) = rev.parse::<ObjectId>() {
        return Ok(id);
    }
    [Ref::BRANCHES, Ref::TAGS]
        .iter()
        .find_map(|prefix| refs.get(&format!("{prefix}{rev}")))
        .ok_or_else(|| {
            Error::Remote(format!(
                "--since {rev}: not a full commit id (64 hex digits) nor a branch or tag of {url}"
            ))
        })
}

/// The folder `dir` is in (`.` for a bare name) and its name; `None` for `/` or `..`.
fn place_of(dir: &Path) -> Option<(&Path, &std::ffi::OsStr)> {
    let parent = dir.parent()?;
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    Some((parent, dir.file_name()?))
}

/// Where a clone into `dir` is assembled: `.NAME.mdl-clone-PID` beside it.
fn staging_dir(dir: &Path) -> Result<PathBuf> {
    let (parent, name) = place_of(dir)
        .ok_or_else(|| Error::Remote(format!("{} is not a directory name", dir.display())))?;
    Ok(parent.join(format!(
        ".{}.mdl-clone-{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Removes what clones into `dir` by processes that no longer run left beside it, except one
/// of `url` cut off during its transfer (a repository whose `origin` is `url`, with no commit
/// yet), which becomes `staging`: whether there was one.
// Staging folders of clones whose process is gone: no repository's files yet.
#[allow(clippy::disallowed_methods)]
fn sweep_stale_staging(dir: &Path, url: &str, staging: &Path) -> bool {
    let Some((parent, name)) = place_of(dir) else {
        return false;
    };
    let prefix = format!(".{}.mdl-clone-", name.to_string_lossy());
    let mut resumed = false;
    for entry in std::fs::read_dir(parent).into_iter().flatten().flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        if !resumed
            && resumable(&entry.path(), url)
            && std::fs::rename(entry.path(), staging).is_ok()
        {
            tracing::info!(
                "going on with the clone of {url} cut off in {}",
                entry.path().display()
            );
            resumed = true;
            continue;
        }
        tracing::info!(
            "removing {} left by an interrupted clone",
            entry.path().display()
        );
        let _ = std::fs::remove_dir_all(entry.path());
    }
    resumed
}

/// Whether `path` holds a clone of `url` cut off during its transfer: a repository whose
/// `origin` is `url` and that names no commit yet.
fn resumable(path: &Path, url: &str) -> bool {
    // Its own `.mdl`, not a repository around it.
    if !path.join(".mdl").is_dir() {
        return false;
    }
    let Ok(repo) = Repository::open(path, &mdl::OpenOptions::default()) else {
        return false;
    };
    crate::remotes::remote_url(&repo, "origin").is_ok_and(|u| u == url)
        && mdl::transfer::commits(&repo).is_ok_and(|c| c.is_empty())
}
