//! Shallow clones (issue 72): `clone --depth N` and `--since REV` take the newest commits of a
//! served series and say in `log` and `fsck` where history ends; `fetch --deepen N` brings more;
//! what a shallow clone cannot do (push history the other side lacks, name an ancestor past the
//! end) fails with one line and changes nothing.

use std::path::Path;

use crate::deltas::step;
use crate::server::*;
use crate::transfer::{fails_with, ok_with};
use crate::util::*;

/// `mdl --json clone ARGS… URL DIR`: the record bytes it moved.
fn clone_bytes(url: &str, dir: &Path, args: &[&str]) -> u64 {
    let mut all = vec!["--json", "clone"];
    all.extend_from_slice(args);
    all.extend([url, dir.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&ok_with(READ, &all)).unwrap();
    v["bytes"].as_u64().unwrap()
}

/// The ids `log` shows in `repo`, newest first, each with whether history is cut there.
fn history(repo: &Path) -> Vec<(String, bool)> {
    json(repo, &["log"])
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["id"].as_str().unwrap().to_string(), e["cut"] == true))
        .collect()
}

#[test]
fn a_shallow_clone_takes_the_newest_commits_and_deepens() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init", "repo"]);
    let repo = d.join("repo");
    let mut files = Vec::new();
    for s in 0..8 {
        let f = d.join(format!("s{s}.safetensors"));
        files.push(write_safetensors(&f, &step(s), &[]));
        ok(
            &repo,
            &["commit", f.to_str().unwrap(), "-m", &format!("step {s}")],
        );
        if s == 5 {
            ok(&repo, &["tag", "five"]);
        }
    }
    ok(&repo, &["maintenance"]);
    let ids: Vec<String> = column(&json(&repo, &["log"]), "id")
        .into_iter()
        .map(String::from)
        .collect();
    let server = Server::start(&["--root", d.to_str().unwrap()], d);
    let url = format!("{}/repo", server.base);

    // Depth 1: the newest commit, byte for byte, for what it is stored in (the older steps
    // are small reverse deltas of it).
    let tip_stored: u64 = json(&repo, &["show", "main"])["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["stored_bytes"].as_u64().unwrap())
        .sum();
    let full = clone_bytes(&url, &d.join("full"), &[]);
    let c = d.join("c");
    let shallow = clone_bytes(&url, &c, &["--depth", "1"]);
    assert!(
        shallow < full && shallow * 10 <= tip_stored * 11,
        "depth 1 moved {shallow}: the newest commit is stored in {tip_stored}, all history in {full}"
    );
    assert_eq!(history(&c), [(ids[0].clone(), true)]);
    let text = ok(&c, &["log"]);
    assert!(text.contains("[history cut"), "{text}");
    assert!(text.contains("shallow clone"), "{text}");
    let fsck = ok(&c, &["fsck"]);
    assert!(fsck.contains("history was cut at 1 commits"), "{fsck}");
    let out = d.join("out.safetensors");
    ok(&c, &["checkout", "main", "-o", out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == files[7]);
    fails(&c, &["log", "main~1"], "history is cut at commit");

    // Two more behind the end, and the end moves.
    ok_with(READ, &["-C", c.to_str().unwrap(), "fetch", "--deepen", "2"]);
    let got = history(&c);
    let want: Vec<(String, bool)> = (0..3).map(|i| (ids[i].clone(), i == 2)).collect();
    assert_eq!(got, want);
    ok(
        &c,
        &["checkout", "main~2", "-o", out.to_str().unwrap(), "--force"],
    );
    assert!(std::fs::read(&out).unwrap() == files[5]);
    assert_fsck_clean(&c);
    // A whole clone has nothing to deepen.
    fails_with(
        READ,
        &[
            "-C",
            d.join("full").to_str().unwrap(),
            "fetch",
            "--deepen",
            "1",
        ],
        "history is whole",
    );

    // Since a tag: it and what came after.
    let s = d.join("s");
    clone_bytes(&url, &s, &["--since", "five"]);
    let want: Vec<(String, bool)> = (0..3).map(|i| (ids[i].clone(), i == 2)).collect();
    assert_eq!(history(&s), want);
    fails_with(
        READ,
        &[
            "clone",
            "--since",
            "nosuch",
            &url,
            d.join("x").to_str().unwrap(),
        ],
        "not a full commit id",
    );
    assert!(!d.join("x").exists());

    // A commit made in the shallow clone goes back to the server, which has the history
    // behind it; a fresh repository, which lacks it, refuses it and stays empty.
    let f = d.join("s8.safetensors");
    write_safetensors(&f, &step(8), &[]);
    ok(&c, &["commit", f.to_str().unwrap(), "-m", "step 8"]);
    ok_with(WRITE, &["-C", c.to_str().unwrap(), "push"]);
    assert_eq!(column(&json(&repo, &["log"]), "id").len(), 9);
    let empty = format!("{}/empty", server.base);
    ok_with(ADMIN, &["init", &empty]);
    let c = c.to_str().unwrap();
    ok(Path::new(c), &["remote", "add", "empty", &empty]);
    fails_with(
        WRITE,
        &["-C", c, "push", "empty", "main"],
        "lacks the history before commit",
    );
    assert!(column(&json(&d.join("empty"), &["log"]), "id").is_empty());
    assert_fsck_clean(&repo);
}
