use std::fmt;

/// Why a branch or tag name was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid name {name:?}: {reason}")]
pub struct RefNameError {
    name: String,
    reason: &'static str,
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

#[cfg(test)]
mod tests {
    use super::*;

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
