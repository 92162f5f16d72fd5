//! `push`: a branch to a server, refused unless it fast-forwards there.

use std::collections::HashSet;

use mdl::transfer::{self, Received, RefUpdate};
use mdl::{ObjectId, Ref, RefValue, Repository};
use mdl_protocol::ErrorCode;

use crate::fetch::{branch_name, current_branch, with_progress};
use crate::{Error, Moved, Peer, Result, TransferOutcome};

/// Pushes `branch` (HEAD's when `None`) to `remote`: sends the objects the server lacks, then
/// moves the server's branch by compare-and-swap. Refused when the server's branch has
/// commits this repository does not descend from (unless `force`), or when it changed
/// during the push.
pub fn push(
    repo: &Repository,
    remote_name: &str,
    remote: &dyn Peer,
    branch: Option<&str>,
    force: bool,
    progress: &dyn mdl::Progress,
) -> Result<TransferOutcome> {
    let branch = match branch {
        Some(b) => b.to_string(),
        None => current_branch(repo)?,
    };
    let name = Ref::branch(&branch_name(&branch)?).full();
    let tip = mdl::refs::get(repo, &name)?
        .and_then(|v| v.target())
        .ok_or_else(|| mdl::Error::UnbornBranch(branch.clone()))?;
    let refs = remote.refs()?;
    let theirs = refs.get(&name);
    let mut outcome = TransferOutcome::default();
    if theirs == Some(tip) {
        return Ok(outcome);
    }
    if let (Some(t), false) = (theirs, force) {
        let known = transfer::has_commit(repo, &t)?;
        if !known || !transfer::is_ancestor(repo, &t, &tip)? {
            // Every way out named here, none of which sends the user back to this message.
            return Err(Error::Rejected(format!(
                "push of {branch} rejected: not a fast-forward ({url} has {} there, which {} does not descend from); `mdl pull {remote_name} {branch}` if only they have new commits, else keep yours as another branch (`mdl branch NEW` then `mdl push {remote_name} NEW`) or replace theirs (`mdl push --force`; the server's reflog keeps them)",
                t.short(12),
                tip.short(12),
                url = remote.url(),
            )));
        }
    }
    let update = RefUpdate {
        name: name.clone(),
        old: theirs,
        new: Some(tip),
        force,
    };
    // The server answers `incomplete` when gc removed, between these requests, an object it
    // had counted as present; nothing was published, and asking again sends it.
    let mut attempts = 0;
    let sent = loop {
        match send_and_move(repo, remote, &update, progress) {
            Err(e) if code(&e) == Some(ErrorCode::Incomplete) && attempts < PUSH_RETRIES => {
                attempts += 1;
                tracing::info!(
                    "{} lost objects during the push; sending again",
                    remote.url()
                );
            }
            other => break other,
        }
    };
    match sent {
        Ok(received) => {
            outcome.objects = received.objects;
            outcome.bytes = received.bytes;
        }
        Err(e) if code(&e) == Some(ErrorCode::RefConflict) => {
            return Err(Error::Rejected(format!(
                "push of {branch} rejected: {}'s {branch} changed during the push; pull and push again",
                remote.url()
            )));
        }
        Err(e) if code(&e) == Some(ErrorCode::NotFastForward) => {
            let why = match e {
                Error::Client(mdl_client::Error::Server { message, .. }) => message,
                other => other.to_string(),
            };
            return Err(Error::Rejected(format!("push of {branch} rejected: {why}")));
        }
        Err(e) => return Err(e),
    }
    outcome.moved.push(Moved {
        name,
        old: theirs,
        new: tip,
    });
    // Record what the server now has.
    let tracking = Ref::remote(remote_name, &branch_name(&branch)?).full();
    let old = mdl::refs::get(repo, &tracking)?;
    mdl::refs::compare_and_swap(
        repo,
        &tracking,
        old.as_ref(),
        &RefValue::Direct(tip),
        &format!("push {}", remote.url()),
    )?;
    Ok(outcome)
}

/// The error code of a failure a push answers: a server's, or the one a server would send for
/// the same failure of a repository opened here.
fn code(e: &Error) -> Option<ErrorCode> {
    match e {
        Error::Client(mdl_client::Error::Server { code, .. }) | Error::Peer { code, .. } => *code,
        Error::Local(mdl::Error::Incomplete(_)) => Some(ErrorCode::Incomplete),
        Error::Local(mdl::Error::NotFastForward { .. }) => Some(ErrorCode::NotFastForward),
        Error::Local(mdl::Error::Store(mdl::StoreError::RefConflict { .. })) => {
            Some(ErrorCode::RefConflict)
        }
        _ => None,
    }
}

/// How often a push starts again when the server lost objects it had counted as present.
const PUSH_RETRIES: usize = 3;

/// Sends what the server lacks of `update.new`'s history (asking which commits, then which of
/// their objects), then applies `update`.
fn send_and_move(
    repo: &Repository,
    remote: &dyn Peer,
    update: &RefUpdate,
    progress: &dyn mdl::Progress,
) -> Result<Received> {
    let tip = update.new.expect("a push moves a ref to a commit");
    // With the parents a shallow history lacks: whether the other side has them decides
    // whether the push can go.
    let mut history = transfer::reachable_commits(repo, &[tip])?;
    history.extend(mdl::shallow::parents_beyond(repo)?);
    let missing: HashSet<ObjectId> = remote.missing(&history)?.into_iter().collect();
    let whole = transfer::Shallow::WHOLE;
    let plan = transfer::plan(repo, &[tip], &|id| !missing.contains(id), &whole)?;
    // A shallow clone can push onto history the other side has, not history it lacks itself.
    if let Some(cut) = plan.iter().find(|p| p.cut) {
        return Err(Error::Remote(format!(
            "{} lacks the history before commit {}, where this shallow clone's history ends; `mdl fetch --deepen N` brings more of it",
            remote.url(),
            cut.id.short(12)
        )));
    }
    let ids: Vec<ObjectId> = plan.iter().map(|p| p.id).collect();
    let needed: HashSet<ObjectId> = remote.missing(&ids)?.into_iter().collect();
    let send: Vec<ObjectId> = ids.into_iter().filter(|id| needed.contains(id)).collect();
    let received = if send.is_empty() {
        Received::default()
    } else {
        with_progress(progress, "sending", &plan, &needed, || {
            remote.send_objects(repo, &send, progress)
        })?
    };
    remote.update_ref(update)?;
    Ok(received)
}
