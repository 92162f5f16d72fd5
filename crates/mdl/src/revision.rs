//! Revision syntax: full id, unique prefix (≥ 4 hex digits), branch, tag, `HEAD`, full ref
//! names, followed by any number of `~N`, `~`, `^N` and `^` steps.

use mdl_format::{IdPrefix, ObjectId};
use mdl_store::meta::{MetaRead, HEAD};
use mdl_store::RefValue;

use crate::{Error, Repository, Result};

/// Resolves a revision to a commit id.
pub fn resolve(repo: &Repository, rev: &str) -> Result<ObjectId> {
    let split = rev.find(['~', '^']).unwrap_or(rev.len());
    let (base, steps) = rev.split_at(split);
    let meta = repo.store().meta().read()?;
    let mut id = resolve_base(&meta, base, rev)?;
    let mut rest = steps;
    while let Some(op) = rest.chars().next() {
        rest = &rest[1..];
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: Option<u64> = if digits == 0 {
            None
        } else {
            Some(
                rest[..digits]
                    .parse()
                    .map_err(|_| Error::UnknownRevision(rev.to_string()))?,
            )
        };
        rest = &rest[digits..];
        let parents = |id: &ObjectId| -> Result<Vec<ObjectId>> {
            Ok(meta
                .commit(id)?
                .ok_or_else(|| Error::UnknownRevision(rev.to_string()))?
                .parents)
        };
        match op {
            '~' => {
                for _ in 0..n.unwrap_or(1) {
                    id = *parents(&id)?
                        .first()
                        .ok_or_else(|| Error::NoSuchAncestor(rev.to_string()))?;
                }
            }
            '^' => match n.unwrap_or(1) {
                0 => {}
                k => {
                    id = *parents(&id)?
                        .get(k as usize - 1)
                        .ok_or_else(|| Error::NoSuchAncestor(rev.to_string()))?
                }
            },
            _ => return Err(Error::UnknownRevision(rev.to_string())),
        }
    }
    Ok(id)
}

fn resolve_base(meta: &MetaRead, base: &str, rev: &str) -> Result<ObjectId> {
    if base.is_empty() {
        return Err(Error::UnknownRevision(rev.to_string()));
    }
    let follow = |name: &str| -> Result<Option<ObjectId>> {
        match meta.get_ref(name)? {
            None => Ok(None),
            Some(RefValue::Symbolic(target)) => match meta.get_ref(&target)? {
                Some(v) => Ok(v.target()),
                None => Err(Error::UnbornBranch(
                    target.trim_start_matches("refs/heads/").to_string(),
                )),
            },
            Some(v) => Ok(v.target()),
        }
    };
    if base == HEAD || base == "@" {
        return follow(HEAD)?.ok_or_else(|| Error::UnknownRevision(rev.to_string()));
    }
    if base.starts_with("refs/") {
        if let Some(id) = follow(base)? {
            return Ok(id);
        }
    }
    for prefix in ["refs/heads/", "refs/tags/"] {
        if let Some(id) = follow(&format!("{prefix}{base}"))? {
            return Ok(id);
        }
    }
    if let Ok(prefix) = base.parse::<IdPrefix>() {
        let found = meta.commits_with_prefix(&prefix)?;
        match found.len() {
            0 => {}
            1 => return Ok(found[0]),
            _ => {
                return Err(Error::AmbiguousRevision {
                    rev: rev.to_string(),
                    candidates: found.iter().take(8).map(|id| id.short(12)).collect(),
                })
            }
        }
    }
    Err(Error::UnknownRevision(rev.to_string()))
}
