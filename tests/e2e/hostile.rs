//! The server against clients that mean harm or make mistakes: what an error tells them,
//! lengths that lie, slow and idle connections, many requests at once.

use crate::server::{bearer, http, read_json, Server, READ, WRITE};
use crate::util::*;

#[test]
fn errors_name_no_server_paths() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let served = d.join("srv");
    ok(&served, &["init"]);
    let server = Server::start(&["-C", served.to_str().unwrap()], d);
    let auth = bearer(WRITE);
    let secret = d.to_str().unwrap();
    let bodies: [&[u8]; 3] = [
        b"not safetensors at all",
        &[8, 0, 0, 0, 0, 0, 0, 0, b'{'],
        b"",
    ];
    for body in bodies {
        let (status, _, answer) = http(
            &server.base,
            "POST",
            "/v1/repos/srv/commits",
            &[("Authorization", &auth)],
            body,
        );
        let text = String::from_utf8_lossy(&answer);
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("invalid_safetensors"), "{text}");
        assert!(
            !text.contains(secret) && !text.contains("incoming"),
            "{text}"
        );
    }
    server.stop();
}

#[test]
fn a_repository_held_elsewhere_stalls_nothing_else() {
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = d.join("root");
    ok(&root.join("a"), &["init"]);
    // `--wait 20`: how long a change waits for another process's writer.
    let server = Server::start(&["--root", root.to_str().unwrap(), "--wait", "20"], d);
    // `b` appears after the server started (opened on first use), held by another process.
    ok(&root.join("b"), &["init"]);
    let lock = root.join("b/.mdl/lock");
    let mut holder = std::process::Command::new("python3")
        .args([
            "-c",
            "import fcntl,sys,time; f=open(sys.argv[1],'r+'); fcntl.flock(f, fcntl.LOCK_EX); \
             print('held', flush=True); time.sleep(30)",
            lock.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held");

    // A change to `b` waits for the other process; reads of `b` (no lock) and everything of
    // `a` answer at once meanwhile.
    let auth = bearer(WRITE);
    let base = server.base.clone();
    let busy = std::thread::spawn(move || {
        let started = Instant::now();
        let answer = http(
            &base,
            "POST",
            "/v1/repos/b/config",
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            br#"{"key": "delta.max_depth", "value": "5"}"#,
        );
        (answer, started.elapsed())
    });
    let auth = bearer(WRITE);
    let until = Instant::now() + Duration::from_millis(800);
    while Instant::now() < until {
        for repo in ["a", "b"] {
            let started = Instant::now();
            let (status, _, _) = http(
                &server.base,
                "GET",
                &format!("/v1/repos/{repo}/refs"),
                &[("Authorization", &auth)],
                b"",
            );
            assert_eq!(status, 200);
            assert!(
                started.elapsed() < Duration::from_millis(500),
                "{repo} waited"
            );
        }
    }
    assert!(
        !busy.is_finished(),
        "the change did not wait for the other process"
    );
    // Once the other process is gone, the change goes through.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let ((status, _, body), took) = busy.join().unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(took < Duration::from_secs(15), "b answered after {took:?}");
    let config = read_json(&server.base, "/v1/repos/b/config");
    assert!(config.to_string().contains("\"5\""), "{config}");
    server.stop();
}

/// Needs root (it mounts a small tmpfs); `.ci/run` runs it.
#[test]
#[ignore = "mounts a tmpfs (root only); .ci/run runs it"]
fn the_server_recovers_from_a_full_disk_without_a_restart() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mnt = d.join("small");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=24m",
            "tmpfs",
            mnt.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(mounted.success(), "cannot mount a tmpfs (run as root)");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mnt.clone());
    let repo = mnt.join("repo");
    ok(&repo, &["init"]);
    let server = Server::start(&["-C", repo.to_str().unwrap()], d);
    let auth = bearer(WRITE);
    let commit = |n: u64| {
        let f = d.join("ck.safetensors");
        let bytes = write_safetensors(&f, &mixed(500 + n), &[]);
        http(
            &server.base,
            "POST",
            &format!("/v1/repos/repo/commits?message=c{n}"),
            &[("Authorization", &auth)],
            &bytes,
        )
        .0
    };
    assert_eq!(commit(0), 201);
    let filler = mnt.join("filler");
    let mut failures = 0;
    for (i, free_kib) in (0..96).step_by(2).enumerate() {
        // Fill the disk, then leave `free_kib` free.
        {
            let mut f = std::fs::File::create(&filler).unwrap();
            let block = vec![0xa5u8; 1 << 16];
            while f.write_all(&block).is_ok() {}
            let len = f.metadata().unwrap().len();
            f.set_len(len.saturating_sub(free_kib << 10)).unwrap();
        }
        // 413: refused before it is spooled, as it would leave the disk (near) full.
        let status = commit(1 + i as u64);
        assert!(
            matches!(status, 201 | 413 | 500 | 503),
            "free {free_kib} KiB: {status}"
        );
        failures += usize::from(status != 201);
        std::fs::remove_file(&filler).unwrap();
        // Space is back: the very next commits land, without a restart.
        let mut landed = false;
        for attempt in 0..20 {
            match commit(100 + i as u64 * 20 + attempt) {
                201 => {
                    landed = true;
                    break;
                }
                503 => std::thread::sleep(std::time::Duration::from_millis(200)),
                other => panic!("free {free_kib} KiB, space back: {other}"),
            }
        }
        assert!(landed, "free {free_kib} KiB: the server did not recover");
    }
    assert!(failures > 0, "the disk never filled up");
    server.stop();
    assert_fsck_clean(&repo);
}

/// A pack of one frame: `id`, `record`.
fn pack_of(id: [u8; 32], record: &[u8], claimed_len: Option<u64>) -> Vec<u8> {
    let mut p = b"MDLPACK1".to_vec();
    p.extend_from_slice(&id);
    p.extend_from_slice(&claimed_len.unwrap_or(record.len() as u64).to_le_bytes());
    p.extend_from_slice(record);
    p.extend_from_slice(&[0u8; 40]);
    p
}

/// A float-split record of an f32 tensor of `elems` elements, every plane a constant stream:
/// a few dozen bytes that honestly decode to `4 × elems` bytes of zeros.
fn constant_tensor_record(elems: u64, claimed: u64) -> Vec<u8> {
    use mdl_format::record::{encode, RecordHeader};
    use mdl_format::{Dtype, ObjectKind, TensorHeader};
    let prefix = TensorHeader::new(Dtype::F32, vec![elems]).canonical();
    let mut payload = vec![4u8, 0];
    for _ in 0..4 {
        payload.extend_from_slice(&2u64.to_le_bytes());
    }
    for _ in 0..4 {
        payload.extend_from_slice(&[1, 0]);
    }
    encode(
        &RecordHeader::new(ObjectKind::Tensor, 2, None, prefix),
        &payload,
        claimed,
    )
}

#[test]
fn lengths_that_lie_are_refused_without_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let served = d.join("srv");
    ok(&served, &["init"]);
    let server = Server::start(&["-C", served.to_str().unwrap()], d);
    let auth = bearer(WRITE);
    let send = |body: &[u8]| {
        let (status, _, answer) = http(
            &server.base,
            "POST",
            "/v1/repos/srv/objects",
            &[("Authorization", &auth)],
            body,
        );
        (status, String::from_utf8_lossy(&answer).to_string())
    };
    // A 48-byte pack whose frame claims 60 GiB.
    let mut tiny = b"MDLPACK1".to_vec();
    tiny.extend_from_slice(&[7u8; 32]);
    tiny.extend_from_slice(&(60u64 << 30).to_le_bytes());
    assert_eq!(tiny.len(), 48);
    let (status, text) = send(&tiny);
    assert_eq!(status, 400, "{text}");
    // A record whose trailer claims 2^40 decoded bytes for a 16-element tensor.
    let (status, text) = send(&pack_of(
        [8; 32],
        &constant_tensor_record(16, 1 << 40),
        None,
    ));
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("cannot hold"), "{text}");
    // A few dozen bytes that honestly decode to 1 GiB: refused before decoding.
    let bomb = pack_of([9; 32], &constant_tensor_record(1 << 28, 1 << 30), None);
    assert!(bomb.len() < 200, "{}", bomb.len());
    let (status, text) = send(&bomb);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("decode to"), "{text}");
    // The server is still there, and never held anything near those sizes.
    let (status, _, _) = http(
        &server.base,
        "GET",
        "/v1/repos/srv/refs",
        &[("Authorization", &auth)],
        b"",
    );
    assert_eq!(status, 200);
    let peak = peak_kib(server.pid());
    assert!(peak < 300 << 10, "peak memory {peak} KiB");
    server.stop();
    assert_fsck_clean(&served);
}

/// A bounded slow-client run on loopback: 100 connections that trickle their headers a byte
/// at a time, against a server allowed 96 descriptors and 48 connections. The slow ones are
/// closed once the header timeout passes (without a cap they would take every descriptor),
/// and a real request behind them gets its answer within a few timeouts.
#[test]
fn slow_and_idle_clients_cannot_starve_the_server() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let served = d.join("srv");
    ok(&served, &["init"]);
    let server = Server::start(
        &[
            "-C",
            served.to_str().unwrap(),
            "--max-connections",
            "48",
            "--header-timeout",
            "2",
            "--body-timeout",
            "2",
        ],
        d,
    );
    let limited = std::process::Command::new("prlimit")
        .args(["--pid", &server.pid().to_string(), "--nofile=96:96"])
        .status()
        .unwrap();
    assert!(limited.success());
    let addr = server.base.strip_prefix("http://").unwrap().to_string();
    let started = Instant::now();
    let slow: Vec<_> = (0..100)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || -> Option<Duration> {
                let t0 = Instant::now();
                let mut s = TcpStream::connect(&addr).ok()?;
                s.set_read_timeout(Some(Duration::from_millis(400))).ok()?;
                let _ = s.write_all(b"GET /v1/repos HTTP/1.1\r\nHost: x\r\nX-Slow: ");
                // A byte every 400 ms for at most 9 s; stop when the server has closed it.
                while t0.elapsed() < Duration::from_secs(9) {
                    let mut buf = [0u8; 256];
                    match s.read(&mut buf) {
                        Ok(0) => return Some(t0.elapsed()),
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(_) => return Some(t0.elapsed()),
                    }
                    if s.write_all(b"a").is_err() {
                        return Some(t0.elapsed());
                    }
                }
                None
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // A real request in the middle of it: answered once slow connections time out.
    let t0 = Instant::now();
    let (status, _, _) = http(
        &server.base,
        "GET",
        "/v1/repos",
        &[("Authorization", &bearer(WRITE))],
        b"",
    );
    assert_eq!(status, 200);
    assert!(
        t0.elapsed() < Duration::from_secs(7),
        "took {:?}",
        t0.elapsed()
    );
    let closed: Vec<Option<Duration>> = slow.into_iter().map(|t| t.join().unwrap()).collect();
    let kept = closed.iter().filter(|c| c.is_none()).count();
    assert_eq!(kept, 0, "{kept} slow connections were kept open for 9 s");
    assert!(started.elapsed() < Duration::from_secs(30));

    // An upload that stops sending: cut off with 408.
    let mut s = TcpStream::connect(&addr).unwrap();
    let head = format!(
        "POST /v1/repos/srv/commits HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Length: 1000\r\n\r\n0123456789",
        bearer(WRITE)
    );
    s.write_all(head.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t0 = Instant::now();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        t0.elapsed() < Duration::from_secs(6),
        "took {:?}",
        t0.elapsed()
    );
    server.stop();
}

/// A client that asks for a checkpoint and then stops reading holds what the server decoded
/// for it (its share of the decode budget) only until the body timeout: the connection is cut
/// and every other pull goes on. Before, it held it for as long as it kept the connection.
#[test]
fn a_client_that_stops_reading_holds_the_decode_budget_only_briefly() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let served = d.join("srv");
    ok(&served, &["init"]);
    // Four 24 MiB tensors: far more than loopback's socket buffers and the stream's queue hold.
    let tensors: Vec<T> = (0..4)
        .map(|i| tensor(&format!("t{i}"), "U8", &[24 << 20], 40 + i))
        .collect();
    let file = d.join("big.safetensors");
    let bytes = write_safetensors(&file, &tensors, &[]);
    ok(&served, &["commit", file.to_str().unwrap(), "-m", "big"]);
    // A budget of one tensor at a time: whoever holds it holds every pull.
    let server = Server::start(
        &[
            "-C",
            served.to_str().unwrap(),
            "--decode-memory",
            "48M",
            "--body-timeout",
            "2",
        ],
        d,
    );
    let addr = server.base.strip_prefix("http://").unwrap().to_string();
    let path = "/v1/repos/srv/checkpoints/main.safetensors";
    let auth = bearer(WRITE);
    let mut stalled = TcpStream::connect(&addr).unwrap();
    write!(
        stalled,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n\r\n"
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(1500));

    // Another pull, whole and byte-identical, within a few body timeouts.
    let t0 = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let base = server.base.clone();
    std::thread::spawn(move || {
        let _ = tx.send(http(&base, "GET", path, &[("Authorization", &auth)], b""));
    });
    let (status, _, body) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a pull waited 30 s behind a client that stopped reading");
    assert_eq!(status, 200);
    assert!(body == bytes, "the pull differs from the committed file");
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t0.elapsed()
    );

    // The stalled client's connection was cut: reading it now ends before the whole body.
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    match stalled.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the stalled connection is still open: {e}"),
    }
    assert!(got.len() < bytes.len(), "the stalled client got everything");
    server.stop();
}

/// One client address holding connections open without sending a request (600 of them,
/// reopened as they close) cannot hold the others' connections: past
/// `--max-connections-per-address` its connections are closed as soon as they are accepted,
/// and a request from another address is answered at once, not after a header timeout.
#[test]
fn one_address_cannot_hold_every_connection() {
    use socket2::{Domain, Socket, Type};
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let served = d.join("srv");
    ok(&served, &["init"]);
    let server = Server::start(
        &[
            "-C",
            served.to_str().unwrap(),
            "--max-connections",
            "32",
            "--max-connections-per-address",
            "8",
            "--header-timeout",
            "20",
        ],
        d,
    );
    let addr: SocketAddr = server
        .base
        .strip_prefix("http://")
        .unwrap()
        .parse()
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The attacker, from 127.0.0.2: connections that never send a byte, each reopened when
    // the server closes it.
    let attacker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let open = || {
                let s = Socket::new(Domain::IPV4, Type::STREAM, None).ok()?;
                let from: SocketAddr = "127.0.0.2:0".parse().unwrap();
                s.bind(&from.into()).ok()?;
                s.connect(&addr.into()).ok()?;
                s.set_nonblocking(true).ok()?;
                Some(std::net::TcpStream::from(s))
            };
            let mut held: Vec<std::net::TcpStream> = (0..600).filter_map(|_| open()).collect();
            let mut reopened = 0;
            let t0 = Instant::now();
            // At least two seconds of it, however soon the requests are done.
            while t0.elapsed() < Duration::from_secs(2)
                || !stop.load(std::sync::atomic::Ordering::Relaxed)
                    && t0.elapsed() < Duration::from_secs(15)
            {
                for s in held.iter_mut() {
                    let mut b = [0u8; 1];
                    let closed = match std::io::Read::read(s, &mut b) {
                        Ok(n) => n == 0,
                        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                    };
                    if closed {
                        if let Some(fresh) = open() {
                            *s = fresh;
                            reopened += 1;
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            reopened
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    // Requests from 127.0.0.1 meanwhile, each answered well before a header timeout.
    for _ in 0..5 {
        let t0 = Instant::now();
        let (status, _, _) = http(
            &server.base,
            "GET",
            "/v1/repos",
            &[("Authorization", &bearer(READ))],
            b"",
        );
        assert_eq!(status, 200);
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "a request waited {:?} behind one address's idle connections",
            t0.elapsed()
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reopened = attacker.join().unwrap();
    assert!(
        reopened > 0,
        "the server closed none of the attacker's connections"
    );
}
