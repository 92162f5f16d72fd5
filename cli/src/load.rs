//! `mdl-load`: a bounded load benchmark of `mdl serve` on loopback.
//!
//! Starts the `mdl` binary next to this one as a server on `127.0.0.1:0` over a fresh
//! repository, then runs at the same time: C clients each committing N checkpoints (uploads
//! of an S MiB safetensors file, each a small step from the client's previous one) and P full
//! checkpoint pulls. Prints requests/s, MB/s, latency percentiles per kind, the server's peak
//! RSS (VmHWM), and checks that every commit is in the log afterwards.
//!
//! `mdl-load [--clients 8] [--commits 25] [--pulls 32] [--mib 8] [--decode-memory SIZE]
//! [--mdl PATH]` (`--decode-memory` is passed to `mdl serve`).

// Tests, examples and benchmarks write their own files (checkpoints, outputs, damage done on
// purpose); the rule that repository writes go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

const TOKEN: &str = "load-test-write-token-0123456789";

struct Opts {
    clients: usize,
    commits: usize,
    pulls: usize,
    mib: usize,
    decode_memory: Option<String>,
    mdl: PathBuf,
}

fn parse_args() -> Result<Opts> {
    let mut o = Opts {
        clients: 8,
        commits: 25,
        pulls: 32,
        mib: 8,
        decode_memory: None,
        mdl: std::env::current_exe()?.with_file_name("mdl"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--clients" => o.clients = value()?.parse()?,
            "--commits" => o.commits = value()?.parse()?,
            "--pulls" => o.pulls = value()?.parse()?,
            "--mib" => o.mib = value()?.parse()?,
            "--decode-memory" => o.decode_memory = Some(value()?),
            "--mdl" => o.mdl = PathBuf::from(value()?),
            _ => bail!("unknown option {a}"),
        }
    }
    Ok(o)
}

/// A checkpoint of `mib` MiB of f32 weights in four tensors plus a step counter; `version`
/// perturbs a few percent of the weights of `seed`'s base.
fn checkpoint(path: &Path, mib: usize, seed: u64, version: u64) -> Result<u64> {
    let n = mib * (1 << 20) / 4 / 4;
    let mut header = String::from("{");
    let mut data = Vec::with_capacity(mib << 20);
    for t in 0..4u64 {
        let mut x = (seed * 4 + t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let start = data.len();
        for i in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut v = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02;
            if (i as u64 + version * 7919) % 37 < version.min(30) {
                v *= 1.0 + 0.001 * version as f32;
            }
            data.extend_from_slice(&v.to_le_bytes());
        }
        if t > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"layer{t}.weight\":{{\"dtype\":\"F32\",\"shape\":[{n}],\"data_offsets\":[{start},{}]}}",
            data.len()
        ));
    }
    let start = data.len();
    data.extend_from_slice(&version.to_le_bytes());
    header.push_str(&format!(
        ",\"step\":{{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[{start},{}]}}}}",
        data.len()
    ));
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&data);
    std::fs::write(path, &bytes)?;
    Ok(bytes.len() as u64)
}

fn message(message: String, step: Option<u64>) -> mdl_protocol::params::CommitParams {
    mdl_protocol::params::CommitParams {
        message,
        step,
        ..Default::default()
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn vm_hwm(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

struct Sample {
    kind: &'static str,
    seconds: f64,
    bytes: u64,
}

fn main() -> Result<()> {
    let o = parse_args()?;
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let repo = dir.join("load");
    let status = Command::new(&o.mdl)
        .arg("-C")
        .arg(dir)
        .args(["init", "load"])
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        bail!("mdl init failed");
    }
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("load write {TOKEN}\n"))?;
    let mut server = Command::new(&o.mdl)
        .arg("-C")
        .arg(&repo)
        .args(["serve", "--addr", "127.0.0.1:0", "--tokens"])
        .arg(&tokens)
        .args(
            o.decode_memory
                .iter()
                .flat_map(|m| ["--decode-memory", m.as_str()]),
        )
        .stdout(Stdio::piped())
        .spawn()
        .context("start mdl serve")?;
    let pid = server.id();
    let mut line = String::new();
    BufReader::new(server.stdout.take().context("server stdout")?).read_line(&mut line)?;
    let base = line
        .trim()
        .strip_prefix("listening on ")
        .with_context(|| format!("unexpected server output {line:?}"))?
        .to_string();
    let url = format!("{base}/load");
    let remote = mdl_remote::Remote::new(&url, Some(TOKEN.into()))?;
    // One first commit so pulls have something from the start.
    let first = dir.join("first.safetensors");
    let raw = checkpoint(&first, o.mib, 999, 0)?;
    remote.commit(&first, &message("first".into(), None))?;

    let started = Instant::now();
    let samples: Vec<Sample> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for c in 0..o.clients {
            let (remote, dir) = (remote.clone(), dir.to_path_buf());
            let (commits, mib) = (o.commits, o.mib);
            handles.push(s.spawn(move || -> Result<Vec<Sample>> {
                let mut out = Vec::new();
                let file = dir.join(format!("client{c}.safetensors"));
                for v in 0..commits {
                    let bytes = checkpoint(&file, mib, c as u64, v as u64 + 1)?;
                    let t = Instant::now();
                    remote.commit(
                        &file,
                        &message(format!("client {c} commit {v}"), Some(v as u64)),
                    )?;
                    out.push(Sample {
                        kind: "commit",
                        seconds: t.elapsed().as_secs_f64(),
                        bytes,
                    });
                }
                Ok(out)
            }));
        }
        for p in 0..o.pulls {
            let (remote, dir) = (remote.clone(), dir.to_path_buf());
            handles.push(s.spawn(move || -> Result<Vec<Sample>> {
                let file = dir.join(format!("pull{p}.safetensors"));
                let t = Instant::now();
                let got = mdl_remote::download(&remote, "main", &file, None, true)?;
                let seconds = t.elapsed().as_secs_f64();
                std::fs::remove_file(&file)?;
                Ok(vec![Sample {
                    kind: "pull",
                    seconds,
                    bytes: got.bytes,
                }])
            }));
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread panicked"))
            .collect::<Result<Vec<_>>>()
            .map(|v| v.into_iter().flatten().collect())
    })?;
    let wall = started.elapsed().as_secs_f64();
    let log = remote.log(None, None)?;
    let peak = vm_hwm(pid);
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
    let status = server.wait()?;

    println!(
        "mdl serve load: {} clients x {} commits + {} full pulls at once, {:.1} MiB checkpoints, loopback",
        o.clients,
        o.commits,
        o.pulls,
        raw as f64 / (1 << 20) as f64
    );
    println!();
    println!("| requests | count | wall s | req/s | MB/s | p50 s | p99 s | max s |");
    println!("|---|---|---|---|---|---|---|---|");
    for kind in ["commit", "pull"] {
        let mut lat: Vec<f64> = samples
            .iter()
            .filter(|s| s.kind == kind)
            .map(|s| s.seconds)
            .collect();
        lat.sort_by(f64::total_cmp);
        let bytes: u64 = samples
            .iter()
            .filter(|s| s.kind == kind)
            .map(|s| s.bytes)
            .sum();
        println!(
            "| {kind} | {} | {wall:.2} | {:.1} | {:.1} | {:.3} | {:.3} | {:.3} |",
            lat.len(),
            lat.len() as f64 / wall,
            bytes as f64 / 1e6 / wall,
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            lat.last().copied().unwrap_or(f64::NAN),
        );
    }
    let total_bytes: u64 = samples.iter().map(|s| s.bytes).sum();
    println!(
        "| all | {} | {wall:.2} | {:.1} | {:.1} | | | |",
        samples.len(),
        samples.len() as f64 / wall,
        total_bytes as f64 / 1e6 / wall
    );
    println!();
    let expected = o.clients * o.commits + 1;
    println!(
        "server peak RSS (VmHWM): {}; commits in the log: {} of {expected}; server exit: {status}",
        peak.map(|b| format!("{:.0} MiB", b as f64 / (1 << 20) as f64))
            .unwrap_or_else(|| "unknown".into()),
        log.len()
    );
    if log.len() != expected {
        bail!("{} commits in the log, expected {expected}", log.len());
    }
    Ok(())
}
