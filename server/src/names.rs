//! Repository names, one part (`model`) or two (`team/model`), and how a request path that
//! spells a two-part name as two segments reaches the routes.
//!
//! A served folder holds repositories at its top (`DIR/model`) and one folder down
//! (`DIR/team/model`): the Hugging Face Hub's `namespace/name` ids, which `huggingface_hub`
//! requires of `HfFileSystem`, `hf://` URLs and `create_repo`'s answer. A namespace is a
//! folder of repositories, never a repository itself.
//!
//! Every route takes the name as one path parameter `{repo}`. A two-part name arrives either
//! encoded (`team%2Fmodel`, one segment) or, as the Hub's client and a browser write it, as two
//! segments (`/hf/api/models/team/model/tree/main`, `/ui/team/model`, `/v1/repos/team/model/refs`);
//! [`joined`] rewrites the second form into the first before routing. So that every path has
//! one reading, the second part of a name is never one of the words that follow a name in a
//! route ([`ROUTE_WORDS`]), and a namespace is never `api`.

/// The words that follow a repository's name in a route (native, Hub and web view): a
/// two-part name may not end in one of them.
const ROUTE_WORDS: &[&str] = &[
    // /v1/repos/{repo}/...
    "refs",
    "log",
    "commits",
    "manifests",
    "checkpoints",
    "files",
    "tensors",
    "objects",
    "maintenance",
    "stats",
    "diff",
    "config",
    "branches",
    "head",
    "tags",
    "reset",
    "reflog",
    // /hf/{repo}/... and /hf/api/models/{repo}/...
    "resolve",
    "info",
    "revision",
    "tree",
    "preupload",
    "commit",
    "branch",
    "tag",
    "paths-info",
    "xet-write-token",
    // /ui/{repo}/...
    "file",
    "compare",
    "storage",
];

/// Where a repository's name starts in a path, longest first.
const NAME_STARTS: &[&str] = &["/v1/repos/", "/hf/api/models/", "/hf/", "/ui/"];

/// Whether `part` may be one part of a repository's name: letters, digits, `-`, `_`, `.`, not
/// starting with `.`.
fn valid_part(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 255
        && !part.starts_with('.')
        && part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Whether `name` may name a repository: one part, or a namespace and a name (`team/model`)
/// whose name is not a route's word and whose namespace is not `api`.
pub fn valid_repo_name(name: &str) -> bool {
    match name.split_once('/') {
        None => valid_part(name),
        Some((namespace, rest)) => {
            valid_part(namespace)
                && valid_part(rest)
                && namespace != "api"
                && !ROUTE_WORDS.contains(&rest)
        }
    }
}

/// `path` with a two-part name written as two segments joined into one (`team%2Fmodel`), or
/// `None` when it names no such repository (a one-part name, another route).
pub(crate) fn joined(path: &str) -> Option<String> {
    let start = NAME_STARTS.iter().find(|s| path.starts_with(**s))?;
    let rest = &path[start.len()..];
    let mut parts = rest.splitn(3, '/');
    let (namespace, name) = (parts.next()?, parts.next()?);
    // `/hf/team/model.git/info/lfs/...`: git LFS's batch route.
    let bare = match *start {
        "/hf/" => name.strip_suffix(".git").unwrap_or(name),
        _ => name,
    };
    let hub_top = *start == "/hf/" && namespace == "api";
    if hub_top || !valid_repo_name(&format!("{namespace}/{bare}")) {
        return None;
    }
    let tail = parts.next().map_or(String::new(), |t| format!("/{t}"));
    Some(format!("{start}{namespace}%2F{name}{tail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["run-1.a_b", "team/model", "a/b.c", "api"] {
            assert!(valid_repo_name(good), "{good:?}");
        }
        let long = "a".repeat(256);
        for bad in [
            "",
            ".hidden",
            "..",
            "a b",
            "a\u{1}",
            "a/",
            "/a",
            "a/b/c",
            "a/.b",
            "team/refs",
            "team/tree",
            "api/model",
            long.as_str(),
        ] {
            assert!(!valid_repo_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn two_segments_are_joined_where_a_name_starts() {
        let cases = [
            (
                "/v1/repos/team/model/refs",
                Some("/v1/repos/team%2Fmodel/refs"),
            ),
            ("/v1/repos/model/refs", None),
            ("/v1/repos", None),
            (
                "/hf/api/models/team/model/tree/main/a/b",
                Some("/hf/api/models/team%2Fmodel/tree/main/a/b"),
            ),
            (
                "/hf/api/models/team/model",
                Some("/hf/api/models/team%2Fmodel"),
            ),
            ("/hf/api/models/model/revision/main", None),
            ("/hf/api/models/model", None),
            ("/hf/api/repos/create", None),
            (
                "/hf/team/model/resolve/main/config.json",
                Some("/hf/team%2Fmodel/resolve/main/config.json"),
            ),
            ("/hf/model/resolve/main/config.json", None),
            (
                "/hf/team/model.git/info/lfs/objects/batch",
                Some("/hf/team%2Fmodel.git/info/lfs/objects/batch"),
            ),
            ("/hf/model.git/info/lfs/objects/batch", None),
            ("/hf/.lfs/team%2Fmodel/00", None),
            ("/ui/team/model", Some("/ui/team%2Fmodel")),
            (
                "/ui/team/model/commit/abc",
                Some("/ui/team%2Fmodel/commit/abc"),
            ),
            ("/ui/model/commit/abc", None),
            ("/ui/.style.css", None),
            ("/ui/", None),
        ];
        for (path, want) in cases {
            assert_eq!(joined(path).as_deref(), want, "{path}");
        }
    }
}
