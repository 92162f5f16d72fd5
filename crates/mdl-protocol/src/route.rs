//! Paths and headers. A path with `{name}` parts is a template: the server routes it as it is
//! and the client fills it in ([`fill`]). Repository routes are relative to [`REPO`].

/// `GET`: the repositories a server holds ([`crate::body::Repos`]); `POST`: create one
/// ([`crate::body::NewRepo`], answered 201 with the same body; an `admin` token, and a server
/// that serves a folder of repositories).
pub const REPOS: &str = "/v1/repos";
/// The prefix of one repository's routes.
pub const REPO: &str = "/v1/repos/{repo}";

/// `GET`: branches, tags and HEAD ([`crate::body::Refs`]); `POST`: a compare-and-swap of one
/// ref ([`crate::transfer::RefUpdate`], answered by [`crate::body::RefMoved`]).
pub const REFS: &str = "/refs";
/// `GET ?name=&from=&timeout_ms=`: waits until a ref no longer points at `from`
/// ([`crate::body::WaitQuery`] → [`crate::body::Waited`]): a long poll, at most
/// [`crate::body::MAX_WAIT_MS`].
pub const REFS_WAIT: &str = "/refs/wait";
/// `GET ?rev=&limit=`: history ([`crate::body::LogQuery`]).
pub const LOG: &str = "/log";
/// `POST`: commit an uploaded checkpoint ([`crate::params`]).
pub const COMMITS: &str = "/commits";
/// `GET`: a commit and its tensors ([`crate::history::Shown`]).
pub const COMMIT: &str = "/commits/{rev}";
/// `GET`: a manifest.
pub const MANIFEST: &str = "/manifests/{id}";
/// `GET`: a checkpoint; `file` is `REV.safetensors`.
pub const CHECKPOINT: &str = "/checkpoints/{file}";
/// `GET`: the files of a commit ([`crate::body::Files`]).
pub const FILES: &str = "/files/{rev}";
/// `GET`, `HEAD`: one file of a commit (`path` may contain `/`), with `Range`.
pub const FILE: &str = "/files/{rev}/{*path}";
/// `GET`: one tensor's bytes (`name` may contain `/`).
pub const TENSOR: &str = "/tensors/{rev}/{*name}";
/// `POST`: upload a pack.
pub const OBJECTS: &str = "/objects";
/// `POST`: which ids the server lacks ([`crate::body::Ids`] → [`crate::body::Missing`]).
pub const OBJECTS_MISSING: &str = "/objects/missing";
/// `POST`: what a fetch would send ([`crate::body::PlanRequest`] → [`crate::body::Plan`]).
pub const OBJECTS_PLAN: &str = "/objects/plan";
/// `POST`: a pack of the given ids ([`crate::body::FetchRequest`]).
pub const OBJECTS_FETCH: &str = "/objects/fetch";
/// How much of a pack upload cut off the server holds (`GET`, write scope): its key is the
/// blake3 hash of the whole pack.
pub const OBJECTS_UPLOAD: &str = "/objects/uploads/{key}";
/// `POST`: bound the delta chains ([`crate::outcome::CompactOptions`]).
pub const COMPACT: &str = "/maintenance/compact";
/// `POST`: garbage collection ([`crate::body::GcRequest`]).
pub const GC: &str = "/maintenance/gc";

/// `GET`: repository totals ([`crate::outcome::Stats`]).
pub const STATS: &str = "/stats";
/// `GET ?a=&b=`: two revisions compared ([`crate::history::Diff`], [`crate::body::DiffQuery`]).
pub const DIFF: &str = "/diff";
/// `GET`: every setting as `[key, value, is_default]`; `POST`: one changed
/// ([`crate::body::ConfigSet`]).
pub const CONFIG: &str = "/config";
/// `POST`: create or move a branch ([`crate::body::BranchRequest`] → [`crate::history::BranchMove`]).
pub const BRANCHES: &str = "/branches";
/// `DELETE ?force=`: delete a branch ([`crate::body::DeleteBranch`] → [`crate::body::Deleted`]).
pub const BRANCH: &str = "/branches/{name}";
/// `POST`: point HEAD at another branch ([`crate::body::Head`]).
pub const HEAD: &str = "/head";
/// `POST`: create a tag ([`crate::body::TagRequest`] → [`crate::body::Tagged`]).
pub const TAGS: &str = "/tags";
/// `DELETE`: delete a tag (→ [`crate::body::Deleted`]).
pub const TAG: &str = "/tags/{name}";
/// `POST`: move the current branch to a revision ([`crate::body::ResetRequest`] →
/// [`crate::history::BranchMove`]).
pub const RESET: &str = "/reset";
/// `GET ?name=`: where a ref pointed, newest first ([`crate::body::ReflogQuery`] →
/// [`crate::body::Reflog`]).
pub const REFLOG: &str = "/reflog";
/// `POST`: check the whole repository ([`crate::outcome::FsckReport`]).
pub const FSCK: &str = "/maintenance/fsck";

/// The commit a checkpoint or tensor download comes from.
pub const HEADER_COMMIT: &str = "x-mdl-commit";
/// How many of a checkpoint's tensors were stored lossily.
pub const HEADER_LOSSY_TENSORS: &str = "x-mdl-lossy-tensors";
/// Header of a pack upload (`POST /objects`) that may be resumed: the blake3 hash of the whole
/// pack, 64 hex digits.
pub const HEADER_UPLOAD: &str = "x-mdl-upload";
/// Header of a pack upload that goes on from where one with the same key was cut off: the
/// offset in the pack its body starts at.
pub const HEADER_UPLOAD_OFFSET: &str = "x-mdl-upload-offset";
/// A pack stream's content type.
pub const PACK: &str = "application/x-mdl-pack";

/// `template` with each `{name}` (or `{*name}`) replaced by its value, percent-encoded (a
/// `{*name}` value keeps its `/`s).
pub fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = template.to_string();
    for (name, value) in values {
        let one = format!("{{{name}}}");
        let rest = format!("{{*{name}}}");
        if out.contains(&one) {
            out = out.replace(&one, &segment(value));
        } else {
            let parts: Vec<String> = value.split('/').map(segment).collect();
            out = out.replace(&rest, &parts.join("/"));
        }
    }
    out
}

/// Percent-encodes a revision or name for one URL path segment.
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_filled_with_encoded_values() {
        assert_eq!(fill(REPO, &[("repo", "run-1")]), "/v1/repos/run-1");
        assert_eq!(fill(COMMIT, &[("rev", "main~2")]), "/commits/main~2");
        assert_eq!(fill(COMMIT, &[("rev", "exp/a b")]), "/commits/exp%2Fa%20b");
        assert_eq!(
            fill(TENSOR, &[("rev", "v1"), ("name", "model/h.0 w")]),
            "/tensors/v1/model/h.0%20w"
        );
    }
}
