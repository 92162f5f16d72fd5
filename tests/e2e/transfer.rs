//! Transfers on a real `mdl serve` that maintenance has touched. A push is three requests
//! (which objects are missing, the pack, the ref update), and a gc may run between any two of
//! them: no interleaving may publish a ref to a commit whose manifest, tensors or delta bases
//! are gone. A repository that retention thinned is cloned, pushed and pulled as thinned.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mdl::transfer::{self, RefUpdate, Shallow};
use mdl::{ObjectId, Repository};
use mdl_remote::{Peer, Remote};

use crate::maintenance::{checkpoint, data_and_names};
use crate::server::{read, Server, READ, WRITE};
use crate::util::*;

/// Runs `mdl` with the write token.
fn with_token(args: &[&str]) -> std::process::Output {
    run_with(WRITE, args)
}

/// `mdl ARGS` with `token` (and an author), whatever its outcome.
pub(crate) fn run_with(token: &str, args: &[&str]) -> std::process::Output {
    Command::new(mdl_bin())
        .args(args)
        .env("MDL_TOKEN", token)
        .env("MDL_AUTHOR", "tester")
        .output()
        .unwrap()
}

fn commit_on(dir: &Path, file: &Path, branch: &str, message: &str) -> ObjectId {
    let v = json(
        dir,
        &[
            "commit",
            file.to_str().unwrap(),
            "-b",
            branch,
            "-m",
            message,
        ],
    );
    v["id"].as_str().unwrap().parse().unwrap()
}

/// The three requests of a push of `tip` to `branch` (new there), with `gc` run after the
/// request numbered `gc_after` (1: after asking what is missing, 2: after the upload, 3: after
/// the ref update). Returns the server's error code if a request was refused.
fn push_in_steps(
    local: &Path,
    remote: &Remote,
    branch: &str,
    tip: ObjectId,
    gc_after: usize,
    gc: &dyn Fn(),
) -> Option<String> {
    let repo = Repository::open(local, &Default::default()).unwrap();
    let code = |e: mdl_remote::Error| match e {
        mdl_remote::Error::Client(mdl_client::Error::Server {
            code: Some(code), ..
        }) => code.as_str().to_string(),
        other => panic!("push step failed without a server error: {other}"),
    };
    let history = transfer::reachable_commits(&repo, &[tip]).unwrap();
    let missing: Vec<ObjectId> = remote.missing(&history).unwrap();
    let plan = transfer::plan(&repo, &[tip], &|id| !missing.contains(id), &Shallow::WHOLE).unwrap();
    let ids: Vec<ObjectId> = plan.iter().map(|p| p.id).collect();
    let needed = remote.missing(&ids).unwrap();
    if gc_after == 1 {
        gc();
    }
    let send: Vec<ObjectId> = ids.into_iter().filter(|i| needed.contains(i)).collect();
    if let Err(e) = remote.send_objects(&repo, &send, &mdl::NoProgress) {
        return Some(code(e));
    }
    if gc_after == 2 {
        gc();
    }
    let update = RefUpdate {
        name: format!("refs/heads/{branch}"),
        old: None,
        new: Some(tip),
        force: false,
    };
    if let Err(e) = remote.update_ref(&update) {
        return Some(code(e.into()));
    }
    if gc_after == 3 {
        gc();
    }
    None
}

#[test]
fn gc_between_push_requests_never_publishes_an_incomplete_commit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = d.join("served");
    let local = d.join("local");
    ok(&local, &["init"]);
    let l = local.to_str().unwrap();
    // One served repository per gc position, so that each gc takes only its own objects.
    let points = [0usize, 1, 2, 3];
    for p in points {
        ok(&root.join(format!("p{p}")), &["init"]);
    }
    let server = Server::start(&["--root", root.to_str().unwrap()], d);
    let mut remotes = Vec::new();
    let mut files = Vec::new();
    for p in points {
        let url = format!("{}/p{p}", server.base);
        ok(&local, &["remote", "add", &format!("p{p}"), &url]);
        let remote = Remote::new(&url, Some(WRITE.into())).unwrap();
        // A checkpoint the server received once, on a branch that was then deleted: its
        // objects are indexed there, and nothing reaches them.
        let file = d.join(format!("ck{p}.safetensors"));
        let bytes = write_safetensors(&file, &mixed(100 + p as u64), &[]);
        let first = commit_on(&local, &file, &format!("old{p}"), "first");
        let out = with_token(&["-C", l, "push", &format!("p{p}"), &format!("old{p}")]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let delete = RefUpdate {
            name: format!("refs/heads/old{p}"),
            old: Some(first),
            new: None,
            force: false,
        };
        remote.update_ref(&delete).unwrap();
        remotes.push(remote);
        files.push((file, bytes));
    }
    // Those objects are now older than the grace period of the gcs below; what the pushes
    // below upload is younger.
    std::thread::sleep(Duration::from_secs(4));

    for p in points {
        let (remote, (file, bytes)) = (&remotes[p], &files[p]);
        let gc = || {
            remote.gc(Some("3s"), None, false).unwrap();
        };
        // The same checkpoint again, as a new commit: the server already has its manifest and
        // tensors (unreachable), so only the commit object travels.
        let branch = format!("new{p}");
        let tip = commit_on(&local, file, &branch, "again");
        let refused = push_in_steps(&local, remote, &branch, tip, p, &gc);
        let published = remote.refs().unwrap().get(&format!("refs/heads/{branch}"));
        match &refused {
            None => assert_eq!(published, Some(tip), "gc after request {p}"),
            Some(code) => {
                assert_eq!(code, "incomplete", "gc after request {p}");
                assert_eq!(published, None, "a refused push moved {branch}");
            }
        }
        // Whatever happened, what the server publishes is whole: a full push (which sends
        // again what gc took) lands, and the checkpoint reads back byte for byte.
        let out = with_token(&["-C", l, "push", &format!("p{p}"), &branch]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = read(
            &server.base,
            &format!("/v1/repos/p{p}/checkpoints/{branch}.safetensors"),
        );
        assert!(got == *bytes, "gc after request {p}: checkpoint differs");
    }
    server.stop();
    for p in points {
        assert_fsck_clean(&root.join(format!("p{p}")));
    }
}

/// Runs `mdl` with `token`, asserting success.
pub(crate) fn ok_with(token: &str, args: &[&str]) -> String {
    let out = run_with(token, args);
    assert!(
        out.status.success(),
        "mdl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `mdl ARGS` with `token`, which must fail with one line containing `want`.
pub(crate) fn fails_with(token: &str, args: &[&str], want: &str) {
    let out = run_with(token, args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mdl {args:?} succeeded");
    assert!(err.contains(want), "mdl {args:?}: {err:?} lacks {want:?}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err:?}");
}

#[test]
fn thinned_repositories_clone_push_and_pull() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = d.join("src");
    ok(&src, &["init"]);
    ok(&src, &["config", "retention.keep_last", "1"]);
    let mut ids = Vec::new();
    for n in 0..3 {
        let f = d.join(format!("f{n}.safetensors"));
        checkpoint(&f, n, true);
        ids.push(
            json(
                &src,
                &["commit", f.to_str().unwrap(), "-m", &format!("c{n}")],
            )["id"]
                .clone(),
        );
    }
    let gc = json(&src, &["gc", "--prune-older-than", "0s"]);
    assert!(gc["expired"].as_u64().unwrap() > 0, "{gc}");
    let thinned = ids[0].as_str().unwrap().to_string();
    let log = json(&src, &["log"]);
    let empty = d.join("empty");
    ok(&empty, &["init"]);

    let server = Server::start(&["--root", d.to_str().unwrap()], d);
    let url = format!("{}/src", server.base);
    let (c1, c2) = (d.join("c1"), d.join("c2"));
    for c in [&c1, &c2] {
        ok_with(READ, &["clone", &url, c.to_str().unwrap()]);
        assert_fsck_clean(c);
        assert_eq!(json(c, &["log"]), log);
    }
    // The clone knows which tensors expired: the thinned commit checks out as it does at the
    // origin (refused, then without them), the others byte for byte.
    let thin_out = d.join("thin.safetensors");
    fails(
        &c1,
        &["checkout", &thinned, "-o", thin_out.to_str().unwrap()],
        "expired by retention",
    );
    ok(
        &c1,
        &[
            "checkout",
            &thinned,
            "-o",
            thin_out.to_str().unwrap(),
            "--skip-expired",
        ],
    );
    let want = checkpoint(&d.join("thin-want.safetensors"), 0, false);
    assert_eq!(
        data_and_names(&std::fs::read(&thin_out).unwrap()),
        data_and_names(&want)
    );
    let tip_out = d.join("tip.safetensors");
    ok(&c1, &["checkout", "main", "-o", tip_out.to_str().unwrap()]);
    assert!(std::fs::read(&tip_out).unwrap() == std::fs::read(d.join("f2.safetensors")).unwrap());

    // A commit on top is pushed back and pulled by the other clone.
    let f3 = d.join("f3.safetensors");
    let sent = checkpoint(&f3, 3, true);
    ok(&c1, &["commit", f3.to_str().unwrap(), "-m", "c3"]);
    ok_with(WRITE, &["-C", c1.to_str().unwrap(), "push"]);
    ok_with(READ, &["-C", c2.to_str().unwrap(), "pull"]);
    assert_eq!(json(&c2, &["log"]), json(&c1, &["log"]));
    let got = d.join("got.safetensors");
    ok(&c2, &["checkout", "main", "-o", got.to_str().unwrap()]);
    assert!(std::fs::read(&got).unwrap() == sent);
    assert_fsck_clean(&c2);

    // The whole thinned history pushed into an empty repository on the server.
    let c1s = c1.to_str().unwrap();
    ok(
        &c1,
        &["remote", "add", "e", &format!("{}/empty", server.base)],
    );
    ok_with(WRITE, &["-C", c1s, "push", "e", "main"]);
    server.stop();
    for r in [&src, &empty, &c1] {
        assert_fsck_clean(r);
    }
    assert_eq!(json(&empty, &["log"]), json(&c1, &["log"]));
    let shown = json(&empty, &["show", &thinned]);
    assert!(shown["expired_tensors"].as_u64().unwrap() > 0, "{shown}");
}

#[test]
fn refused_uploads_report_the_servers_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let served = d.join("srv");
    ok(&served, &["init"]);
    let local = d.join("local");
    ok(&local, &["init"]);
    // Large enough that the upload cannot fit in the sockets' buffers before the server
    // answers (and closes).
    let big = d.join("big.safetensors");
    write_safetensors(&big, &[tensor("w", "U8", &[48 << 20], 5)], &[]);
    ok(&local, &["commit", big.to_str().unwrap()]);
    let server = Server::start(&["-C", served.to_str().unwrap()], d);
    let url = format!("{}/srv", server.base);
    let l = local.to_str().unwrap();
    ok(&local, &["remote", "add", "origin", &url]);
    let run = |token: &str, args: &[&str]| {
        Command::new(mdl_bin())
            .args(args)
            .env("MDL_TOKEN", token)
            .output()
            .unwrap()
    };
    for args in [
        vec!["-C", l, "push"],
        vec!["commit", big.to_str().unwrap(), "--remote", &url],
    ] {
        let out = run(READ, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} with a read token");
        assert!(
            err.contains("needs write") && err.contains("forbidden"),
            "{args:?}: {err}"
        );
    }
    server.stop();
}
