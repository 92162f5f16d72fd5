//! Float codecs end to end through the library, on a generated training-like series: every
//! dtype, every delta mode, every commit checked out byte for byte, chains within the cap, and
//! corruption reported against the object it hit.

// Tests, examples and benchmarks write their own files (checkpoints, outputs, damage done on
// purpose); the rule that repository writes go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};

use mdl::checkout::{checkout, CheckoutOptions};
use mdl::commit::{commit, CommitOptions};
use mdl::policy::{DeltaMode, DeltaPolicy};
use mdl::{NoProgress, Repository};

mod common;
use common::{adam_step, checks_out_exactly, write_safetensors, Rng};

/// A model's state during training: weights of several dtypes, Adam-like moments.
struct Training {
    rng: Rng,
    w32: Vec<f32>,
    w64: Vec<f64>,
    m: Vec<f32>,
    v: Vec<f32>,
    step: u64,
}

const N: usize = 300_000;

impl Training {
    fn new() -> Training {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let w32 = (0..N).map(|_| (rng.normal() * 0.02) as f32).collect();
        let w64 = (0..N / 8).map(|_| rng.normal() * 0.5).collect();
        Training {
            rng,
            w32,
            w64,
            m: vec![0.0; N],
            v: vec![0.0; N],
            step: 0,
        }
    }

    /// One optimizer step with a small learning rate: weights move a little.
    fn step(&mut self) {
        self.step += 1;
        let rng = &mut self.rng;
        adam_step(&mut self.w32, &mut self.m, &mut self.v, 1e-4, |_| {
            rng.normal() as f32 * 0.01
        });
        for w in &mut self.w64 {
            *w += self.rng.normal() * 1e-6;
        }
    }

    fn write(&self, path: &Path) {
        let bf16: Vec<u8> = self
            .w32
            .iter()
            .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let f16: Vec<u8> = self
            .w32
            .iter()
            .take(N / 4)
            .flat_map(|&x| f32_to_f16_bits(x * 50.0).to_le_bytes())
            .collect();
        let mut specials: Vec<u8> = Vec::new();
        for bits in [
            0u32,
            0x8000_0000,
            1,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0001,
            0x7fbf_ffff,
        ] {
            specials.extend(std::iter::repeat_n(bits.to_le_bytes(), 700).flatten());
        }
        let tensors = [
            ("model.w", "F32", vec![600, 500], le(&self.w32)),
            ("model.w_bf16", "BF16", vec![600, 500], bf16),
            ("model.w_f16", "F16", vec![N as u64 / 4], f16),
            ("model.w_f64", "F64", vec![N as u64 / 8], le(&self.w64)),
            ("model.specials", "F32", vec![4900], specials),
            ("model.tiny", "F32", vec![3], le(&self.w32[..3])),
            ("optim.w.exp_avg", "F32", vec![600, 500], le(&self.m)),
            ("optim.w.exp_avg_sq", "F32", vec![600, 500], le(&self.v)),
            (
                "optim.step",
                "I64",
                vec![],
                self.step.to_le_bytes().to_vec(),
            ),
        ];
        write_safetensors(path, &tensors);
    }
}

trait Le {
    fn le(&self) -> Vec<u8>;
}
impl Le for f32 {
    fn le(&self) -> Vec<u8> {
        self.to_le_bytes().to_vec()
    }
}
impl Le for f64 {
    fn le(&self) -> Vec<u8> {
        self.to_le_bytes().to_vec()
    }
}
fn le<T: Le>(xs: &[T]) -> Vec<u8> {
    xs.iter().flat_map(Le::le).collect()
}

fn f32_to_f16_bits(x: f32) -> u16 {
    // Truncating conversion; any bit pattern will do for a lossless codec.
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    if exp <= 0 {
        sign
    } else if exp >= 31 {
        sign | 0x7c00
    } else {
        sign | (exp as u16) << 10 | ((b >> 13) & 0x3ff) as u16
    }
}

/// A repository and its commits, each with the checkpoint it committed.
type Series = (Repository, Vec<(PathBuf, mdl::ObjectId)>);

/// Commits a series of `len` checkpoints under `policy`; returns the files and commit ids.
fn series(dir: &Path, len: usize, policy: DeltaPolicy) -> Series {
    let repo = Repository::init(dir).unwrap();
    let mut t = Training::new();
    let mut out = Vec::new();
    for i in 0..len {
        t.step();
        let path = dir.join(format!("ckpt{i}.safetensors"));
        t.write(&path);
        let opts = CommitOptions {
            delta: Some(policy),
            ..Default::default()
        };
        let c = commit(&repo, &path, &opts, &NoProgress).unwrap();
        out.push((path, c.id));
    }
    (repo, out)
}

fn codecs(repo: &Repository, id: &mdl::ObjectId) -> Vec<(String, String, u32)> {
    mdl::show::show(repo, &id.to_hex())
        .unwrap()
        .tensors
        .into_iter()
        .map(|t| (t.name, t.codec, t.depth))
        .collect()
}

#[test]
fn every_mode_round_trips_and_respects_the_depth_cap() {
    for mode in [DeltaMode::Reverse, DeltaMode::Forward, DeltaMode::Off] {
        let dir = tempfile::tempdir().unwrap();
        let policy = DeltaPolicy {
            mode,
            max_depth: 2,
            max_restore_cost: None,
            defer: false,
        };
        let (repo, commits) = series(dir.path(), 6, policy);
        checks_out_exactly(&repo, &commits, dir.path());
        let mut saw_delta = false;
        for (i, (_, id)) in commits.iter().enumerate() {
            for (name, codec, depth) in codecs(&repo, id) {
                assert!(depth <= 2, "{mode}: {name} at depth {depth}");
                saw_delta |= codec.ends_with("-delta");
                if name == "model.tiny" || name == "optim.step" {
                    assert!(codec == "raw" || codec == "zstd", "{name}: {codec}");
                }
                if name == "model.w" && i == 0 {
                    assert_ne!(codec, "raw", "normal weights compress");
                }
                // Reverse deltas: the newest commit never decodes through a chain.
                if mode == DeltaMode::Reverse && i == commits.len() - 1 {
                    assert_eq!(depth, 0, "{name} in the newest commit");
                }
            }
        }
        assert_eq!(saw_delta, mode != DeltaMode::Off, "{mode}");
    }
}

#[test]
fn deltas_make_the_series_smaller() {
    let sizes: Vec<u64> = [DeltaMode::Off, DeltaMode::Reverse]
        .into_iter()
        .map(|mode| {
            let dir = tempfile::tempdir().unwrap();
            let (repo, _) = series(
                dir.path(),
                4,
                DeltaPolicy {
                    mode,
                    max_depth: 8,
                    max_restore_cost: None,
                    defer: false,
                },
            );
            mdl::stats::stats(&repo, false).unwrap().stored_bytes
        })
        .collect();
    assert!(sizes[1] < sizes[0], "{sizes:?}");
}

fn largest_record(repo: &Repository, commit_id: &mdl::ObjectId) -> (mdl::ObjectId, PathBuf) {
    let shown = mdl::show::show(repo, &commit_id.to_hex()).unwrap();
    let t = shown
        .tensors
        .iter()
        .filter(|t| t.name == "model.w")
        .max_by_key(|t| t.stored_bytes)
        .unwrap();
    (t.id, mdl::inspect::record_path(repo, &t.id).unwrap())
}

fn flip_bit(path: &Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = at.min(bytes.len() - 30);
    bytes[at] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

const REVERSE: DeltaPolicy = DeltaPolicy {
    mode: DeltaMode::Reverse,
    max_depth: 8,
    max_restore_cost: None,
    defer: false,
};

/// The error of a checkout of `rev` that must fail.
fn checkout_error(repo: &Repository, rev: &mdl::ObjectId, out: &Path) -> String {
    checkout(
        repo,
        &rev.to_hex(),
        out,
        &CheckoutOptions::default(),
        &NoProgress,
    )
    .unwrap_err()
    .to_string()
}

#[test]
fn a_flipped_bit_is_an_error_naming_the_object() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, commits) = series(dir.path(), 3, REVERSE);
    let newest = commits.last().unwrap().1;
    let oldest = commits[0].1;
    // A chunk of the newest commit's weights (a float-split base of the whole chain).
    let (id, path) = largest_record(&repo, &newest);
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    flip_bit(&path, len / 2);
    for rev in [newest, oldest] {
        let out = dir.path().join("out.safetensors");
        let err = checkout_error(&repo, &rev, &out);
        assert!(err.contains(&id.to_hex()), "{err}");
        assert!(!out.exists(), "no output after a failed checkout");
    }
    let report = mdl::fsck::fsck(&repo, false).unwrap();
    assert!(!report.ok());
    assert!(report.problems.iter().any(|p| p.contains(&id.to_hex())));
}

#[test]
fn a_flipped_bit_in_a_delta_names_the_delta() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, commits) = series(dir.path(), 3, REVERSE);
    let oldest = commits[0].1;
    let (id, path) = largest_record(&repo, &oldest);
    let shown = mdl::show::show(&repo, &oldest.to_hex()).unwrap();
    assert!(shown
        .tensors
        .iter()
        .any(|t| t.id == id && t.codec.ends_with("-delta")));
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    flip_bit(&path, len / 3);
    let out = dir.path().join("out.safetensors");
    let err = checkout_error(&repo, &oldest, &out);
    assert!(err.contains(&id.to_hex()), "{err}");
    // The newest commit does not depend on the damaged delta.
    checkout(
        &repo,
        &commits[2].1.to_hex(),
        &out,
        &CheckoutOptions::default(),
        &NoProgress,
    )
    .unwrap();
}

/// Tensors of 64 MiB and more take the one-at-a-time path in commit and checkout.
#[test]
#[ignore = "large: two 72 MiB tensors (run with --release --ignored)"]
fn big_tensors_round_trip_through_reverse_deltas() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let n = 18 << 20; // f32 elements: 72 MiB
    let mut rng = Rng(7);
    let mut w: Vec<f32> = (0..n).map(|_| (rng.normal() * 0.02) as f32).collect();
    let mut files = Vec::new();
    for i in 0..2 {
        let path = dir.path().join(format!("big{i}.safetensors"));
        write_safetensors(&path, &[("w", "F32", vec![n as u64], le(&w))]);
        let c = commit(&repo, &path, &CommitOptions::default(), &NoProgress).unwrap();
        files.push((path, c.id));
        for x in &mut w {
            *x += (rng.normal() * 1e-5) as f32;
        }
    }
    checks_out_exactly(&repo, &files, dir.path());
    let older = codecs(&repo, &files[0].1);
    assert!(older[0].1.ends_with("-delta"), "{older:?}");
}

/// Every tensor object of `commits`, with its index entry and its record's bytes.
fn tensor_records(
    repo: &Repository,
    commits: &[mdl::ObjectId],
) -> std::collections::BTreeMap<String, (String, Vec<u8>)> {
    let mut out = std::collections::BTreeMap::new();
    for c in commits {
        for t in mdl::show::show(repo, &c.to_hex()).unwrap().tensors {
            let entry = mdl::inspect::object(repo, &t.id).unwrap().unwrap();
            let record = mdl::inspect::record(repo, &t.id).unwrap();
            // All but the time it was written.
            let e = (
                entry.codec,
                entry.generation,
                entry.base,
                entry.depth,
                entry.stored_len,
                entry.content_len,
            );
            out.insert(t.id.to_hex(), (format!("{e:?}"), record));
        }
    }
    out
}

/// Deferred reverse deltas (`delta.defer`): however the queue is worked — after every commit,
/// once at the end, or now and then while commits go on — the repository ends with exactly the
/// records, index entries and chains of eager reverse-delta commits, and every commit checks
/// out byte for byte.
#[test]
fn deferred_reverse_deltas_end_where_eager_ones_do() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Training::new();
    let files: Vec<PathBuf> = (0..5)
        .map(|i| {
            t.step();
            let path = dir.path().join(format!("ckpt{i}.safetensors"));
            t.write(&path);
            path
        })
        .collect();
    let deferred = DeltaPolicy {
        defer: true,
        ..REVERSE
    };
    let nothing = || false;
    // (policy, after which commits the queue is worked)
    let runs: [(DeltaPolicy, &[usize]); 4] = [
        (REVERSE, &[]),
        (deferred, &[0, 1, 2, 3, 4]),
        (deferred, &[4]),
        (deferred, &[1, 4]),
    ];
    let mut results = Vec::new();
    for (k, (policy, work_after)) in runs.iter().enumerate() {
        let repo = Repository::init(&dir.path().join(format!("repo{k}"))).unwrap();
        let mut commits = Vec::new();
        for (i, f) in files.iter().enumerate() {
            let opts = CommitOptions {
                delta: Some(*policy),
                ..Default::default()
            };
            commits.push(commit(&repo, f, &opts, &NoProgress).unwrap().id);
            if i > 0 && policy.defer && !work_after.contains(&i) {
                // Not worked yet: the previous version is still whole.
                let older = codecs(&repo, &commits[i - 1]);
                assert!(older.iter().all(|c| !c.1.ends_with("-delta")), "{older:?}");
            }
            if work_after.contains(&i) {
                let report = mdl::commit::run_deferred(&repo, None, &nothing).unwrap();
                assert_eq!(report.pending, 0);
            }
        }
        let paired: Vec<_> = files.iter().cloned().zip(commits.iter().copied()).collect();
        let out = dir.path().join(format!("out{k}"));
        std::fs::create_dir(&out).unwrap();
        checks_out_exactly(&repo, &paired, &out);
        assert!(mdl::fsck::fsck(&repo, false).unwrap().ok());
        results.push(tensor_records(&repo, &commits));
    }
    let eager = &results[0];
    assert!(
        eager.values().any(|(e, _)| e.contains("Some(")),
        "the series has reverse deltas"
    );
    for (k, r) in results.iter().enumerate().skip(1) {
        assert_eq!(r.len(), eager.len());
        for (id, (entry, record)) in eager {
            let (e, rec) = &r[id];
            assert_eq!(e, entry, "run {k}: {id}");
            assert!(rec == record, "run {k}: {id}: other record bytes");
        }
    }
}

/// The same four-commit series in two repositories: reverse deltas made eagerly, and deferred
/// (the queue not worked yet).
fn eager_and_deferred(dir: &Path) -> (Series, Series) {
    let deferred = DeltaPolicy {
        defer: true,
        ..REVERSE
    };
    (
        series(&dir.join("eager"), 4, REVERSE),
        series(&dir.join("deferred"), 4, deferred),
    )
}

/// Asserts that the series `commits` of `repo` stores every tensor as `eager_commits` of
/// `eager` do: the same records, byte for byte.
fn same_records(
    eager: &Repository,
    eager_commits: &[(PathBuf, mdl::ObjectId)],
    repo: &Repository,
    commits: &[(PathBuf, mdl::ObjectId)],
) {
    let ids = |c: &[(PathBuf, mdl::ObjectId)]| c.iter().map(|(_, id)| *id).collect::<Vec<_>>();
    let (a, b) = (
        tensor_records(eager, &ids(eager_commits)),
        tensor_records(repo, &ids(commits)),
    );
    assert_eq!(a.len(), b.len());
    for (id, rec) in &a {
        assert!(b[id] == *rec, "{id}");
    }
}

/// A stop request ends the work at the next tensor: what was finished of the commit it was on
/// is published and the commit stays queued (the repository sound), and later runs finish
/// where eager commits end.
#[test]
fn deferred_work_stopped_anywhere_resumes_to_the_same_end() {
    let dir = tempfile::tempdir().unwrap();
    let ((eager, eager_commits), (repo, commits)) = eager_and_deferred(dir.path());
    let queued = mdl::commit::pending_deferred(&repo).unwrap();
    assert_eq!(queued, 3);
    let mut runs = 0;
    for k in 0.. {
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let stop = || calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= k;
        let report = mdl::commit::run_deferred(&repo, None, &stop).unwrap();
        assert!(mdl::fsck::fsck(&repo, false).unwrap().ok());
        runs += 1;
        if report.pending == 0 {
            break;
        }
    }
    assert!(runs > 3, "the work was stopped part-way at least once");
    checks_out_exactly(&repo, &commits, dir.path());
    same_records(&eager, &eager_commits, &repo, &commits);
    let again = mdl::commit::run_deferred(&repo, None, &|| false).unwrap();
    assert_eq!(again, mdl::commit::DeferredReport::default());
}

/// Tensors of a million elements and more are judged on their first elements before their
/// versions are decoded: one drifting (its previous version becomes a delta) and one redrawn
/// each step (no delta pays, so it is left whole without decoding either version). Deferred
/// re-encodes end with the records eager commits write.
#[test]
fn large_tensors_are_judged_on_their_first_elements() {
    let dir = tempfile::tempdir().unwrap();
    let n = 9usize << 17;
    let mut rng = Rng(7);
    let mut drifting: Vec<f32> = (0..n).map(|_| (rng.normal() * 0.02) as f32).collect();
    let files: Vec<PathBuf> = (0..3)
        .map(|i| {
            for w in &mut drifting {
                *w += (rng.normal() * 1e-5) as f32;
            }
            let redrawn: Vec<f32> = (0..n).map(|_| (rng.normal() * 1e-3) as f32).collect();
            let path = dir.path().join(format!("big{i}.safetensors"));
            write_safetensors(
                &path,
                &[
                    ("w", "F32", vec![n as u64], le(&drifting)),
                    ("w.exp_avg", "F32", vec![n as u64], le(&redrawn)),
                ],
            );
            path
        })
        .collect();
    let deferred = DeltaPolicy {
        defer: true,
        ..REVERSE
    };
    let mut records = Vec::new();
    for (k, policy) in [REVERSE, deferred].into_iter().enumerate() {
        let repo = Repository::init(&dir.path().join(format!("repo{k}"))).unwrap();
        let opts = CommitOptions {
            delta: Some(policy),
            ..Default::default()
        };
        let commits: Vec<_> = files
            .iter()
            .map(|f| commit(&repo, f, &opts, &NoProgress).unwrap().id)
            .collect();
        mdl::commit::run_deferred(&repo, None, &|| false).unwrap();
        let paired: Vec<_> = files.iter().cloned().zip(commits.iter().copied()).collect();
        let out = dir.path().join(format!("out{k}"));
        std::fs::create_dir(&out).unwrap();
        checks_out_exactly(&repo, &paired, &out);
        let oldest = codecs(&repo, &commits[0]);
        let codec = |name: &str| oldest.iter().find(|c| c.0 == name).unwrap().1.clone();
        assert!(codec("w").ends_with("-delta"), "{oldest:?}");
        assert!(!codec("w.exp_avg").ends_with("-delta"), "{oldest:?}");
        records.push(tensor_records(&repo, &commits));
    }
    assert_eq!(records[0].len(), records[1].len());
    for (id, rec) in &records[0] {
        assert!(records[1][id] == *rec, "{id}");
    }
}

/// Work stopped after every tensor still gets done (a committer whose commits come faster than
/// a commit's re-encodes catches up): each run publishes the tensor it finished, and the series
/// ends where eager commits end.
#[test]
fn deferred_work_done_a_tensor_at_a_time_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let ((eager, eager_commits), (repo, commits)) = eager_and_deferred(dir.path());
    let mut rewritten = 0;
    let mut runs = 0;
    while mdl::commit::pending_deferred(&repo).unwrap() > 0 {
        // The loop's own check, then one tensor: the next tensor's check stops the run.
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let stop = || calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= 2;
        let report = mdl::commit::run_deferred(&repo, None, &stop).unwrap();
        assert!(report.rewritten <= 1, "{report:?}");
        rewritten += report.rewritten;
        runs += 1;
        assert!(runs < 100, "the work does not advance");
    }
    assert!(rewritten > 1, "the re-encodes were published one at a time");
    assert!(mdl::fsck::fsck(&repo, false).unwrap().ok());
    checks_out_exactly(&repo, &commits, dir.path());
    same_records(&eager, &eager_commits, &repo, &commits);
}
