//! Repositories in object storage, against a real S3-compatible server: SeaweedFS (`weed mini`,
//! installed by `scripts/seaweedfs-env.sh`, found through `MDL_WEED`), started by each test
//! on free loopback ports with a bucket of its own. Every "machine" is a separate cache
//! (`MDL_CACHE_DIR`), so writers share nothing but the bucket.
//!
//! Ignored in a plain `cargo test` (they need the server); `scripts/test.sh` installs it and
//! runs them, so CI never skips them.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::journeys::nudged;
use crate::util::{mdl_bin, mixed, tensor, write_safetensors, T};

const KEY: &str = "mdl-test-key";
const SECRET: &str = "mdl-test-secret";
pub(crate) const BUCKET: &str = "mdl";

/// Every port `weed mini` opens, set so that servers started in parallel do not collide; the
/// S3 port is the 7th.
const PORT_FLAGS: [&str; 12] = [
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
    "admin.port",
    "admin.port.grpc",
];

/// A running `weed mini` with its data folder; killed when dropped.
pub(crate) struct Weed {
    child: Option<Child>,
    dir: tempfile::TempDir,
    ports: Vec<u16>,
    pub endpoint: String,
}

fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

impl Weed {
    /// Starts SeaweedFS with a bucket named [`BUCKET`] and waits until its S3 port answers.
    pub(crate) fn start() -> Weed {
        let dir = tempfile::tempdir().unwrap();
        let ports = free_ports(PORT_FLAGS.len());
        let mut weed = Weed {
            child: None,
            endpoint: format!("http://127.0.0.1:{}", ports[6]),
            dir,
            ports,
        };
        // A port taken between choosing and binding it (tests start servers in parallel)
        // makes weed fail: try again on other ports.
        for _ in 0..2 {
            if weed.spawn().is_ok() {
                return weed;
            }
            weed.kill();
            weed.ports = free_ports(PORT_FLAGS.len());
            weed.endpoint = format!("http://127.0.0.1:{}", weed.ports[6]);
        }
        if let Err(log) = weed.spawn() {
            panic!("SeaweedFS did not start: {log}");
        }
        weed
    }

    fn spawn(&mut self) -> Result<(), String> {
        let bin = std::env::var("MDL_WEED").expect("MDL_WEED names SeaweedFS's weed binary");
        let p = &self.ports;
        let data = self.dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let log = std::fs::File::create(self.dir.path().join("weed.log")).unwrap();
        let mut cmd = Command::new(bin);
        cmd.arg("mini")
            .arg(format!("-dir={}", data.display()))
            .args([
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-webdav=false",
                "-admin.ui=false",
            ])
            .arg(format!("-bucket={BUCKET}"))
            .args(PORT_FLAGS.iter().zip(p).map(|(k, v)| format!("-{k}={v}")))
            // weed mini makes these its admin identity: requests signed with them are allowed.
            .env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null());
        self.child = Some(cmd.spawn().expect("start weed"));
        let started = Instant::now();
        // Up when a signed request lists the bucket.
        while started.elapsed() < Duration::from_secs(60) {
            if self.probe() {
                return Ok(());
            }
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Err(std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default())
    }

    fn probe(&self) -> bool {
        // The client retries a refused connection for minutes: ask only once the port is open.
        let addr = format!("127.0.0.1:{}", self.ports[6]);
        if std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(1))
            .is_err()
        {
            return false;
        }
        let probe = tempfile::tempdir().unwrap();
        let out = self
            .mdl(
                probe.path(),
                &["-C", &format!("s3://{BUCKET}/probe"), "log"],
            )
            .stderr;
        let err = String::from_utf8_lossy(&out);
        err.contains("is not an mdl repository")
    }

    /// Kills the server (SIGKILL), leaving its data.
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same ports and data.
    pub(crate) fn restart(&mut self) {
        self.kill();
        if let Err(log) = self.spawn() {
            panic!("SeaweedFS did not start again: {log}");
        }
    }

    /// `mdl ARGS` as a machine whose cache is `cache`, talking to this server.
    pub(crate) fn command(&self, cache: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(mdl_bin());
        c.args(args)
            .env("MDL_AUTHOR", "tester")
            .env("MDL_CACHE_DIR", cache)
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("AWS_ALLOW_HTTP", "true")
            .env_remove("AWS_REGION")
            .env_remove("AWS_PROFILE");
        c
    }

    pub(crate) fn mdl(&self, cache: &Path, args: &[&str]) -> Output {
        self.command(cache, args).output().expect("run mdl")
    }
}

impl Drop for Weed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A repository in the test's bucket, and the machines that use it.
pub(crate) struct Repo {
    pub(crate) weed: Weed,
    pub(crate) url: String,
    root: tempfile::TempDir,
    /// Checkouts made so far (each into a file of its own).
    checkouts: std::sync::atomic::AtomicU32,
}

impl Repo {
    pub(crate) fn new(name: &str) -> Repo {
        let weed = Weed::start();
        let repo = Repo {
            url: format!("s3://{BUCKET}/{name}"),
            weed,
            root: tempfile::tempdir().unwrap(),
            checkouts: Default::default(),
        };
        repo.ok("init-machine", &["init"]);
        repo
    }

    /// The cache of machine `m`.
    pub(crate) fn cache(&self, m: &str) -> PathBuf {
        self.root.path().join("cache").join(m)
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    /// `mdl -C AT ARGS` on machine `m`: the bucket, a folder or a server.
    pub(crate) fn run_at(&self, m: &str, at: &str, args: &[&str]) -> Output {
        let mut all = vec!["-C", at];
        all.extend_from_slice(args);
        self.weed.mdl(&self.cache(m), &all)
    }

    pub(crate) fn ok(&self, m: &str, args: &[&str]) -> String {
        self.ok_at(m, &self.url, args)
    }

    pub(crate) fn ok_at(&self, m: &str, at: &str, args: &[&str]) -> String {
        let out = self.run_at(m, at, args);
        assert!(
            out.status.success(),
            "mdl -C {at} {args:?} on {m} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    pub(crate) fn fails(&self, m: &str, args: &[&str], want: &str) -> String {
        self.fails_at(m, &self.url, args, want)
    }

    pub(crate) fn fails_at(&self, m: &str, at: &str, args: &[&str], want: &str) -> String {
        let out = self.run_at(m, at, args);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(err.contains(want), "{args:?}: {err:?} lacks {want:?}");
        assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err:?}");
        err
    }

    /// Commit ids of `rev`'s history, newest first, as machine `m` sees it.
    pub(crate) fn history(&self, m: &str, rev: &str) -> Vec<String> {
        self.history_at(m, &self.url, &[rev])
    }

    /// Commit ids `log ARGS` lists at `at`, newest first.
    pub(crate) fn history_at(&self, m: &str, at: &str, args: &[&str]) -> Vec<String> {
        let mut all = vec!["log", "--json"];
        all.extend_from_slice(args);
        let log: serde_json::Value = serde_json::from_str(&self.ok_at(m, at, &all)).unwrap();
        log.as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_string())
            .collect()
    }

    /// Checks out on machine `m`, at `at`, with `args` (the revision and any flags), into a
    /// file of its own, and asserts it holds `want`.
    pub(crate) fn checks_out(&self, m: &str, at: &str, args: &[&str], want: &[u8]) {
        use std::sync::atomic::Ordering::Relaxed;
        let out = self.path(&format!("out-{}", self.checkouts.fetch_add(1, Relaxed)));
        let args = [&["checkout", "-o", out.to_str().unwrap()], args].concat();
        self.ok_at(m, at, &args);
        assert_eq!(std::fs::read(&out).unwrap(), want, "{m}: {args:?}");
    }

    /// Checkpoint `n` written to a file: its path and bytes.
    pub(crate) fn checkpoint(&self, n: u64) -> (PathBuf, Vec<u8>) {
        let f = self.path(&format!("ckpt-{n}.safetensors"));
        let bytes = write_safetensors(&f, &mixed(n), &[]);
        (f, bytes)
    }
}

#[test]
#[ignore = "needs SeaweedFS (MDL_WEED); scripts/test.sh installs it and runs these"]
fn commands_run_on_a_repository_in_object_storage() {
    let r = Repo::new("team/run");
    r.fails("a", &["init"], "is already an mdl repository");
    // `mdl init URL`, as the README and the hints spell it: the repository is made there, and
    // no folder here.
    let (here, fresh) = (r.path("."), format!("s3://{BUCKET}/fresh"));
    r.ok_at("a", here.to_str().unwrap(), &["init", &fresh]);
    assert!(!here.join("s3:").exists());
    r.fails_at("a", here.to_str().unwrap(), &["init", &fresh], "already");
    r.ok_at("a", &fresh, &["branch"]);
    let out = r.weed.mdl(
        &r.cache("a"),
        &["-C", &format!("s3://{BUCKET}/nothing"), "log"],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not an mdl repository"));

    // Machine a commits two checkpoints; machine b, with a cache of its own, sees them and
    // checks out each byte for byte.
    let f1 = r.path("one.safetensors");
    let one = write_safetensors(&f1, &mixed(1), &[]);
    let f2 = r.path("two.safetensors");
    let two = write_safetensors(&f2, &mixed(2), &[]);
    let c1 = r.ok(
        "a",
        &["commit", f1.to_str().unwrap(), "-m", "one", "--step", "1"],
    );
    let c2 = r.ok(
        "a",
        &["commit", f2.to_str().unwrap(), "-m", "two", "--step", "2"],
    );
    assert_eq!(
        r.history("b", "main"),
        vec![c2.trim().to_string(), c1.trim().to_string()]
    );
    for (rev, want) in [("HEAD", &two), ("HEAD~1", &one)] {
        r.checks_out("b", &r.url, &[rev], want);
    }
    let show = r.ok("b", &["show", "HEAD"]);
    assert!(show.contains("two"), "{show}");
    r.ok("b", &["diff", "HEAD~1", "HEAD"]);
    r.ok("b", &["stats"]);
    r.ok("b", &["fsck"]);

    // Branches, tags and settings made on one machine are seen on another; deletions too.
    r.ok("b", &["branch", "exp", "HEAD~1"]);
    r.ok("b", &["tag", "v1", "HEAD", "-m", "first release"]);
    r.ok("b", &["config", "delta.max_depth", "8"]);
    assert!(r.ok("c", &["branch"]).contains("exp"));
    assert!(r.ok("c", &["tag"]).contains("v1"));
    assert!(r.ok("c", &["config", "delta.max_depth"]).contains('8'));
    r.ok("c", &["branch", "-d", "exp"]);
    assert!(!r.ok("a", &["branch"]).contains("exp"));
    r.ok("a", &["branch", "exp", "HEAD"]);
    assert!(r.ok("c", &["branch"]).contains("exp"));
    // Moving a branch back (branch -f, reset) is published like any ref change.
    r.ok("c", &["branch", "-f", "exp", "HEAD~1"]);
    assert_eq!(r.history("a", "exp"), vec![c1.trim().to_string()]);
    r.ok("c", &["switch", "exp"]);
    r.ok("c", &["reset", c2.trim()]);
    r.ok("c", &["switch", "main"]);
    assert_eq!(r.history("b", "exp")[0], c2.trim());

    // commit -b onto a branch of its own, then checked out elsewhere.
    let f3 = r.path("three.safetensors");
    let three = write_safetensors(&f3, &mixed(3), &[]);
    r.ok(
        "a",
        &["commit", f3.to_str().unwrap(), "-b", "job-2", "-m", "three"],
    );
    r.checks_out("c", &r.url, &["job-2"], &three);

    // compact and fsck --repair work on this machine's copy: compaction to depth 0 leaves
    // every checkout exact; a copy whose database is gone is rebuilt and brought up to date.
    r.ok("a", &["compact", "--max-depth", "0"]);
    r.checks_out("a", &r.url, &["HEAD~1"], &one);
    let replicas = r.cache("b").join("s3");
    let replica = std::fs::read_dir(&replicas)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::remove_file(replica.join("repo/.mdl/meta.redb")).unwrap();
    r.ok("b", &["fsck", "--repair"]);
    r.ok("b", &["fsck"]);
    r.checks_out("b", &r.url, &["HEAD~1"], &one);

    // A push with no remote fails as in a local repository, and changes nothing.
    let before = r.history("a", "main");
    r.fails("a", &["push"], "no remote named origin");
    assert_eq!(r.history("c", "main"), before);
    // A bad input fails with its usual error and publishes nothing.
    let before = r.history("a", "main");
    r.fails(
        "a",
        &["commit", r.path("missing").to_str().unwrap(), "-m", "x"],
        "missing",
    );
    assert_eq!(r.history("c", "main"), before);
    // A machine's copy can be thrown away: the next command makes it again.
    std::fs::remove_dir_all(r.cache("b")).unwrap();
    assert_eq!(r.history("b", "main"), before);
}

#[test]
#[ignore = "needs SeaweedFS (MDL_WEED); scripts/test.sh installs it and runs these"]
fn writers_racing_on_one_branch_lose_no_commit() {
    let r = Repo::new("race");
    let rounds = 6;
    let writers = 3;
    let mut files = Vec::new();
    for i in 0..rounds * writers {
        let f = r.path(&format!("c{i}.safetensors"));
        write_safetensors(&f, &[tensor("w", "F32", &[256, 64], 100 + i as u64)], &[]);
        files.push(f);
    }
    let mut landed = Vec::new();
    for round in 0..rounds {
        let children: Vec<_> = (0..writers)
            .map(|w| {
                let f = &files[round * writers + w];
                let url = r.url.clone();
                let mut c = r.weed.command(
                    &r.cache(&format!("w{w}")),
                    &[
                        "-C",
                        &url,
                        "commit",
                        f.to_str().unwrap(),
                        "-m",
                        &format!("r{round} w{w}"),
                    ],
                );
                c.stdout(Stdio::piped()).stderr(Stdio::piped());
                c.spawn().unwrap()
            })
            .collect();
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "a racing commit failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            landed.push(String::from_utf8(out.stdout).unwrap().trim().to_string());
        }
    }
    // Every commit printed is on main, once, in one line of history.
    let history = r.history("reader", "main");
    assert_eq!(history.len(), rounds * writers, "{history:?}");
    let mut sorted_history = history.clone();
    sorted_history.sort();
    landed.sort();
    assert_eq!(sorted_history, landed);
    let log: serde_json::Value = serde_json::from_str(&r.ok("reader", &["log", "--json"])).unwrap();
    for pair in log.as_array().unwrap().windows(2) {
        assert_eq!(pair[0]["parents"][0], pair[1]["id"], "history is a line");
    }
    // Each checks out as the file its writer committed.
    for (i, f) in files.iter().enumerate().step_by(5) {
        let msg = format!("r{} w{}", i / writers, i % writers);
        let entry = log
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["message"] == msg.as_str())
            .unwrap();
        let out = r.path(&format!("out{i}"));
        r.ok(
            "reader",
            &[
                "checkout",
                entry["id"].as_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ],
        );
        assert_eq!(
            std::fs::read(&out).unwrap(),
            std::fs::read(f).unwrap(),
            "{msg}"
        );
    }
}

#[test]
#[ignore = "needs SeaweedFS (MDL_WEED); scripts/test.sh installs it and runs these"]
fn a_writer_killed_mid_commit_leaves_the_repository_as_it_was() {
    let r = Repo::new("killed");
    let f = r.path("base.safetensors");
    let w = tensor("w", "F32", &[512, 512], 1);
    let moved = T {
        data: nudged(&w.data, 3),
        ..tensor("w", "F32", &[512, 512], 1)
    };
    write_safetensors(&f, &[w], &[]);
    r.ok("a", &["commit", f.to_str().unwrap(), "-m", "base"]);
    let before = r.history("observer", "main");
    let big = r.path("big.safetensors");
    write_safetensors(&big, &[moved], &[]);
    for delay_ms in [5u64, 40, 120, 300, 700] {
        let mut c = r.weed.command(
            &r.cache("victim"),
            &[
                "-C",
                &r.url,
                "commit",
                big.to_str().unwrap(),
                "-m",
                "killed",
            ],
        );
        c.stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = c.spawn().unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        let status = child.wait().unwrap();
        let now = r.history("observer", "main");
        if status.success() {
            // It finished before the kill: then it is all there.
            assert_eq!(now.len(), before.len() + 1);
            return;
        }
        assert!(now == before || now.len() == before.len() + 1, "{now:?}");
        if now.len() > before.len() {
            // Killed after the ref moved: the commit is whole.
            let out = r.path("after-kill");
            r.ok(
                "observer",
                &["checkout", "HEAD", "-o", out.to_str().unwrap(), "--force"],
            );
            assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&big).unwrap());
            return;
        }
        // The victim's machine goes on from its interrupted copy.
        r.ok("victim", &["log"]);
    }
    let c = r.ok("victim", &["commit", big.to_str().unwrap(), "-m", "again"]);
    assert_eq!(r.history("observer", "main")[0], c.trim());
}

#[test]
#[ignore = "needs SeaweedFS (MDL_WEED); scripts/test.sh installs it and runs these"]
fn a_commit_rides_out_a_server_restart() {
    let mut r = Repo::new("restart");
    let f = r.path("a.safetensors");
    let data = write_safetensors(&f, &[tensor("w", "F32", &[2048, 1024], 5)], &[]);
    // The server goes away while the commit runs and comes back on the same ports: the
    // client's retries carry the commit through.
    let mut c = r.weed.command(
        &r.cache("a"),
        &["-C", &r.url, "commit", f.to_str().unwrap(), "-m", "x"],
    );
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(150));
    r.weed.restart();
    let out = child.wait_with_output().unwrap();
    // Its ref write once met a pooled connection the restart had dropped, which the client
    // does not try again for a conditional write: mdl does (`Bucket::put`; about one run in
    // six failed before, `s3_availability` cuts one on purpose).
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    r.checks_out("b", &r.url, &["HEAD"], &data);
}

#[test]
#[ignore = "needs SeaweedFS (MDL_WEED); scripts/test.sh installs it and runs these"]
fn what_a_machine_made_but_never_published_is_sent_with_the_next_commit() {
    let r = Repo::new("unpublished");
    let f = r.path("a.safetensors");
    let data = write_safetensors(&f, &mixed(4), &[]);
    r.ok("a", &["log"]);
    // Machine a's copy holds the commit's records, as after a commit killed before it
    // published: made in the copy itself, which the next sync resets to the bucket's refs.
    let copies: Vec<_> = std::fs::read_dir(r.cache("a").join("s3"))
        .unwrap()
        .collect();
    assert_eq!(copies.len(), 1);
    let copy = copies[0].as_ref().unwrap().path().join("repo");
    crate::util::ok(
        &copy,
        &["commit", f.to_str().unwrap(), "-m", "never published"],
    );
    // The same checkpoint committed to the bucket: its records go, though the copy had them.
    let id = r.ok("a", &["commit", f.to_str().unwrap(), "-m", "published"]);
    assert_eq!(r.history("b", "main"), vec![id.trim().to_string()]);
    r.checks_out("b", &r.url, &["HEAD"], &data);
}

#[test]
#[ignore = "needs SeaweedFS (MDL_WEED); scripts/test.sh installs it and runs these"]
fn history_moves_between_local_repositories_and_object_storage() {
    let r = Repo::new("shared");
    let ok = |m: &str, dir: &Path, args: &[&str]| r.ok_at(m, dir.to_str().unwrap(), args);
    let fails = |m: &str, dir: &Path, args: &[&str], want: &str| {
        r.fails_at(m, dir.to_str().unwrap(), args, want);
    };
    let history = |m: &str, dir: &Path, rev: &str| r.history_at(m, dir.to_str().unwrap(), &[rev]);
    let checkpoint = |n: u64| r.checkpoint(n);

    // A local repository's history, pushed: the bucket holds the same commits, ids and all.
    let a = r.path("a");
    ok("a", &r.path("."), &["init", a.to_str().unwrap()]);
    let (f1, one) = checkpoint(1);
    let (f2, _) = checkpoint(2);
    ok("a", &a, &["commit", f1.to_str().unwrap(), "-m", "one"]);
    ok("a", &a, &["commit", f2.to_str().unwrap(), "-m", "two"]);
    fails(
        "a",
        &a,
        &["remote", "add", "bad", "s3://A/x"],
        "expected s3://BUCKET[/PREFIX]",
    );
    ok("a", &a, &["remote", "add", "s3", &r.url]);
    ok("a", &a, &["push", "s3"]);
    assert_eq!(r.history("x", "main"), history("a", &a, "main"));

    // Cloned on another machine, checked out byte for byte; its commit pushed back and pulled.
    let b = r.path("b");
    ok("b", &r.path("."), &["clone", &r.url, b.to_str().unwrap()]);
    assert_eq!(history("b", &b, "main"), history("a", &a, "main"));
    r.checks_out("b", b.to_str().unwrap(), &["HEAD~1"], &one);
    let (f3, three) = checkpoint(3);
    ok("b", &b, &["commit", f3.to_str().unwrap(), "-m", "three"]);
    ok("b", &b, &["push", "origin"]);
    ok("a", &a, &["pull", "s3"]);
    assert_eq!(history("a", &a, "main"), history("b", &b, "main"));
    assert_eq!(r.history("x", "main"), history("b", &b, "main"));
    r.checks_out("a", a.to_str().unwrap(), &["HEAD"], &three);

    // Tags made in the bucket arrive with a fetch.
    r.ok("x", &["tag", "v1", "HEAD~1"]);
    ok("a", &a, &["fetch", "s3"]);
    assert!(ok("a", &a, &["tag"]).contains("v1"));

    // Diverged: the push is refused and the bucket's branch is as it was; --force replaces it.
    let (f4, _) = checkpoint(4);
    let (f5, _) = checkpoint(5);
    ok("a", &a, &["commit", f4.to_str().unwrap(), "-m", "four"]);
    r.ok("x", &["commit", f5.to_str().unwrap(), "-m", "five"]);
    let before = r.history("y", "main");
    fails("a", &a, &["push", "s3"], "not a fast-forward");
    assert_eq!(r.history("y", "main"), before);
    fails("a", &a, &["pull", "s3"], "have diverged");
    ok("a", &a, &["push", "s3", "--force"]);
    assert_eq!(r.history("y", "main"), history("a", &a, "main"));

    // A clone of nothing fails and makes no folder.
    let c = r.path("c");
    fails(
        "c",
        &r.path("."),
        &[
            "clone",
            &format!("s3://{BUCKET}/nothing"),
            c.to_str().unwrap(),
        ],
        "is not an mdl repository",
    );
    assert!(!c.exists());

    // The bucket's repository as the local side: pushed into a second one, and a commit made
    // there pulled back by another machine (the remote is a shared setting), ids unchanged.
    let mirror = format!("s3://{BUCKET}/mirror");
    r.ok_at("x", &mirror, &["init"]);
    r.ok("x", &["remote", "add", "mirror", &mirror]);
    r.ok("x", &["push", "mirror"]);
    assert_eq!(
        r.history_at("z", &mirror, &["main"]),
        r.history("z", "main")
    );
    let (f6, six) = checkpoint(6);
    r.ok_at("z", &mirror, &["commit", f6.to_str().unwrap(), "-m", "six"]);
    r.ok("y", &["pull", "mirror"]);
    assert_eq!(
        r.history("w", "main"),
        r.history_at("w", &mirror, &["main"])
    );
    r.checks_out("w", &r.url, &["HEAD"], &six);
    r.fails("y", &["clone", &mirror], "a clone makes a new repository");
    // A remote removed on one machine is gone on the others; its tracking branches too.
    assert!(r.ok("y", &["branch", "-r"]).contains("mirror/main"));
    assert!(r.ok("w", &["remote"]).contains("mirror"));
    r.ok("y", &["remote", "remove", "mirror"]);
    assert!(!r.ok("y", &["branch", "-r"]).contains("mirror/main"));
    assert!(!r.ok("w", &["remote"]).contains("mirror"));
    r.fails("w", &["pull", "mirror"], "no remote named mirror");
}

#[test]
#[ignore = "needs SeaweedFS (MDL_WEED); scripts/test.sh installs it and runs these"]
fn two_servers_over_one_bucket_serve_the_same_repository() {
    use crate::server::{Server, WRITE};
    let r = Repo::new("served");
    let servers: Vec<Server> = ["s1", "s2"]
        .iter()
        .map(|m| {
            let tokens = r.path(m);
            std::fs::create_dir_all(&tokens).unwrap();
            Server::spawn(r.weed.command(&r.cache(m), &[]), &["-C", &r.url], &tokens)
        })
        .collect();
    let urls: Vec<String> = servers
        .iter()
        .map(|s| format!("{}/served", s.base))
        .collect();
    // `mdl -C URL ARGS` against server `i`, as a client machine.
    let via = |i: usize, args: &[&str]| {
        r.ok_at("client", &urls[i], &[&["--token", WRITE], args].concat())
    };
    let history = |i: usize| r.history_at("client", &urls[i], &["--token", WRITE]);
    let checkpoint = |n: u64| r.checkpoint(n);

    // Commits through either server, and straight into the bucket, are one history on both.
    let (f1, one) = checkpoint(1);
    let (f2, _) = checkpoint(2);
    let (f3, _) = checkpoint(3);
    let c1 = via(0, &["commit", f1.to_str().unwrap(), "-m", "one", "--json"]);
    let c2 = via(1, &["commit", f2.to_str().unwrap(), "-m", "two", "--json"]);
    let c3 = r.ok("machine", &["commit", f3.to_str().unwrap(), "-m", "three"]);
    let id = |json: &str| -> String {
        serde_json::from_str::<serde_json::Value>(json).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let want = vec![c3.trim().to_string(), id(&c2), id(&c1)];
    assert_eq!(history(0), want);
    assert_eq!(history(1), want);
    r.checks_out("client", &urls[1], &["--token", WRITE, "HEAD~2"], &one);

    // Commits racing through both servers at once: every one lands, once, in one line, under
    // the id its answer named.
    let ids: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|k| {
                let (f, _) = checkpoint(10 + k);
                let via = &via;
                s.spawn(move || {
                    let msg = format!("race {k}");
                    id(&via(
                        (k % 2) as usize,
                        &["commit", f.to_str().unwrap(), "-m", &msg, "--json"],
                    ))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let after = history(1);
    assert_eq!(after.len(), want.len() + ids.len(), "{after:?}");
    for id in &ids {
        assert!(after.contains(id), "{id} not in {after:?}");
    }
    assert_eq!(history(0), after);

    // A push through one server is cloned through the other, byte for byte.
    let a = r.path("a");
    let local = |dir: &Path, args: &[&str]| {
        r.ok_at(
            "client",
            dir.to_str().unwrap(),
            &[&["--token", WRITE], args].concat(),
        );
    };
    local(&r.path("."), &["clone", &urls[0], a.to_str().unwrap()]);
    let (f4, four) = checkpoint(4);
    local(&a, &["commit", f4.to_str().unwrap(), "-m", "four"]);
    local(&a, &["push"]);
    let b = r.path("b");
    local(&r.path("."), &["clone", &urls[1], b.to_str().unwrap()]);
    r.checks_out("client", b.to_str().unwrap(), &["HEAD"], &four);

    // gc through the servers: one marks what no ref needs (a deleted branch's checkpoint),
    // the other deletes it; every commit still checks out through both.
    let (f5, _) = checkpoint(5);
    r.ok(
        "machine",
        &["commit", f5.to_str().unwrap(), "-b", "tmp", "-m", "dropped"],
    );
    r.ok("machine", &["branch", "-D", "tmp"]);
    let gc = |i: usize| -> serde_json::Value {
        let out = via(i, &["gc", "--prune-older-than", "0s", "--json"]);
        serde_json::from_str(&out).unwrap()
    };
    let marked = gc(0)["marked"].clone();
    assert!(!marked.as_array().unwrap().is_empty(), "{marked}");
    assert_eq!(gc(1)["deleted"], marked);
    for server in &urls {
        r.checks_out("client", server, &["--token", WRITE, &id(&c1)], &one);
        r.checks_out("client", server, &["--token", WRITE, "HEAD"], &four);
    }
    r.fails_at(
        "client",
        &urls[0],
        &["--token", WRITE, "gc", "--expire-reflog", "1d"],
        "keeps no reflog",
    );
    for s in servers {
        s.stop();
    }
}
