//! `mdl compact`, `mdl gc` and `mdl maintenance` through the binary: SIGKILL at random instants (the repository
//! stays sound and every commit checks out as before), commits racing gc in two processes and
//! through the server, and the maintenance routes.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::crash::{crash_iterations, stratified};
use crate::server::{http, Server};
use crate::util::*;

const LAYERS: u64 = 2;
const ELEMS: u64 = 16 << 10; // 64 KiB of f32 per tensor

/// Checkpoint `n` of a run: each layer's weight and its two Adam moments; every file changes
/// the low mantissa bytes (so deltas pay and chains form). Without `moments`, the weights only
/// (what a thinned checkout holds).
pub(crate) fn checkpoint(path: &Path, n: u64, moments: bool) -> Vec<u8> {
    let mut ts = Vec::new();
    for l in 0..LAYERS {
        let names = [
            format!("model.l{l}"),
            format!("optim.l{l}.exp_avg"),
            format!("optim.l{l}.exp_avg_sq"),
        ];
        for (k, name) in names.iter().enumerate() {
            if k > 0 && !moments {
                continue;
            }
            let mut t = tensor(name, "F32", &[ELEMS], l * 3 + k as u64);
            let low = noise(7_000 + n * 16 + l * 3 + k as u64, ELEMS as usize);
            for (w, r) in t.data.chunks_mut(4).zip(low) {
                w[0] = r;
            }
            ts.push(t);
        }
    }
    write_safetensors(path, &ts, &[])
}

fn id_of(v: &serde_json::Value) -> String {
    v["id"].as_str().unwrap().to_string()
}

/// The data section of a safetensors file and its tensor names.
pub(crate) fn data_and_names(bytes: &[u8]) -> (Vec<u8>, Vec<String>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut names: Vec<(u64, String)> = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| (v["data_offsets"][0].as_u64().unwrap(), k.clone()))
        .collect();
    names.sort();
    (
        bytes[8 + n..].to_vec(),
        names.into_iter().map(|(_, k)| k).collect(),
    )
}

/// Checks out commit `id` (file `n`): identical to the file, or, for a thinned commit, the
/// weights exactly and nothing else.
fn assert_checkout(d: &Path, id: &str, n: u64) {
    let out = d.join("out.safetensors");
    let shown = json(d, &["show", id]);
    let full = checkpoint(&d.join("expect.safetensors"), n, true);
    if shown["expired_tensors"].as_u64().unwrap() == 0 {
        ok(d, &["checkout", id, "-o", out.to_str().unwrap(), "--force"]);
        assert!(
            std::fs::read(&out).unwrap() == full,
            "commit {id} (file {n}) changed"
        );
    } else {
        fails(
            d,
            &["checkout", id, "-o", out.to_str().unwrap(), "--force"],
            "expired by retention",
        );
        ok(
            d,
            &[
                "checkout",
                id,
                "-o",
                out.to_str().unwrap(),
                "--force",
                "--skip-expired",
            ],
        );
        let thin = checkpoint(&d.join("expect.safetensors"), n, false);
        assert_eq!(
            data_and_names(&std::fs::read(&out).unwrap()),
            data_and_names(&thin),
            "thinned commit {id} (file {n}) lost weights"
        );
    }
}

/// Kills `mdl args…` after a random delay below `span`; returns whether it was killed before
/// finishing.
fn kill_during(d: &Path, args: &[&str], delay: Duration) -> bool {
    let mut child = Command::new(mdl_bin())
        .arg("-C")
        .arg(d)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(delay);
    let _ = child.kill(); // SIGKILL
    !child.wait().unwrap().success()
}

/// Random numbers for the kill loops, seeded per process.
struct Rand(Vec<u8>);

impl Rand {
    fn below(&mut self, n: u64) -> u64 {
        let r = u64::from_le_bytes(self.0.drain(..8).collect::<Vec<_>>().try_into().unwrap());
        r % n.max(1)
    }
}

/// A repository under a kill loop: its commits as (id, file number).
struct Crashes<'a> {
    d: &'a Path,
    committed: Vec<(String, u64)>,
}

impl Crashes<'_> {
    /// `iterations` times: `step(n)` makes commit `n`, then `mdl args(rand)` is started and
    /// SIGKILLed within one uninterrupted run of `mdl timed` (measured first), the kills
    /// spread evenly over it ([`stratified`]). After every kill fsck is clean, the log is whole,
    /// and the newest, the first and a random commit check out as before; at the end, after one
    /// run to completion, every commit does. Returns how many kills landed mid-run.
    fn run(
        &mut self,
        iterations: u64,
        timed: &[&str],
        step: impl Fn(u64) -> String,
        args: impl Fn(&mut Rand) -> Vec<String>,
    ) -> u64 {
        let d = self.d;
        let t = Instant::now();
        ok(d, timed);
        let span = (t.elapsed().as_micros() as u64).max(2_000);
        let seed = std::process::id() as u64 ^ timed.len() as u64;
        let mut rand = Rand(noise(seed, 64 * iterations as usize));
        let mut killed = 0;
        for it in 0..iterations {
            let n = self.committed.last().map_or(0, |c| c.1 + 1);
            self.committed.push((step(n), n));
            let args = args(&mut rand);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let r = rand.below(u64::MAX);
            let delay = Duration::from_micros(stratified(it, iterations, span, r));
            if kill_during(d, &args, delay) {
                killed += 1;
            }
            assert_fsck_clean(d);
            let log = json(d, &["log"]);
            assert_eq!(log.as_array().unwrap().len(), self.committed.len());
            let last = self.committed.len() - 1;
            for i in [last, 0, rand.below(last as u64 + 1) as usize] {
                let (id, n) = &self.committed[i];
                assert_checkout(d, id, *n);
            }
        }
        ok(d, timed);
        for (id, n) in &self.committed {
            assert_checkout(d, id, *n);
        }
        eprintln!("{timed:?}: {iterations} kills, {killed} before the command finished");
        killed
    }
}

#[test]
fn sigkill_during_compact_never_corrupts() {
    compact_crash_test(crash_iterations(24));
}

#[test]
#[ignore = "long: 150 kills"]
fn sigkill_during_compact_never_corrupts_long() {
    compact_crash_test(150);
}

fn compact_crash_test(iterations: u64) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    // Forward deltas with no practical cap: every commit makes every chain one longer.
    ok(d, &["config", "delta.mode", "forward"]);
    ok(d, &["config", "delta.max_depth", "512"]);
    let file = d.join("ckpt.safetensors");
    let commit = |n: u64| {
        checkpoint(&file, n, true);
        id_of(&json(d, &["commit", file.to_str().unwrap()]))
    };
    let mut crashes = Crashes {
        d,
        committed: (0..6).map(|n| (commit(n), n)).collect(),
    };
    let killed = crashes.run(
        iterations,
        &["compact", "--max-depth", "1"],
        commit,
        |rand| {
            let cap = rand.below(3).to_string();
            vec!["compact".into(), "--max-depth".into(), cap]
        },
    );
    let report = json(d, &["fsck"]);
    assert!(report["longest_chain"].as_u64().unwrap() <= 1);
    assert!(killed > 0, "no kill landed inside a compaction");
}

/// Deferred re-encodes (`delta.defer`): `mdl maintenance` SIGKILLed at random instants never
/// corrupts, and a last run leaves nothing queued and the chains eager commits would make.
#[test]
fn sigkill_during_deferred_reencode_never_corrupts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    ok(d, &["config", "delta.defer", "true"]);
    let file = d.join("ckpt.safetensors");
    // Commits queue their re-encodes; the test runs (and kills) the maintenance itself.
    let commit = |n: u64| {
        checkpoint(&file, n, true);
        let out = ok_queued(d, &["--json", "commit", file.to_str().unwrap()]);
        id_of(&serde_json::from_str(&out).unwrap())
    };
    let mut crashes = Crashes {
        d,
        committed: (0..6).map(|n| (commit(n), n)).collect(),
    };
    let killed = crashes.run(crash_iterations(12), &["maintenance"], commit, |_| {
        vec!["maintenance".into()]
    });
    assert_eq!(json(d, &["maintenance"])["pending"], 0);
    assert!(killed > 0, "no kill landed inside a maintenance");
    // Every commit's re-encodes were done in the end: one chain through all of them, up to
    // delta.max_depth (16).
    let report = json(d, &["fsck"]);
    let commits = crashes.committed.len() as u64;
    assert_eq!(report["longest_chain"], (commits - 1).min(16), "{report}");
}

/// A commit with re-encodes to defer starts `mdl maintenance --background`, which does them
/// without anyone asking: the repository ends with the chain eager commits would have made.
#[test]
fn a_deferring_commit_starts_its_maintenance() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    ok(d, &["config", "delta.defer", "true"]);
    let file = d.join("ckpt.safetensors");
    let mut ids = Vec::new();
    for n in 0..4 {
        checkpoint(&file, n, true);
        ids.push(id_of(&json(d, &["commit", file.to_str().unwrap()])));
    }
    // Nobody here runs maintenance: the chain can only come from the background runs.
    let t = Instant::now();
    loop {
        let r = mdl(d, &["--json", "--wait", "0", "fsck"]);
        let report: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap_or_default();
        if report["longest_chain"] == 3 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "never re-encoded: {report}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(json(d, &["maintenance"])["pending"], 0);
    assert_fsck_clean(d);
    for (n, id) in ids.iter().enumerate() {
        assert_checkout(d, id, n as u64);
    }
}

#[test]
fn sigkill_during_gc_never_corrupts() {
    gc_crash_test(crash_iterations(24));
}

#[test]
#[ignore = "long: 150 kills"]
fn sigkill_during_gc_never_corrupts_long() {
    gc_crash_test(150);
}

fn gc_crash_test(iterations: u64) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    ok(d, &["config", "retention.keep_last", "3"]);
    let file = d.join("ckpt.safetensors");
    // Main gets file n; a throwaway branch gets another file and is deleted: garbage.
    let step = |n: u64| -> String {
        checkpoint(&file, n, true);
        let id = id_of(&json(d, &["commit", file.to_str().unwrap()]));
        checkpoint(&file, 100_000 + n, true);
        ok(d, &["commit", file.to_str().unwrap(), "-b", "scratch"]);
        ok(d, &["branch", "-D", "scratch"]);
        id
    };
    let mut crashes = Crashes {
        d,
        committed: (0..4).map(|n| (step(n), n)).collect(),
    };
    ok(d, &["tag", "keep", &crashes.committed[0].0]);
    let gc = ["gc", "--prune-older-than", "0s", "--expire-reflog", "0s"];
    let killed = crashes.run(iterations, &gc, step, |_| gc.map(String::from).to_vec());
    let report = json(d, &["fsck"]);
    assert_eq!(report["unindexed_records"], 0);
    assert!(
        report["expired"].as_u64().unwrap() > 0,
        "retention thinned nothing"
    );
    assert!(killed > 0, "no kill landed inside a gc");
}

#[test]
fn commit_and_gc_in_two_processes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    let mut committed = Vec::new();
    for round in 0..4u64 {
        let files: Vec<_> = (0..3)
            .map(|k| {
                let n = round * 3 + k;
                let f = d.join(format!("c{n}.safetensors"));
                checkpoint(&f, n, true);
                (f, n)
            })
            .collect();
        // gc and a series of commits at once; the lock makes one wait for the other.
        let gc = Command::new(mdl_bin())
            .arg("-C")
            .arg(d)
            .args(["gc", "--prune-older-than", "0s", "--expire-reflog", "0s"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        for (f, n) in &files {
            committed.push((id_of(&json(d, &["commit", f.to_str().unwrap()])), *n));
        }
        let gc = gc.wait_with_output().unwrap();
        assert!(gc.status.success());
        ok(
            d,
            &["gc", "--prune-older-than", "0s", "--expire-reflog", "0s"],
        );
        assert_fsck_clean(d);
    }
    for (id, n) in &committed {
        assert_checkout(d, id, *n);
    }
}

#[test]
fn maintenance_through_the_server_beside_commits() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("repo");
    ok(dir.path(), &["init", "repo"]);
    ok(&d, &["config", "delta.mode", "forward"]);
    let server = Server::start(&["-C", d.to_str().unwrap()], dir.path());
    let url = format!("{}/repo", server.base);
    let token = "wwwwwwwwwwwwwwwwwwwwwwww";
    let auth = format!("Bearer {token}");
    let post = |route: &str, body: &str| {
        http(
            &server.base,
            "POST",
            &format!("/v1/repos/repo/maintenance/{route}"),
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
        )
    };

    // Commits over HTTP while compaction and gc run through the server.
    let committed = std::thread::scope(|s| {
        let commits = s.spawn(|| {
            let mut out = Vec::new();
            for n in 0..8u64 {
                let f = dir.path().join(format!("s{n}.safetensors"));
                checkpoint(&f, n, true);
                let v = json(
                    dir.path(),
                    &[
                        "commit",
                        f.to_str().unwrap(),
                        "--remote",
                        &url,
                        "--token",
                        token,
                    ],
                );
                out.push((id_of(&v), n));
            }
            out
        });
        for _ in 0..6 {
            let (status, _, body) = post("compact", r#"{"max_depth": 1}"#);
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
            let (status, _, body) = post("gc", r#"{"prune_older_than": "0s"}"#);
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        }
        commits.join().unwrap()
    });
    let (status, _, body) = post("compact", r#"{"max_depth": 0, "dry_run": true}"#);
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["dry_run"], true);
    // Bad input: a clear error, nothing changed.
    let (status, _, body) = post("gc", r#"{"prune_older_than": "soon"}"#);
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("invalid_duration"));
    let (status, _, _) = http(
        &server.base,
        "POST",
        "/v1/repos/repo/maintenance/gc",
        &[("Content-Type", "application/json")],
        b"{}",
    );
    assert_eq!(status, 401, "maintenance needs a write token");
    // Forwarded from the CLI in the served directory.
    let out = ok(&d, &["compact", "--max-depth", "0"]);
    assert!(out.contains("re-encoded"), "{out}");
    server.stop();
    assert_fsck_clean(&d);
    for (id, n) in &committed {
        assert_checkout(&d, id, *n);
    }
}

/// Readers never wait for maintenance: while `mdl maintenance` re-encodes a series (deferred
/// reverse deltas; for a lossy series, `mdl compact`), `log`, `show` and `checkout` with
/// `--wait 0` all answer, and every checkout is what it was before — on disk, or (`served`)
/// through a server that runs the maintenance itself and answers the reads over HTTP.
fn readers_during_maintenance(lossy: bool, served: bool) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("repo");
    ok(dir.path(), &["init", "repo"]);
    ok(&d, &["config", "delta.defer", "true"]);
    let file = dir.path().join("ckpt.safetensors");
    // Large enough tensors that the re-encodes take a while (compaction is quicker).
    let elems = if lossy { 1 << 21 } else { 1 << 20 };
    let write = |n: u64| {
        let ts: Vec<T> = (0..4)
            .map(|k| {
                let mut t = tensor(&format!("w{k}"), "F32", &[elems], k);
                let low = noise(9_000 + n * 8 + k, elems as usize);
                for (w, r) in t.data.chunks_mut(4).zip(low) {
                    w[0] = r;
                }
                t
            })
            .collect();
        write_safetensors(&file, &ts, &[])
    };
    let out = dir.path().join("out");
    let checkout = |id: &str| {
        let _ = std::fs::remove_file(&out);
        let r = mdl(
            &d,
            &["--wait", "0", "checkout", id, "-o", out.to_str().unwrap()],
        );
        assert!(
            r.status.success(),
            "checkout during maintenance: {}",
            String::from_utf8_lossy(&r.stderr)
        );
        std::fs::read(&out).unwrap()
    };
    let mut committed = Vec::new();
    for n in 0..6 {
        write(n);
        let mut args = vec!["--json", "commit", file.to_str().unwrap()];
        if lossy {
            args.push("--lossy");
        }
        let id = id_of(&serde_json::from_str(&ok_queued(&d, &args)).unwrap());
        let before = checkout(&id);
        committed.push((id, before));
    }
    // A lossy series defers nothing (its deltas are quantized forward): its maintenance is
    // compaction, every chain re-encoded whole.
    let upkeep: &[&str] = if lossy {
        &["compact", "--max-depth", "0"]
    } else {
        let pending = json(&d, &["stats"])["pending_reencodes"].as_u64().unwrap();
        assert!(pending >= 5, "{pending} re-encodes queued");
        &["maintenance"]
    };
    // The maintenance: `mdl maintenance`, or a served repository's own after a commit.
    let (mut maintenance, server) = if served {
        let server = Server::start(&["-C", d.to_str().unwrap()], dir.path());
        write(6);
        ok(&d, &["commit", file.to_str().unwrap()]);
        (None, Some(server))
    } else {
        let child = Command::new(mdl_bin())
            .arg("-C")
            .arg(&d)
            .args(upkeep)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        (Some(child), None)
    };
    let (mut reads, mut during) = (0, 0);
    loop {
        let running = match &mut maintenance {
            Some(child) => child.try_wait().unwrap().is_none(),
            None => reads < 12,
        };
        let (id, before) = &committed[reads % committed.len()];
        for args in [
            vec!["--wait", "0", "log", "--json"],
            vec!["--wait", "0", "show", id],
        ] {
            let r = mdl(&d, &args);
            assert!(
                r.status.success(),
                "{args:?} during maintenance: {}",
                String::from_utf8_lossy(&r.stderr)
            );
        }
        assert!(checkout(id) == *before, "checkout of {id}");
        reads += 1;
        if !running {
            break;
        }
        during += 1;
    }
    if let Some(child) = maintenance {
        let status = child.wait_with_output().unwrap();
        assert!(status.status.success(), "{status:?}");
    }
    // Compaction is over in about a round of reads here; the re-encodes take several.
    let overlap = if lossy { 1 } else { 3 };
    assert!(
        during >= overlap,
        "only {during} rounds of reads overlapped the maintenance"
    );
    if let Some(server) = server {
        server.stop();
    }
    // Whatever a stopped server left is done here.
    assert_eq!(json(&d, &["maintenance"])["pending"], 0);
    assert_fsck_clean(&d);
}

#[test]
fn readers_never_wait_for_maintenance() {
    readers_during_maintenance(false, false);
}

#[test]
fn readers_never_wait_for_the_maintenance_of_a_lossy_series() {
    readers_during_maintenance(true, false);
}

#[test]
fn readers_of_a_served_repository_never_wait_for_its_maintenance() {
    readers_during_maintenance(false, true);
}
