//! Names that come from elsewhere — a manifest, a server's listing or refs, a tar, a Hub
//! route, a bucket's keys, a remote's name — checked by one rule each, in this one place,
//! before anything is written under them: a tree path never leaves the folder it is written
//! into, a ref name is one git would take, and a name shown in a message is escaped.

use crate::{FormatError, Ref, RefName};

/// Longest path a tree may hold, in bytes.
pub const MAX_PATH_LEN: usize = 4096;

/// Checks a tree path: relative, `/`-separated components, none empty, `.`, `..` or `.mdl`
/// (a repository's own folder), no control characters; at most [`MAX_PATH_LEN`] bytes.
pub fn check_path(path: &str) -> Result<(), FormatError> {
    let bad = |why: &str| Err(FormatError::invalid("path", format!("{path:?}: {why}")));
    if path.is_empty() {
        return bad("empty");
    }
    if path.len() > MAX_PATH_LEN {
        return bad("too long");
    }
    if path.chars().any(unsafe_char) {
        return bad("holds a control character or one that reorders text");
    }
    for part in path.split('/') {
        match part {
            "" => return bad("absolute, or an empty component"),
            "." | ".." => return bad("holds a '.' or '..' component"),
            ".mdl" => return bad("names a repository folder (.mdl)"),
            _ => {}
        }
    }
    Ok(())
}

/// Checks a tensor's name as one that can be asked for by itself, in a URL
/// (`GET …/tensors/{name}`): not empty, not absolute, no `..` component, no control
/// characters, at most [`MAX_PATH_LEN`] bytes. Anything else goes (dots, slashes, spaces).
pub fn check_tensor_name(name: &str) -> Result<(), FormatError> {
    let bad = |why: &str| {
        Err(FormatError::invalid(
            "tensor name",
            format!("{name:?}: {why}"),
        ))
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_PATH_LEN {
        return bad("too long");
    }
    if name.starts_with('/') {
        return bad("starts with '/'");
    }
    if name.chars().any(unsafe_char) {
        return bad("holds a control character or one that reorders text");
    }
    if name.split('/').any(|c| c == "..") {
        return bad("holds a '..' component");
    }
    Ok(())
}

/// A character no name may hold: a control character, or one that reorders how text is shown
/// (a name that reads as another in a terminal).
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` as it may be shown on a terminal: every control or text-direction character
/// escaped (`\u{1b}`), everything else as it is. For names and messages that come from
/// elsewhere (a server's error, a refused name).
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Checks free text from elsewhere (a tag's tagger, or its message where `lines`): no control
/// character (but newlines and tabs in lines), no text-direction character.
pub fn check_text(text: &str, lines: bool) -> Result<(), FormatError> {
    let allowed = |c: char| lines && matches!(c, '\n' | '\t');
    match text.chars().find(|&c| unsafe_char(c) && !allowed(c)) {
        Some(c) => Err(FormatError::invalid(
            "text",
            format!(
                "{:?} holds the character {}",
                printable(text),
                c.escape_default()
            ),
        )),
        None => Ok(()),
    }
}

/// Checks the paths of a whole tree, in the order given: each one by [`check_path`], sorted and
/// unique, and none a folder of another (a file `a` and a file `a/b`). What a manifest holds
/// and what a server lists as a commit's files.
pub fn check_tree<'a>(paths: impl IntoIterator<Item = &'a str>) -> Result<(), FormatError> {
    let bad = |detail: String| Err(FormatError::invalid("tree", detail));
    let paths: Vec<&str> = paths.into_iter().collect();
    for p in &paths {
        check_path(p)?;
    }
    for w in paths.windows(2) {
        if w[0] >= w[1] {
            return bad(format!(
                "paths out of order or repeated: {:?}, {:?}",
                w[0], w[1]
            ));
        }
    }
    let all: std::collections::HashSet<&str> = paths.iter().copied().collect();
    for p in &paths {
        for (at, _) in p.match_indices('/') {
            if all.contains(&p[..at]) {
                return bad(format!("{:?} is both a file and a folder", &p[..at]));
            }
        }
    }
    Ok(())
}

/// Checks a full ref name that another repository may send or change: `refs/heads/NAME` or
/// `refs/tags/NAME`, NAME one git would take ([`RefName::new`]: no control character, space,
/// `..`, component starting with `.`, …). The ref it names.
pub fn check_ref(name: &str) -> Result<Ref, FormatError> {
    let bad = |why: String| FormatError::invalid("ref name", format!("{name:?}: {why}"));
    let short = if let Some(s) = name.strip_prefix(Ref::BRANCHES) {
        s
    } else if let Some(s) = name.strip_prefix(Ref::TAGS) {
        s
    } else {
        return Err(bad("neither refs/heads/… nor refs/tags/…".into()));
    };
    RefName::new(short).map_err(|e| bad(e.reason().into()))?;
    Ref::parse(name).ok_or_else(|| bad("not a branch or tag".into()))
}

/// Checks a remote's name (`mdl remote add NAME`, `refs/remotes/NAME/…`): a valid ref name
/// without `/`.
pub fn check_remote(name: &str) -> Result<RefName, FormatError> {
    let bad = |why: &str| FormatError::invalid("remote name", format!("{name:?}: {why}"));
    if name.contains('/') {
        return Err(bad("it may not contain '/'"));
    }
    RefName::new(name).map_err(|e| bad(e.reason()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_names() {
        for ok in [
            "a",
            "model.layers.0.weight",
            "a/b",
            "a..b",
            "x y",
            "state.0.exp_avg",
        ] {
            assert!(check_tensor_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "/a", "a/../b", "..", "a\nb", "a\u{1b}b"] {
            assert!(check_tensor_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn trees() {
        assert!(check_tree(["a", "b/c", "b/d"]).is_ok());
        for bad in [
            &["b", "a"][..],
            &["a", "a"],
            &["a", "a/b"],
            &["x/a", "x/a/b"],
            &["../../tmp/x"],
            &["/etc/passwd"],
            &[".mdl/meta.redb"],
            &[""],
        ] {
            assert!(check_tree(bad.iter().copied()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn refs_from_elsewhere() {
        assert_eq!(
            check_ref("refs/heads/exp/lr").unwrap(),
            Ref::Branch(RefName::new("exp/lr").unwrap())
        );
        assert!(matches!(check_ref("refs/tags/v1.0").unwrap(), Ref::Tag(_)));
        for bad in [
            "refs/tags/",
            "refs/tags/../heads/main",
            "refs/tags/.mdl",
            "refs/tags/a/../../heads/evil",
            "refs/tags/x y",
            "refs/tags/a\u{1b}[2Jb\u{7}",
            "refs/remotes/o/main",
            "HEAD",
            "main",
        ] {
            let e = check_ref(bad).unwrap_err().to_string();
            assert!(!e.contains('\u{1b}') && !e.contains('\u{7}'), "{e}");
        }
        assert_eq!(printable("a\u{1b}[2J\u{7}é"), "a\\u{1b}[2J\\u{7}é");
        assert!(check_text("line\n\tmore", true).is_ok());
        assert!(check_text("line\nmore", false).is_err());
        assert!(check_text("bell\u{7}", true).is_err());
        assert!(check_remote("origin").is_ok());
        for bad in ["", "a/b", "..", "x y", ".hidden"] {
            assert!(check_remote(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn paths() {
        for ok in [
            "a",
            "a/b.safetensors",
            "checkpoint-10/optimizer.pt",
            "x y/.hidden",
            "a\\b",
        ] {
            assert!(check_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "a//b",
            "./a",
            "a/..",
            "../a",
            "a/./b",
            ".mdl/x",
            "a/.mdl",
            "a\nb",
            "a\0b",
            "a\u{202e}b",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        assert!(check_path(&"a".repeat(MAX_PATH_LEN + 1)).is_err());
    }
}
