//! Fetching what changed (issue 72): a clone holding one commit of a series gets the next as
//! records coded against the tensors it holds — a fraction of the bytes — exactly, and a server
//! whose delta does not rebuild the tensor asked for is refused, changing nothing.

use std::path::Path;
use std::process::{Command, Output};

use mdl_format::record;

use crate::peer_proxy::{Answer, Body, Proxy, Route};
use crate::server::*;
use crate::transfer::ok_with;
use crate::util::*;

/// A bf16 tensor of 1 Mi elements and an f32 one of 64 Ki: step `step` of a run whose every
/// step changes about 1 % of the elements in their low bits.
pub(crate) fn step(step: u64) -> Vec<T> {
    let mut w = tensor("model.w", "BF16", &[1024, 1024], 1);
    let mut v = tensor("model.v", "F32", &[256, 256], 2);
    for s in 1..=step {
        for (t, width) in [(&mut w, 2usize), (&mut v, 4)] {
            let n = t.data.len() / width;
            for k in (s as usize * 7..n).step_by(97) {
                t.data[k * width] ^= (s as u8) | 1;
            }
        }
    }
    vec![w, v]
}

/// `mdl fetch evil` in `clone`, which must fail: its output.
fn refused_fetch(clone: &Path) -> Output {
    Command::new(mdl_bin())
        .args(["-C", clone.to_str().unwrap(), "fetch", "evil"])
        .env("MDL_TOKEN", READ)
        .env("MDL_AUTHOR", "tester")
        .env("MDL_REMOTE_REQUEST_TIMEOUT", "20")
        .output()
        .unwrap()
}

/// `mdl --json fetch` of origin in `clone`: the record bytes it moved.
pub(crate) fn fetched_bytes(clone: &Path) -> u64 {
    let out = ok_with(READ, &["-C", clone.to_str().unwrap(), "--json", "fetch"]);
    let moved: serde_json::Value = serde_json::from_str(&out).unwrap();
    moved["bytes"].as_u64().unwrap()
}

/// A served repository holding step 0, and a clone of it.
fn served_and_cloned(d: &Path) -> (std::path::PathBuf, Server, std::path::PathBuf) {
    ok(d, &["init", "repo"]);
    let repo = d.join("repo");
    let f = d.join("s0.safetensors");
    write_safetensors(&f, &step(0), &[]);
    ok(&repo, &["commit", f.to_str().unwrap(), "-m", "step 0"]);
    let server = Server::start(&["--root", d.to_str().unwrap()], d);
    let clone = d.join("clone");
    let url = format!("{}/repo", server.base);
    ok_with(READ, &["clone", &url, clone.to_str().unwrap()]);
    (repo, server, clone)
}

#[test]
fn a_fetch_moves_what_changed_and_rebuilds_it_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (repo, server, clone) = served_and_cloned(d);
    let mut whole = 0;
    for s in 1..=2u64 {
        let f = d.join(format!("s{s}.safetensors"));
        let bytes = write_safetensors(&f, &step(s), &[]);
        ok(
            &repo,
            &["commit", f.to_str().unwrap(), "-m", &format!("step {s}")],
        );
        let stored = json(&repo, &["stats"])["stored_bytes"].as_u64().unwrap();
        whole = whole.max(stored / (s + 1));
        let moved = fetched_bytes(&clone);
        // About 1 % of the elements changed: the deltas are a few percent of a step stored
        // whole (the manifest and commit records come too).
        assert!(
            moved * 10 < whole,
            "step {s}: moved {moved} of about {whole}"
        );
        let out = d.join(format!("out{s}"));
        let rev = "refs/remotes/origin/main";
        ok(&clone, &["checkout", rev, "-o", out.to_str().unwrap()]);
        assert_eq!(std::fs::read(&out).unwrap(), bytes, "step {s}");
    }
    assert_fsck_clean(&clone);
    server.stop();
}

/// A clone that follows a run a step at a time keeps its chains within `delta.max_depth`:
/// every step travels as a delta, and one that would pass the cap is stored whole on arrival,
/// so fsck stays clean however long it follows.
#[test]
fn following_a_run_keeps_the_clones_chains_within_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (repo, server, clone) = served_and_cloned(d);
    ok(&clone, &["config", "delta.max_depth", "2"]);
    let mut moved = Vec::new();
    for s in 1..=4u64 {
        let f = d.join(format!("s{s}.safetensors"));
        let bytes = write_safetensors(&f, &step(s), &[]);
        ok(
            &repo,
            &["commit", f.to_str().unwrap(), "-m", &format!("step {s}")],
        );
        moved.push((fetched_bytes(&clone), bytes.len() as u64));
        let out = d.join(format!("out{s}"));
        let rev = "refs/remotes/origin/main";
        ok(&clone, &["checkout", rev, "-o", out.to_str().unwrap()]);
        assert_eq!(std::fs::read(&out).unwrap(), bytes, "step {s}");
        assert_fsck_clean(&clone);
    }
    // Every step came as a delta, step 3's over a version at the cap (stored whole here).
    assert!(moved.iter().all(|(m, file)| m * 10 < *file), "{moved:?}");
    let longest = json(&clone, &["fsck"])["longest_chain"].as_u64().unwrap();
    assert!(longest <= 2, "longest chain {longest}");
    server.stop();
}

/// `fetch --depth 1` brings a follower that fell five steps behind the newest commit alone,
/// as deltas against what it holds: less than the five steps would move, the steps between
/// cut here (`log` says so), the newest checking out exactly; `--deepen` brings them after.
#[test]
fn a_fetch_of_the_newest_commit_alone_skips_the_steps_between() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (repo, server, clone) = served_and_cloned(d);
    let whole = d.join("whole");
    let url = format!("{}/repo", server.base);
    ok_with(READ, &["clone", &url, whole.to_str().unwrap()]);
    let mut newest = Vec::new();
    for s in 1..=5u64 {
        let f = d.join(format!("s{s}.safetensors"));
        newest = write_safetensors(&f, &step(s), &[]);
        ok(
            &repo,
            &["commit", f.to_str().unwrap(), "-m", &format!("step {s}")],
        );
    }
    let all = fetched_bytes(&whole);
    let args = [
        "-C",
        clone.to_str().unwrap(),
        "--json",
        "fetch",
        "--depth",
        "1",
    ];
    let out: serde_json::Value = serde_json::from_str(&ok_with(READ, &args)).unwrap();
    let moved = out["bytes"].as_u64().unwrap();
    // (The steps change every 97th element, a pattern run-coded masks take in few bytes:
    // the five steps move 1.6× what the newest alone does.)
    assert!(moved < all, "depth 1 moved {moved}, the five steps {all}");
    let rev = "refs/remotes/origin/main";
    let log = json(&clone, &["log", rev]);
    let entries = log.as_array().unwrap();
    assert_eq!(entries.len(), 1, "{log}");
    assert_eq!(entries[0]["cut"], true);
    let out = d.join("out");
    ok(&clone, &["checkout", rev, "-o", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(&out).unwrap(), newest);
    assert_fsck_clean(&clone);
    let both = [
        "-C",
        clone.to_str().unwrap(),
        "fetch",
        "--depth",
        "1",
        "--deepen",
        "1",
    ];
    let refused = Command::new(mdl_bin()).args(both).output().unwrap();
    assert!(!refused.status.success());
    ok_with(
        READ,
        &["-C", clone.to_str().unwrap(), "fetch", "--deepen", "4"],
    );
    assert_eq!(json(&clone, &["log", rev]).as_array().unwrap().len(), 6);
    assert_fsck_clean(&clone);
    server.stop();
}

/// `checkout --since` brings a file that holds one commit to the next in place: only the
/// tensors that changed are written (decoded over the file's own bytes where the clone holds
/// them as deltas), and the file is then the newer commit's byte for byte; a file that does not
/// hold what `--since` says fails the check of what decodes over it.
#[test]
fn a_checked_out_file_is_updated_in_place() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (repo, server, clone) = served_and_cloned(d);
    let f = d.join("s1.safetensors");
    let newer = write_safetensors(&f, &step(1), &[]);
    ok(&repo, &["commit", f.to_str().unwrap(), "-m", "step 1"]);
    fetched_bytes(&clone);
    let out = d.join("out.safetensors");
    ok(&clone, &["checkout", "main", "-o", out.to_str().unwrap()]);
    let inode = std::fs::metadata(&out).unwrap().ino();
    let done = json(
        &clone,
        &[
            "checkout",
            "origin/main",
            "-o",
            out.to_str().unwrap(),
            "--since",
            "main",
        ],
    );
    assert!(std::fs::read(&out).unwrap() == newer);
    assert_eq!(
        std::fs::metadata(&out).unwrap().ino(),
        inode,
        "not updated in place"
    );
    let written = done["bytes"].as_u64().unwrap();
    assert!(
        written < newer.len() as u64,
        "wrote {written} of {}",
        newer.len()
    );

    // One byte off in the older file's tensors: what decodes over it fails its id.
    let other = d.join("other.safetensors");
    ok(&clone, &["checkout", "main", "-o", other.to_str().unwrap()]);
    let mut bytes = std::fs::read(&other).unwrap();
    let at = bytes.len() - 1000;
    bytes[at] ^= 0x40;
    std::fs::write(&other, &bytes).unwrap();
    fails(
        &clone,
        &[
            "checkout",
            "origin/main",
            "-o",
            other.to_str().unwrap(),
            "--since",
            "main",
        ],
        "corrupt",
    );
    server.stop();
}

/// Flips a payload byte of every delta record of a pack (a record whose header names a base)
/// and writes the record again with a checksum that agrees: a well-formed record that does not
/// rebuild its tensor.
fn altered_deltas(route: Route, mut a: Answer) -> Answer {
    let Body::Bytes(body) = &mut a.body else {
        return a;
    };
    if route != Route::Pack || a.status != 200 {
        return a;
    }
    let mut at = 8;
    while at + 40 <= body.len() {
        let len = u64::from_le_bytes(body[at + 32..at + 40].try_into().unwrap()) as usize;
        if len == 0 || len == u64::MAX as usize {
            break;
        }
        let rec = &mut body[at + 40..at + 40 + len];
        let (header, payload, trailer) = record::decode(rec).unwrap();
        if header.base.is_some() && payload.len() > 100 {
            let mut altered = payload.to_vec();
            altered[payload.len() / 2] ^= 0x40;
            rec.copy_from_slice(&record::encode(&header, &altered, trailer.content_len));
        }
        at += 40 + len;
    }
    a
}

#[test]
fn a_delta_that_does_not_rebuild_its_tensor_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (repo, server, clone) = served_and_cloned(d);
    let proxy = Proxy::start(&server.base, altered_deltas);
    ok(
        &clone,
        &["remote", "add", "evil", &format!("{}/repo", proxy.base)],
    );
    let f = d.join("s1.safetensors");
    write_safetensors(&f, &step(1), &[]);
    ok(&repo, &["commit", f.to_str().unwrap(), "-m", "step 1"]);
    let before = state(&clone);
    let out = refused_fetch(&clone);
    assert!(!out.status.success(), "a forged delta was taken");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert_eq!(state(&clone), before);
    assert_fsck_clean(&clone);
    // The honest server's deltas are taken.
    fetched_bytes(&clone);
    server.stop();
}
