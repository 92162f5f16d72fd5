//! `fetch` and `pull`: branches and tags from another repository (a [`Peer`]) into this one.

use std::collections::HashSet;

use mdl::names;
use mdl::transfer::{self, Added, PlannedObject, Receipt, Received, RefChange, Shallow};
use mdl::{ObjectId, Progress, Ref, RefName, RefValue, Repository, Timestamp};
use mdl_protocol::body::{ListedRef, Refs};

use crate::{Error, Peer, Result};

/// A ref that a fetch, pull or push moved.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Moved {
    /// Full ref name.
    pub name: String,
    /// Its value before.
    pub old: Option<ObjectId>,
    /// Its value now.
    pub new: ObjectId,
}

/// What a transfer did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TransferOutcome {
    /// Objects that travelled.
    pub objects: u64,
    /// Their record bytes.
    pub bytes: u64,
    /// Refs changed (locally for fetch and pull, on the server for push).
    pub moved: Vec<Moved>,
}

/// Fetches `branch` (every branch when `None`) and every tag from `remote` into `repo`, with
/// as much history as `limit` takes: branches land as `refs/remotes/REMOTE_NAME/BRANCH`; tags
/// missing locally are created (existing local tags are never moved). The refs move in one
/// transaction, once every commit they name is here and whole; a refused answer moves none.
pub fn fetch(
    repo: &Repository,
    remote_name: &str,
    remote: &dyn Peer,
    branch: Option<&str>,
    limit: &Shallow,
    progress: &dyn Progress,
) -> Result<TransferOutcome> {
    let refs = remote.refs()?;
    let (outcome, changes, added) =
        fetch_refs(repo, remote_name, remote, &refs, branch, limit, progress)?;
    if let Err(e) = transfer::update_refs(repo, &changes, &format!("fetch {}", remote.url())) {
        // Refs that name what never came: nothing of the fetch stays.
        added.undo(repo);
        return Err(e.into());
    }
    Ok(outcome)
}

/// Checks the refs the peer at `url` sent, before anything is fetched: every name a branch or
/// tag name git would take ([`transfer::check_ref_name`]), none twice, HEAD a valid branch
/// name, a tag's tagger and message free of control characters. One bad name refuses the
/// whole answer.
pub fn check_refs(url: &str, refs: &Refs) -> Result<()> {
    let refuse = |why: String| -> Error {
        mdl_client::Error::Answer {
            url: url.to_string(),
            why,
        }
        .into()
    };
    let mut seen = HashSet::new();
    for r in &refs.refs {
        transfer::check_ref_name(&r.name).map_err(|e| refuse(format!("refs: {e}")))?;
        if !seen.insert(r.name.as_str()) {
            return Err(refuse(format!("refs: {:?} listed twice", r.name)));
        }
        let text = [(r.tagger.as_deref(), false), (r.message.as_deref(), true)];
        for (t, lines) in text {
            if let Some(t) = t {
                names::check_text(t, lines)
                    .map_err(|e| refuse(format!("refs: the tag {}: {e}", r.name)))?;
            }
        }
    }
    if let Some(head) = &refs.head {
        RefName::new(head).map_err(|e| refuse(format!("refs: HEAD names {e}")))?;
    }
    Ok(())
}

/// What fetching `branch` (every branch when `None`) and every tag from `remote` brings, given
/// its refs, with as much history as `limit` takes (shallow history, asked for or held, takes
/// only the tags that name commits it holds after): the commits fetched, the ref changes that take them (remote-tracking branches,
/// new tags), not yet made, and what the fetch added, to be taken out again if they are
/// refused.
pub(crate) fn fetch_refs(
    repo: &Repository,
    remote_name: &str,
    remote: &dyn Peer,
    refs: &Refs,
    branch: Option<&str>,
    limit: &Shallow,
    progress: &dyn Progress,
) -> Result<(TransferOutcome, Vec<RefChange>, Added)> {
    check_refs(remote.url(), refs)?;
    let branches: Vec<&ListedRef> = refs
        .refs
        .iter()
        .filter(|r| match (r.name.strip_prefix(Ref::BRANCHES), branch) {
            (Some(b), Some(want)) => b == want,
            (Some(_), None) => true,
            (None, _) => false,
        })
        .collect();
    if let (Some(b), true) = (branch, branches.is_empty()) {
        return Err(Error::Remote(format!("{} has no branch {b}", remote.url())));
    }
    let tags: Vec<&ListedRef> = refs
        .refs
        .iter()
        .filter(|r| r.name.starts_with(Ref::TAGS))
        .collect();
    // Shallow history takes the branches' newest commits, and the tags among them: a tag of
    // an old step would bring that whole checkpoint (and, past the cut, its history).
    let shallow = !limit.is_whole() || !mdl::shallow::cut(repo)?.is_empty();
    let mut outcome = TransferOutcome::default();
    let wanted: Vec<ObjectId> = match shallow {
        true => branches.iter().map(|r| r.target).collect(),
        false => branches.iter().chain(&tags).map(|r| r.target).collect(),
    };
    let receipt = fetch_commits(repo, remote, &wanted, limit, progress)?;
    let mut tags = tags;
    if shallow {
        let mut held = Vec::new();
        for t in tags {
            if transfer::has_commit(repo, &t.target)? {
                held.push(t);
            }
        }
        tags = held;
    }
    outcome.objects = receipt.received.objects;
    outcome.bytes = receipt.received.bytes;
    match ref_changes(repo, remote_name, &branches, &tags, &mut outcome) {
        Ok(changes) => Ok((outcome, changes, receipt.added)),
        Err(e) => {
            receipt.added.undo(repo);
            Err(e)
        }
    }
}

/// The ref changes a fetch makes: `branches` as remote-tracking branches of `remote_name`,
/// the `tags` this repository lacks; each noted in `outcome`.
fn ref_changes(
    repo: &Repository,
    remote_name: &str,
    branches: &[&ListedRef],
    tags: &[&ListedRef],
    outcome: &mut TransferOutcome,
) -> Result<Vec<RefChange>> {
    let mut changes = Vec::new();
    for r in branches {
        let short = branch_name(&r.name[Ref::BRANCHES.len()..])?;
        let tracking = Ref::remote(remote_name, &short).full();
        let old = mdl::refs::get(repo, &tracking)?;
        if old.as_ref().and_then(RefValue::target) == Some(r.target) {
            continue;
        }
        outcome.moved.push(Moved {
            name: tracking.clone(),
            old: old.as_ref().and_then(RefValue::target),
            new: r.target,
        });
        changes.push(RefChange {
            name: tracking,
            old,
            new: RefValue::Direct(r.target),
        });
    }
    for t in tags {
        if mdl::refs::get(repo, &t.name)?.is_some() {
            continue;
        }
        let value = match (&t.tagger, t.time_ms, &t.message) {
            (Some(tagger), Some(time), Some(message)) => RefValue::Annotated {
                target: t.target,
                tagger: tagger.clone(),
                time: Timestamp(time),
                message: message.clone(),
            },
            _ => RefValue::Direct(t.target),
        };
        outcome.moved.push(Moved {
            name: t.name.clone(),
            old: None,
            new: t.target,
        });
        changes.push(RefChange {
            name: t.name.clone(),
            old: None,
            new: value,
        });
    }
    Ok(changes)
}

/// Brings the commits `want` (and their history, as far as `limit` takes it) from the server,
/// sending only objects this repository lacks; what came, and what it added.
fn fetch_commits(
    repo: &Repository,
    remote: &dyn Peer,
    want: &[ObjectId],
    limit: &Shallow,
    progress: &dyn Progress,
) -> Result<Receipt> {
    let have: Vec<ObjectId> = transfer::commits(repo)?;
    let have_set: HashSet<ObjectId> = have.iter().copied().collect();
    let want: Vec<ObjectId> = want
        .iter()
        .filter(|id| !have_set.contains(id))
        .copied()
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if want.is_empty() {
        return Ok(Receipt::default());
    }
    // The server may re-encode a planned record after the plan (its deferred re-encodes, a
    // compaction, another process's maintenance): a record then arrives as a delta of one not
    // sent first, or longer than planned. The pack is refused (and what it added removed); a
    // new plan orders the objects by their bases and sizes now.
    let mut attempts = 0;
    loop {
        let plan = remote.plan(&want, &have, limit)?;
        let mut ids = HashSet::new();
        if let Some(twice) = plan.iter().find(|p| !ids.insert(p.id)) {
            return Err(mdl_client::Error::Answer {
                url: remote.url().to_string(),
                why: format!("the plan lists {} twice", twice.id),
            }
            .into());
        }
        let planned: Vec<ObjectId> = plan.iter().map(|p| p.id).collect();
        let needed: HashSet<ObjectId> = transfer::missing(repo, &planned)?.into_iter().collect();
        let needed: Vec<PlannedObject> = plan
            .iter()
            .filter(|p| needed.contains(&p.id))
            .copied()
            .collect();
        tracing::info!(
            "fetching {} of {} objects from {}",
            needed.len(),
            plan.len(),
            remote.url()
        );
        let bytes = needed.iter().map(|p| p.size).fold(0, u64::saturating_add);
        transfer::check_room(repo, bytes)?;
        progress.start("receiving", bytes);
        let got = remote.fetch_objects(repo, &needed, progress);
        progress.finish();
        match got {
            Err(Error::Local(mdl::Error::BaseNotSent { .. } | mdl::Error::PlanChanged { .. }))
                if attempts < FETCH_RETRIES =>
            {
                attempts += 1;
                tracing::info!(
                    "{} re-encoded objects during the fetch; asking again",
                    remote.url()
                );
            }
            other => return other,
        }
    }
}

/// Brings `by` more commits of history behind each commit where this repository's history is
/// cut (a shallow clone), from `remote`; refs do not move. Refused for a repository whose
/// history is whole.
pub fn deepen(
    repo: &Repository,
    remote: &dyn Peer,
    by: u32,
    progress: &dyn Progress,
) -> Result<TransferOutcome> {
    let want = mdl::shallow::parents_beyond(repo)?;
    if want.is_empty() {
        return Err(Error::Remote(
            "--deepen: this repository's history is whole (not a shallow clone)".into(),
        ));
    }
    let limit = Shallow {
        depth: Some(by),
        since: None,
    };
    let receipt = fetch_commits(repo, remote, &want, &limit, progress)?;
    Ok(TransferOutcome {
        objects: receipt.received.objects,
        bytes: receipt.received.bytes,
        moved: Vec::new(),
    })
}

/// How often a fetch plans again when the server re-encoded objects after planning.
const FETCH_RETRIES: usize = 3;

/// Runs `transfer` (of the objects of `plan` that `ids` names) with `progress` started for
/// their planned bytes, and finished after it, whatever its outcome.
pub(crate) fn with_progress(
    progress: &dyn Progress,
    what: &str,
    plan: &[PlannedObject],
    ids: &HashSet<ObjectId>,
    transfer: impl FnOnce() -> Result<Received>,
) -> Result<Received> {
    let bytes = plan
        .iter()
        .filter(|p| ids.contains(&p.id))
        .map(|p| p.size)
        .sum();
    progress.start(what, bytes);
    let done = transfer();
    progress.finish();
    done
}

/// Fetches `branch` (HEAD's when `None`) and fast-forwards the local branch to it (creating
/// it when missing). A local branch with commits the remote lacks is left alone with an
/// error naming both tips.
pub fn pull(
    repo: &Repository,
    remote_name: &str,
    remote: &dyn Peer,
    branch: Option<&str>,
    limit: &Shallow,
    progress: &dyn Progress,
) -> Result<TransferOutcome> {
    let branch = match branch {
        Some(b) => b.to_string(),
        None => current_branch(repo)?,
    };
    let mut outcome = fetch(repo, remote_name, remote, Some(&branch), limit, progress)?;
    let tracking = Ref::remote(remote_name, &branch_name(&branch)?).full();
    let theirs = mdl::refs::get(repo, &tracking)?
        .and_then(|v| v.target())
        .ok_or_else(|| Error::Remote(format!("{} has no branch {branch}", remote.url())))?;
    let name = Ref::branch(&branch_name(&branch)?).full();
    let ours = mdl::refs::get(repo, &name)?;
    let ours_id = ours.as_ref().and_then(RefValue::target);
    match ours_id {
        Some(o) if o == theirs => {}
        Some(o) if transfer::is_ancestor(repo, &theirs, &o)? => {}
        Some(o) if !transfer::is_ancestor(repo, &o, &theirs)? => {
            return Err(Error::Rejected(format!(
                "cannot fast-forward {branch}: the local branch ({}) and {}'s ({}) have diverged; `mdl reset {}` (on {branch}) or `mdl branch -f {branch} {}` takes theirs (the reflog keeps yours), `mdl branch NEW` keeps yours under a new name, `mdl push --force` replaces theirs",
                o.short(12),
                remote.url(),
                theirs.short(12),
                theirs.short(12),
                theirs.short(12)
            )));
        }
        _ => {
            mdl::refs::compare_and_swap(
                repo,
                &name,
                ours.as_ref(),
                &RefValue::Direct(theirs),
                &format!("pull {}", remote.url()),
            )?;
            outcome.moved.push(Moved {
                name,
                old: ours_id,
                new: theirs,
            });
        }
    }
    Ok(outcome)
}

/// A branch name given by the user or a server, validated.
pub(crate) fn branch_name(name: &str) -> Result<RefName> {
    Ok(RefName::new(name).map_err(mdl::Error::from)?)
}

pub(crate) fn current_branch(repo: &Repository) -> Result<String> {
    let head = repo.head_branch()?;
    Ok(head
        .strip_prefix(Ref::BRANCHES)
        .unwrap_or(&head)
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_names_are_validated() {
        assert!(branch_name("exp/lr").is_ok());
        assert!(branch_name("a..b").is_err());
        assert!(branch_name("").is_err());
    }
}
