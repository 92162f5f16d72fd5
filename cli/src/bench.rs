//! `mdl-bench DIR...`: commits each directory's checkpoints in order into a fresh repository,
//! checks every commit out again, verifies the bytes, and prints a table per series with the
//! order-0 entropy estimates computed from the data and `zstd -3` / `zstd -19` as baselines.
//!
//! Not a test: timings are for `docs/BENCHMARKS.md`. Runs the `mdl` binary next to this one
//! (or `--mdl PATH`), so commit and checkout are measured as users run them, with their peak
//! resident memory taken from the kernel's accounting of each child process.

// Tests, examples and benchmarks write their own files (checkpoints, outputs, damage done on
// purpose); the rule that repository writes go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use mdl::Dtype;
use mdl_format::safetensors;

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

/// Order-0 estimates for a file, in bytes: each float tensor as the entropy of its exponent
/// field plus its other bits raw (`own`), and the smaller of that and the entropies of the byte
/// planes of its XOR with the same tensor of `prev` (`with_xor`). Other tensors count raw.
struct Estimate {
    own: f64,
    with_xor: f64,
}

struct Tensors {
    bytes: Vec<u8>,
    /// name → (dtype, data range)
    tensors: std::collections::BTreeMap<String, (Dtype, std::ops::Range<usize>)>,
}

impl Tensors {
    fn largest(&self) -> u64 {
        self.tensors
            .values()
            .map(|t| t.1.len() as u64)
            .max()
            .unwrap_or(0)
    }
}

/// Reads a checkpoint, with the same validation `mdl commit` applies.
fn load(path: &Path) -> Result<Tensors> {
    let bytes = std::fs::read(path)?;
    let hl = safetensors::header_len(bytes.get(..8).context("short file")?, bytes.len() as u64)?;
    let layout = safetensors::parse(&bytes[8..8 + hl as usize], bytes.len() as u64)?;
    let start = layout.data_start() as usize;
    let tensors = layout
        .tensors
        .iter()
        .map(|t| {
            let at = start + t.offset as usize;
            (t.name.clone(), (t.header.dtype, at..at + t.len as usize))
        })
        .collect();
    Ok(Tensors { bytes, tensors })
}

fn entropy_bits(counts: &[u64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| -(c as f64) * (c as f64 / n as f64).log2())
        .sum()
}

/// (width in bytes, exponent shift, exponent bits) of a float dtype.
fn float_layout(dtype: Dtype) -> Option<(usize, u32, u32)> {
    match dtype {
        Dtype::BF16 => Some((2, 7, 8)),
        Dtype::F16 => Some((2, 10, 5)),
        Dtype::F32 => Some((4, 23, 8)),
        Dtype::F64 => Some((8, 52, 11)),
        _ => None,
    }
}

fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(w)
}

fn estimate(cur: &Tensors, prev: Option<&Tensors>) -> Estimate {
    let mut e = Estimate {
        own: (cur.bytes.len() - cur.tensors.values().map(|t| t.1.len()).sum::<usize>()) as f64,
        with_xor: 0.0,
    };
    e.with_xor = e.own;
    for (name, (dtype, range)) in &cur.tensors {
        let data = &cur.bytes[range.clone()];
        let Some((w, shift, ebits)) = float_layout(*dtype).filter(|_| data.len() >= 4096) else {
            e.own += data.len() as f64;
            e.with_xor += data.len() as f64;
            continue;
        };
        let n = (data.len() / w) as f64;
        let mut hist = vec![0u64; 1 << ebits];
        for c in data.chunks_exact(w) {
            hist[((word(c) >> shift) & ((1 << ebits) - 1)) as usize] += 1;
        }
        let own = entropy_bits(&hist) / 8.0 + n * (w * 8 - ebits as usize) as f64 / 8.0;
        e.own += own;
        let xor = prev
            .and_then(|p| {
                let (pd, pr) = p.tensors.get(name)?;
                (pd == dtype && pr.len() == range.len()).then(|| &p.bytes[pr.clone()])
            })
            .map(|pdata| {
                let mut planes = vec![[0u64; 256]; w];
                for (c, pc) in data.chunks_exact(w).zip(pdata.chunks_exact(w)) {
                    for k in 0..w {
                        planes[k][(c[k] ^ pc[k]) as usize] += 1;
                    }
                }
                planes.iter().map(|p| entropy_bits(p)).sum::<f64>() / 8.0
            })
            .unwrap_or(f64::MAX);
        e.with_xor += own.min(xor);
    }
    e
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn mdl_cmd(mdl: &Path, repo: &Path) -> Command {
    let mut c = Command::new(mdl);
    c.arg("-C").arg(repo);
    c
}

struct Opts {
    mdl: PathBuf,
    repeat: usize,
    config: Vec<(String, String)>,
    zstd19: bool,
    commit_args: Vec<String>,
    dirs: Vec<String>,
}

fn parse_args() -> Result<Opts> {
    let mut args = std::env::args().skip(1);
    let mut o = Opts {
        mdl: std::env::current_exe()?.with_file_name("mdl"),
        repeat: 3,
        commit_args: Vec::new(),
        config: Vec::new(),
        zstd19: true,
        dirs: Vec::new(),
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--mdl" => o.mdl = PathBuf::from(args.next().context("--mdl needs a path")?),
            "--repeat" => o.repeat = args.next().context("--repeat needs N")?.parse()?,
            "--config" => {
                let kv = args.next().context("--config needs KEY=VALUE")?;
                let (k, v) = kv.split_once('=').context("--config needs KEY=VALUE")?;
                o.config.push((k.into(), v.into()));
            }
            "--no-zstd19" => o.zstd19 = false,
            "--commit-arg" => o
                .commit_args
                .push(args.next().context("--commit-arg needs an argument")?),
            _ if a.starts_with("--") => bail!("unknown option {a}"),
            _ => o.dirs.push(a),
        }
    }
    if o.dirs.is_empty() || o.repeat == 0 {
        bail!(
            "usage: mdl-bench [--mdl PATH] [--repeat N] [--config KEY=VALUE]... [--commit-arg ARG]... [--no-zstd19] DIR..."
        );
    }
    Ok(o)
}

fn main() -> Result<()> {
    let o = parse_args()?;
    if o.dirs.len() > 1 {
        // One child process per series: this process grows while it computes the estimates,
        // and a child's peak RSS starts at its parent's (see `measure`).
        let args: Vec<String> = std::env::args().skip(1).collect();
        let dirs: std::collections::HashSet<&String> = o.dirs.iter().collect();
        let common: Vec<&String> = args.iter().filter(|a| !dirs.contains(a)).collect();
        for dir in &o.dirs {
            let st = Command::new(std::env::current_exe()?)
                .args(&common)
                .arg(dir)
                .status()?;
            if !st.success() {
                bail!("benchmark of {dir} failed");
            }
        }
        return Ok(());
    }
    let have_zstd = Command::new("zstd").arg("--version").output().is_ok();
    bench_series(&o, Path::new(&o.dirs[0]), have_zstd)
}

fn bench_series(o: &Opts, dir: &Path, have_zstd: bool) -> Result<()> {
    let series = dir
        .file_name()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    let config: Vec<String> = o.config.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "\n### {series} ({} files, config: {}, median of {} runs)\n",
        files.len(),
        if config.is_empty() {
            "defaults".into()
        } else {
            config.join(", ")
        },
        o.repeat
    );

    // Commit the series `repeat` times into fresh repositories; the last one stays for the
    // checkouts.
    let n = files.len();
    let mut commit_s = vec![Vec::new(); n];
    let mut stored = vec![0u64; n];
    let mut rss_c = 0u64;
    let mut ids = vec![String::new(); n];
    let mut lossy = vec![false; n];
    let mut keep = None;
    for _ in 0..o.repeat {
        let repo = tempfile::tempdir()?;
        let r = repo.path();
        if !mdl_cmd(&o.mdl, r).arg("init").output()?.status.success() {
            bail!("mdl init failed");
        }
        for (k, v) in &o.config {
            let st = mdl_cmd(&o.mdl, r).args(["config", k, v]).output()?;
            if !st.status.success() {
                bail!(
                    "mdl config {k} {v}: {}",
                    String::from_utf8_lossy(&st.stderr)
                );
            }
        }
        for (i, f) in files.iter().enumerate() {
            let c = measure(
                mdl_cmd(&o.mdl, r)
                    .args(["commit", "--json"])
                    .args(&o.commit_args)
                    .arg(f),
            )?;
            let v: serde_json::Value = serde_json::from_slice(&c.stdout)?;
            lossy[i] = v["lossy_tensors"].as_u64().unwrap_or(0) > 0;
            stored[i] = v["stored_bytes"].as_u64().context("stored_bytes")?;
            ids[i] = v["id"].as_str().context("id")?.to_string();
            commit_s[i].push(c.seconds);
            rss_c = rss_c.max(c.max_rss);
        }
        keep = Some(repo);
    }
    let repo = keep.expect("at least one run");
    let r = repo.path();
    let stats = measure(mdl_cmd(&o.mdl, r).args(["stats", "--json"]))?;
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout)?;
    let store_total = stats["stored_bytes"].as_u64().context("stats")?;

    // Final stored size per dtype class, over every distinct tensor of the series.
    let mut by_class: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    let mut seen = std::collections::HashSet::new();
    for id in &ids {
        let shown = measure(mdl_cmd(&o.mdl, r).args(["show", "--json", id]))?;
        let shown: serde_json::Value = serde_json::from_slice(&shown.stdout)?;
        for t in shown["tensors"].as_array().context("tensors")? {
            if !seen.insert(t["id"].as_str().unwrap_or("").to_string()) {
                continue;
            }
            let name = t["name"].as_str().unwrap_or("");
            let class = format!(
                "{} {}",
                t["dtype"].as_str().unwrap_or("?"),
                if name.starts_with("optim.") {
                    "optimizer state"
                } else {
                    "weights"
                }
            );
            let e = by_class.entry(class).or_default();
            e.0 += t["raw_bytes"].as_u64().unwrap_or(0);
            e.1 += t["stored_bytes"].as_u64().unwrap_or(0);
        }
    }

    // Check out every commit (newest first), verifying the bytes each time.
    let out = r.join("out.safetensors");
    let mut checkout_s = vec![Vec::new(); n];
    let mut rss_o = 0u64;
    for _ in 0..o.repeat {
        for i in (0..n).rev() {
            // Deleting the previous output (freeing its page cache) is not checkout's work.
            let _ = std::fs::remove_file(&out);
            let c = measure(
                mdl_cmd(&o.mdl, r)
                    .args(["checkout", &ids[i], "-o"])
                    .arg(&out),
            )?;
            // A lossy checkout is a reconstruction (its content hash is verified by checkout).
            if !lossy[i] && !same_bytes(&out, &files[i])? {
                bail!("checkout of {} is not byte-identical", files[i].display());
            }
            checkout_s[i].push(c.seconds);
            rss_o = rss_o.max(c.max_rss);
        }
    }
    std::fs::remove_file(&out)?;

    println!(
        "| file | raw MB | stored MB | ratio | order-0 est. | order-0 est. with XOR | commit MB/s | checkout MB/s | zstd -3 | zstd -19 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let (mut raw_t, mut own_t, mut xor_t, mut z3_t, mut z19_t) = (0u64, 0f64, 0f64, 0u64, 0u64);
    let (mut commit_t, mut largest) = (0f64, 0u64);
    let mut prev: Option<Tensors> = None;
    for (i, f) in files.iter().enumerate() {
        let raw = std::fs::metadata(f)?.len();
        let cur = load(f)?;
        largest = largest.max(cur.largest());
        let est = estimate(&cur, prev.as_ref());
        prev = Some(cur);
        let zstd = |level: &str| -> Result<u64> {
            Ok(measure(Command::new("zstd").args([level, "-q", "-c", "-T0"]).arg(f))?.stdout_len)
        };
        let z3 = if have_zstd { zstd("-3")? } else { 0 };
        let z19 = if have_zstd && o.zstd19 {
            zstd("-19")?
        } else {
            0
        };
        let ratio = |b: u64| {
            if b == 0 {
                "n/a".to_string()
            } else {
                format!("{:.3}", raw as f64 / b as f64)
            }
        };
        let c = median(commit_s[i].clone());
        let co = median(checkout_s[i].clone());
        println!(
            "| {} | {:.1} | {:.1} | {:.3} | {:.3} | {:.3} | {:.0} | {:.0} | {} | {} |",
            f.file_name().unwrap().to_string_lossy(),
            mb(raw),
            mb(stored[i]),
            raw as f64 / stored[i].max(1) as f64,
            raw as f64 / est.own,
            raw as f64 / est.with_xor,
            mb(raw) / c,
            mb(raw) / co,
            ratio(z3),
            ratio(z19),
        );
        raw_t += raw;
        own_t += est.own;
        xor_t += est.with_xor;
        z3_t += z3;
        z19_t += z19;
        commit_t += c;
    }
    let total_ratio = |b: u64| {
        if b == 0 {
            "n/a".to_string()
        } else {
            format!("{:.3}", raw_t as f64 / b as f64)
        }
    };
    println!(
        "| **series** | {:.1} | {:.1} | **{:.3}** | {:.3} | {:.3} | **{:.0}** | newest **{:.0}** | {} | {} |",
        mb(raw_t),
        mb(store_total),
        raw_t as f64 / store_total.max(1) as f64,
        raw_t as f64 / own_t,
        raw_t as f64 / xor_t,
        mb(raw_t) / commit_t,
        mb(std::fs::metadata(&files[n - 1])?.len()) / median(checkout_s[n - 1].clone()),
        total_ratio(z3_t),
        total_ratio(z19_t),
    );
    println!("\n| tensors (distinct, whole series) | raw MB | stored MB | ratio |");
    println!("|---|---:|---:|---:|");
    for (class, (raw, stored)) in &by_class {
        println!(
            "| {class} | {:.1} | {:.1} | {:.3} |",
            mb(*raw),
            mb(*stored),
            *raw as f64 / (*stored).max(1) as f64
        );
    }
    println!(
        "\nStored MB per file is what its commit added (with reverse deltas: the new tensors, less \
         what re-encoding the previous ones saved); the series row is the store's final size. \
         Peak RSS: commit {:.1} MB, checkout {:.1} MB; largest tensor {:.1} MB.",
        mb(rss_c),
        mb(rss_o),
        mb(largest)
    );
    Ok(())
}
