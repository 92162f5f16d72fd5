//! The paths of a tree's files: what a manifest may name, so that a checkout never writes
//! outside the folder it was given.

use crate::FormatError;

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
    if path.chars().any(char::is_control) {
        return bad("holds a control character");
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
    if name.chars().any(char::is_control) {
        return bad("holds a control character");
    }
    if name.split('/').any(|c| c == "..") {
        return bad("holds a '..' component");
    }
    Ok(())
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
            "", "/a", "a/", "a//b", "./a", "a/..", "../a", "a/./b", ".mdl/x", "a/.mdl", "a\nb",
            "a\0b",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        assert!(check_path(&"a".repeat(MAX_PATH_LEN + 1)).is_err());
    }
}
