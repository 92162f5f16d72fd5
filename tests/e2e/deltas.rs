//! Fetching what changed (issue 72): a clone holding one commit of a series gets the next as
//! records coded against the tensors it holds — a fraction of the bytes — exactly, and a server
//! whose delta does not rebuild the tensor asked for is refused, changing nothing.

use std::path::Path;
use std::process::{Command, Output};

use crate::peer_proxy::{Answer, Body, Proxy, Route};
use crate::server::*;
use crate::util::*;

/// A bf16 tensor of 1 Mi elements and an f32 one of 64 Ki: step `step` of a run whose every
/// step changes about 1 % of the elements in their low bits.
fn step(step: u64) -> Vec<T> {
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

fn fetch(clone: &Path, remote: Option<&str>) -> Output {
    let c = clone.to_str().unwrap();
    let mut args = vec!["-C", c, "--json", "fetch"];
    args.extend(remote);
    Command::new(mdl_bin())
        .args(&args)
        .env("MDL_TOKEN", READ)
        .env("MDL_AUTHOR", "tester")
        .env("MDL_REMOTE_REQUEST_TIMEOUT", "20")
        .output()
        .unwrap()
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
    let out = Command::new(mdl_bin())
        .args([
            "clone",
            &format!("{}/repo", server.base),
            clone.to_str().unwrap(),
        ])
        .env("MDL_TOKEN", READ)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
        let out = fetch(&clone, None);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let moved: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let moved = moved["bytes"].as_u64().unwrap();
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

/// The standard CRC-32 (what a record's trailer holds), for forging a consistent record.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Flips a payload byte of every delta record of a pack (a record whose header names a base)
/// and makes its checksum agree: a well-formed record that does not rebuild its tensor.
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
        // magic 4 | version 2 | kind 1 | codec 1 | flags 1: flag 1 names a base.
        if rec[8] & 1 == 1 && rec.len() > 200 {
            let mid = rec.len() / 2;
            rec[mid] ^= 0x40;
            let crc = crc32(&rec[..len - 4]);
            rec[len - 4..].copy_from_slice(&crc.to_le_bytes());
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
    let out = fetch(&clone, Some("evil"));
    assert!(!out.status.success(), "a forged delta was taken");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert_eq!(state(&clone), before);
    assert_fsck_clean(&clone);
    // The honest server's deltas are taken.
    let out = fetch(&clone, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.stop();
}
