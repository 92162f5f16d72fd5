//! What a newcomer meets first: a training loop's run where `log` looks for it (HEAD follows a
//! new repository's first branch), and a binary that says which commit it was built from.

use crate::util::*;

#[test]
fn a_new_repositorys_first_branch_is_the_one_head_follows() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("run");
    ok(dir.path(), &["init", "run"]);
    let f = dir.path().join("a.safetensors");
    write_safetensors(&f, &mixed(1), &[]);
    // A training loop's first commit goes to its own branch: HEAD follows it, so the history
    // is where `log`, `show` and `diff` look.
    ok(
        &repo,
        &["commit", f.to_str().unwrap(), "-b", "mlp", "-m", "one"],
    );
    write_safetensors(&f, &mixed(2), &[]);
    ok(
        &repo,
        &["commit", f.to_str().unwrap(), "-b", "mlp", "-m", "two"],
    );
    assert_eq!(column(&json(&repo, &["log"]), "message"), ["two", "one"]);
    assert!(ok(&repo, &["status"]).contains("mlp"));
    ok(&repo, &["diff", "HEAD~1", "HEAD"]);
    // Once the repository has a branch, a commit to another one leaves HEAD where it is.
    ok(
        &repo,
        &["commit", f.to_str().unwrap(), "-b", "side", "-m", "side"],
    );
    assert_eq!(column(&json(&repo, &["log"]), "message"), ["two", "one"]);
    let branches = json(&repo, &["branch"]);
    let current: Vec<_> = branches
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["current"] == true)
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(current, ["mlp"]);
    // Nor does HEAD move for a repository whose own branch has commits.
    let other = dir.path().join("other");
    ok(dir.path(), &["init", "other"]);
    ok(&other, &["commit", f.to_str().unwrap(), "-m", "on main"]);
    ok(
        &other,
        &["commit", f.to_str().unwrap(), "-b", "exp", "-m", "exp"],
    );
    assert_eq!(column(&json(&other, &["log"]), "message"), ["on main"]);
}

#[test]
fn the_version_names_the_commit_it_was_built_from() {
    let dir = tempfile::tempdir().unwrap();
    let version = ok(dir.path(), &["--version"]);
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let built_from = head.unwrap_or_else(|| "unknown commit".into());
    assert_eq!(
        version.trim(),
        format!("mdl {} ({built_from})", env!("CARGO_PKG_VERSION"))
    );
}
