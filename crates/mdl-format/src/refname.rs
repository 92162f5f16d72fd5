use std::fmt;

/// Why a branch or tag name was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid name {name:?}: {reason}")]
pub struct RefNameError {
    name: String,
    reason: &'static str,
}

impl RefNameError {
    /// Why, without the name.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

/// A validated branch or tag name (the part after `refs/heads/` or `refs/tags/`), following
/// git's `check-ref-format` rules, plus `HEAD` being reserved.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RefName(String);

impl RefName {
    /// Validates a name.
    pub fn new(name: &str) -> Result<Self, RefNameError> {
        let fail = |reason| {
            Err(RefNameError {
                name: name.to_string(),
                reason,
            })
        };
        if name.is_empty() {
            return fail("empty");
        }
        if name.len() > 255 {
            return fail("longer than 255 bytes");
        }
        if name == "@" || name == "HEAD" {
            return fail("reserved");
        }
        if name.starts_with('-') {
            return fail("starts with '-'");
        }
        if name.ends_with('/') || name.ends_with('.') {
            return fail("ends with '/' or '.'");
        }
        if name.contains("..") || name.contains("//") || name.contains("@{") {
            return fail("contains '..', '//' or '@{'");
        }
        if let Some(c) = name.chars().find(|&c| {
            c.is_control() || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\')
        }) {
            let _ = c;
            return fail("contains a space, a control character or one of ~^:?*[\\");
        }
        for part in name.split('/') {
            if part.is_empty() || part.starts_with('.') || part.ends_with(".lock") {
                return fail("a component is empty, starts with '.' or ends with '.lock'");
            }
        }
        Ok(RefName(name.to_string()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RefName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A full ref name: a branch (`refs/heads/NAME`), a tag (`refs/tags/NAME`) or a branch of a
/// remote as last fetched (`refs/remotes/REMOTE/NAME`). The one place these strings are made
/// and taken apart.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ref {
    /// `refs/heads/NAME`.
    Branch(RefName),
    /// `refs/tags/NAME`.
    Tag(RefName),
    /// `refs/remotes/REMOTE/NAME`.
    Remote {
        /// The remote's name (no `/`).
        remote: String,
        /// The branch's name there.
        branch: RefName,
    },
}

impl Ref {
    /// Where branches live.
    pub const BRANCHES: &'static str = "refs/heads/";
    /// Where tags live.
    pub const TAGS: &'static str = "refs/tags/";
    /// Where remotes' branches live.
    pub const REMOTES: &'static str = "refs/remotes/";

    /// The branch a new repository's HEAD points at: `refs/heads/main`.
    pub fn main() -> Ref {
        Ref::Branch(RefName("main".to_string()))
    }

    /// Branch `name`.
    pub fn branch(name: &RefName) -> Ref {
        Ref::Branch(name.clone())
    }

    /// Branch `name` of remote `remote`.
    pub fn remote(remote: &str, branch: &RefName) -> Ref {
        Ref::Remote {
            remote: remote.to_string(),
            branch: branch.clone(),
        }
    }

    /// Takes a full name apart; `None` for anything else (a name in no namespace, an invalid
    /// short name).
    pub fn parse(full: &str) -> Option<Ref> {
        if let Some(short) = full.strip_prefix(Self::BRANCHES) {
            return RefName::new(short).ok().map(Ref::Branch);
        }
        if let Some(short) = full.strip_prefix(Self::TAGS) {
            return RefName::new(short).ok().map(Ref::Tag);
        }
        let (remote, branch) = full.strip_prefix(Self::REMOTES)?.split_once('/')?;
        (!remote.is_empty() && RefName::new(remote).is_ok()).then_some(())?;
        Some(Ref::Remote {
            remote: remote.to_string(),
            branch: RefName::new(branch).ok()?,
        })
    }

    /// The full name.
    pub fn full(&self) -> String {
        match self {
            Ref::Branch(n) => format!("{}{n}", Self::BRANCHES),
            Ref::Tag(n) => format!("{}{n}", Self::TAGS),
            Ref::Remote { remote, branch } => format!("{}{remote}/{branch}", Self::REMOTES),
        }
    }

    /// The branch's or tag's own name (without namespace or remote).
    pub fn short(&self) -> &RefName {
        match self {
            Ref::Branch(n) | Ref::Tag(n) | Ref::Remote { branch: n, .. } => n,
        }
    }
}

impl fmt::Display for Ref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_names_round_trip() {
        let n = RefName::new("exp/lr").unwrap();
        for r in [
            Ref::Branch(n.clone()),
            Ref::Tag(n.clone()),
            Ref::remote("origin", &n),
        ] {
            assert_eq!(Ref::parse(&r.full()), Some(r.clone()));
            assert_eq!(r.short(), &n);
        }
        assert_eq!(Ref::branch(&n).full(), "refs/heads/exp/lr");
        assert_eq!(Ref::remote("o", &n).full(), "refs/remotes/o/exp/lr");
        for bad in [
            "HEAD",
            "refs/heads/",
            "refs/heads/a..b",
            "refs/x/y",
            "refs/remotes/o",
        ] {
            assert_eq!(Ref::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn git_rules() {
        for ok in ["main", "run-a", "exp/lr-low", "v1.0", "a_b", "ünï"] {
            assert!(RefName::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "HEAD",
            "@",
            "-x",
            "a/",
            "a.",
            "a..b",
            "a//b",
            "a@{1}",
            "a b",
            "a~1",
            "a^",
            "a:b",
            "a?",
            "a*",
            "a[",
            "a\\b",
            ".hidden",
            "x/.y",
            "x.lock",
            "x/y.lock/z",
            "tab\there",
        ] {
            assert!(RefName::new(bad).is_err(), "{bad:?} accepted");
        }
    }
}
