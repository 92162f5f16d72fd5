//! A served repository's folder: what `mdl serve` says about connecting, the commands that
//! forward to it from the folder, and progress on a terminal.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::server::*;
use crate::util::*;

#[test]
fn serve_says_who_may_connect_and_how_to_let_others_in() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _, _) = two_commits(dir.path());
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("writer write {WRITE}\n")).unwrap();
    let first_lines = |extra: &[&std::ffi::OsStr]| -> String {
        let mut child = Command::new(mdl_bin())
            .current_dir(&repo)
            .args(["serve", "--addr", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut text = String::new();
        let mut r = BufReader::new(child.stdout.as_mut().unwrap());
        while !text.contains("access:") {
            assert!(r.read_line(&mut text).unwrap() > 0, "{text}");
        }
        child.kill().unwrap();
        child.wait().unwrap();
        text
    };
    let owner_only = first_lines(&[]);
    assert!(
        owner_only.contains("serving http://127.0.0.1:"),
        "{owner_only}"
    );
    assert!(
        owner_only.contains("access: only mdl commands run in a served repository's folder")
            && owner_only.contains("--read-public lets anyone read, --tokens FILE grants tokens"),
        "{owner_only}"
    );
    let public = first_lines(&["--read-public".as_ref()]);
    assert!(public.contains("access: anyone may read"), "{public}");
    let with_tokens = first_lines(&["--tokens".as_ref(), tokens.as_os_str()]);
    assert!(
        with_tokens.contains(&format!("access: tokens from {}", tokens.display())),
        "{with_tokens}"
    );
}

#[test]
fn a_served_repository_is_inspected_and_administered_from_its_folder() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _, _) = two_commits(dir.path());
    let local_diff = json(&repo, &["diff", "HEAD~1", "HEAD"]);
    let local_stats = json(&repo, &["stats"]);
    let local_accounting = json(&repo, &["stats", "--lossy"]);
    assert_eq!(local_accounting["lossy"]["commits"].as_u64(), Some(2));
    assert_eq!(local_stats.get("lossy"), None);
    ok(&repo, &["branch", "side", "HEAD~1"]);
    let local_all = json(&repo, &["log", "--all"]);
    let server = Server::start(&["-C", repo.to_str().unwrap()], dir.path());
    assert_eq!(json(&repo, &["log", "--all"]), local_all);
    assert!(ok(&repo, &["log", "--all", "--graph"]).contains("side"));
    assert!(ok(&repo, &["branch", "-D", "side"]).contains("deleted branch side"));

    // Read: the same answers as from the repository itself.
    assert_eq!(json(&repo, &["diff", "HEAD~1", "HEAD"]), local_diff);
    assert_eq!(json(&repo, &["stats"]), local_stats);
    assert_eq!(json(&repo, &["stats", "--lossy"]), local_accounting);
    assert!(ok(&repo, &["stats", "--lossy"]).contains("DynaQuant"));
    assert!(ok(&repo, &["diff", "--changed", "HEAD~1", "HEAD"]).contains("model.w"));
    let report = json(&repo, &["fsck"]);
    assert_eq!(report["problems"], serde_json::json!([]));
    assert!(report["objects_checked"].as_u64().unwrap() > 0);
    fails(&repo, &["fsck", "--repair"], "stop the `mdl serve`");

    // Settings.
    ok(&repo, &["config", "delta.max_depth", "5"]);
    let listed = json(&repo, &["config", "delta.max_depth"]);
    assert!(listed.to_string().contains("\"5\""), "{listed}");
    fails(&repo, &["config", "no.such.key"], "no.such.key");
    fails(
        &repo,
        &["config", "delta.max_depth", "many"],
        "delta.max_depth",
    );

    // Branches and HEAD, with the same refusals as locally.
    assert!(ok(&repo, &["branch", "exp", "HEAD~1"]).contains("branch exp at"));
    fails(&repo, &["branch", "exp"], "exists");
    let moved = json(&repo, &["branch", "-f", "exp", "HEAD"]);
    assert_eq!(moved["branch"], "exp");
    ok(&repo, &["switch", "exp"]);
    fails(&repo, &["switch", "nope"], "nope");
    let f = dir.path().join("c.safetensors");
    write_safetensors(&f, &[tensor("model.w", "F32", &[8, 8], 99)], &[]);
    ok(&repo, &["commit", f.to_str().unwrap(), "-m", "only on exp"]);
    ok(&repo, &["switch", "main"]);
    fails(&repo, &["branch", "-d", "exp"], "1 commit");
    assert!(ok(&repo, &["branch", "-D", "exp"]).contains("deleted branch exp"));
    fails(&repo, &["branch", "-a"], "remote-tracking");
    server.stop();

    // What the server did is the repository's own once it stops.
    let config = json(&repo, &["config", "delta.max_depth"]);
    assert!(config.to_string().contains("\"5\""), "{config}");
    let branches = json(&repo, &["branch"]);
    let names = column(&branches, "name");
    assert_eq!(names, ["main"]);
    // The deletion, the move and the creation are in the branch's reflog, as if run locally.
    let reflog = json(&repo, &["reflog", "exp"]);
    let messages = column(&reflog["entries"], "message");
    assert_eq!(messages.first(), Some(&"deleted"));
    assert!(messages.len() >= 3, "{messages:?}");
}

#[test]
fn transfers_and_fsck_show_progress_on_a_terminal_only() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _, _) = two_commits(dir.path());
    let server = Server::start(&["-C", repo.to_str().unwrap()], dir.path());
    let url = format!("{}/repo", server.base);
    // `script` runs the command on a pseudo-terminal and copies what it shows to stdout.
    let on_terminal = |args: &str| -> String {
        let cmd = format!("{} {args}", mdl_bin().display());
        let out = Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .env("MDL_TOKEN", READ)
            .output()
            .expect("script(1), from util-linux, runs the command on a terminal");
        assert!(
            out.status.success(),
            "{args}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let tty = dir.path().join("tty");
    let shown = on_terminal(&format!("clone {url} {}", tty.display()));
    assert!(shown.contains("receiving"), "{shown}");
    let shown = on_terminal(&format!("-C {} fsck", tty.display()));
    assert!(shown.contains("checking"), "{shown}");
    // Not under --json, and not when stderr is not a terminal.
    let quiet = on_terminal(&format!(
        "--json clone {url} {}",
        dir.path().join("j").display()
    ));
    assert!(!quiet.contains("receiving"), "{quiet}");
    let piped = Command::new(mdl_bin())
        .args(["clone", &url])
        .arg(dir.path().join("piped"))
        .env("MDL_TOKEN", READ)
        .output()
        .unwrap();
    assert!(piped.status.success());
    assert!(!String::from_utf8_lossy(&piped.stderr).contains("receiving"));
    server.stop();
}

/// A served repository does the re-encodes commits deferred (`delta.defer`, the default)
/// itself: those queued before it was served, and those of the commits it answers. Nobody runs
/// `mdl maintenance`, yet every older version becomes a reverse delta against the newer one.
#[test]
fn a_served_repository_does_its_deferred_reencodes() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    ok(dir.path(), &["init", "repo"]);
    let f = dir.path().join("c.safetensors");
    // Queued before serving (no background run started).
    for n in 0..2 {
        crate::maintenance::checkpoint(&f, n, true);
        ok_queued(&repo, &["commit", f.to_str().unwrap()]);
    }
    let server = Server::start(&["-C", repo.to_str().unwrap()], dir.path());
    crate::maintenance::checkpoint(&f, 2, true);
    ok(&repo, &["commit", f.to_str().unwrap()]);
    fails(&repo, &["maintenance"], "does its maintenance");
    let t = std::time::Instant::now();
    loop {
        let codecs: Vec<String> = ["HEAD~1", "HEAD~2"]
            .iter()
            .flat_map(|rev| {
                let shown = json(&repo, &["show", rev]);
                let codecs: Vec<String> = shown["tensors"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["codec"].as_str().unwrap().to_string())
                    .collect();
                codecs
            })
            .collect();
        if codecs.iter().all(|c| c.ends_with("-delta")) {
            break;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "never re-encoded: {codecs:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(json(&repo, &["fsck"])["problems"], serde_json::json!([]));
    server.stop();
}

/// A tree committed in a served repository's folder goes through its server as one upload:
/// checked out, it is the folder byte for byte, executable bits included. A tree the server
/// cannot take (a path out of the tree, a symlink, a file twice, fewer files than announced)
/// is refused with one error, and nothing changes.
#[test]
fn a_tree_is_committed_through_the_server() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (repo, _, _) = two_commits(dir.path());
    let ck = dir.path().join("checkpoint-200");
    std::fs::create_dir_all(ck.join("extra")).unwrap();
    write_safetensors(&ck.join("model.safetensors"), &mixed(200), &[]);
    std::fs::write(ck.join("trainer_state.json"), br#"{"global_step": 200}"#).unwrap();
    std::fs::write(ck.join("extra/notes.txt"), b"a nested file").unwrap();
    std::fs::write(ck.join("run.sh"), b"#!/bin/sh\necho resume\n").unwrap();
    std::fs::set_permissions(ck.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = Server::start(&["-C", repo.to_str().unwrap()], dir.path());

    ok(
        &repo,
        &[
            "commit",
            ck.to_str().unwrap(),
            "-m",
            "tree",
            "--step",
            "200",
        ],
    );
    assert_eq!(json(&repo, &["show", "HEAD"])["step"], 200);
    let out = dir.path().join("out");
    ok(&repo, &["checkout", "HEAD", "-o", out.to_str().unwrap()]);
    assert_eq!(state_of(&out), state_of(&ck));
    // Several paths: each file under its name, each folder's files under their paths.
    let lone = dir.path().join("lone.bin");
    std::fs::write(&lone, b"lone").unwrap();
    let both = json(
        &repo,
        &[
            "commit",
            lone.to_str().unwrap(),
            ck.join("extra").to_str().unwrap(),
        ],
    );
    let shown = json(&repo, &["show", both["id"].as_str().unwrap()]);
    let paths: Vec<&str> = shown["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["lone.bin", "notes.txt"]);

    let before = json(&repo, &["log"]);
    let write = bearer(WRITE);
    let post = |query: &str, tar: &[u8]| {
        let path = format!("/v1/repos/repo/commits?{query}");
        let headers = [
            ("Authorization", write.as_str()),
            ("Content-Type", "application/x-tar"),
        ];
        let (status, _, body) = http(&server.base, "POST", &path, &headers, tar);
        (status, String::from_utf8_lossy(&body).to_string())
    };
    let file = |name: &str| tar_entry(name, b'0', b"data");
    let cases: [(&str, Vec<u8>, &str); 5] = [
        ("files=1", [file("../escape"), tar_end()].concat(), "escape"),
        (
            "files=1",
            [tar_entry("link", b'2', b""), tar_end()].concat(),
            "not a regular file",
        ),
        (
            "files=2",
            [file("a"), file("a"), tar_end()].concat(),
            "twice",
        ),
        ("files=2", [file("a"), tar_end()].concat(), "cut short"),
        (
            "path=x&files=1",
            [file("a"), tar_end()].concat(),
            "path names the one file",
        ),
    ];
    for (query, tar, want) in cases {
        let (status, body) = post(query, &tar);
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains(want), "{query}: {body}");
    }
    assert_eq!(json(&repo, &["log"]), before);
    let incoming = repo.join(".mdl/incoming");
    let left: Vec<_> = std::fs::read_dir(&incoming)
        .map(|d| d.collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    server.stop();
}

/// Every file under `root` by relative path, with its bytes and whether it is executable.
fn state_of(root: &std::path::Path) -> Vec<(String, Vec<u8>, bool)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                let mode = std::fs::metadata(&p).unwrap().permissions().mode();
                let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_string();
                out.push((rel, std::fs::read(&p).unwrap(), mode & 0o111 != 0));
            }
        }
    }
    out.sort();
    out
}

/// One tar entry: a ustar header (`kind` b'0' a file, b'2' a symlink) and `data`, padded.
fn tar_entry(name: &str, kind: u8, data: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
    h[136..148].copy_from_slice(b"00000000000\0");
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut out = h.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

/// The two zero blocks that end a tar.
fn tar_end() -> Vec<u8> {
    vec![0; 1024]
}

/// A listener that counts the connections it is offered and answers none usefully: where a
/// planted advertisement would send a command.
fn spy() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(conn);
        }
    });
    (addr, seen)
}

#[test]
fn a_planted_advertisement_is_never_followed() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let repo = d.join("repo");
    ok(d, &["init", "repo"]);
    let ck = d.join("ck.safetensors");
    write_safetensors(&ck, &[tensor("w", "F32", &[64], 1)], &[]);
    let (spied, seen) = spy();
    // A real mdl serve of this user's, of another repository: a live pid that is mdl serve and
    // listens — on its own port, not the spy's.
    let other = d.join("other");
    ok(d, &["init", "other"]);
    let server = Server::start(&["-C", other.to_str().unwrap()], d);
    let server_addr = server.base.strip_prefix("http://").unwrap().to_string();
    // A live process of this user's that says `serve` but listens on nothing.
    let mut pretender = Command::new("python3")
        .args(["-c", "import time; time.sleep(60)", "serve"])
        .spawn()
        .unwrap();
    let ad = |pid: u32, addr: &str| {
        format!(r#"{{"pid":{pid},"url":"http://{addr}/x","token":"stolen-or-planted"}}"#)
    };
    let root = is_root();
    // (what is planted, its mode, chown to another user, why it is not followed)
    let mut plants: Vec<(String, u32, bool, &str)> = vec![
        (
            ad(server.pid(), &spied),
            0o644,
            false,
            "others may read or write it",
        ),
        (ad(1, &spied), 0o600, false, ""),
        (ad(pretender.id(), &spied), 0o600, false, "does not listen"),
        (ad(server.pid(), &spied), 0o600, false, "does not listen"),
        (
            ad(
                server.pid(),
                &format!("localhost:{}", spied.rsplit(':').next().unwrap()),
            ),
            0o600,
            false,
            "is not http://ADDRESS:PORT/NAME",
        ),
    ];
    if root {
        plants.push((ad(server.pid(), &spied), 0o600, true, "owned by user 65534"));
    } else {
        eprintln!(
            "not root: the planted file owned by another user is not tried here (CI runs as root)"
        );
    }
    let planted = repo.join(".mdl/serve.json");
    for (i, (text, mode, chown, why)) in plants.iter().enumerate() {
        std::fs::write(&planted, text).unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(*mode)).unwrap();
        if *chown {
            std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
        }
        let out = Command::new(mdl_bin())
            .current_dir(&repo)
            .args([
                "-v",
                "commit",
                ck.to_str().unwrap(),
                "-m",
                &format!("secret {i}"),
            ])
            .env("MDL_AUTHOR", "tester")
            .env("MDL_NO_BACKGROUND", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "plant {i}: {err}");
        assert!(
            err.contains("not following") && err.contains(why),
            "plant {i}: {err}"
        );
        for args in [&["log"][..], &["status"], &["branch"]] {
            ok(&repo, args);
        }
        assert_eq!(
            seen.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "plant {i}"
        );
        let _ = std::fs::remove_file(&planted);
    }
    // Every commit landed here.
    let log = json(&repo, &["log"]);
    assert_eq!(log.as_array().unwrap().len(), plants.len());
    // The server's own, genuine advertisement of its repository is still followed.
    assert!(ok(&other, &["status"]).contains(&server_addr));
    pretender.kill().unwrap();
    pretender.wait().unwrap();
    server.stop();
}

/// Whether the tests run as root (who may give a file to another user).
fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

#[test]
fn a_repository_in_a_namespace_is_served_through_every_door() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repos");
    std::fs::create_dir_all(root.join("team")).unwrap();
    let (made, b1, b2) = two_commits(dir.path());
    std::fs::rename(&made, root.join("team").join("model")).unwrap();
    let repo = root.join("team").join("model");
    let server = Server::start(&["--root", root.to_str().unwrap()], dir.path());
    let base = &server.base;
    let auth = bearer(READ);
    let get = |path: &str| http(base, "GET", path, &[("Authorization", &auth)], b"");

    let (status, _, body) = get("/v1/repos");
    assert_eq!(status, 200);
    let listed: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(listed["repos"], serde_json::json!(["team/model"]));
    // The name as one encoded segment or as two: the same routes.
    for path in ["/v1/repos/team%2Fmodel/refs", "/v1/repos/team/model/refs"] {
        let (status, _, body) = get(path);
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
    }
    let (status, _, body) = get("/hf/api/models/team/model");
    assert_eq!(status, 200);
    let info: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(info["id"], "team/model");
    let (status, _, body) = get("/ui/team/model");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));

    // Cloned by its URL into a folder of its own name, byte-identical checkouts.
    let url = format!("{base}/team/model");
    ok(dir.path(), &["--token", READ, "clone", &url]);
    let clone = dir.path().join("model");
    let out = dir.path().join("first.safetensors");
    ok(&clone, &["checkout", "HEAD~1", "-o", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(&out).unwrap(), b1);
    let shown = |dir: &std::path::Path| json(dir, &["show", "HEAD"])["tensors"].clone();
    assert_eq!(shown(&clone), shown(&repo)); // the lossy commit: the same records
    drop(b2);
    // The served folder's own commands go to the server that owns it (its advertisement
    // names the repository by both parts).
    assert_eq!(json(&repo, &["log"]).as_array().unwrap().len(), 2);

    // A namespace is never a repository, nor a repository a namespace.
    let admin = bearer(ADMIN);
    let create = |name: &str| {
        let body = format!("{{\"name\":\"{name}\"}}");
        http(
            base,
            "POST",
            "/v1/repos",
            &[
                ("Authorization", &admin),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
        )
    };
    assert_eq!(create("team").0, 400);
    assert_eq!(create("team/model/x").0, 400);
    assert_eq!(create("team/refs").0, 400);
    assert!(!root.join("team").join(".mdl").exists());
    assert_eq!(create("team/other").0, 201);
    assert_eq!(create("team/model").0, 409);
    ok(dir.path(), &["init", "solo"]);
    std::fs::rename(dir.path().join("solo"), root.join("solo")).unwrap();
    assert_eq!(create("solo/inside").0, 400);
    assert!(!root.join("solo").join("inside").exists());
}
