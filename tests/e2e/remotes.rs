//! Remotes: clone, push and pull between repositories through `mdl serve`, push conflicts,
//! and the token, URL and removal of a remote.

use std::process::Command;

use crate::server::*;
use crate::transfer::ok_with;
use crate::util::*;

#[test]
fn clone_push_pull_and_push_conflicts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (repo, _, _) = two_commits(d);
    ok(&repo, &["tag", "v1", "main~1", "-m", "first"]);
    let server = Server::start(&["--root", d.to_str().unwrap()], d);
    let url = format!("{}/repo", server.base);
    let with = |args: &[&str], token: &str| {
        Command::new(mdl_bin())
            .args(args)
            .env("MDL_TOKEN", token)
            .env("MDL_AUTHOR", "tester")
            .output()
            .unwrap()
    };
    let c1 = d.join("c1");
    let c2 = d.join("c2");
    for c in [&c1, &c2] {
        let out = with(&["clone", &url, c.to_str().unwrap()], READ);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let served_log = read_json(&server.base, "/v1/repos/repo/log");
    assert_eq!(json(&c1, &["log"]), served_log);
    assert_eq!(json(&c1, &["tag"])[0]["name"], "v1");
    assert_fsck_clean(&c1);
    // Checkouts in a clone equal the server's.
    let a = d.join("a.out");
    ok(&c1, &["checkout", "main", "-o", a.to_str().unwrap()]);
    let b = read(&server.base, "/v1/repos/repo/checkpoints/main.safetensors");
    assert_eq!(std::fs::read(&a).unwrap(), b);

    // c1 commits and pushes (a read token is refused); c2 pulls it.
    let f = d.join("n.safetensors");
    let sent = write_safetensors(&f, &mixed(21), &[]);
    ok(&c1, &["commit", f.to_str().unwrap(), "-m", "from c1"]);
    let c1s = c1.to_str().unwrap();
    let out = with(&["-C", c1s, "push"], READ);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("forbidden"));
    let out = with(&["-C", c1s, "push"], WRITE);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = with(&["-C", c2.to_str().unwrap(), "pull"], READ);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json(&c2, &["log"]), json(&c1, &["log"]));
    let got = d.join("got.out");
    ok(&c2, &["checkout", "main", "-o", got.to_str().unwrap()]);
    assert_eq!(std::fs::read(&got).unwrap(), sent);
    assert_fsck_clean(&c2);

    // Both commit; both push at once: exactly one lands, the other is told why, and nothing
    // is lost (the loser still has its commit and can pull, which refuses to drop it).
    for (c, seed) in [(&c1, 31), (&c2, 32)] {
        let f = d.join(format!("p{seed}.safetensors"));
        write_safetensors(&f, &mixed(seed), &[]);
        ok(
            c,
            &["commit", f.to_str().unwrap(), "-m", &format!("seed {seed}")],
        );
    }
    let tips: Vec<String> = [&c1, &c2]
        .iter()
        .map(|c| {
            json(c, &["log", "-n", "1"])[0]["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let handles: Vec<_> = [c1.clone(), c2.clone()]
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                Command::new(mdl_bin())
                    .args(["-C", c.to_str().unwrap(), "push"])
                    .env("MDL_TOKEN", WRITE)
                    .output()
                    .unwrap()
            })
        })
        .collect();
    let outs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let won: Vec<usize> = (0..2).filter(|&i| outs[i].status.success()).collect();
    assert_eq!(
        won.len(),
        1,
        "exactly one push lands: {:?}",
        outs.iter()
            .map(|o| String::from_utf8_lossy(&o.stderr).to_string())
            .collect::<Vec<_>>()
    );
    let lost = 1 - won[0];
    let err = String::from_utf8_lossy(&outs[lost].stderr);
    assert!(err.contains("rejected"), "{err}");
    let refs = read_json(&server.base, "/v1/repos/repo/refs");
    let main = refs["refs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "refs/heads/main")
        .unwrap();
    assert_eq!(main["target"], tips[won[0]].as_str());
    let loser = if lost == 0 { &c1 } else { &c2 };
    assert_eq!(
        json(loser, &["log", "-n", "1"])[0]["id"],
        tips[lost].as_str()
    );
    let out = with(&["-C", loser.to_str().unwrap(), "pull"], READ);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("diverged"), "{err}");
    // Every way out: take theirs, keep yours under a new name, or replace theirs.
    assert!(
        err.contains(&format!("`mdl reset {}`", &tips[won[0]][..12]))
            && err.contains("`mdl branch NEW`")
            && err.contains("`mdl push --force`"),
        "{err}"
    );
    assert_eq!(
        json(loser, &["log", "-n", "1"])[0]["id"],
        tips[lost].as_str()
    );
    // The way out the refusal names: the loser keeps its commit on a branch of its own, takes
    // the winner's, and pulls cleanly from then on.
    let moved = json(loser, &["branch", "-f", "mine", "main"]);
    assert_eq!(moved["to"], tips[lost].as_str());
    assert!(moved["from"].is_null());
    let moved = json(loser, &["reset", &tips[won[0]][..12]]);
    assert_eq!(
        (&moved["branch"], &moved["from"], &moved["to"]),
        (
            &serde_json::json!("main"),
            &serde_json::json!(tips[lost]),
            &serde_json::json!(tips[won[0]])
        )
    );
    let out = with(&["-C", loser.to_str().unwrap(), "pull"], READ);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        json(loser, &["log", "-n", "1"])[0]["id"],
        tips[won[0]].as_str()
    );
    assert_eq!(
        json(loser, &["log", "mine", "-n", "1"])[0]["id"],
        tips[lost].as_str()
    );
    // Remote-tracking branches: listed with -r and -a, and a revision like any branch.
    assert_eq!(
        json(loser, &["log", "origin/main", "-n", "1"])[0]["id"],
        tips[won[0]].as_str()
    );
    let names = |args: &[&str]| -> Vec<String> {
        json(loser, args)
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&["branch", "-r"]), vec!["origin/main"]);
    assert_eq!(
        names(&["branch", "-a"]),
        vec!["main", "mine", "origin/main"]
    );
    // branch -f moves an existing branch, saying where it was.
    let moved = json(loser, &["branch", "-f", "mine", "main"]);
    assert_eq!(
        (&moved["from"], &moved["to"]),
        (
            &serde_json::json!(tips[lost]),
            &serde_json::json!(tips[won[0]])
        )
    );

    // A stale compare-and-swap over the API is a 409.
    let root = served_log.as_array().unwrap().last().unwrap()["id"].clone();
    let body = serde_json::json!({"name": "refs/heads/main", "old": root, "new": tips[won[0]]});
    let (s, _, b) = http(
        &server.base,
        "POST",
        "/v1/repos/repo/refs",
        &[
            ("Authorization", &bearer(WRITE)),
            ("Content-Type", "application/json"),
        ],
        body.to_string().as_bytes(),
    );
    assert_eq!(s, 409, "{}", String::from_utf8_lossy(&b));
    server.stop();
    assert_fsck_clean(&repo);
}

#[test]
fn a_remote_keeps_its_token_and_can_be_repointed_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (served, _, _) = two_commits(d);
    let server = Server::start(&["-C", served.to_str().unwrap()], d);
    let url = format!("{}/repo", server.base);
    let local = d.join("local");
    ok(d, &["init", local.to_str().unwrap()]);
    let run = |args: &[&str], token: Option<&str>| {
        let mut c = Command::new(mdl_bin());
        c.current_dir(&local).args(args).env_remove("MDL_TOKEN");
        if let Some(t) = token {
            c.env("MDL_TOKEN", t);
        }
        c.output().unwrap()
    };
    let fails_with = |args: &[&str], token: Option<&str>, want: &str| {
        let out = run(args, token);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(want),
            "{args:?}: {err}"
        );
    };
    let succeeds = |args: &[&str], token: Option<&str>| {
        let out = run(args, token);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    succeeds(&["remote", "add", "origin", &url], None);
    fails_with(&["fetch"], None, "unauthorized");
    fails_with(&["remote", "set-token", "origin"], None, "no token to keep");
    // Kept with a credential file's permissions, never among the shared settings.
    succeeds(&["remote", "set-token", "origin"], Some(READ));
    let kept = local.join(".mdl/remote-tokens");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(!succeeds(&["config"], None).contains(READ));
    succeeds(&["fetch"], None);
    assert!(succeeds(&["branch", "-r"], None).contains("origin/main"));
    // Repointed at a server that is not there, then back.
    succeeds(
        &["remote", "set-url", "origin", "http://127.0.0.1:9/repo"],
        None,
    );
    fails_with(&["fetch"], None, "cannot reach");
    fails_with(
        &["remote", "set-url", "nope", &url],
        None,
        "no remote named nope",
    );
    succeeds(&["remote", "set-url", "origin", &url], None);
    succeeds(&["fetch"], None);
    succeeds(&["remote", "set-token", "origin", "--clear"], None);
    fails_with(&["fetch"], None, "unauthorized");
    // Removed: its URL, token and tracking branches go.
    succeeds(&["remote", "set-token", "origin"], Some(READ));
    succeeds(&["remote", "remove", "origin"], None);
    assert!(succeeds(&["remote"], None).trim().is_empty());
    assert!(succeeds(&["branch", "-r"], None).trim().is_empty());
    assert!(!std::fs::read_to_string(&kept).unwrap().contains(READ));
    fails_with(&["fetch"], None, "no remote named origin");
    fails_with(
        &["remote", "remove", "origin"],
        None,
        "no remote named origin",
    );
}

/// A checkpoint of many identical tensors (28,000 zero-initialised LoRA `B` matrices of 16×8)
/// has a manifest that compresses far better than a transfer lets a record claim; it is stored
/// in a form every transfer accepts, so its history clones and pushes.
#[test]
fn a_manifest_of_identical_tensors_clones_and_pushes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init", "lora"]);
    ok(d, &["init", "empty"]);
    let lora = d.join("lora");
    let projections = ["q_proj", "k_proj", "v_proj", "o_proj"];
    let tensors: Vec<T> = (0..28_000)
        .map(|i| T {
            name: format!(
                "base_model.model.layers.{}.self_attn.{}.lora_B.weight",
                i / 4,
                projections[i % 4]
            ),
            dtype: "F32",
            shape: vec![16, 8],
            data: vec![0; 16 * 8 * 4],
        })
        .collect();
    let f = d.join("adapter_model.safetensors");
    let sent = write_safetensors(&f, &tensors, &[]);
    assert!(sent.len() > 17 << 20);
    ok(&lora, &["commit", f.to_str().unwrap(), "-m", "LoRA init"]);
    let server = Server::start(&["--root", d.to_str().unwrap()], d);
    let clone = d.join("clone");
    let url = format!("{}/lora", server.base);
    ok_with(READ, &["clone", &url, clone.to_str().unwrap()]);
    let got = d.join("got.safetensors");
    ok(&clone, &["checkout", "main", "-o", got.to_str().unwrap()]);
    assert_eq!(std::fs::read(&got).unwrap(), sent);
    assert_fsck_clean(&clone);
    // The clone pushes that history on to an empty repository.
    ok(
        &clone,
        &["remote", "add", "dst", &format!("{}/empty", server.base)],
    );
    ok_with(
        WRITE,
        &["-C", clone.to_str().unwrap(), "push", "dst", "main"],
    );
    let pushed = read(&server.base, "/v1/repos/empty/checkpoints/main.safetensors");
    assert_eq!(pushed, sent);
}
