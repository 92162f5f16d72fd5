//! Checkpoints as training stacks write them: directories of sharded safetensors, `torch.save`
//! archives (real ones, from `tests/fixtures/torch`) and other files, committed per tensor and
//! checked out byte for byte.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::util::*;

pub(crate) fn torch_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/torch")
        .join(name)
}

/// A Trainer-like checkpoint directory at step `step`: two safetensors shards and their index,
/// a real `torch.save` optimizer, JSON state, a tokenizer file that never changes, an
/// executable script and a file in a subfolder.
fn trainer_dir(dir: &Path, step: u64) {
    std::fs::create_dir_all(dir.join("extra")).unwrap();
    let all = mixed(step);
    write_safetensors(
        &dir.join("model-00001-of-00002.safetensors"),
        &all[..4],
        &[],
    );
    write_safetensors(
        &dir.join("model-00002-of-00002.safetensors"),
        &all[4..],
        &[("format", "pt")],
    );
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        r#"{"metadata": {}, "weight_map": {}}"#,
    )
    .unwrap();
    std::fs::copy(torch_fixture("optimizer.pt"), dir.join("optimizer.pt")).unwrap();
    std::fs::write(
        dir.join("trainer_state.json"),
        format!(
            r#"{{"global_step": {step}, "log_history": [
                {{"step": {prev}, "loss": 9.0}},
                {{"epoch": 0.5, "step": {step}, "loss": {loss}, "learning_rate": 0.001}},
                {{"step": {step}, "eval_loss": {eval}, "eval_runtime": 1.5}}]}}"#,
            prev = step - 1,
            loss = 3.0 / step as f64,
            eval = 4.0 / step as f64
        ),
    )
    .unwrap();
    std::fs::write(dir.join("tokenizer.json"), "x".repeat(10_000)).unwrap();
    std::fs::write(dir.join("run.sh"), "#!/bin/sh\necho resume\n").unwrap();
    std::fs::set_permissions(dir.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.join("extra/notes.txt"), format!("step {step}\n")).unwrap();
    std::fs::write(dir.join("empty"), "").unwrap();
}

#[test]
fn a_checkpoint_directory_round_trips_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ok(d, &["init"]);
    let ck = d.join("checkpoint-10");
    trainer_dir(&ck, 10);
    let first = json(d, &["commit", ck.to_str().unwrap(), "-m", "step 10"]);
    let ck2 = d.join("checkpoint-20");
    trainer_dir(&ck2, 20);
    let second = json(d, &["commit", ck2.to_str().unwrap(), "-m", "step 20"]);
    // The optimizer and tokenizer did not change: only the shards, the state and the notes
    // took new objects.
    assert!(second["stored_bytes"].as_u64() < first["stored_bytes"].as_u64());

    // The step and its metrics come from trainer_state.json.
    let log = json(d, &["log"]);
    assert_eq!(log[0]["step"], 20);
    assert_eq!(log[0]["metrics"]["loss"], 0.15);
    assert_eq!(log[0]["metrics"]["eval_loss"], 0.2);
    assert_eq!(log[0]["metrics"]["learning_rate"], 0.001);
    assert_eq!(log[1]["step"], 10);
    // --step and --metric win over what the checkpoint records.
    let ck3 = d.join("checkpoint-30");
    trainer_dir(&ck3, 30);
    ok(
        d,
        &[
            "commit",
            ck3.to_str().unwrap(),
            "-b",
            "side",
            "--step",
            "7",
            "--metric",
            "acc=0.5",
        ],
    );
    let side = json(d, &["show", "side"]);
    assert_eq!(side["step"], 7);
    assert_eq!(side["metrics"], serde_json::json!({"acc": 0.5}));

    // The tree, file by file: formats, tensors named from the pickle, notes.
    let shown = json(d, &["show", "main~1"]);
    let files: BTreeMap<&str, &serde_json::Value> = shown["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap(), f))
        .collect();
    assert_eq!(files["optimizer.pt"]["format"], "torch");
    assert_eq!(
        files["model-00001-of-00002.safetensors"]["format"],
        "safetensors"
    );
    assert_eq!(files["tokenizer.json"]["format"], "bytes");
    assert_eq!(files["run.sh"]["executable"], true);
    assert!(files.contains_key("extra/notes.txt") && files.contains_key("empty"));
    let names: Vec<&str> = shown["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["file"] == "optimizer.pt")
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"state.0.exp_avg"), "{names:?}");
    assert!(names.contains(&"state.1.exp_avg_sq"), "{names:?}");

    // Checkout writes the tree exactly, permissions included.
    for (rev, src) in [("main~1", &ck), ("main", &ck2)] {
        let out = d.join(format!("out-{}", rev.replace('~', "-")));
        ok(d, &["checkout", rev, "-o", out.to_str().unwrap()]);
        assert_eq!(snapshot(&out), snapshot(src), "{rev}");
    }

    // One file, and a subtree.
    let one = d.join("one.pt");
    ok(
        d,
        &[
            "checkout",
            "main",
            "-o",
            one.to_str().unwrap(),
            "--path",
            "optimizer.pt",
        ],
    );
    assert_eq!(
        std::fs::read(&one).unwrap(),
        std::fs::read(ck2.join("optimizer.pt")).unwrap()
    );
    let sub = d.join("sub");
    ok(
        d,
        &[
            "checkout",
            "main",
            "-o",
            sub.to_str().unwrap(),
            "--path",
            "extra",
        ],
    );
    assert_eq!(std::fs::read(sub.join("notes.txt")).unwrap(), b"step 20\n");
    fails(
        d,
        &[
            "checkout",
            "main",
            "-o",
            d.join("x").to_str().unwrap(),
            "--path",
            "nope",
        ],
        "no file or folder",
    );

    // A folder that is not empty is refused without --force; with it, the tree's files are
    // replaced and others left.
    let before = state(d);
    fails(
        d,
        &["checkout", "main", "-o", sub.to_str().unwrap()],
        "exists",
    );
    ok(
        d,
        &["checkout", "main", "-o", sub.to_str().unwrap(), "--force"],
    );
    assert_eq!(std::fs::read(sub.join("notes.txt")).unwrap(), b"step 20\n");
    assert_eq!(
        std::fs::read(sub.join("extra/notes.txt")).unwrap(),
        b"step 20\n"
    );
    assert_eq!(state(d), before);

    // Diff: file by file.
    let diff = json(d, &["diff", "main~1", "main"]);
    let change: BTreeMap<&str, &str> = diff["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap(), f["change"].as_str().unwrap()))
        .collect();
    assert_eq!(change["optimizer.pt"], "unchanged");
    assert_eq!(change["tokenizer.json"], "unchanged");
    assert_eq!(change["trainer_state.json"], "changed");
    assert_eq!(change["model-00001-of-00002.safetensors"], "changed");
    assert_fsck_clean(d);
}

#[test]
fn files_mdl_cannot_take_are_refused_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ok(d, &["init"]);
    let good = d.join("good");
    trainer_dir(&good, 1);
    ok(d, &["commit", good.to_str().unwrap()]);
    let before = state(d);

    let ck = d.join("ck");
    trainer_dir(&ck, 2);
    std::os::unix::fs::symlink(&good, ck.join("linked-dir")).unwrap();
    fails(
        d,
        &["commit", ck.to_str().unwrap()],
        "symlink to a directory",
    );
    std::fs::remove_file(ck.join("linked-dir")).unwrap();
    std::os::unix::fs::symlink(d.join("gone"), ck.join("dangling")).unwrap();
    fails(d, &["commit", ck.to_str().unwrap()], "dangling");
    std::fs::remove_file(ck.join("dangling")).unwrap();
    // A broken shard named .safetensors is refused, not stored as bytes.
    std::fs::write(ck.join("model-00001-of-00002.safetensors"), b"garbage").unwrap();
    fails(
        d,
        &["commit", ck.to_str().unwrap()],
        "model-00001-of-00002.safetensors",
    );
    // Two paths entered under one name.
    fails(
        d,
        &[
            "commit",
            good.join("run.sh").to_str().unwrap(),
            ck.join("run.sh").to_str().unwrap(),
        ],
        "also that of",
    );
    assert_eq!(state(d), before, "a refused commit changed the repository");

    // A pickle with an opcode torch never writes is stored whole, with a note, and comes back
    // byte for byte.
    let odd = d.join("odd");
    std::fs::create_dir(&odd).unwrap();
    std::fs::copy(torch_fixture("unsupported-opcode.pt"), odd.join("model.pt")).unwrap();
    ok(d, &["commit", odd.to_str().unwrap()]);
    let shown = json(d, &["show", "main"]);
    let f = &shown["files"][0];
    assert_eq!(f["format"], "bytes");
    assert!(f["note"].as_str().unwrap().contains("opcode"), "{f}");
    // A commit of one file is written into a folder that exists (else to the path itself).
    let out = d.join("odd-out");
    std::fs::create_dir(&out).unwrap();
    ok(d, &["checkout", "main", "-o", out.to_str().unwrap()]);
    assert_eq!(
        std::fs::read(out.join("model.pt")).unwrap(),
        std::fs::read(odd.join("model.pt")).unwrap()
    );
    assert_fsck_clean(d);
}

/// Retention's "keep only the weights of old commits" finds optimizer state inside
/// `optimizer.pt`; a thinned tree clones, checks out without that file, and fscks clean on both
/// sides; trees push and pull.
#[test]
fn trees_thin_clone_push_and_pull() {
    use crate::server::{Server, READ, WRITE};
    use crate::transfer::ok_with;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = d.join("src");
    ok(&src, &["init"]);
    ok(&src, &["config", "retention.keep_last", "1"]);
    let mut dirs = Vec::new();
    for (n, optimizer) in ["optimizer.pt", "optimizer-later.pt"].iter().enumerate() {
        let ck = d.join(format!("ck{n}"));
        std::fs::create_dir(&ck).unwrap();
        write_safetensors(&ck.join("model.safetensors"), &mixed(n as u64), &[]);
        std::fs::copy(torch_fixture(optimizer), ck.join("optimizer.pt")).unwrap();
        std::fs::write(ck.join("config.json"), "{}").unwrap();
        ok(
            &src,
            &["commit", ck.to_str().unwrap(), "-m", &format!("c{n}")],
        );
        dirs.push(ck);
    }
    let gc = json(&src, &["gc", "--prune-older-than", "0s"]);
    assert!(gc["expired"].as_u64().unwrap() > 0, "{gc}");
    let shown = json(&src, &["show", "main~1"]);
    let expired: Vec<&str> = shown["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["expired"].is_string())
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        !expired.is_empty()
            && expired
                .iter()
                .all(|n| n.ends_with("exp_avg") || n.ends_with("exp_avg_sq")),
        "{expired:?}"
    );
    assert_fsck_clean(&src);

    let server = Server::start(&["--root", d.to_str().unwrap()], d);
    let url = format!("{}/src", server.base);
    let clone = d.join("clone");
    ok_with(READ, &["clone", &url, clone.to_str().unwrap()]);
    assert_fsck_clean(&clone);
    // The thinned commit: refused whole, then written without optimizer.pt.
    let thin = d.join("thin");
    fails(
        &clone,
        &["checkout", "main~1", "-o", thin.to_str().unwrap()],
        "expired",
    );
    ok(
        &clone,
        &[
            "checkout",
            "main~1",
            "-o",
            thin.to_str().unwrap(),
            "--skip-expired",
        ],
    );
    let mut want = snapshot(&dirs[0]);
    want.remove("optimizer.pt");
    assert_eq!(snapshot(&thin), want);
    let tip = d.join("tip");
    ok(&clone, &["checkout", "main", "-o", tip.to_str().unwrap()]);
    assert_eq!(snapshot(&tip), snapshot(&dirs[1]));

    // A tree committed in the clone is pushed, and fetched back by the origin's server. Its
    // optimizer.pt is the thinned commit's again: the origin has those tensors only as
    // expired, so they must travel as records (they once did not, and the origin's tip could
    // not be checked out).
    let ck = d.join("ck2");
    trainer_dir(&ck, 2);
    ok(&clone, &["commit", ck.to_str().unwrap(), "-m", "c2"]);
    ok_with(WRITE, &["-C", clone.to_str().unwrap(), "push"]);
    let again = d.join("again");
    ok_with(READ, &["clone", &url, again.to_str().unwrap()]);
    let out = d.join("out");
    ok(&again, &["checkout", "main", "-o", out.to_str().unwrap()]);
    assert_eq!(snapshot(&out), snapshot(&ck));
    assert_fsck_clean(&again);
    drop(server);
    assert_fsck_clean(&src);
}

/// The file routes: a commit's listing, any file whole or by byte range (a range over a split
/// file decodes only what it touches and equals the file's bytes there), ETags that follow the
/// content across commits.
#[test]
fn files_over_http_whole_and_by_range() {
    use crate::server::{bearer, http, read, Server, READ};
    use crate::transfer::ok_with;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let repo = d.join("repo");
    ok(&repo, &["init"]);
    let (a, b) = (d.join("a"), d.join("b"));
    trainer_dir(&a, 1);
    trainer_dir(&b, 2);
    ok(&repo, &["commit", a.to_str().unwrap()]);
    ok(&repo, &["commit", b.to_str().unwrap()]);
    let server = Server::start(&["-C", repo.to_str().unwrap()], d);
    let base = &server.base;

    let listing: serde_json::Value =
        serde_json::from_slice(&read(base, "/v1/repos/repo/files/main")).unwrap();
    let etag = |l: &serde_json::Value, path: &str| {
        l["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == path)
            .unwrap_or_else(|| panic!("{path} not listed: {l}"))["etag"]
            .clone()
    };
    let older: serde_json::Value =
        serde_json::from_slice(&read(base, "/v1/repos/repo/files/main~1")).unwrap();
    assert_eq!(etag(&listing, "optimizer.pt"), etag(&older, "optimizer.pt"));
    assert_ne!(
        etag(&listing, "extra/notes.txt"),
        etag(&older, "extra/notes.txt")
    );

    for path in [
        "optimizer.pt",
        "model-00001-of-00002.safetensors",
        "extra/notes.txt",
        "empty",
    ] {
        let want = std::fs::read(b.join(path)).unwrap();
        assert_eq!(
            read(base, &format!("/v1/repos/repo/files/main/{path}")),
            want,
            "{path}"
        );
        if want.len() < 10 {
            continue;
        }
        // Ranges that start and end inside tensors, headers and the pickle.
        let len = want.len();
        for (s, e) in [(0, 9), (5, len / 2), (len / 3, len - 1), (len - 7, len - 1)] {
            let range = format!("bytes={s}-{e}");
            let (status, _, body) = http(
                base,
                "GET",
                &format!("/v1/repos/repo/files/main/{path}"),
                &[("Authorization", &bearer(READ)), ("Range", &range)],
                b"",
            );
            assert_eq!(status, 206, "{path} {range}");
            assert_eq!(body, want[s..=e], "{path} {range}");
        }
    }
    let (status, _, _) = http(
        base,
        "GET",
        "/v1/repos/repo/files/main/nope",
        &[("Authorization", &bearer(READ))],
        b"",
    );
    assert_eq!(status, 404);
    // `mdl checkout` against the server writes the tree, or one file of it, as a local one.
    let url = format!("{base}/repo");
    let got = d.join("over-http");
    ok_with(
        READ,
        &[
            "-C",
            &url,
            "checkout",
            "main~1",
            "-o",
            got.to_str().unwrap(),
        ],
    );
    assert_eq!(snapshot(&got), snapshot(&a));
    let one = d.join("one.txt");
    ok_with(
        READ,
        &[
            "-C",
            &url,
            "checkout",
            "main",
            "-o",
            one.to_str().unwrap(),
            "--path",
            "extra/notes.txt",
        ],
    );
    assert_eq!(std::fs::read(&one).unwrap(), b"step 2\n");
    // A tree is not one checkpoint file.
    let (status, _, _) = http(
        base,
        "GET",
        "/v1/repos/repo/checkpoints/main.safetensors",
        &[("Authorization", &bearer(READ))],
        b"",
    );
    assert_eq!(status, 404);
}

/// A tree of more files than a checkout keeps open at once, in nested folders, committed by
/// a process that may open fewer files than the tree has (a commit once held every file open
/// and mapped: past `ulimit -n` it failed with "Too many open files").
#[test]
fn a_tree_of_many_files() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ok(d, &["init"]);
    let src = d.join("many");
    for i in 0..600 {
        let dir = src.join(format!("shard-{}", i % 7));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}.bin")), vec![i as u8; i * 13]).unwrap();
    }
    // Large enough to be mapped rather than read whole.
    for i in 0..3 {
        std::fs::write(src.join(format!("large{i}.bin")), noise(i, 3 << 19)).unwrap();
    }
    let commit = std::process::Command::new("sh")
        .args(["-c", "ulimit -n 200 && exec \"$0\" \"$@\""])
        .arg(mdl_bin())
        .arg("-C")
        .arg(d)
        .args(["commit", src.to_str().unwrap()])
        .env("MDL_AUTHOR", "tester")
        .output()
        .unwrap();
    assert!(
        commit.status.success(),
        "{}",
        String::from_utf8_lossy(&commit.stderr)
    );
    let out = d.join("out");
    ok(d, &["checkout", "main", "-o", out.to_str().unwrap()]);
    assert_eq!(snapshot(&out), snapshot(&src));
}

/// A folder committed with a repository's `.mdl` inside it: the rest is committed, and the
/// leaving out is said (it once went without a word).
#[test]
fn a_repository_folder_inside_a_tree_is_left_out_with_a_word() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ok(d, &["init", "repo"]);
    let src = d.join("ck");
    std::fs::create_dir_all(src.join("sub/.mdl")).unwrap();
    std::fs::write(src.join("sub/.mdl/x"), "x").unwrap();
    std::fs::write(src.join("ok.txt"), "ok").unwrap();
    let out = mdl(&d.join("repo"), &["commit", src.to_str().unwrap()]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("left out") && stderr.contains(".mdl"),
        "{stderr}"
    );
    let listed = ok(&d.join("repo"), &["show", "main"]);
    assert!(
        listed.contains("ok.txt") && !listed.contains(".mdl"),
        "{listed}"
    );
}

/// A file whose size says 0 but which reads more (`/proc/self/status`) is refused, not
/// committed empty.
#[test]
fn a_file_whose_size_says_nothing_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ok(d, &["init"]);
    let before = state(d);
    fails(d, &["commit", "/proc/self/status"], "/proc or /sys file");
    assert_eq!(state(d), before);
}

/// A damaged safetensors file is refused naming the fault whatever its name (a truncated
/// `x.st` was once committed as bytes), and stored whole with `--as-bytes`.
#[test]
fn a_damaged_checkpoint_is_refused_whatever_its_name() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ok(d, &["init"]);
    let full = write_safetensors(
        &d.join("full.safetensors"),
        &[tensor("w", "F32", &[1024], 1)],
        &[],
    );
    let cut = d.join("x.st");
    std::fs::write(&cut, &full[..full.len() - 100]).unwrap();
    let before = state(d);
    fails(d, &["commit", cut.to_str().unwrap()], "safetensors");
    assert_eq!(state(d), before);
    ok(d, &["commit", cut.to_str().unwrap(), "--as-bytes"]);
}
