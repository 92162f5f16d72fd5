//! The client against a hostile peer: every answer mode of `peer_proxy` run against `clone`,
//! `fetch`, `pull` and a remote `checkout` (the Python package's are in
//! tests/python/test_hostile.py). Each case asserts that nothing was written outside the
//! target (a sentinel tree around it is compared before and after), that the local
//! repository's refs and record files are as they were, that the command ended well within its
//! deadlines with one clear line and a failing exit code, and that its peak resident memory
//! stayed under the client's stated budget (docs/RELIABILITY.md).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::hostile_modes::{modes, Cmd, Mode};
use crate::peer_proxy::Proxy;
use crate::server::{Server, READ};
use crate::util::*;

/// The client's peak resident memory in any case, in KiB (docs/RELIABILITY.md states it).
const BUDGET_KIB: i64 = 512 << 10;
/// How long any case may take: its deadlines are a few seconds here (`env` below).
const CASE_LIMIT: Duration = Duration::from_secs(45);

fn env(cmd: &mut Command) -> &mut Command {
    cmd.env("MDL_REMOTE_CONNECT_TIMEOUT", "3")
        .env("MDL_REMOTE_IDLE_TIMEOUT", "2")
        .env("MDL_REMOTE_REQUEST_TIMEOUT", "4")
        .env("MDL_AUTHOR", "tester")
        .env("MDL_TOKEN", READ)
}

// --- The honest repository, and one case --------------------------------------------------

/// `DIR/srv`: two commits of a tree with a folder (`config.json`, `ck/model.safetensors`,
/// `ck/notes.txt`), an annotated tag, a second branch.
fn honest_repository(dir: &Path) -> std::path::PathBuf {
    let repo = dir.join("srv");
    ok(dir, &["init", "srv"]);
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("ck")).unwrap();
    for step in 1..=2u64 {
        std::fs::write(tree.join("config.json"), format!("{{\"step\": {step}}}")).unwrap();
        std::fs::write(tree.join("ck/notes.txt"), "notes ".repeat(1000)).unwrap();
        write_safetensors(
            &tree.join("ck/model.safetensors"),
            &[
                tensor("w", "F32", &[64, 64], step),
                tensor("b", "F32", &[512], step + 7),
            ],
            &[],
        );
        ok(&repo, &["commit", "-m", "step", tree.to_str().unwrap()]);
        if step == 1 {
            ok(&repo, &["tag", "v1", "-m", "first"]);
            ok(&repo, &["branch", "exp"]);
        }
    }
    ok(&repo, &["maintenance"]);
    repo
}

/// Every file under `root` (but `skip`), with its bytes' hash and mode.
fn tree_of(root: &Path, skip: Option<&Path>) -> BTreeMap<String, (String, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if Some(p.as_path()) == skip {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if m.is_dir() {
                stack.push(p);
                out.insert(rel, (String::from("dir"), m.permissions().mode()));
            } else {
                let bytes = if m.file_type().is_symlink() {
                    std::fs::read_link(&p)
                        .unwrap()
                        .display()
                        .to_string()
                        .into_bytes()
                } else {
                    std::fs::read(&p).unwrap()
                };
                let hash = mdl_format::ObjectId::hash(&bytes).to_hex();
                out.insert(rel, (hash, m.permissions().mode()));
            }
        }
    }
    out
}

/// What a local repository holds that a refused transfer must leave as it was: its refs and
/// history, and its record files and packs (the folders they fan out into may stay).
fn repository_state(repo: &Path) -> String {
    let records: Vec<String> = [".mdl/objects", ".mdl/packs"]
        .into_iter()
        .map(|dir| repo.join(dir))
        .filter(|dir| dir.exists())
        .flat_map(|dir| tree_of(&dir, None))
        .filter(|(_, (hash, _))| hash != "dir")
        .map(|(name, _)| name)
        .collect();
    let branches = ok(repo, &["branch", "-a", "--json"]);
    format!("{}{branches}{records:?}", state(repo))
}

/// Runs `mdl args` in `dir` with the test's deadlines; (exit code, stderr, wall time, peak
/// resident KiB).
fn run_measured(dir: &Path, args: &[&str]) -> (i32, String, Duration, i64) {
    let started = Instant::now();
    let mut child = env(Command::new(mdl_bin()).current_dir(dir).args(args))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    // The peak resident memory of the command itself, sampled until it exits. A sample counts
    // only once the process is named `mdl`: `spawn` can return while the child, between being
    // woken from vfork and switching to its new address space, still reports the test's own
    // memory (the kernel names the process after the switch).
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0i64;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            let field = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim().to_string())
            };
            if field("Name:").as_deref() == Some("mdl") {
                if let Some(hwm) = field("VmHWM:")
                    .and_then(|v| v.trim_end_matches("kB").trim().parse::<i64>().ok())
                {
                    peak = peak.max(hwm);
                }
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > CASE_LIMIT * 2 {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let code = status.code().unwrap_or(-1);
    (code, reader.join().unwrap(), started.elapsed(), peak)
}
/// Runs `cmd` against the proxy in mode `m` and checks everything the module promises.
fn case(m: &Mode, cmd: Cmd, proxy_url: &str) {
    let world = tempfile::tempdir().unwrap();
    let w = world.path();
    std::fs::create_dir_all(w.join("outside")).unwrap();
    std::fs::write(w.join("outside/sentinel.txt"), "keep me").unwrap();
    std::fs::create_dir_all(w.join("work")).unwrap();
    let local = w.join("work/local");
    if matches!(cmd, Cmd::Fetch | Cmd::Pull) {
        ok(w, &["init", local.to_str().unwrap()]);
        std::fs::write(w.join("mine.txt"), "local work").unwrap();
        ok(
            &local,
            &["commit", w.join("mine.txt").to_str().unwrap(), "-m", "mine"],
        );
        ok(&local, &["remote", "add", "evil", proxy_url]);
    }
    let before = tree_of(w, Some(&local.join(".mdl")));
    let repo_before = local.exists().then(|| repository_state(&local));
    let local_s = local.to_str().unwrap().to_string();
    let clone_to = w.join("work/clone").display().to_string();
    let out = w.join("work/out").display().to_string();
    let args: Vec<&str> = match cmd {
        Cmd::Clone => vec!["clone", proxy_url, &clone_to],
        Cmd::Fetch => vec!["-C", &local_s, "fetch", "evil"],
        Cmd::Pull => vec!["-C", &local_s, "pull", "evil", "exp"],
        Cmd::Checkout => vec!["-C", proxy_url, "checkout", "main", "-o", &out],
    };
    let (code, stderr, took, peak) = run_measured(w, &args);
    let what = format!("{} / {cmd:?}", m.name);
    assert_ne!(code, 0, "{what}: succeeded ({stderr})");
    assert!(code > 0, "{what}: killed ({stderr})");
    assert!(took < CASE_LIMIT, "{what}: took {took:?}");
    assert!(peak < BUDGET_KIB, "{what}: peak resident {peak} KiB");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: {stderr:?}");
    assert!(lines[0].starts_with("error: "), "{what}: {stderr:?}");
    assert!(
        lines[0].contains(m.expect),
        "{what}: {stderr:?} lacks {:?}",
        m.expect
    );
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains('\u{7}'),
        "{what}: raw control characters in {stderr:?}"
    );
    // A pack stream cut off — it ends early, or the idle deadline ends it — keeps what arrived
    // whole, verified, for the command to go on from the next time (a clone's in its hidden
    // folder): the one change it may make.
    let cut = lines[0].contains("transfer cut off") || lines[0].contains("remote.idle-timeout");
    let around = |tree: BTreeMap<String, (String, u32)>| -> BTreeMap<String, (String, u32)> {
        let kept = |name: &String| cut && name.contains(".clone.mdl-clone-");
        tree.into_iter().filter(|(name, _)| !kept(name)).collect()
    };
    assert_eq!(
        around(tree_of(w, Some(&local.join(".mdl")))),
        before,
        "{what}: files changed around the target"
    );
    assert!(!Path::new("/tmp/mdl-hostile-PWNED").exists(), "{what}");
    if let Some(repo_before) = repo_before {
        let refs = |state: &str| {
            state
                .rsplit_once('[')
                .map_or(state.to_string(), |s| s.0.into())
        };
        let state = repository_state(&local);
        match cut {
            true => assert_eq!(refs(&state), refs(&repo_before), "{what}: refs changed"),
            false => assert_eq!(state, repo_before, "{what}: repository changed"),
        }
        assert_fsck_clean(&local);
    }
}

/// Every mode that reaches one of `cmds`, against those commands, a few cases at a time (they
/// mostly wait on deadlines).
fn run_modes(cmds: &[Cmd]) {
    let dir = tempfile::tempdir().unwrap();
    let repo = honest_repository(dir.path());
    let server = Server::start(&["-C", repo.to_str().unwrap()], dir.path());
    let cases: Vec<(Mode, Cmd)> = modes()
        .into_iter()
        .flat_map(|m| {
            let reached: Vec<Cmd> = m
                .cmds
                .iter()
                .copied()
                .filter(|c| cmds.contains(c))
                .collect();
            reached.into_iter().map(move |c| (m, c))
        })
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((m, cmd)) = cases.get(i) else { break };
                let proxy = Proxy::start(&server.base, m.tamper);
                let url = format!("{}/srv", proxy.base);
                let run = std::panic::catch_unwind(|| case(m, *cmd, &url));
                if let Err(panic) = run {
                    failed.lock().unwrap().push(panic_text(&*panic));
                }
            });
        }
    });
    server.stop();
    // Every failing case in the one message a test run shows last, not only in the panics
    // printed as they happened (a log cut short keeps its end).
    let failed = failed.into_inner().unwrap();
    assert!(
        failed.is_empty(),
        "{} of {} cases failed:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}

/// What a caught panic said, on one line.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(a panic without a message)");
    text.replace('\n', " | ")
}

#[test]
fn the_honest_proxy_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let repo = honest_repository(d);
    let server = Server::start(&["-C", repo.to_str().unwrap()], d);
    let proxy = Proxy::start(&server.base, |_, a| a);
    let url = format!("{}/srv", proxy.base);
    let out = d.join("out").display().to_string();
    for args in [
        &["clone", &url, "cloned"][..],
        &["-C", &url, "checkout", "main", "-o", &out],
    ] {
        let (code, stderr, _, _) = run_measured(d, args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
    }
    assert_fsck_clean(&d.join("cloned"));
    ok(
        &repo,
        &["checkout", "main", "-o", d.join("direct").to_str().unwrap()],
    );
    assert_eq!(
        tree_of(&d.join("out"), None),
        tree_of(&d.join("direct"), None)
    );
    server.stop();
}

#[test]
fn hostile_answers_to_clone() {
    run_modes(&[Cmd::Clone]);
}

#[test]
fn hostile_answers_to_fetch_and_pull() {
    run_modes(&[Cmd::Fetch, Cmd::Pull]);
}

#[test]
fn hostile_answers_to_a_remote_checkout() {
    run_modes(&[Cmd::Checkout]);
}

#[test]
fn there_are_more_modes_than_the_audit_had() {
    let modes = modes();
    assert!(modes.len() >= 31, "{} modes", modes.len());
    let names: std::collections::HashSet<&str> = modes.iter().map(|m| m.name).collect();
    assert_eq!(names.len(), modes.len(), "a mode named twice");
}

#[test]
fn a_symlink_in_the_output_is_never_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let repo = honest_repository(d);
    let server = Server::start(&["-C", repo.to_str().unwrap()], d);
    let url = format!("{}/srv", server.base);
    std::fs::create_dir_all(d.join("outside")).unwrap();
    std::fs::create_dir_all(d.join("out")).unwrap();
    std::os::unix::fs::symlink(d.join("outside"), d.join("out/ck")).unwrap();
    let around = |d: &Path| {
        (
            tree_of(&d.join("outside"), None),
            tree_of(&d.join("out"), None),
        )
    };
    let before = around(d);
    let out = d.join("out").display().to_string();
    let (code, stderr, _, _) =
        run_measured(d, &["-C", &url, "checkout", "main", "-o", &out, "--force"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("a file or a symlink"), "{stderr}");
    assert_eq!(around(d), before);
    server.stop();
}

/// A clone waiting on a server that stalls, its stderr a pipe nobody reads any more: Ctrl-C
/// still ends it at once, with 130, and removes its staging folder (the handler used to die
/// printing "interrupted" to the closed pipe, and the process waited on).
#[test]
fn an_interrupt_ends_a_stalled_clone_whatever_stderr_is() {
    use crate::peer_proxy::{Answer, Body, Route};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let repo = honest_repository(d);
    let server = Server::start(&["-C", repo.to_str().unwrap()], d);
    let proxy = Proxy::start(&server.base, |r, a| {
        if r == Route::Pack {
            Answer {
                body: Body::Stall,
                ..a
            }
        } else {
            a
        }
    });
    let work = d.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let mut child = Command::new(mdl_bin())
        .current_dir(&work)
        .args(["clone", &format!("{}/srv", proxy.base), "cloned"])
        .env("MDL_TOKEN", READ)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let staging = |w: &Path| {
        std::fs::read_dir(w)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains("mdl-clone"))
    };
    let started = Instant::now();
    while !staging(&work) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no staging folder"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let interrupted = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if interrupted.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("mdl clone went on after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    assert!(!staging(&work), "the staging folder stayed");
    assert!(!work.join("cloned").exists());
    server.stop();
}

/// Six Adam steps of two layers (weights and both moments), committed lossily, then older
/// first moments coarsened by retention: `DIR/coarse`, with what `main~4` now checks out to
/// here.
fn coarsened_repository(d: &Path) -> (std::path::PathBuf, Vec<u8>) {
    let repo = d.join("coarse");
    ok(d, &["init", "coarse"]);
    const N: usize = 16 << 10;
    let uniform = |seed: u64| -> Vec<f32> {
        noise(seed, N * 4)
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as f32 / u32::MAX as f32 - 0.5)
            .collect()
    };
    let mut w: Vec<Vec<f32>> = (0..2)
        .map(|l| uniform(l).iter().map(|x| x * 0.1).collect())
        .collect();
    let mut m = vec![vec![0f32; N]; 2];
    let mut v = vec![vec![0f32; N]; 2];
    let bytes = |x: &[f32]| x.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    for step in 0..6u64 {
        let mut ts = Vec::new();
        for l in 0..2 {
            let g = uniform(100 + step * 2 + l as u64);
            for i in 0..N {
                let g = g[i] * 0.02 + 0.002 * w[l][i];
                m[l][i] = 0.9 * m[l][i] + 0.1 * g;
                v[l][i] = 0.95 * v[l][i] + 0.05 * g * g;
                w[l][i] -= 1e-3 * m[l][i] / (v[l][i].sqrt() + 1e-8);
            }
            for (name, x) in [
                (format!("model.l{l}"), &w[l]),
                (format!("optim.l{l}.exp_avg"), &m[l]),
                (format!("optim.l{l}.exp_avg_sq"), &v[l]),
            ] {
                ts.push(T {
                    name,
                    dtype: "F32",
                    shape: vec![N as u64],
                    data: bytes(x),
                });
            }
        }
        let file = d.join("ck.safetensors");
        write_safetensors(&file, &ts, &[("step", &(step + 1).to_string())]);
        ok_queued(
            &repo,
            &[
                "commit",
                file.to_str().unwrap(),
                "--lossy",
                "--metric",
                "loss=2.0",
            ],
        );
    }
    ok(&repo, &["maintenance"]);
    ok(&repo, &["config", "retention.coarsen_after", "2"]);
    let gc = ok(&repo, &["gc"]);
    assert!(gc.contains("coarsened"), "{gc}");
    let out = d.join("coarse-main4.safetensors");
    ok(&repo, &["checkout", "main~4", "-o", out.to_str().unwrap()]);
    let shown = json(&repo, &["show", "main~4"]);
    let coarse = shown["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["lossy_info"]["coarsened"] == true)
        .count();
    assert!(coarse > 0, "nothing coarsened in main~4");
    assert_eq!(
        shown["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "optim.l0.exp_avg")
            .unwrap()["lossy_info"]["coarsened"],
        true
    );
    (repo, std::fs::read(out).unwrap())
}

/// A tensor retention coarsened decodes to other bytes than its id names: a remote checkout
/// takes them only as its record says it was coarsened — so such a commit checks out, byte for
/// byte as here, and a server that alters those bytes is still refused.
#[test]
fn coarsened_tensors_check_out_from_a_server_and_altered_ones_do_not() {
    use crate::peer_proxy::{Answer, Body, Route};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (repo, here) = coarsened_repository(d);
    let server = Server::start(&["-C", repo.to_str().unwrap()], d);
    let url = format!("{}/coarse", server.base);
    let out = d.join("remote.safetensors").display().to_string();
    let (code, stderr, _, _) = run_measured(d, &["-C", &url, "checkout", "main~4", "-o", &out]);
    assert_eq!(code, 0, "{stderr}");
    assert!(std::fs::read(&out).unwrap() == here);
    // One byte of a coarsened first moment flipped (the lossless tensors untouched).
    let proxy = Proxy::start(&server.base, |r, a| {
        if r != Route::File || a.status != 200 {
            return a;
        }
        let mut b = crate::peer_proxy::bytes(&a).to_vec();
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
        let at = header["optim.l0.exp_avg"]["data_offsets"][0]
            .as_u64()
            .unwrap() as usize;
        b[8 + n + at + 100] ^= 0x01;
        Answer {
            body: Body::Bytes(b),
            ..a
        }
    });
    let altered = d.join("altered.safetensors").display().to_string();
    let url = format!("{}/coarse", proxy.base);
    let (code, stderr, _, _) = run_measured(d, &["-C", &url, "checkout", "main~4", "-o", &altered]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("differs from the commit's"), "{stderr}");
    assert!(!Path::new(&altered).exists());
    server.stop();
}
