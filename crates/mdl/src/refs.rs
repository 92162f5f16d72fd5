//! Branches, tags and `switch`. Every change is a compare-and-swap with a reflog entry.

use mdl_format::{ObjectId, Ref, RefName, Timestamp};
use mdl_store::meta::HEAD;
use mdl_store::RefValue;
use serde::{Deserialize, Serialize};

use mdl_protocol::body::{ListedRef, Refs};

pub use mdl_protocol::history::{BranchMove, ReflogLine};

use crate::{revision, Error, Repository, Result};

/// A branch or tag as listed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RefInfo {
    /// Short name.
    pub name: String,
    /// The commit it points at.
    pub target: ObjectId,
    /// For branches: whether HEAD points here.
    pub current: bool,
    /// For annotated tags: the message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Lists branches, with the current one marked.
pub fn branches(repo: &Repository) -> Result<Vec<RefInfo>> {
    let head = repo.head_branch()?;
    list(repo, Ref::BRANCHES, &head)
}

/// Lists remote-tracking branches (what fetch and pull last saw), named `REMOTE/BRANCH`.
pub fn remote_branches(repo: &Repository) -> Result<Vec<RefInfo>> {
    list(repo, Ref::REMOTES, "")
}

/// Lists tags.
pub fn tags(repo: &Repository) -> Result<Vec<RefInfo>> {
    list(repo, Ref::TAGS, "")
}

fn list(repo: &Repository, prefix: &str, head: &str) -> Result<Vec<RefInfo>> {
    let meta = repo.store().meta().read()?;
    Ok(meta
        .refs(prefix)?
        .into_iter()
        .filter_map(|(name, v)| {
            Some(RefInfo {
                current: name == head,
                name: name[prefix.len()..].to_string(),
                target: v.target()?,
                message: match v {
                    RefValue::Annotated { message, .. } => Some(message),
                    _ => None,
                },
            })
        })
        .collect())
}

/// Every branch and tag by full name (`refs/heads/…`, `refs/tags/…`), with its value.
pub fn all(repo: &Repository) -> Result<Vec<(String, RefValue)>> {
    let meta = repo.store().meta().read()?;
    let mut out = meta.refs(Ref::BRANCHES)?;
    out.extend(meta.refs(Ref::TAGS)?);
    Ok(out)
}

/// Every branch and tag as a server lists them, and the branch HEAD points at.
pub fn listed(repo: &Repository) -> Result<Refs> {
    let head = repo
        .head_branch()
        .ok()
        .and_then(|h| h.strip_prefix(Ref::BRANCHES).map(str::to_string));
    let mut refs = Vec::new();
    for (name, value) in all(repo)? {
        let Some(target) = value.target() else {
            continue;
        };
        let (tagger, time_ms, message) = match value {
            RefValue::Annotated {
                tagger,
                time,
                message,
                ..
            } => (Some(tagger), Some(time.0), Some(message)),
            _ => (None, None, None),
        };
        refs.push(ListedRef {
            name,
            target,
            tagger,
            time_ms,
            message,
        });
    }
    Ok(Refs { head, refs })
}

/// Every ref whose full name starts with `prefix`, with its value.
pub fn all_with_prefix(repo: &Repository, prefix: &str) -> Result<Vec<(String, RefValue)>> {
    Ok(repo.store().meta().read()?.refs(prefix)?)
}

/// The value of ref `name` (a full name), if it exists.
pub fn get(repo: &Repository, name: &str) -> Result<Option<RefValue>> {
    Ok(repo.store().meta().read()?.get_ref(name)?)
}

/// Moves ref `name` (a full name) from `expected` (`None`: must not exist) to `new`, with a
/// reflog entry saying `message`; another value there is [`mdl_store::StoreError::RefConflict`].
pub fn compare_and_swap(
    repo: &Repository,
    name: &str,
    expected: Option<&RefValue>,
    new: &RefValue,
    message: &str,
) -> Result<()> {
    replace(repo, name, expected, Some(new), message)
}

/// [`compare_and_swap`] that may also delete the ref (`new` = `None`): for a copy of refs kept
/// elsewhere (a repository in object storage), which nothing here checks.
pub fn replace(
    repo: &Repository,
    name: &str,
    expected: Option<&RefValue>,
    new: Option<&RefValue>,
    message: &str,
) -> Result<()> {
    let mut w = repo.store().meta().write()?;
    w.update_ref(name, expected, new, message)?;
    w.commit_txn()?;
    Ok(())
}

/// Creates branch `name` at `rev` (HEAD when `None`).
pub fn create_branch(repo: &Repository, name: &str, rev: Option<&str>) -> Result<ObjectId> {
    let name = RefName::new(name)?;
    let target = revision::resolve(repo, rev.unwrap_or("HEAD"))?;
    create(
        repo,
        &Ref::Branch(name),
        RefValue::Direct(target),
        &format!("branch: created from {}", rev.unwrap_or("HEAD")),
    )?;
    Ok(target)
}

/// Moves HEAD's branch to `rev`, wherever that is (an ancestor, another branch's commit): the
/// way out of a diverged or unwanted history. The reflog records where it was, so `reset`
/// itself can be undone until gc expires that entry.
pub fn reset(repo: &Repository, rev: &str) -> Result<BranchMove> {
    let head = repo.head_branch()?;
    let name = head.trim_start_matches(Ref::BRANCHES);
    let r = Ref::Branch(RefName::new(name)?);
    set_branch(repo, &r, rev, &format!("reset: moving to {rev}"))
}

/// Creates branch `name` at `rev` (HEAD when `None`), or moves it there if it exists
/// (`branch -f`), recording where it was in its reflog.
pub fn force_branch(repo: &Repository, name: &str, rev: Option<&str>) -> Result<BranchMove> {
    let r = Ref::Branch(RefName::new(name)?);
    let rev = rev.unwrap_or("HEAD");
    set_branch(repo, &r, rev, &format!("branch: reset to {rev}"))
}

/// Points branch `r` at `rev`, created or moved, in one transaction with the value it replaces.
fn set_branch(repo: &Repository, r: &Ref, rev: &str, log: &str) -> Result<BranchMove> {
    let to = revision::resolve(repo, rev)?;
    let full = r.full();
    let mut w = repo.store().meta().write()?;
    let current = w.get_ref(&full)?;
    w.update_ref(&full, current.as_ref(), Some(&RefValue::Direct(to)), log)?;
    w.commit_txn()?;
    Ok(BranchMove {
        branch: r.short().to_string(),
        from: current.and_then(|v| v.target()),
        to,
    })
}

/// Creates tag `name` at `rev` (HEAD when `None`), annotated when a message is given.
pub fn create_tag(
    repo: &Repository,
    name: &str,
    rev: Option<&str>,
    message: Option<&str>,
    tagger: &str,
) -> Result<ObjectId> {
    let name = RefName::new(name)?;
    let target = revision::resolve(repo, rev.unwrap_or("HEAD"))?;
    let value = match message {
        Some(m) => RefValue::Annotated {
            target,
            tagger: tagger.to_string(),
            time: Timestamp::now(),
            message: m.to_string(),
        },
        None => RefValue::Direct(target),
    };
    create(repo, &Ref::Tag(name), value, "tag: created")?;
    Ok(target)
}

/// What a ref is called in messages.
fn kind(r: &Ref) -> &'static str {
    match r {
        Ref::Branch(_) => "branch",
        Ref::Tag(_) => "tag",
        Ref::Remote { .. } => "remote branch",
    }
}

fn create(repo: &Repository, r: &Ref, value: RefValue, log: &str) -> Result<()> {
    let full = r.full();
    let mut w = repo.store().meta().write()?;
    if w.get_ref(&full)?.is_some() {
        return Err(Error::RefExists {
            kind: kind(r),
            name: r.short().to_string(),
        });
    }
    w.update_ref(&full, None, Some(&value), log)?;
    w.commit_txn()?;
    Ok(())
}

/// Deletes a branch (not the current one); its reflog stays, ending with the deletion, so
/// its commits can be found again until gc expires the entries ([`reflog`]). Unless `force`,
/// a branch whose commits no other branch, tag or remote-tracking ref reaches is refused.
pub fn delete_branch(repo: &Repository, name: &str, force: bool) -> Result<ObjectId> {
    let r = Ref::Branch(RefName::new(name)?);
    let full = r.full();
    if repo.head_branch()? == full {
        return Err(Error::DeleteCurrentBranch(name.to_string()));
    }
    if !force {
        let meta = repo.store().meta().read()?;
        let mut tip = None;
        let mut others = Vec::new();
        for (n, v) in meta.refs("refs/")? {
            match (n == full, v.target()) {
                (true, t) => tip = t,
                (false, Some(t)) => others.push(t),
                (false, None) => {}
            }
        }
        drop(meta);
        if let Some(tip) = tip {
            let only = crate::history::only_from(repo, &tip, &others)?;
            if !only.is_empty() {
                return Err(Error::UnmergedBranch {
                    name: name.to_string(),
                    commits: only.len(),
                });
            }
        }
    }
    delete(repo, &r)
}

/// Where ref `name` pointed, newest first: HEAD's branch when `None`; a short name is looked
/// for among branches, tags and remote-tracking refs (`origin/main`), deleted ones included
/// while their reflog lasts. Returns the full name and the entries.
pub fn reflog(repo: &Repository, name: Option<&str>) -> Result<(String, Vec<ReflogLine>)> {
    let full = match name {
        None | Some("HEAD") => repo.head_branch()?,
        Some(n) if n.starts_with("refs/") => n.to_string(),
        Some(n) => {
            let meta = repo.store().meta().read()?;
            let mut found = None;
            for prefix in [Ref::BRANCHES, Ref::TAGS, Ref::REMOTES] {
                let full = format!("{prefix}{n}");
                if meta.get_ref(&full)?.is_some() || !meta.reflog(&full)?.is_empty() {
                    found = Some(full);
                    break;
                }
            }
            found.ok_or_else(|| Error::NoSuchRef {
                kind: "branch, tag or remote branch",
                name: n.to_string(),
            })?
        }
    };
    let entries = repo.store().meta().read()?.reflog(&full)?;
    let lines = entries
        .into_iter()
        .rev()
        .map(|e| ReflogLine {
            old: e.old,
            new: e.new,
            time_ms: e.time.0,
            message: e.message,
        })
        .collect();
    Ok((full, lines))
}

/// Deletes a tag.
pub fn delete_tag(repo: &Repository, name: &str) -> Result<ObjectId> {
    delete(repo, &Ref::Tag(RefName::new(name)?))
}

fn delete(repo: &Repository, r: &Ref) -> Result<ObjectId> {
    let full = r.full();
    let mut w = repo.store().meta().write()?;
    let current = w.get_ref(&full)?.ok_or_else(|| Error::NoSuchRef {
        kind: kind(r),
        name: r.short().to_string(),
    })?;
    w.update_ref(&full, Some(&current), None, "deleted")?;
    w.commit_txn()?;
    Ok(current
        .target()
        .expect("branches and tags point at commits"))
}

/// Points HEAD at branch `name`, which must exist (or be HEAD's own unborn branch).
pub fn switch(repo: &Repository, name: &str) -> Result<()> {
    let name = RefName::new(name)?;
    let full = Ref::branch(&name).full();
    let mut w = repo.store().meta().write()?;
    let head = w.get_ref(HEAD)?;
    let already = matches!(&head, Some(RefValue::Symbolic(t)) if *t == full);
    if !already && w.get_ref(&full)?.is_none() {
        return Err(Error::NoSuchRef {
            kind: "branch",
            name: name.to_string(),
        });
    }
    w.update_ref(
        HEAD,
        head.as_ref(),
        Some(&RefValue::Symbolic(full)),
        &format!("switch: to {name}"),
    )?;
    w.commit_txn()?;
    Ok(())
}
