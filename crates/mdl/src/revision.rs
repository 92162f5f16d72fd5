//! Revision syntax: full id, unique prefix (≥ 4 hex digits), branch, tag, remote-tracking
//! branch (`origin/main`), `HEAD`, full ref names, followed by any number of `~N`, `~`, `^N`
//! and `^` steps.

use mdl_format::{IdPrefix, ObjectId, Ref};
use mdl_store::meta::{MetaRead, HEAD};
use mdl_store::RefValue;

use crate::{Error, Repository, Result};

/// One step from a commit: `~N` (the N-th first-parent ancestor) or `^N` (the N-th parent;
/// `^0` is the commit itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `~N`.
    Ancestor(u64),
    /// `^N`.
    Parent(u64),
}

/// Splits a revision into its base (a name or id prefix) and its steps, without looking
/// anything up. Anything after the base that is not `~`, `^` or a number is an error.
pub fn parse(rev: &str) -> Result<(&str, Vec<Step>)> {
    let bad = || Error::UnknownRevision(rev.to_string());
    let split = rev.find(['~', '^']).unwrap_or(rev.len());
    let (base, mut rest) = rev.split_at(split);
    if base.is_empty() {
        return Err(bad());
    }
    let mut steps = Vec::new();
    while let Some(op) = rest.chars().next() {
        if op != '~' && op != '^' {
            return Err(bad());
        }
        rest = &rest[op.len_utf8()..];
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n = match digits {
            0 => 1,
            _ => rest[..digits].parse().map_err(|_| bad())?,
        };
        rest = &rest[digits..];
        steps.push(if op == '~' {
            Step::Ancestor(n)
        } else {
            Step::Parent(n)
        });
    }
    Ok((base, steps))
}

/// Resolves a revision to a commit id.
pub fn resolve(repo: &Repository, rev: &str) -> Result<ObjectId> {
    let (base, steps) = parse(rev)?;
    let meta = repo.store().meta().read()?;
    let mut id = resolve_base(&meta, base, rev)?;
    let cut = meta.shallow()?;
    let parents = |id: &ObjectId| -> Result<Vec<ObjectId>> {
        if cut.contains(id) {
            return Err(Error::NoSuchAncestor {
                rev: rev.to_string(),
                why: format!(
                    "history is cut at commit {} (a shallow clone; `mdl fetch --deepen N` brings more)",
                    id.short(12)
                ),
            });
        }
        Ok(meta
            .commit(id)?
            .ok_or_else(|| Error::UnknownRevision(rev.to_string()))?
            .parents)
    };
    let missing = |id: &ObjectId, k: u64, has: usize| Error::NoSuchAncestor {
        rev: rev.to_string(),
        why: match has {
            0 => format!(
                "commit {} is the first commit (it has no parent)",
                id.short(12)
            ),
            _ => format!(
                "commit {} has no {} parent (it has {})",
                id.short(12),
                ordinal(k),
                plural(has as u64, "parent")
            ),
        },
    };
    for step in steps {
        match step {
            Step::Ancestor(n) => {
                for _ in 0..n {
                    let p = parents(&id)?;
                    id = *p.first().ok_or_else(|| missing(&id, 1, p.len()))?;
                }
            }
            Step::Parent(0) => {}
            Step::Parent(k) => {
                let p = parents(&id)?;
                let found = usize::try_from(k - 1).ok().and_then(|i| p.get(i));
                id = *found.ok_or_else(|| missing(&id, k, p.len()))?;
            }
        }
    }
    Ok(id)
}

/// `1st`, `2nd`, `3rd`, `4th`, … `11th`, `12th`, `13th`, `21st`.
fn ordinal(n: u64) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// `1 parent`, `2 parents`.
fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("{n} {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn resolve_base(meta: &MetaRead, base: &str, rev: &str) -> Result<ObjectId> {
    let follow = |name: &str| -> Result<Option<ObjectId>> {
        match meta.get_ref(name)? {
            None => Ok(None),
            Some(RefValue::Symbolic(target)) => match meta.get_ref(&target)? {
                Some(v) => Ok(v.target()),
                None => Err(Error::UnbornBranch(
                    target.trim_start_matches(Ref::BRANCHES).to_string(),
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
    for prefix in [Ref::BRANCHES, Ref::TAGS, Ref::REMOTES] {
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
    if base.len() < IdPrefix::MIN_LEN && base.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::ShortIdPrefix(rev.to_string()));
    }
    // Name the branches there are, HEAD's first, so that `main~2` in a repository whose run
    // went to `mlp` says where the history is.
    let head = match meta.get_ref(HEAD)? {
        Some(RefValue::Symbolic(target)) => target,
        _ => String::new(),
    };
    let mut branches: Vec<String> = meta
        .refs(Ref::BRANCHES)?
        .into_iter()
        .map(|(name, _)| match name == head {
            true => format!("{} (HEAD)", name.trim_start_matches(Ref::BRANCHES)),
            false => name.trim_start_matches(Ref::BRANCHES).to_string(),
        })
        .collect();
    branches.sort_by_key(|b| !b.ends_with("(HEAD)"));
    if branches.is_empty() || branches.len() > 8 {
        return Err(Error::UnknownRevision(rev.to_string()));
    }
    Err(Error::NotABranchHere {
        rev: rev.to_string(),
        branches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps() {
        assert_eq!(parse("main").unwrap(), ("main", vec![]));
        assert_eq!(
            parse("main~2^^0~").unwrap(),
            (
                "main",
                vec![
                    Step::Ancestor(2),
                    Step::Parent(1),
                    Step::Parent(0),
                    Step::Ancestor(1)
                ]
            )
        );
        for bad in [
            "",
            "~1",
            "main~é",
            "main^x",
            "main~1é",
            "a~99999999999999999999999",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ordinals() {
        let got: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111]
            .into_iter()
            .map(ordinal)
            .collect();
        assert_eq!(
            got,
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
                "111th"
            ]
        );
    }

    proptest::proptest! {
        /// Any text parses or is refused, never panics; what parses prints back to itself up
        /// to the spelling of the steps.
        #[test]
        fn never_panics(rev in "[a-zé~^0-9]{0,12}|\\PC{0,16}") {
            if let Ok((base, steps)) = parse(&rev) {
                proptest::prop_assert!(!base.is_empty() && rev.starts_with(base));
                proptest::prop_assert!(steps.len() <= rev.len());
            }
        }
    }
}
