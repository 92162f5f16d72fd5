//! Repositories in object storage, kept small: gc beside writers on other machines, and a
//! machine that fetches only the records it reads (its cache bounded). Against SeaweedFS, as
//! `s3.rs` (whose `Repo` these use).

use std::path::PathBuf;

use crate::journeys::nudged;
use crate::s3::Repo;
use crate::util::{tensor, write_safetensors};

#[test]
#[ignore = "needs SeaweedFS (MDL_WEED); scripts/test.sh installs it and runs these"]
fn gc_deletes_only_what_no_ref_needs_beside_writers_on_other_machines() {
    let r = Repo::new("gc");
    let gc_with = |m: &str, flags: &[&str]| -> (Vec<String>, Vec<String>) {
        let args = [&["gc", "--prune-older-than", "0s", "--json"], flags].concat();
        let out: serde_json::Value = serde_json::from_str(&r.ok(m, &args)).unwrap();
        let keys = |k: &str| -> Vec<String> {
            out[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        (keys("deleted"), keys("marked"))
    };
    let gc = |m: &str| gc_with(m, &[]);
    let (f1, one) = r.checkpoint(1);
    r.ok("a", &["commit", f1.to_str().unwrap(), "-m", "one"]);
    // A branch of its own, then deleted: its pack is the one no ref needs.
    let (f2, two) = r.checkpoint(2);
    r.ok(
        "a",
        &["commit", f2.to_str().unwrap(), "-b", "tmp", "-m", "two"],
    );
    r.ok("a", &["branch", "-D", "tmp"]);
    r.fails("g", &["gc", "--expire-reflog", "1d"], "keeps no reflog");
    let (deleted, marked) = gc("g");
    assert!(deleted.is_empty(), "{deleted:?}");
    assert_eq!(marked.len(), 1, "{marked:?}");

    // After the mark, another machine commits the same checkpoint again: the records it
    // needs are marked, so it sends them again rather than naming them in the marked pack.
    let again = r.ok("b", &["commit", f2.to_str().unwrap(), "-m", "two again"]);
    // A dry run says what the sweep would delete, and deletes nothing: the sweep after it
    // still finds the pack to delete.
    let (would, _) = gc_with("g", &["--dry-run"]);
    assert_eq!(would, marked);
    let (deleted, _) = gc("g");
    assert_eq!(deleted, marked, "the marked pack, no longer needed, goes");
    let fresh = |m: &str| {
        r.ok(m, &["fsck"]);
        for (rev, want) in [("HEAD", &two), ("HEAD~1", &one)] {
            r.checks_out(m, &r.url, &[rev], want);
        }
    };
    fresh("c");
    assert_eq!(r.history("c", "main")[0], again.trim());

    // gc racing commits from another machine: every commit stays whole.
    let writer = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut made = Vec::new();
            for n in 3..7u64 {
                let (f, bytes) = r.checkpoint(n);
                r.ok("w", &["commit", f.to_str().unwrap(), "-b", "w", "-m", "w"]);
                made.push(bytes);
                // And garbage for the gc beside it.
                let (g, _) = r.checkpoint(100 + n);
                let tmp = format!("tmp-{n}");
                r.ok("w", &["commit", g.to_str().unwrap(), "-b", &tmp, "-m", "x"]);
                r.ok("w", &["branch", "-D", &tmp]);
            }
            made
        });
        for _ in 0..4 {
            gc("g");
        }
        writer.join().unwrap()
    });
    gc("g");
    gc("g");
    for (k, want) in writer.iter().rev().enumerate() {
        r.checks_out("d", &r.url, &[&format!("w~{k}")], want);
    }
    fresh("d");
}

/// Bytes of the record files in machine `m`'s copies.
fn record_bytes(r: &Repo, m: &str) -> u64 {
    record_files(r, m)
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum()
}

/// The record files of machine `m`'s copies.
fn record_files(r: &Repo, m: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for copy in std::fs::read_dir(r.cache(m).join("s3")).unwrap() {
        let objects = copy.unwrap().path().join("repo/.mdl/objects");
        for dir in std::fs::read_dir(objects).unwrap() {
            for f in std::fs::read_dir(dir.unwrap().path()).unwrap() {
                files.push(f.unwrap().path());
            }
        }
    }
    files
}

/// The bytes a command's `-v` report says it downloaded.
fn bytes_down(stderr: &[u8]) -> u64 {
    let err = String::from_utf8_lossy(stderr);
    let line = err.lines().find(|l| l.contains("bytes down")).unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "down").unwrap();
    words[at - 2].parse().unwrap()
}

#[test]
#[ignore = "needs SeaweedFS (MDL_WEED); scripts/test.sh installs it and runs these"]
fn a_machine_fetches_only_the_records_it_reads_and_keeps_its_cache_bounded() {
    let r = Repo::new("lazy");
    // Four float tensors of 1 MiB, nudged at each step: every commit's pack is larger than
    // what a copy reads whole.
    let mut tensors: Vec<crate::util::T> = (0..4)
        .map(|i| tensor(&format!("layer.{i}.weight"), "F32", &[512, 512], 100 + i))
        .collect();
    let mut ckpts = Vec::new();
    for step in 1..=3u64 {
        if step > 1 {
            for (i, t) in tensors.iter_mut().enumerate() {
                t.data = nudged(&t.data, step * 10 + i as u64);
            }
        }
        let f = r.path(&format!("big-{step}.safetensors"));
        ckpts.push(write_safetensors(&f, &tensors, &[]));
        r.ok(
            "a",
            &["commit", f.to_str().unwrap(), "-m", &format!("step {step}")],
        );
    }
    // The writer re-encoded nothing the bucket holds (reverse deltas would rewrite each
    // previous version as a second generation only this machine has): every record of its
    // copy is as the bucket has it, so all of them can be evicted.
    let files = record_files(&r, "a");
    assert!(files.len() >= 12, "{files:?}");
    assert!(
        files.iter().all(|f| f.extension().unwrap() == "0"),
        "{files:?}"
    );

    // A fresh machine lists the history from the packs' tables of contents, manifests and
    // commits alone.
    let out = r.run_at("b", &r.url, &["-v", "log"]);
    assert!(out.status.success());
    let down = bytes_down(&out.stderr);
    assert!(down < 300_000, "log downloaded {down} bytes");
    assert!(record_bytes(&r, "b") < 100_000, "{}", record_bytes(&r, "b"));
    // It checks out the oldest and the newest byte for byte, fetching their records.
    r.checks_out("b", &r.url, &["HEAD~2"], &ckpts[0]);
    r.checks_out("b", &r.url, &["HEAD"], &ckpts[2]);
    assert!(record_bytes(&r, "b") > 4 << 20);

    // A machine whose cache holds 1 MiB: every read still byte for byte, with evicted records
    // fetched again, and its record files back within the size after each command.
    let small = |args: &[&str]| {
        let mut all = vec!["-C", r.url.as_str()];
        all.extend_from_slice(args);
        let out = r
            .weed
            .command(&r.cache("c"), &all)
            .env("MDL_CACHE_SIZE", "1M")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            record_bytes(&r, "c") <= 1 << 20,
            "{args:?}: {} {}",
            record_bytes(&r, "c"),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    for (n, (rev, want)) in [
        ("HEAD", &ckpts[2]),
        ("HEAD~1", &ckpts[1]),
        ("HEAD", &ckpts[2]),
    ]
    .into_iter()
    .enumerate()
    {
        let out = r.path(&format!("small-{n}"));
        small(&["checkout", rev, "-o", out.to_str().unwrap()]);
        assert_eq!(&std::fs::read(&out).unwrap(), want, "{rev}");
    }
    // It commits the next step with its delta bases evicted; another machine reads it back.
    for (i, t) in tensors.iter_mut().enumerate() {
        t.data = nudged(&t.data, 40 + i as u64);
    }
    let f = r.path("big-4.safetensors");
    let four = write_safetensors(&f, &tensors, &[]);
    let id = small(&["commit", f.to_str().unwrap(), "-m", "step 4"]);
    assert_eq!(r.history("b", "main")[0], id.trim());
    r.checks_out("b", &r.url, &["HEAD"], &four);
    // A full check reads every record, from the bucket where the cache lacks it.
    small(&["fsck"]);
}

/// A machine whose cache cannot take a record (its disk full; here a file size limit, which
/// fails the same writes) checks a repository in object storage: `fsck` stops with one line
/// saying why, and calls nothing damaged (it once listed every record it could not write as
/// a problem and exited 3, DAMAGED). With room, the same check is clean.
#[test]
#[ignore = "needs SeaweedFS (MDL_WEED); scripts/test.sh installs it and runs these"]
fn a_cache_that_cannot_take_a_record_is_not_damage() {
    use std::os::unix::process::CommandExt;
    let r = Repo::new("team/full");
    let f = r.path("big.safetensors");
    write_safetensors(&f, &[tensor("w", "F32", &[2 << 20], 5)], &[]);
    r.ok("a", &["commit", f.to_str().unwrap(), "-m", "big"]);
    r.ok("b", &["log"]);
    let mut fsck = r.weed.command(&r.cache("b"), &["-C", &r.url, "fsck"]);
    // SAFETY: between fork and exec only async-signal-safe calls (signal, setrlimit) on
    // values made here; the limit and the ignored signal are the child's alone.
    #[allow(unsafe_code)]
    unsafe {
        fsck.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let limit = libc::rlimit {
                rlim_cur: 4 << 20,
                rlim_max: 4 << 20,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &limit);
            Ok(())
        });
    }
    let out = fsck.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{said}");
    assert_ne!(out.status.code(), Some(3), "{said}{err}");
    assert!(
        !said.contains("DAMAGED") && !err.contains("DAMAGED"),
        "{said}{err}"
    );
    assert!(err.contains("File too large"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let clean = r.ok("b", &["fsck"]);
    assert!(!clean.contains("DAMAGED"), "{clean}");
}
