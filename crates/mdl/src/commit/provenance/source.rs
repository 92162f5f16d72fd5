//! The code a checkpoint came from: the git commit of the training code's work tree, and
//! whether it had uncommitted changes, recorded with the commit as `source.git` and
//! `source.dirty`. Looked up while the commit is being made, like its author.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::Soon;

/// `source.git` (the work tree's HEAD commit) and `source.dirty` (`true` when tracked files
/// differ from it; untracked files, checkpoints among them, do not count) of the git work tree
/// holding `dir`; nothing when `dir` is in none or git cannot be run.
pub fn source_properties(dir: &Path) -> Vec<(String, String)> {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "--verify", "--quiet", "HEAD"]).filter(|h| !h.is_empty())
    else {
        return Vec::new();
    };
    let mut out = vec![("source.git".to_string(), head)];
    if let Some(status) = git(&["status", "--porcelain", "--untracked-files=no"]) {
        out.push(("source.dirty".into(), (!status.is_empty()).to_string()));
    }
    out
}

/// [`source_properties`] of `dir` looked up on a thread of its own while the commit is made;
/// nothing without a `dir`.
pub(crate) fn source_soon(dir: Option<&PathBuf>) -> Soon<Vec<(String, String)>> {
    match dir.cloned() {
        Some(d) => Soon::spawn(move || source_properties(&d)),
        None => Soon::none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let ok = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
            .output()
            .unwrap()
            .status
            .success();
        assert!(ok, "git {args:?}");
    }

    #[test]
    // The test's own work tree, not a repository's files.
    #[allow(clippy::disallowed_methods)]
    fn a_work_trees_commit_and_its_changes_are_found() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert!(source_properties(dir).is_empty(), "not a work tree");
        git(dir, &["init", "-q"]);
        assert!(source_properties(dir).is_empty(), "no commit yet");
        std::fs::write(dir.join("train.py"), "print(1)\n").unwrap();
        git(dir, &["add", "train.py"]);
        git(dir, &["commit", "-q", "-m", "one"]);
        let head = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["rev-parse", "HEAD"])
            .output()
            .unwrap();
        let head = String::from_utf8(head.stdout).unwrap().trim().to_string();
        // An untracked checkpoint does not make it dirty; a changed script does.
        std::fs::write(dir.join("ckpt.safetensors"), b"x").unwrap();
        assert_eq!(
            source_properties(dir),
            [
                ("source.git".into(), head.clone()),
                ("source.dirty".into(), "false".into())
            ]
        );
        std::fs::write(dir.join("train.py"), "print(2)\n").unwrap();
        assert_eq!(
            source_properties(&dir.join(".")),
            [
                ("source.git".into(), head),
                ("source.dirty".into(), "true".into())
            ]
        );
    }
}
