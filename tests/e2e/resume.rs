//! Transfers that resume (issue 72): a clone or fetch whose pack stream is cut off keeps what
//! arrived whole, verified, and the same command again moves only the rest; nothing a ref
//! names changes until the whole transfer is in.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::deltas::fetched_bytes;
use crate::peer_proxy::{Answer, Body, Proxy, Route};
use crate::server::*;
use crate::transfer::ok_with;
use crate::util::*;

/// Whether the clone test's proxy, and the fetch test's, still cut the next pack they pass.
static CUT_CLONE: AtomicBool = AtomicBool::new(true);
static CUT_FETCH: AtomicBool = AtomicBool::new(false);

/// `a` with its body cut to the first half (as a whole answer of that length: the stream ends
/// there) if `route` is a pack and `cut` still says so (then no longer).
fn cut_once(cut: &AtomicBool, route: Route, mut a: Answer) -> Answer {
    if route == Route::Pack && cut.swap(false, Ordering::SeqCst) {
        if let Body::Bytes(b) = &a.body {
            a.body = Body::Bytes(b[..b.len() / 2].to_vec());
        }
    }
    a
}

/// A commit of 48 tensors of 256 KiB of noise (nothing compresses), so a cut leaves many
/// whole: the file's bytes.
fn noisy_commit(repo: &Path, seed: u64, message: &str) -> Vec<u8> {
    let ts: Vec<T> = (0..48)
        .map(|i| tensor(&format!("layer{i}.w"), "F32", &[256, 256], seed + i))
        .collect();
    let f = repo.with_extension(format!("{seed}.safetensors"));
    let sent = write_safetensors(&f, &ts, &[]);
    ok(repo, &["commit", f.to_str().unwrap(), "-m", message]);
    sent
}

/// A served folder `d` holding `repo`, one noisy commit in it (seed `seed`): the repository,
/// the file committed, and the server.
fn served_noisy(d: &Path, seed: u64) -> (std::path::PathBuf, Vec<u8>, Server) {
    ok(d, &["init", "repo"]);
    let repo = d.join("repo");
    let sent = noisy_commit(&repo, seed, "one");
    let server = Server::start(&["--root", d.to_str().unwrap()], d);
    (repo, sent, server)
}

/// `mdl ARGS` with the read token, which must fail with one line saying the transfer was cut.
fn cut_off(args: &[&str]) {
    let out = std::process::Command::new(mdl_bin())
        .args(args)
        .env("MDL_TOKEN", READ)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a cut transfer succeeded");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cut off"), "{stderr}");
}

/// `mdl --json clone URL DIR`: the record bytes it moved.
fn cloned_bytes(url: &str, dir: &Path) -> u64 {
    let out = ok_with(READ, &["--json", "clone", url, dir.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["bytes"].as_u64().unwrap()
}

#[test]
fn a_clone_cut_off_half_way_moves_only_the_rest_the_next_time() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_, sent, server) = served_noisy(d, 100);
    let whole = cloned_bytes(&format!("{}/repo", server.base), &d.join("plain"));

    let proxy = Proxy::start(&server.base, |r, a| cut_once(&CUT_CLONE, r, a));
    let url = format!("{}/repo", proxy.base);
    let target = d.join("c");
    cut_off(&["clone", &url, target.to_str().unwrap()]);
    assert!(!target.exists(), "a cut clone left its target");

    // Again: the objects kept are not sent again.
    let rest = cloned_bytes(&url, &target);
    eprintln!("the second clone moved {rest} of {whole} bytes");
    assert!(
        rest * 100 <= whole * 55,
        "the second clone moved {rest} of {whole} bytes"
    );
    assert!(
        rest * 100 >= whole * 40,
        "{rest} of {whole}: was half kept?"
    );
    let got = d.join("got.safetensors");
    ok(&target, &["checkout", "main", "-o", got.to_str().unwrap()]);
    assert_eq!(std::fs::read(&got).unwrap(), sent);
    assert_fsck_clean(&target);
    // Nothing of it was left beside the clone.
    let left: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("mdl-clone"))
        .collect();
    assert!(left.is_empty());
}

#[test]
fn a_fetch_cut_off_moves_no_ref_and_only_the_rest_the_next_time() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (repo, _, server) = served_noisy(d, 200);
    let proxy = Proxy::start(&server.base, |r, a| cut_once(&CUT_FETCH, r, a));
    let (plain, clone) = (d.join("plain"), d.join("clone"));
    for c in [&plain, &clone] {
        ok_with(
            READ,
            &[
                "clone",
                &format!("{}/repo", proxy.base),
                c.to_str().unwrap(),
            ],
        );
    }
    let sent = noisy_commit(&repo, 300, "two");
    let whole = fetched_bytes(&plain);
    let tracking = |c: &Path| json(c, &["log", "refs/remotes/origin/main"])[0]["id"].clone();
    let before = tracking(&clone);
    CUT_FETCH.store(true, Ordering::SeqCst);
    cut_off(&["-C", clone.to_str().unwrap(), "fetch"]);
    assert_eq!(tracking(&clone), before, "a cut fetch moved a ref");
    assert_fsck_clean(&clone);
    let rest = fetched_bytes(&clone);
    assert!(rest * 100 <= whole * 55, "{rest} of {whole}");
    assert!(
        rest * 100 >= whole * 40,
        "{rest} of {whole}: was half kept?"
    );
    let got = d.join("got.safetensors");
    ok(
        &clone,
        &[
            "checkout",
            "refs/remotes/origin/main",
            "-o",
            got.to_str().unwrap(),
        ],
    );
    assert_eq!(std::fs::read(&got).unwrap(), sent);
    assert_fsck_clean(&clone);
}
