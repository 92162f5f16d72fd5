//! `mdl serve` for the tests that drive it: the real server on 127.0.0.1:0, plain HTTP requests,
//! tokens, and a repository to serve.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::util::*;

pub(crate) const READ: &str = "rrrrrrrrrrrrrrrrrrrrrrrr";
pub(crate) const WRITE: &str = "wwwwwwwwwwwwwwwwwwwwwwww";
pub(crate) const ADMIN: &str = "aaaaaaaaaaaaaaaaaaaaaaaa";

/// A running `mdl serve`, stopped with SIGTERM when dropped.
pub(crate) struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Server {
    /// Starts `mdl serve --addr 127.0.0.1:0` with `args` (e.g. `-C repo`), a tokens file with
    /// a read and a write token, and waits until it listens.
    pub(crate) fn start(args: &[&str], tokens_dir: &Path) -> Server {
        Server::spawn(Command::new(mdl_bin()), args, tokens_dir)
    }

    /// [`Server::start`] from `mdl`, a command with its environment set.
    pub(crate) fn spawn(mut mdl: Command, args: &[&str], tokens_dir: &Path) -> Server {
        let tokens = tokens_dir.join("tokens");
        std::fs::write(
            &tokens,
            format!(
                "# test tokens\nreader read {READ}\nwriter write {WRITE}\nadmin admin {ADMIN}\n"
            ),
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
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the server (SIGTERM) and waits for it.
    pub(crate) fn stop(mut self) {
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
pub(crate) fn http(
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
pub(crate) fn read(base: &str, path: &str) -> Vec<u8> {
    let (status, _, body) = http(base, "GET", path, &[("Authorization", &bearer(READ))], b"");
    assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
    body
}

pub(crate) fn read_json(base: &str, path: &str) -> serde_json::Value {
    serde_json::from_slice(&read(base, path)).unwrap()
}

pub(crate) fn header<'a>(h: &'a [(String, String)], name: &str) -> &'a str {
    h.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} header in {h:?}"))
}

pub(crate) fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// A repository `DIR/repo` with a lossless and a lossy commit of a float checkpoint.
pub(crate) fn two_commits(dir: &Path) -> (PathBuf, Vec<u8>, Vec<u8>) {
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
    // What the commits deferred, done now: the repository is in its settled state.
    ok(&repo, &["maintenance"]);
    (repo, b1, b2)
}
