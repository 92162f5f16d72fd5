//! `mdl-bench DIR...`: commits each directory's checkpoints in order into a fresh repository,
//! checks each out again, verifies the bytes, and prints a table with `zstd -3` as a baseline.
//!
//! Not a test: timings are for `docs/BENCHMARKS.md`. Runs the `mdl` binary next to this one
//! (or `--mdl PATH`), so commit and checkout are measured as users run them, with their peak
//! resident memory taken from the kernel's accounting of each child process.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

struct Run {
    seconds: f64,
    max_rss: u64,
    stdout: Vec<u8>,
    stdout_len: u64,
}

/// Runs a command to completion, returning wall time and peak RSS. Only the first 1 MiB of
/// stdout is kept (the rest is counted): Linux starts a child's peak RSS at its parent's RSS at
/// fork time, so this process must stay small for the children's numbers to mean anything.
fn measure(cmd: &mut Command) -> Result<Run> {
    let start = Instant::now();
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawn")?;
    let pid = child.id() as libc::pid_t;
    let mut stdout = Vec::new();
    let mut stdout_len = 0u64;
    let mut child = child;
    if let Some(mut out) = child.stdout.take() {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = std::io::Read::read(&mut out, &mut buf)?;
            if n == 0 {
                break;
            }
            stdout_len += n as u64;
            if stdout.len() < 1 << 20 {
                stdout.extend_from_slice(&buf[..n]);
            }
        }
    }
    let mut stderr = Vec::new();
    if let Some(mut err) = child.stderr.take() {
        std::io::Read::read_to_end(&mut err, &mut stderr)?;
    }
    let mut status = 0;
    // SAFETY: plain FFI call with pointers to live, correctly sized locals; `pid` is our own
    // child, which has not been reaped (std's Child is not waited on before this).
    #[allow(unsafe_code)]
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::wait4(pid, &mut status, 0, &mut usage) < 0 {
            bail!("wait4 failed: {}", std::io::Error::last_os_error());
        }
        usage
    };
    let seconds = start.elapsed().as_secs_f64();
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&stderr));
    }
    Ok(Run {
        seconds,
        max_rss: usage.ru_maxrss as u64 * 1024,
        stdout,
        stdout_len,
    })
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

fn same_bytes(a: &Path, b: &Path) -> Result<bool> {
    use std::io::Read;
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(fb.read(&mut bb[..1])? == 0);
        }
        fb.read_exact(&mut bb[..n])
            .map_err(|_| anyhow::anyhow!("shorter"))?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

fn largest_tensor(path: &Path) -> Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)?;
    let mut header = vec![0u8; u64::from_le_bytes(len) as usize];
    f.read_exact(&mut header)?;
    let v: serde_json::Value = serde_json::from_slice(&header)?;
    Ok(v.as_object()
        .into_iter()
        .flatten()
        .filter_map(|(_, t)| {
            let o = t.get("data_offsets")?.as_array()?;
            Some(o[1].as_u64()? - o[0].as_u64()?)
        })
        .max()
        .unwrap_or(0))
}

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut mdl = std::env::current_exe()?.with_file_name("mdl");
    if let Some(i) = args.iter().position(|a| a == "--mdl") {
        mdl = PathBuf::from(args.get(i + 1).context("--mdl needs a path")?);
        args.drain(i..i + 2);
    }
    if args.is_empty() {
        bail!("usage: mdl-bench [--mdl PATH] DIR...");
    }
    let have_zstd = Command::new("zstd").arg("--version").output().is_ok();
    println!(
        "| series | file | raw MB | stored MB | ratio | commit MB/s | checkout MB/s | commit RSS MB | checkout RSS MB | zstd -3 ratio | zstd -3 MB/s |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for dir in &args {
        let dir = Path::new(dir);
        let series = dir
            .file_name()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        let repo = tempfile::tempdir()?;
        let r = repo.path();
        let st = Command::new(&mdl).arg("-C").arg(r).arg("init").output()?;
        if !st.status.success() {
            bail!("mdl init failed");
        }
        let (mut raw_t, mut stored_t, mut ct, mut cot, mut zt, mut zb) =
            (0u64, 0u64, 0f64, 0f64, 0f64, 0u64);
        let (mut rss_c, mut rss_o, mut largest) = (0u64, 0u64, 0u64);
        for f in &files {
            let raw = std::fs::metadata(f)?.len();
            largest = largest.max(largest_tensor(f)?);
            let c = measure(
                Command::new(&mdl)
                    .arg("-C")
                    .arg(r)
                    .args(["commit", "--json"])
                    .arg(f),
            )?;
            let v: serde_json::Value = serde_json::from_slice(&c.stdout)?;
            let stored = v["stored_bytes"].as_u64().context("stored_bytes")?;
            let id = v["id"].as_str().context("id")?.to_string();
            let out = r.join("out.safetensors");
            let o = measure(
                Command::new(&mdl)
                    .arg("-C")
                    .arg(r)
                    .args(["checkout", &id, "--force", "-o"])
                    .arg(&out),
            )?;
            if !same_bytes(&out, f)? {
                bail!("checkout of {} is not byte-identical", f.display());
            }
            let (zratio, zspeed, zbytes, zsecs) = if have_zstd {
                let z = measure(Command::new("zstd").args(["-3", "-q", "-c", "-T1"]).arg(f))?;
                let n = z.stdout_len;
                (
                    format!("{:.3}", raw as f64 / n as f64),
                    format!("{:.0}", mb(raw) / z.seconds),
                    n,
                    z.seconds,
                )
            } else {
                ("n/a".into(), "n/a".into(), 0, 0.0)
            };
            println!(
                "| {series} | {} | {:.1} | {:.1} | {:.3} | {:.0} | {:.0} | {:.1} | {:.1} | {zratio} | {zspeed} |",
                f.file_name().unwrap().to_string_lossy(),
                mb(raw),
                mb(stored),
                raw as f64 / stored.max(1) as f64,
                mb(raw) / c.seconds,
                mb(raw) / o.seconds,
                mb(c.max_rss),
                mb(o.max_rss),
            );
            raw_t += raw;
            stored_t += stored;
            ct += c.seconds;
            cot += o.seconds;
            zt += zsecs;
            zb += zbytes;
            rss_c = rss_c.max(c.max_rss);
            rss_o = rss_o.max(o.max_rss);
        }
        println!(
            "| {series} | **total** | {:.1} | {:.1} | **{:.3}** | {:.0} | {:.0} | {:.1} (max) | {:.1} (max) | {} | {} |",
            mb(raw_t),
            mb(stored_t),
            raw_t as f64 / stored_t.max(1) as f64,
            mb(raw_t) / ct,
            mb(raw_t) / cot,
            mb(rss_c),
            mb(rss_o),
            if have_zstd { format!("{:.3}", raw_t as f64 / zb as f64) } else { "n/a".into() },
            if have_zstd { format!("{:.0}", mb(raw_t) / zt) } else { "n/a".into() },
        );
        eprintln!(
            "{series}: largest tensor {:.1} MB; memory target (largest tensor + 64 MB) = {:.1} MB",
            mb(largest),
            mb(largest + (64 << 20))
        );
    }
    Ok(())
}
