//! Crash safety: SIGKILL `mdl commit` at random instants; the repository must stay sound and
//! every earlier commit must still check out byte for byte.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;

const TENSORS: u64 = 25;
const NEW_PER_COMMIT: u64 = 5;
const ELEMS: u64 = 1 << 19; // 2 MiB of f32 per tensor, 50 MiB per file

/// File `n`: 25 tensors of 2 MiB; the last 5 are new in every file (the shared values with new
/// low mantissa bytes, so each commit re-encodes their previous versions as deltas), the rest
/// shared.
fn checkpoint(path: &Path, n: u64) -> Vec<u8> {
    let ts: Vec<T> = (0..TENSORS)
        .map(|i| {
            let mut t = tensor(&format!("layer{i}.weight"), "F32", &[ELEMS], i);
            if i >= TENSORS - NEW_PER_COMMIT {
                let low = noise(1_000 + n * TENSORS + i, ELEMS as usize);
                for (w, r) in t.data.chunks_mut(4).zip(low) {
                    w[0] = r;
                }
            }
            t
        })
        .collect();
    write_safetensors(path, &ts, &[("n", &n.to_string())])
}

/// The instant of kill `i` of `n` within `span` µs: in the `i`-th of `n` equal slices, at a
/// random point of it, so a few kills already cover every phase of the command.
pub(crate) fn stratified(i: u64, n: u64, span: u64, random: u64) -> u64 {
    let slice = (span / n.max(1)).max(1);
    (i % n.max(1)) * slice + random % slice
}

/// Kills per crash test in the default run (`MDL_CRASH_ITERATIONS` overrides); the long runs
/// are `--ignored`.
pub(crate) fn crash_iterations(default: u64) -> u64 {
    std::env::var("MDL_CRASH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run_crash_test(iterations: u64) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    let file = d.join("ckpt.safetensors");
    let mut committed: Vec<(String, u64)> = Vec::new();

    // A reference commit, timed, to spread the kills over a whole commit.
    checkpoint(&file, 0);
    let t0 = Instant::now();
    committed.push((
        json(d, &["commit", file.to_str().unwrap()])["id"]
            .as_str()
            .unwrap()
            .to_string(),
        0,
    ));
    checkpoint(&file, 1);
    let t1 = Instant::now();
    committed.push((
        json(d, &["commit", file.to_str().unwrap()])["id"]
            .as_str()
            .unwrap()
            .to_string(),
        1,
    ));
    let span = t1.elapsed().max(t0.elapsed() / 4).as_micros() as u64 * 6 / 5;

    let mut rng = noise(
        std::process::id() as u64 ^ 0x5eed,
        8 * iterations as usize * 2,
    );
    let mut kills_before_done = 0;
    let out = d.join("out.safetensors");
    for it in 0..iterations {
        let n = it + 2;
        checkpoint(&file, n);
        let r = u64::from_le_bytes(rng.drain(..8).collect::<Vec<_>>().try_into().unwrap());
        let delay = Duration::from_micros(stratified(it, iterations, span, r));
        let mut child = Command::new(mdl_bin())
            .arg("-C")
            .arg(d)
            .args([
                "commit",
                file.to_str().unwrap(),
                "--json",
                "-m",
                &format!("n{n}"),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL
        let status = child.wait().unwrap();
        if !status.success() {
            kills_before_done += 1;
        }

        sound_with_old_or_new_tip(d, &mut committed, n);

        // The newest commit and one earlier one check out byte-identical.
        let r2 = u64::from_le_bytes(rng.drain(..8).collect::<Vec<_>>().try_into().unwrap());
        let pick = [committed.len() - 1, (r2 % committed.len() as u64) as usize];
        for &i in &pick {
            let (id, n) = &committed[i];
            ok(d, &["checkout", id, "-o", out.to_str().unwrap(), "--force"]);
            let expect = checkpoint(&d.join("expect.safetensors"), *n);
            assert!(
                std::fs::read(&out).unwrap() == expect,
                "commit {id} (file {n}) changed after a crash"
            );
        }
    }
    // At the end, every commit checks out identical.
    for (id, n) in &committed {
        ok(d, &["checkout", id, "-o", out.to_str().unwrap(), "--force"]);
        assert!(std::fs::read(&out).unwrap() == checkpoint(&d.join("expect.safetensors"), *n));
    }
    eprintln!(
        "crash test: {iterations} kills, {kills_before_done} before the commit finished, {} commits landed",
        committed.len() - 2
    );
    assert!(
        kills_before_done > 0,
        "no kill landed inside a commit; the timing is off"
    );
}

#[test]
fn sigkill_during_commit_never_corrupts() {
    run_crash_test(crash_iterations(24));
}

#[test]
#[ignore = "long: 1000 kills"]
fn sigkill_during_commit_never_corrupts_long() {
    run_crash_test(1000);
}

/// SIGKILL `mdl serve` at instants spread over an HTTP commit upload (spooling, encoding,
/// publishing): the repository stays sound, the branch has the old tip or the new commit,
/// and every commit checks out as it was.
fn server_crash_test(iterations: u64) {
    use crate::server::{bearer, http, Server, WRITE};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let repo = d.join("srv");
    ok(&repo, &["init"]);
    let file = d.join("ckpt.safetensors");
    let upload = move |base: &str, n: u64, bytes: &[u8]| {
        http(
            base,
            "POST",
            &format!("/v1/repos/srv/commits?message=n{n}"),
            &[("Authorization", &bearer(WRITE))],
            bytes,
        )
        .0
    };
    // One upload timed, to spread the kills over it.
    let server = Server::start(&["-C", repo.to_str().unwrap()], d);
    let first = checkpoint(&file, 0);
    let t = Instant::now();
    assert_eq!(upload(&server.base, 0, &first), 201);
    let span = t.elapsed().as_micros() as u64 * 6 / 5;
    server.stop();
    let mut committed: Vec<(String, u64)> =
        vec![(json(&repo, &["log"])[0]["id"].as_str().unwrap().into(), 0)];
    let mut rng = noise(std::process::id() as u64 ^ 0x5e7e, 8 * iterations as usize);
    let mut cut_short = 0;
    let out = d.join("out.safetensors");
    for it in 0..iterations {
        let n = it + 1;
        let bytes = checkpoint(&file, n);
        let server = Server::start(&["-C", repo.to_str().unwrap()], d);
        let base = server.base.clone();
        let client = std::thread::spawn(move || upload(&base, n, &bytes));
        let r = u64::from_le_bytes(rng.drain(..8).collect::<Vec<_>>().try_into().unwrap());
        std::thread::sleep(Duration::from_micros(stratified(it, iterations, span, r)));
        drop(server); // SIGKILL
        if client.join().ok() != Some(201) {
            cut_short += 1;
        }
        sound_with_old_or_new_tip(&repo, &mut committed, n);
        let (id, n) = committed.last().unwrap();
        ok(
            &repo,
            &["checkout", id, "-o", out.to_str().unwrap(), "--force"],
        );
        assert!(std::fs::read(&out).unwrap() == checkpoint(&d.join("expect.safetensors"), *n));
    }
    for (id, n) in &committed {
        ok(
            &repo,
            &["checkout", id, "-o", out.to_str().unwrap(), "--force"],
        );
        assert!(std::fs::read(&out).unwrap() == checkpoint(&d.join("expect.safetensors"), *n));
    }
    eprintln!("server crash test: {iterations} kills, {cut_short} cut an upload short");
    assert!(cut_short > 0, "no kill landed inside an upload");
}

#[test]
fn sigkill_of_the_server_during_uploads_never_corrupts() {
    server_crash_test(crash_iterations(12));
}

#[test]
#[ignore = "long: 100 kills"]
fn sigkill_of_the_server_during_uploads_never_corrupts_long() {
    server_crash_test(100);
}

/// After a kill during commit `n` (message `n{n}`): the repository fscks clean and its branch
/// tip is either the last of `committed` or the new commit, which is then added to it; the log
/// holds exactly the commits made so far.
fn sound_with_old_or_new_tip(repo: &std::path::Path, committed: &mut Vec<(String, u64)>, n: u64) {
    assert_fsck_clean(repo);
    let log = json(repo, &["log"]);
    let tip = log[0]["id"].as_str().unwrap().to_string();
    if tip != committed.last().unwrap().0 {
        assert_eq!(
            log[0]["message"],
            format!("n{n}"),
            "tip is neither old nor new"
        );
        committed.push((tip, n));
    }
    assert_eq!(log.as_array().unwrap().len(), committed.len());
}

/// SIGKILL `mdl serve` at instants spread over `mdl push`es (a pack received, its records
/// written, synced once, verified, indexed): the served repository fscks clean, its branch is
/// the old tip or the pushed one, with the pusher's history up to it, and the tip checks out
/// as the pusher's does; a later push completes what a killed one left.
fn push_crash_test(iterations: u64) {
    use crate::server::{Server, WRITE};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (srv, cl) = (d.join("srv"), d.join("cl"));
    ok(&srv, &["init"]);
    ok(&cl, &["init"]);
    let file = d.join("ckpt.safetensors");
    let push = |base: &str, k: u64| {
        let remote = format!("s{k}");
        ok(&cl, &["remote", "add", &remote, &format!("{base}/srv")]);
        let out = Command::new(mdl_bin())
            .args(["-C", cl.to_str().unwrap(), "push", &remote])
            .env("MDL_TOKEN", WRITE)
            .env("MDL_NO_BACKGROUND", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        match out.status.success() {
            true => Ok(()),
            false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        }
    };
    let ids = |repo: &Path| -> Vec<String> {
        let log = json(repo, &["log"]);
        let log = log.as_array().unwrap();
        log.iter()
            .map(|c| c["id"].as_str().unwrap().to_string())
            .collect()
    };
    let tip = |repo: &Path| ids(repo)[0].clone();
    // One push timed, to spread the kills over it.
    checkpoint(&file, 0);
    ok_queued(&cl, &["commit", file.to_str().unwrap(), "-m", "n0"]);
    let server = Server::start(&["-C", srv.to_str().unwrap()], d);
    let t = Instant::now();
    push(&server.base, 0).expect("the timed push");
    let span = t.elapsed().as_micros() as u64 * 6 / 5;
    drop(server);
    let mut rng = noise(std::process::id() as u64 ^ 0x9a5b, 8 * iterations as usize);
    let (mut cut_short, mut old) = (0, tip(&srv));
    let (a, b) = (d.join("a.out"), d.join("b.out"));
    for it in 0..iterations {
        let n = it + 1;
        checkpoint(&file, n);
        ok_queued(
            &cl,
            &["commit", file.to_str().unwrap(), "-m", &format!("n{n}")],
        );
        let server = Server::start(&["-C", srv.to_str().unwrap()], d);
        let r = u64::from_le_bytes(rng.drain(..8).collect::<Vec<_>>().try_into().unwrap());
        let base = server.base.clone();
        let pushed = std::thread::scope(|s| {
            let pusher = s.spawn(|| push(&base, n));
            std::thread::sleep(Duration::from_micros(stratified(it, iterations, span, r)));
            drop(server); // SIGKILL
            pusher.join().unwrap()
        });
        if pushed.is_err() {
            cut_short += 1;
        }
        assert_fsck_clean(&srv);
        let now = tip(&srv);
        assert!(
            now == old || now == tip(&cl),
            "the served tip is neither old nor new"
        );
        let (theirs, ours) = (ids(&srv), ids(&cl));
        let from = ours.iter().position(|c| *c == now).unwrap();
        assert_eq!(theirs[..], ours[from..]);
        ok(
            &srv,
            &["checkout", &now, "-o", a.to_str().unwrap(), "--force"],
        );
        ok(
            &cl,
            &["checkout", &now, "-o", b.to_str().unwrap(), "--force"],
        );
        assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
        old = now;
    }
    // What the kills cut short goes in with one more push.
    let server = Server::start(&["-C", srv.to_str().unwrap()], d);
    push(&server.base, iterations + 1).expect("the push after the kills");
    drop(server);
    assert_eq!(ids(&srv), ids(&cl));
    assert_fsck_clean(&srv);
    eprintln!("push crash test: {iterations} kills, {cut_short} cut a push short");
    assert!(cut_short > 0, "no kill landed inside a push");
}

#[test]
fn sigkill_of_the_server_during_pushes_never_corrupts() {
    push_crash_test(crash_iterations(8));
}

#[test]
#[ignore = "long: 100 kills"]
fn sigkill_of_the_server_during_pushes_never_corrupts_long() {
    push_crash_test(100);
}
