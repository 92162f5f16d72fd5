//! `mdl serve` and remotes: the real server on 127.0.0.1:0, driven over HTTP and by `mdl`.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::util::*;

pub const READ: &str = "rrrrrrrrrrrrrrrrrrrrrrrr";
pub const WRITE: &str = "wwwwwwwwwwwwwwwwwwwwwwww";

/// A running `mdl serve`, stopped with SIGTERM when dropped.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Server {
    /// Starts `mdl serve --addr 127.0.0.1:0` with `args` (e.g. `-C repo`), a tokens file with
    /// a read and a write token, and waits until it listens.
    pub fn start(args: &[&str], tokens_dir: &Path) -> Server {
        Server::spawn(Command::new(mdl_bin()), args, tokens_dir)
    }

    /// [`Server::start`] from `mdl`, a command with its environment set.
    pub fn spawn(mut mdl: Command, args: &[&str], tokens_dir: &Path) -> Server {
        let tokens = tokens_dir.join("tokens");
        std::fs::write(
            &tokens,
            format!("# test tokens\nreader read {READ}\nwriter write {WRITE}\n"),
        )
        .unwrap();
        let mut child = mdl
            .args(["serve", "--addr", "127.0.0.1:0", "--tokens"])
            .arg(&tokens)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start mdl serve");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let base = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Server { child, base }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the server (SIGTERM) and waits for it.
    pub fn stop(mut self) {
        self.terminate();
    }

    fn terminate(&mut self) {
        #[allow(unsafe_code)]
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let status = self.child.wait().unwrap();
        assert!(status.success(), "mdl serve exited with {status}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A plain HTTP/1.1 request on a fresh connection (paths are sent exactly as given).
/// Returns (status, headers lowercased, body).
pub fn http(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let addr = base.strip_prefix("http://").unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of headers");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    (status, headers, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let n = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        b = &b[eol + 2..];
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[..n]);
        b = &b[n + 2..];
    }
}

/// `GET path` with the read token; the body.
pub fn read(base: &str, path: &str) -> Vec<u8> {
    let (status, _, body) = http(base, "GET", path, &[("Authorization", &bearer(READ))], b"");
    assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
    body
}

fn read_json(base: &str, path: &str) -> serde_json::Value {
    serde_json::from_slice(&read(base, path)).unwrap()
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> &'a str {
    h.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} header in {h:?}"))
}

pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// A repository `DIR/repo` with a lossless and a lossy commit of a float checkpoint.
fn two_commits(dir: &Path) -> (PathBuf, Vec<u8>, Vec<u8>) {
    let repo = dir.join("repo");
    ok(dir, &["init", "repo"]);
    let t = |seed: u64| {
        vec![
            tensor("model.w", "F32", &[128, 64], seed),
            tensor("model.b", "BF16", &[300], seed + 1),
            tensor("optim.step", "I64", &[], seed),
            tensor("empty", "F32", &[0, 4], seed),
            tensor("model.v", "F32", &[40, 40], seed + 2),
        ]
    };
    let f1 = dir.join("a.safetensors");
    let b1 = write_safetensors(&f1, &t(1), &[("step", "1")]);
    ok(&repo, &["commit", f1.to_str().unwrap(), "-m", "exact"]);
    let f2 = dir.join("b.safetensors");
    let b2 = write_safetensors(&f2, &t(5), &[("step", "2")]);
    ok(
        &repo,
        &["commit", f2.to_str().unwrap(), "-m", "lossy", "--lossy"],
    );
    (repo, b1, b2)
}

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
    let after = read(&server.base, "/v1/repos/repo/log");
    assert_eq!(before, after);
    let incoming = repo.join(".mdl/incoming");
    assert_eq!(
        std::fs::read_dir(&incoming).map(|d| d.count()).unwrap_or(0),
        0
    );

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
    fails(&repo, &["reflog"], "does not run over HTTP");
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
    assert!(
        err.contains(&format!("`mdl reset {}`", &tips[won[0]][..12])),
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

#[test]
fn a_served_repository_is_inspected_and_administered_from_its_folder() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _, _) = two_commits(dir.path());
    let local_diff = json(&repo, &["diff", "HEAD~1", "HEAD"]);
    let local_stats = json(&repo, &["stats"]);
    let server = Server::start(&["-C", repo.to_str().unwrap()], dir.path());

    // Read: the same answers as from the repository itself.
    assert_eq!(json(&repo, &["diff", "HEAD~1", "HEAD"]), local_diff);
    assert_eq!(json(&repo, &["stats"]), local_stats);
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
    let names: Vec<&str> = branches
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["main"]);
    // The deletion, the move and the creation are in the branch's reflog, as if run locally.
    let reflog = json(&repo, &["reflog", "exp"]);
    let messages: Vec<&str> = reflog["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
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
