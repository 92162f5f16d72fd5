//! Interrupted commands leave nothing behind: Ctrl-C (SIGINT) during a checkout removes its
//! temporary file; an interrupted clone leaves no half-made directory, and what a killed one
//! left does not block the next.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::server::{Server, READ};
use crate::util::*;

fn signal(child: &Child, sig: i32) {
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

/// A repository with one 192 MiB checkpoint: slow enough to interrupt.
fn big_repository(d: &Path) -> Vec<u8> {
    ok(d, &["init"]);
    let f = d.join("big.safetensors");
    let ts: Vec<T> = (0..6)
        .map(|i| tensor(&format!("w{i}"), "F32", &[8 << 20], i))
        .collect();
    let bytes = write_safetensors(&f, &ts, &[]);
    ok(d, &["commit", f.to_str().unwrap()]);
    std::fs::remove_file(&f).unwrap();
    bytes
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn an_interrupted_checkout_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let repo = d.join("repo");
    let want = big_repository(&repo);
    let outdir = d.join("out");
    std::fs::create_dir(&outdir).unwrap();
    let out = outdir.join("ck.safetensors");
    let mut interrupted = 0;
    for delay_ms in [30, 60, 120, 250, 500, 1000] {
        let child = Command::new(mdl_bin())
            .args(["-C", repo.to_str().unwrap(), "checkout", "main", "-o"])
            .arg(&out)
            .arg("--force")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        signal(&child, libc::SIGINT);
        let result = child.wait_with_output().unwrap();
        match result.status.code() {
            Some(130) => {
                interrupted += 1;
                let left: Vec<String> = names(&outdir)
                    .into_iter()
                    .filter(|n| n != "ck.safetensors")
                    .collect();
                assert!(left.is_empty(), "after {delay_ms} ms: left {left:?}");
            }
            Some(0) => assert!(std::fs::read(&out).unwrap() == want),
            other => panic!(
                "after {delay_ms} ms: {other:?} {}",
                String::from_utf8_lossy(&result.stderr)
            ),
        }
    }
    assert!(interrupted > 0, "no checkout was interrupted");
}

#[test]
fn an_interrupted_clone_blocks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = d.join("root");
    big_repository(&root.join("repo"));
    let server = Server::start(&["--root", root.to_str().unwrap()], d);
    let url = format!("{}/repo", server.base);
    let target = d.join("clones").join("c");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let clone = || {
        Command::new(mdl_bin())
            .args(["clone", &url])
            .arg(&target)
            .env("MDL_TOKEN", READ)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut stopped = 0;
    for (sig, delay_ms) in [
        (libc::SIGINT, 150),
        (libc::SIGKILL, 150),
        (libc::SIGINT, 400),
    ] {
        let child = clone();
        let pid = child.id();
        std::thread::sleep(Duration::from_millis(delay_ms));
        signal(&child, sig);
        let result = child.wait_with_output().unwrap();
        if result.status.success() {
            std::fs::remove_dir_all(&target).unwrap();
            continue;
        }
        stopped += 1;
        assert!(
            !target.exists(),
            "a stopped clone left {}",
            target.display()
        );
        if sig == libc::SIGINT {
            // The interrupted clone removed its own staging folder, though its workers were
            // still writing into it. (One a SIGKILL left may still be there if this clone was
            // stopped before it swept: the next clone does.)
            let own = format!(".mdl-clone-{pid}");
            let left: Vec<String> = names(target.parent().unwrap())
                .into_iter()
                .filter(|n| n.ends_with(&own))
                .collect();
            assert_eq!(left, Vec::<String>::new());
        }
    }
    assert!(stopped > 0, "no clone was stopped");
    // The next clone works, and sweeps what a killed one left.
    let result = clone().wait_with_output().unwrap();
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert_eq!(names(target.parent().unwrap()), vec!["c".to_string()]);
    assert_fsck_clean(&target);
    server.stop();
}
