//! Transfers that resume (issue 72): a clone or fetch whose pack stream is cut off keeps what
//! arrived whole, verified, and the start of the record it was cut inside, and the same
//! command again moves only the rest; nothing a ref names changes until the whole transfer is
//! in.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::deltas::fetched_bytes;
use crate::peer_proxy::{Answer, Body, Proxy, Route, Tamper};
use crate::server::*;
use crate::transfer::ok_with;
use crate::util::*;

/// Whether the clone test's proxy, and the fetch test's, still cut the next pack they pass.
static CUT_CLONE: AtomicBool = AtomicBool::new(true);
static CUT_FETCH: AtomicBool = AtomicBool::new(false);
static CUT_INSIDE: AtomicBool = AtomicBool::new(true);
static CUT_DAMAGED: AtomicBool = AtomicBool::new(true);
static STALL_HALF: AtomicBool = AtomicBool::new(true);

/// `a` with its length declared but only the first half of its body sent, the connection
/// then held open (a server that stalls), if `route` is a pack and the flag still says so.
fn stall_half(route: Route, mut a: Answer) -> Answer {
    if route == Route::Pack && STALL_HALF.swap(false, Ordering::SeqCst) {
        if let Body::Bytes(b) = &a.body {
            a.body = Body::Short(b.len() as u64, b[..b.len() / 2].to_vec());
        }
    }
    a
}

#[test]
fn a_clone_killed_inside_a_record_goes_on_from_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // 48 MiB: what the writer buffers and a kill loses (1 MiB) is 2.5 % of it.
    let (_, sent, server) = served(d, |repo| commit_of_rows(repo, 13, 3 << 12));
    let whole = cloned_bytes(&format!("{}/repo", server.base), &d.join("plain"));
    let proxy = Proxy::start(&server.base, stall_half);
    let url = format!("{}/repo", proxy.base);
    let target = d.join("c");
    let mut child = std::process::Command::new(mdl_bin())
        .args(["clone", &url, target.to_str().unwrap()])
        .env("MDL_TOKEN", READ)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once the half sent is on its disk (what it holds of the record stops growing).
    let held = || {
        kept_starts(d)
            .iter()
            .map(|p| p.metadata().map_or(0, |m| m.len()))
            .max()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut last = (0, std::time::Instant::now());
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the record never arrived"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        let now = held().unwrap_or(0);
        if now != last.0 {
            last = (now, std::time::Instant::now());
        } else if now * 10 >= whole * 4 && last.1.elapsed().as_millis() >= 300 {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let rest = cloned_bytes(&url, &target);
    moved_about_half("the clone after the kill", rest, whole);
    cloned_exactly(d, &target, &sent);
}

/// What a push test's proxy saw: whether it still cuts the next upload, the whole pack's
/// length, and the bytes of the uploads that passed after the cut.
struct Pushed {
    cut: AtomicBool,
    whole: AtomicU64,
    after: AtomicU64,
}

impl Pushed {
    const fn new() -> Pushed {
        Pushed {
            cut: AtomicBool::new(true),
            whole: AtomicU64::new(0),
            after: AtomicU64::new(0),
        }
    }

    /// Cuts the first pack upload at half; counts the bytes of those after it.
    fn cut(&self, body: &[u8]) -> Option<usize> {
        if self.cut.swap(false, Ordering::SeqCst) {
            self.whole.store(body.len() as u64, Ordering::SeqCst);
            return Some(body.len() / 2);
        }
        self.after.fetch_add(body.len() as u64, Ordering::SeqCst);
        None
    }

    /// The whole pack's length and what the uploads after the cut sent.
    fn bytes(&self) -> (u64, u64) {
        let load = |a: &AtomicU64| a.load(Ordering::SeqCst);
        (load(&self.whole), load(&self.after))
    }
}

static PUSH_RESUMED: Pushed = Pushed::new();
static PUSH_DAMAGED: Pushed = Pushed::new();

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

/// A commit of one tensor of 24 MiB of noise, so a pack cut at half is cut inside its record:
/// the file's bytes.
fn large_commit(repo: &Path, seed: u64) -> Vec<u8> {
    commit_of_rows(repo, seed, 3 << 11)
}

/// A commit of one tensor of `rows` rows of 4 KiB of noise: the file's bytes.
fn commit_of_rows(repo: &Path, seed: u64, rows: u64) -> Vec<u8> {
    let ts = [tensor("embed.w", "F32", &[rows, 1 << 10], seed)];
    let f = repo.with_extension(format!("{seed}.safetensors"));
    let sent = write_safetensors(&f, &ts, &[]);
    ok(repo, &["commit", f.to_str().unwrap(), "-m", "large"]);
    sent
}

/// A served folder `d` holding `repo`, one noisy commit in it (seed `seed`): the repository,
/// the file committed, and the server.
fn served_noisy(d: &Path, seed: u64) -> (std::path::PathBuf, Vec<u8>, Server) {
    served(d, |repo| noisy_commit(repo, seed, "one"))
}

/// A served folder `d` holding `repo`, with what `commit` commits in it: the repository, the
/// file committed, and the server.
fn served(
    d: &Path,
    commit: impl FnOnce(&Path) -> Vec<u8>,
) -> (std::path::PathBuf, Vec<u8>, Server) {
    ok(d, &["init", "repo"]);
    let repo = d.join("repo");
    let sent = commit(&repo);
    let server = Server::start(&["--root", d.to_str().unwrap()], d);
    (repo, sent, server)
}

/// The files of `.mdl/partial` (record starts kept) in the clone folders under `d`, the
/// hidden one of a clone cut off included.
fn kept_starts(d: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .flat_map(|e| {
            std::fs::read_dir(e.path().join(".mdl/partial"))
                .into_iter()
                .flatten()
        })
        .flatten()
        .map(|e| e.path())
        .collect()
}

/// That the clone in `target` (under `d`) checks out as `sent`, fsck finds it clean, and no
/// record start is left in `d`.
fn cloned_exactly(d: &Path, target: &Path, sent: &[u8]) {
    let got = d.join("got.safetensors");
    ok(target, &["checkout", "main", "-o", got.to_str().unwrap()]);
    assert_eq!(std::fs::read(&got).unwrap(), sent);
    assert_fsck_clean(target);
    assert!(
        kept_starts(d).is_empty(),
        "a record start outlived the clone"
    );
}

/// Clones the large commit served from `d` through a proxy that cuts the first pack at half,
/// lets `between` see the folder `d` after the cut, clones again: the bytes the whole clone
/// moves, and those the second one moved. The clone checks out as the file committed.
fn clone_cut_inside(d: &Path, cut: Tamper, between: impl FnOnce(&Path)) -> (u64, u64) {
    let (_, sent, server) = served(d, |repo| large_commit(repo, 7));
    let whole = cloned_bytes(&format!("{}/repo", server.base), &d.join("plain"));
    let proxy = Proxy::start(&server.base, cut);
    let url = format!("{}/repo", proxy.base);
    let target = d.join("c");
    cut_off(&["clone", &url, target.to_str().unwrap()]);
    between(d);
    let rest = cloned_bytes(&url, &target);
    cloned_exactly(d, &target, &sent);
    (whole, rest)
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

/// That the second of two transfers, the first cut at half, moved about the other half of the
/// `whole`: at most 55 % (the target), at least 40 % (half was kept, not all).
fn moved_about_half(what: &str, rest: u64, whole: u64) {
    eprintln!("{what} moved {rest} of {whole} bytes");
    assert!(rest * 100 <= whole * 55, "{what}: {rest} of {whole}");
    assert!(
        rest * 100 >= whole * 40,
        "{what}: {rest} of {whole}: was half kept?"
    );
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
    moved_about_half("the second clone", rest, whole);
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
    moved_about_half("the second fetch", rest, whole);
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

#[test]
fn a_clone_cut_inside_a_record_goes_on_from_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, rest) = clone_cut_inside(
        dir.path(),
        |r, a| cut_once(&CUT_INSIDE, r, a),
        |d| {
            assert_eq!(kept_starts(d).len(), 1, "the record's start was not kept");
        },
    );
    moved_about_half("the second clone", rest, whole);
}

#[test]
fn a_kept_record_start_that_differs_is_sent_whole_and_the_clone_stays_exact() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, rest) = clone_cut_inside(
        dir.path(),
        |r, a| cut_once(&CUT_DAMAGED, r, a),
        |d| {
            let kept = kept_starts(d);
            assert_eq!(kept.len(), 1);
            let mut bytes = std::fs::read(&kept[0]).unwrap();
            let at = bytes.len() / 2;
            bytes[at] ^= 0x40;
            std::fs::write(&kept[0], bytes).unwrap();
        },
    );
    // The server's record no longer starts as the kept bytes: it comes whole.
    assert!(rest * 100 >= whole * 95, "{rest} of {whole}");
}

/// Pushes a large commit through a proxy that cuts the first upload at half (`cut`), lets
/// `between` see the server's repository after the cut, pushes again: the push completes, the
/// server's copy checks out as the file committed, and nothing of the upload is left.
fn push_cut(d: &Path, cut: crate::peer_proxy::CutUpload, between: impl FnOnce(&Path)) {
    let (root, cl) = (d.join("served"), d.join("cl"));
    let srv = root.join("srv");
    ok(&srv, &["init"]);
    ok(&cl, &["init"]);
    let sent = large_commit(&cl, 9);
    let server = Server::start(&["--root", root.to_str().unwrap()], d);
    let proxy = Proxy::start_with(&server.base, |_, a| a, cut);
    ok(
        &cl,
        &["remote", "add", "up", &format!("{}/srv", proxy.base)],
    );
    let push =
        || crate::transfer::run_with(WRITE, &["-C", cl.to_str().unwrap(), "push", "up", "main"]);
    let out = push();
    assert!(!out.status.success(), "a cut push succeeded");
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    assert!(
        json(&srv, &["log"]).as_array().unwrap().is_empty(),
        "a cut push moved a ref"
    );
    between(&srv);
    let out = push();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = d.join("got.safetensors");
    ok(&srv, &["checkout", "main", "-o", got.to_str().unwrap()]);
    assert_eq!(std::fs::read(&got).unwrap(), sent);
    assert_fsck_clean(&srv);
    let left: Vec<_> = std::fs::read_dir(srv.join(".mdl/incoming"))
        .unwrap()
        .flatten()
        .collect();
    assert!(left.is_empty(), "the upload's start outlived the push");
}

#[test]
fn a_push_cut_off_half_way_sends_only_the_rest_the_next_time() {
    let dir = tempfile::tempdir().unwrap();
    push_cut(dir.path(), |b| PUSH_RESUMED.cut(b), |_| {});
    let (whole, rest) = PUSH_RESUMED.bytes();
    moved_about_half("the second push", rest, whole);
}

#[test]
fn a_push_whose_kept_start_was_damaged_is_sent_whole_and_lands_exact() {
    let dir = tempfile::tempdir().unwrap();
    push_cut(
        dir.path(),
        |b| PUSH_DAMAGED.cut(b),
        |srv| {
            let kept: Vec<_> = std::fs::read_dir(srv.join(".mdl/incoming"))
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .collect();
            assert_eq!(kept.len(), 1, "{kept:?}");
            let mut bytes = std::fs::read(&kept[0]).unwrap();
            let at = bytes.len() / 3;
            bytes[at] ^= 0x10;
            std::fs::write(&kept[0], bytes).unwrap();
        },
    );
    // The rest, refused (`upload_gone`), then the whole pack.
    let (whole, after) = PUSH_DAMAGED.bytes();
    assert!(after >= whole * 14 / 10, "{after} of {whole}");
}
