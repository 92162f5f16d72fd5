//! What `mdl serve` answers over HTTP: checkpoints, files and tensors with ranges and tokens;
//! commits uploaded, and `mdl commit` forwarded to the server that owns the folder.

use std::path::Path;
use std::process::Command;

use crate::server::*;
use crate::util::*;

#[test]
fn pulls_equal_checkout_with_ranges_and_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _, _) = two_commits(dir.path());
    // What a local checkout writes, for both commits.
    let mut local = Vec::new();
    for rev in ["main~1", "main"] {
        let out = dir
            .path()
            .join(format!("local-{}.safetensors", rev.replace('~', "_")));
        ok(&repo, &["checkout", rev, "-o", out.to_str().unwrap()]);
        local.push(std::fs::read(out).unwrap());
    }
    let ids: Vec<String> = json(&repo, &["log"])
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .rev()
        .collect();
    assert!(json(&repo, &["log"])[0]["lossy_tensors"].as_u64().unwrap() > 0);

    let server = Server::start(&["-C", repo.to_str().unwrap()], dir.path());
    let base = server.base.clone();
    let url = |p: &str| format!("/v1/repos/repo{p}");
    let read = bearer(READ);
    let auth = [("Authorization", read.as_str())];

    // Tokens: none, wrong, read-only for a write.
    let (s, _, b) = http(&base, "GET", &url("/refs"), &[], b"");
    assert_eq!(s, 401, "{}", String::from_utf8_lossy(&b));
    let err: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(err["code"], "unauthorized");
    let (s, _, _) = http(
        &base,
        "GET",
        &url("/refs"),
        &[("Authorization", "Bearer nope-nope-nope-nope")],
        b"",
    );
    assert_eq!(s, 401);
    let (s, _, b) = http(&base, "POST", &url("/commits"), &auth, b"junk");
    assert_eq!(s, 403, "{}", String::from_utf8_lossy(&b));

    // Whole checkpoints equal local checkouts, with ETag = commit id.
    for (rev, (want, id)) in ["main~1", "main"].iter().zip(local.iter().zip(&ids)) {
        let (s, h, body) = http(
            &base,
            "GET",
            &url(&format!("/checkpoints/{rev}.safetensors")),
            &auth,
            b"",
        );
        assert_eq!(s, 200);
        assert_eq!(&body, want, "pull of {rev} differs from checkout");
        assert_eq!(header(&h, "etag"), format!("\"{id}\""));
        assert_eq!(header(&h, "content-length"), want.len().to_string());
        assert_eq!(header(&h, "accept-ranges"), "bytes");
    }
    let full = &local[1];
    let path = url("/checkpoints/main.safetensors");

    // Range: the header, one tensor, a suffix, past the end.
    let hlen = u64::from_le_bytes(full[..8].try_into().unwrap()) as usize;
    let (s, h, body) = http(
        &base,
        "GET",
        &path,
        &[auth[0], ("Range", &format!("bytes=0-{}", 8 + hlen - 1))],
        b"",
    );
    assert_eq!(s, 206);
    assert_eq!(body, full[..8 + hlen]);
    assert_eq!(
        header(&h, "content-range"),
        format!("bytes 0-{}/{}", 8 + hlen - 1, full.len())
    );
    let hdr: serde_json::Value = serde_json::from_slice(&full[8..8 + hlen]).unwrap();
    let offs = &hdr["model.v"]["data_offsets"];
    let (a, b) = (
        8 + hlen + offs[0].as_u64().unwrap() as usize,
        8 + hlen + offs[1].as_u64().unwrap() as usize,
    );
    let (s, _, body) = http(
        &base,
        "GET",
        &path,
        &[auth[0], ("Range", &format!("bytes={a}-{}", b - 1))],
        b"",
    );
    assert_eq!(s, 206);
    assert_eq!(body, full[a..b], "one tensor's range");
    // A range straddling two tensors and the header.
    let (s, _, body) = http(
        &base,
        "GET",
        &path,
        &[auth[0], ("Range", &format!("bytes={}-{}", hlen, a + 10))],
        b"",
    );
    assert_eq!(s, 206);
    assert_eq!(body, full[hlen..a + 11]);
    let (s, _, body) = http(
        &base,
        "GET",
        &path,
        &[auth[0], ("Range", "bytes=-100")],
        b"",
    );
    assert_eq!((s, &body[..]), (206, &full[full.len() - 100..]));
    let (s, h, _) = http(
        &base,
        "GET",
        &path,
        &[auth[0], ("Range", &format!("bytes={}-", full.len()))],
        b"",
    );
    assert_eq!(s, 416);
    assert_eq!(
        header(&h, "content-range"),
        format!("bytes */{}", full.len())
    );
    // HEAD: headers only.
    let (s, h, body) = http(&base, "HEAD", &path, &auth, b"");
    assert_eq!((s, body.len()), (200, 0));
    assert_eq!(header(&h, "content-length"), full.len().to_string());

    // curl with --range, as a lazy loader would.
    if Command::new("curl").arg("--version").output().is_ok() {
        let out = dir.path().join("curl.part");
        let status = Command::new("curl")
            .args([
                "-sSf",
                "--range",
                &format!("{a}-{}", b - 1),
                "-H",
                &format!("Authorization: {read}"),
                "-o",
            ])
            .arg(&out)
            .arg(format!("{base}{path}"))
            .status()
            .unwrap();
        assert!(status.success());
        assert_eq!(std::fs::read(&out).unwrap(), full[a..b]);
    } else {
        eprintln!("curl not installed: skipped the curl --range check");
    }

    // One tensor, with dtype and shape.
    let (s, h, body) = http(&base, "GET", &url("/tensors/main/model.v"), &auth, b"");
    assert_eq!(s, 200);
    assert_eq!(body, full[a..b]);
    assert_eq!(header(&h, "x-mdl-dtype"), "F32");
    assert_eq!(header(&h, "x-mdl-shape"), "40,40");
    let (s, _, _) = http(&base, "GET", &url("/tensors/main/nope"), &auth, b"");
    assert_eq!(s, 404);

    // Names that try to leave their place are refused.
    for bad in [
        "/v1/repos/..%2Fetc/refs",
        "/v1/repos/.mdl/refs",
        "/v1/repos/repo/tensors/main/a%2F..%2F..%2Fb",
        "/v1/repos/repo/tensors/main/%2Fetc%2Fpasswd",
        "/v1/repos/repo/tensors/main/a%0Ab",
    ] {
        let (s, _, b) = http(&base, "GET", bad, &auth, b"");
        assert_eq!(s, 400, "{bad}: {}", String::from_utf8_lossy(&b));
    }
    let (s, _, b) = http(&base, "GET", "/v1/repos/other/refs", &auth, b"");
    assert_eq!(s, 404);
    let err: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(err["code"], "no_such_repository");
    let (s, _, b) = http(&base, "GET", &url("/log?rev=nope"), &auth, b"");
    assert_eq!(s, 404);
    let err: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(err["code"], "unknown_revision");
    server.stop();
}

#[test]
fn commits_over_http_and_forwarding() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (repo, _, _) = two_commits(d);
    let r = repo.to_str().unwrap();
    let server = Server::start(&["-C", r, "--max-body", "100K"], d);
    let url = format!("{}/repo", server.base);
    let before = read(&server.base, "/v1/repos/repo/log");

    // A malformed upload is refused and changes nothing (no temporary file stays either).
    let w = bearer(WRITE);
    let (s, _, b) = http(
        &server.base,
        "POST",
        "/v1/repos/repo/commits?message=bad",
        &[("Authorization", &w)],
        b"not a safetensors file",
    );
    assert_eq!(s, 400, "{}", String::from_utf8_lossy(&b));
    let err: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(err["code"], "invalid_safetensors");
    // A zip (a torch.save file) uploaded as safetensors is named for what it is.
    let (s, _, b) = http(
        &server.base,
        "POST",
        "/v1/repos/repo/commits?message=zip",
        &[("Authorization", &w)],
        b"PK\x03\x04\x14\0\0\0 a zip archive",
    );
    assert_eq!(s, 400);
    let err: serde_json::Value = serde_json::from_slice(&b).unwrap();
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("it is a zip archive"), "{message}");
    assert!(
        !message.contains(".mdl"),
        "the upload's path leaked: {message}"
    );
    let (s, _, _) = http(
        &server.base,
        "POST",
        "/v1/repos/repo/commits?bogus=1",
        &[("Authorization", &w)],
        b"",
    );
    assert_eq!(s, 400);
    // Over --max-body: 413, nothing stored.
    let big = vec![0u8; 200 << 10];
    let (s, _, b) = http(
        &server.base,
        "POST",
        "/v1/repos/repo/commits",
        &[("Authorization", &w)],
        &big,
    );
    assert_eq!(s, 413, "{}", String::from_utf8_lossy(&b));
    let err: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(err["code"], "body_too_large");
    // Over the repository's limits: 413 too_large, nothing stored.
    crate::transfer::ok_with(WRITE, &["-C", r, "config", "limits.tensors", "2"]);
    let three = d.join("three.safetensors");
    let upload = write_safetensors(
        &three,
        &[
            tensor("a", "F32", &[4], 1),
            tensor("b", "F32", &[4], 2),
            tensor("c", "F32", &[4], 3),
        ],
        &[],
    );
    let (s, _, b) = http(
        &server.base,
        "POST",
        "/v1/repos/repo/commits?message=many",
        &[("Authorization", &w)],
        &upload,
    );
    assert_eq!(s, 413, "{}", String::from_utf8_lossy(&b));
    let err: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(err["code"], "too_large");
    assert!(
        err["message"].as_str().unwrap().contains("limits.tensors"),
        "{err}"
    );
    let after = read(&server.base, "/v1/repos/repo/log");
    assert_eq!(before, after);
    let incoming = repo.join(".mdl/incoming");
    assert_eq!(
        std::fs::read_dir(&incoming).map(|d| d.count()).unwrap_or(0),
        0
    );
    crate::transfer::ok_with(WRITE, &["-C", r, "config", "limits.tensors", "1048576"]);

    // Commit over HTTP with -C URL and a token.
    let f = d.join("c.safetensors");
    let bytes = write_safetensors(&f, &mixed(7), &[]);
    let fs = f.to_str().unwrap();
    let out = Command::new(mdl_bin())
        .args([
            "-C",
            &url,
            "--token",
            WRITE,
            "commit",
            fs,
            "-m",
            "over http",
            "--metric",
            "loss=1.5",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Without a token: refused with a one-line error.
    let out = Command::new(mdl_bin())
        .args(["commit", fs, "--remote", &url])
        .env_remove("MDL_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unauthorized") && err.trim().lines().count() == 1,
        "{err}"
    );

    // Commands in the served directory are forwarded (the server holds the lock).
    let log = json(&repo, &["log"]);
    assert_eq!(log[0]["id"], c["id"]);
    assert_eq!(log[0]["message"], "over http");
    // The uploaded file keeps its name in the commit's tree.
    let shown = json(&repo, &["show", c["id"].as_str().unwrap()]);
    let name = Path::new(fs).file_name().unwrap().to_str().unwrap();
    assert_eq!(shown["files"][0]["path"], name);
    let f2 = d.join("d.safetensors");
    write_safetensors(&f2, &mixed(8), &[]);
    let c2 = json(&repo, &["commit", f2.to_str().unwrap(), "-m", "forwarded"]);
    assert_eq!(json(&repo, &["log"])[0]["id"], c2["id"]);
    let pulled = d.join("pulled.safetensors");
    ok(
        &repo,
        &["checkout", "main~1", "-o", pulled.to_str().unwrap()],
    );
    assert_eq!(std::fs::read(&pulled).unwrap(), bytes);
    // Tags, reset and the reflog run on the server too.
    let tagged = json(&repo, &["tag", "v1", "main~1", "-m", "first"]);
    assert!(tagged["message"]
        .as_str()
        .unwrap()
        .starts_with("tag v1 at "));
    let tags = json(&repo, &["tag"]);
    assert_eq!(tags[0]["name"], "v1");
    assert_eq!(tags[0]["target"], c["id"]);
    assert_eq!(tags[0]["message"], "first");
    let moved = json(&repo, &["reset", "v1"]);
    assert_eq!(moved["to"], c["id"]);
    assert_eq!(moved["from"], c2["id"]);
    let reflog = json(&repo, &["reflog"]);
    assert_eq!(reflog["ref"], "refs/heads/main");
    assert_eq!(reflog["entries"][0]["new"], c["id"]);
    assert_eq!(reflog["entries"][1]["new"], c2["id"]);
    ok(&repo, &["reset", c2["id"].as_str().unwrap()]);
    ok(&repo, &["tag", "-d", "v1"]);
    assert_eq!(json(&repo, &["tag"]), serde_json::json!([]));
    // status runs here beside the server and says who owns the repository.
    let st = json(&repo, &["status"]);
    assert_eq!(st["branch"], "main");
    assert_eq!(st["commit"]["id"], c2["id"]);
    assert_eq!(st["served_by"]["url"], url.as_str());
    assert!(ok(&repo, &["status"]).contains(&format!(
        "served by mdl serve (pid {})",
        st["served_by"]["pid"]
    )));
    assert!(repo.join(".mdl/serve.json").exists());
    server.stop();
    let st = json(&repo, &["status"]);
    assert!(st["served_by"].is_null());
    assert!(ok(&repo, &["status"]).contains("not served"));
    assert!(
        !repo.join(".mdl/serve.json").exists(),
        "advertisement left behind"
    );

    // Locally afterwards: the commit is there, byte for byte.
    let out = d.join("after.safetensors");
    ok(&repo, &["checkout", "main~1", "-o", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    assert_fsck_clean(&repo);

    // A stale advertisement (its process is gone) is ignored and cleared.
    std::fs::write(
        repo.join(".mdl/serve.json"),
        r#"{"pid":999999999,"url":"http://127.0.0.1:9/repo","token":"x"}"#,
    )
    .unwrap();
    ok(&repo, &["log"]);
    ok(&repo, &["branch", "x"]);
    assert!(
        !repo.join(".mdl/serve.json").exists(),
        "stale advertisement kept"
    );
}

/// `mdl init http://…` creates a repository on a server of a folder of repositories, for an
/// admin token; anything else is refused with its reason and creates nothing.
#[test]
fn init_over_http_where_the_server_allows_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let here = dir.path();
    let server = Server::start(&["--root", root.to_str().unwrap()], here);
    let url = format!("{}/run-2", server.base);
    let with = |token: &str, args: &[&str]| -> Vec<String> {
        let mut all = vec!["--token".to_string(), token.to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        all
    };
    let run = |args: Vec<String>| -> std::process::Output {
        Command::new(mdl_bin())
            .current_dir(here)
            .args(&args)
            .output()
            .unwrap()
    };
    // A write token may not create; nothing is made.
    let out = run(with(WRITE, &["init", &url]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("needs admin"), "{err}");
    assert!(!root.join("run-2").exists());
    // An admin token creates it, and it is a repository like any other.
    let made = run(with(ADMIN, &["init", &url, "--json"]));
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&made.stdout).unwrap();
    assert_eq!(doc["path"], url.as_str());
    assert!(root.join("run-2").join(".mdl").is_dir());
    let ckpt = here.join("c.safetensors");
    write_safetensors(&ckpt, &mixed(3), &[]);
    let c = ckpt.to_str().unwrap();
    assert!(run(with(WRITE, &["-C", &url, "commit", c, "-m", "first"]))
        .status
        .success());
    let log = run(with(READ, &["-C", &url, "log", "--json"]));
    let log: serde_json::Value = serde_json::from_slice(&log.stdout).unwrap();
    assert_eq!(log[0]["message"], "first");
    // Again: it exists (any token learns that); a bad name is refused before anything.
    for token in [ADMIN, WRITE] {
        let again = run(with(token, &["init", &url]));
        let err = String::from_utf8_lossy(&again.stderr);
        assert!(
            !again.status.success() && err.contains("exists already"),
            "{err}"
        );
    }
    let bad = run(with(ADMIN, &["init", &format!("{}/.hidden", server.base)]));
    assert!(!bad.status.success());
    let listed: Vec<_> = std::fs::read_dir(&root).unwrap().flatten().collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    server.stop();

    // A server of one repository creates none.
    let one = Server::start(&["-C", root.join("run-2").to_str().unwrap()], here);
    let out = run(with(ADMIN, &["init", &format!("{}/other", one.base)]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("creates none"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    one.stop();
}
