//! Second-and-later commit speed of a process that commits repeatedly (docs/BENCHMARKS.md,
//! issue 22), with and without the last commit's tensors kept ([`Committer::keeping`]).
//!
//! ```sh
//! cargo run --release -p mdl --example warm-commits -- DIR [--lossy] [--work /dev/shm/x]
//! ```
//!
//! Commits every `*.safetensors` of `DIR` in name order through one committer, into a fresh
//! repository under `--work` (default `/dev/shm`), once keeping nothing and once keeping the
//! default budget; prints each mode's median time of the second and later commits.

#![allow(clippy::disallowed_methods)] // a benchmark removes its own scratch repositories

use std::path::PathBuf;
use std::time::Instant;

use mdl::background::Committer;
use mdl::commit::{CommitOptions, Staged};
use mdl::warm::DEFAULT_WARM_BYTES;
use mdl::{OpenOptions, Repository};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut dir, mut lossy, mut work) = (None, false, PathBuf::from("/dev/shm"));
    while let Some(a) = args.next() {
        match a.as_str() {
            "--lossy" => lossy = true,
            "--work" => work = PathBuf::from(args.next().ok_or("--work needs a directory")?),
            _ => dir = Some(PathBuf::from(a)),
        }
    }
    let dir = dir.ok_or("usage: warm-commits DIR [--lossy] [--work DIR]")?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "safetensors"));
    files.sort();
    let bytes: u64 = files
        .iter()
        .map(|f| f.metadata().map_or(0, |m| m.len()))
        .sum();
    let per_file = bytes as f64 / files.len().max(1) as f64;
    println!("| mode | median s, 2nd+ commit | MB/s | stored bytes |");
    println!("|---|---:|---:|---:|");
    for (mode, budget) in [
        ("cold (keeps nothing)", 0),
        ("warm (keeps the last commit)", DEFAULT_WARM_BYTES),
    ] {
        let root = work.join(format!("mdl-warm-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        Repository::init(&root)?;
        let at = root.clone();
        let committer = Committer::keeping(
            move || Repository::open(&at, &OpenOptions::default()),
            budget,
        );
        let mut times = Vec::new();
        let mut stored = 0;
        for (k, f) in files.iter().enumerate() {
            let mut opts = CommitOptions {
                message: format!("{k}"),
                ..Default::default()
            };
            if lossy {
                opts.lossy.mode = Some(mdl::lossy::CodecMode::Lossy);
            }
            let t = Instant::now();
            let out = committer
                .submit(Staged::paths(std::slice::from_ref(f))?, opts)?
                .wait()?;
            times.push(t.elapsed().as_secs_f64());
            stored += out.stored_bytes;
        }
        std::fs::remove_dir_all(&root)?;
        let mut later = times[1..].to_vec();
        later.sort_by(f64::total_cmp);
        let median = later.get(later.len() / 2).copied().unwrap_or(f64::NAN);
        println!(
            "| {mode} | {median:.3} | {:.0} | {stored} |",
            per_file / median / 1e6
        );
    }
    Ok(())
}
