//! Compaction, gc and retention through the library: ids and checkouts never change, chains end
//! within the cap, only unreachable objects go, thinned commits say what expired, and a commit
//! racing gc in the same process is never damaged.

// Tests, examples and benchmarks write their own files (checkpoints, outputs, damage done on
// purpose); the rule that repository writes go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use mdl::checkout::{checkout, CheckoutOptions};
use mdl::commit::{commit, CommitOptions};
use mdl::compact::{compact, CompactOptions};
use mdl::gc::{gc, GcOptions};
use mdl::lossy::{CodecMode, LossyRequest};
use mdl::policy::{DeltaMode, DeltaPolicy};
use mdl::{Error, NoProgress, ObjectId, Repository};

mod common;
use common::{adam_step, write_safetensors, Rng};

const N: usize = 40_000;

/// A small model with Adam moments under the default pairing names.
struct Run {
    rng: Rng,
    w: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
    step: u64,
}

impl Run {
    fn new(seed: u64) -> Run {
        let mut rng = Rng(seed);
        let w = (0..N).map(|_| (rng.normal() * 0.02) as f32).collect();
        Run {
            rng,
            w,
            m: vec![0.0; N],
            v: vec![0.0; N],
            step: 0,
        }
    }

    fn step(&mut self) {
        self.step += 1;
        let rng = &mut self.rng;
        adam_step(&mut self.w, &mut self.m, &mut self.v, 1e-4, |_| {
            rng.normal() as f32 * 0.01
        });
    }

    /// Writes the checkpoint; without `moments`, the file a thinned checkout must equal.
    fn write(&self, path: &Path, moments: bool) -> Vec<u8> {
        let bytes = |x: &[f32]| x.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
        let mut t = vec![("model.w", "F32", vec![N as u64], bytes(&self.w))];
        if moments {
            t.push(("optim.w.exp_avg", "F32", vec![N as u64], bytes(&self.m)));
            t.push(("optim.w.exp_avg_sq", "F32", vec![N as u64], bytes(&self.v)));
        }
        write_safetensors(path, &t);
        std::fs::read(path).unwrap()
    }
}

fn opts(mode: DeltaMode, max_depth: u32, lossy: bool) -> CommitOptions {
    CommitOptions {
        delta: Some(DeltaPolicy {
            mode,
            max_depth,
            max_restore_cost: None,
            defer: false,
        }),
        lossy: LossyRequest {
            mode: Some(if lossy {
                CodecMode::Lossy
            } else {
                CodecMode::Lossless
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn checkout_bytes(repo: &Repository, id: &ObjectId, dir: &Path) -> mdl::Result<Vec<u8>> {
    let out = dir.join("out.safetensors");
    let o = CheckoutOptions {
        force: true,
        ..Default::default()
    };
    checkout(repo, &id.to_hex(), &out, &o, &NoProgress)?;
    Ok(std::fs::read(&out).unwrap())
}

/// Commits `n` steps of a run; returns each commit with its checked-out bytes.
fn series(repo: &Repository, dir: &Path, n: usize, o: &CommitOptions) -> Vec<(ObjectId, Vec<u8>)> {
    let mut run = Run::new(7);
    let file = dir.join("ckpt.safetensors");
    let mut out = Vec::new();
    for _ in 0..n {
        run.step();
        run.write(&file, true);
        let c = commit(repo, &file, o, &NoProgress).unwrap();
        out.push((c.id, checkout_bytes(repo, &c.id, dir).unwrap()));
    }
    out
}

fn compact_to(repo: &Repository, cap: u32, dry_run: bool) -> mdl::compact::CompactOutcome {
    let o = CompactOptions {
        max_depth: Some(cap),
        dry_run,
    };
    compact(repo, &o, &NoProgress).unwrap()
}

/// gc with no grace period and no reflog protection.
fn gc_now() -> GcOptions {
    GcOptions {
        prune_older_than: Duration::ZERO,
        expire_reflog: Duration::ZERO,
        dry_run: false,
        count_leftovers: true,
    }
}

fn reverse() -> CommitOptions {
    opts(DeltaMode::Reverse, 16, false)
}

fn depths(repo: &Repository) -> Vec<u32> {
    mdl::inspect::objects(repo)
        .unwrap()
        .iter()
        .map(|(_, e)| e.depth)
        .collect()
}

fn assert_sound(repo: &Repository) -> mdl::fsck::FsckReport {
    let report = mdl::fsck::fsck(repo, false).unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    report
}

#[test]
fn compaction_bounds_chains_and_changes_no_checkout() {
    for lossy in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let commits = series(&repo, dir.path(), 12, &opts(DeltaMode::Forward, 100, lossy));
        assert!(depths(&repo).iter().max().unwrap() >= &10, "forward chains");

        let index_before = mdl::inspect::objects(&repo).unwrap();
        let dry = compact_to(&repo, 3, true);
        assert!(dry.reencoded > 0 && dry.longest_after <= 3);
        assert_eq!(
            mdl::inspect::objects(&repo).unwrap(),
            index_before,
            "a dry run changes nothing"
        );

        for cap in [3, 1, 0] {
            let out = compact_to(&repo, cap, false);
            assert!(out.longest_after <= cap, "{out:?}");
            assert!(
                depths(&repo).iter().all(|&d| d <= cap),
                "lossy={lossy} cap={cap}"
            );
            assert_eq!(
                out.longest_before,
                *depths(&repo).iter().max().unwrap().max(&out.longest_before)
            );
            let report = assert_sound(&repo);
            assert_eq!(report.unindexed_records, 0, "old generations are removed");
            for (id, bytes) in &commits {
                assert!(
                    &checkout_bytes(&repo, id, dir.path()).unwrap() == bytes,
                    "commit {id} changed by compaction (lossy={lossy}, cap={cap})"
                );
            }
        }
        // Nothing left to do.
        let again = compact_to(&repo, 0, false);
        assert_eq!(again.reencoded, 0);
    }
}

#[test]
fn gc_removes_only_what_nothing_reaches() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let repo = Repository::init(d).unwrap();
    let main = series(&repo, d, 3, &reverse());

    // An experiment branch; its first commit makes main's tip tensors deltas against its own.
    let mut run = Run::new(99);
    let file = d.join("exp.safetensors");
    let mut exp = Vec::new();
    for _ in 0..3 {
        run.step();
        run.write(&file, true);
        let o = CommitOptions {
            branch: Some(mdl::RefName::new("exp").unwrap()),
            ..reverse()
        };
        exp.push(commit(&repo, &file, &o, &NoProgress).unwrap().id);
    }
    // Same content on main as the experiment's first checkpoint would share nothing; now
    // delete the branch (refused unless forced: nothing else reaches its commits). Its
    // reflog stays, ending with the deletion, and names its commits until it expires.
    assert!(matches!(
        mdl::refs::delete_branch(&repo, "exp", false),
        Err(mdl::Error::UnmergedBranch { commits: 3, .. })
    ));
    mdl::refs::delete_branch(&repo, "exp", true).unwrap();
    let (_, log) = mdl::refs::reflog(&repo, Some("exp")).unwrap();
    assert_eq!(
        log.len(),
        4,
        "three commits (the first made it), deleted: {log:?}"
    );
    assert_eq!((log[0].old, log[0].new), (Some(exp[2]), None));
    let now = gc_now();

    // The default reflog expiry keeps the deleted branch's commits.
    let kept = gc(&repo, &GcOptions::default(), &NoProgress).unwrap();
    assert_eq!(kept.commits + kept.tensors + kept.manifests, 0);
    // Once its entries expire, the default grace period still keeps everything this young.
    let young = gc(
        &repo,
        &GcOptions {
            expire_reflog: std::time::Duration::ZERO,
            dry_run: true,
            ..GcOptions::default()
        },
        &NoProgress,
    )
    .unwrap();
    assert_eq!(young.commits + young.tensors + young.manifests, 0);
    assert!(young.kept_young > 0);

    let dry = gc(
        &repo,
        &GcOptions {
            dry_run: true,
            ..now.clone()
        },
        &NoProgress,
    )
    .unwrap();
    assert_eq!(dry.commits, 3);
    assert!(mdl::inspect::object(&repo, &exp[0]).unwrap().is_some());

    let out = gc(&repo, &now, &NoProgress).unwrap();
    assert_eq!(out.commits, 3, "{out:?}");
    assert_eq!(out.manifests, 3);
    assert!(out.tensors >= 3 && out.bytes_freed > 0);
    for id in &exp {
        assert!(mdl::inspect::object(&repo, id).unwrap().is_none());
        assert!(!mdl::transfer::has_commit(&repo, id).unwrap());
    }
    let report = assert_sound(&repo);
    assert_eq!(report.unindexed_records, 0);
    for (id, bytes) in &main {
        assert!(
            &checkout_bytes(&repo, id, d).unwrap() == bytes,
            "main changed"
        );
    }
    // A second run finds nothing.
    let again = gc(&repo, &now, &NoProgress).unwrap();
    assert_eq!(
        again.commits + again.tensors + again.manifests + again.leftover_files,
        0
    );
}

#[test]
fn retention_thins_old_commits_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let repo = Repository::init(d).unwrap();
    mdl::config::set_config(&repo, "retention.keep_last", "2").unwrap();
    let mut run = Run::new(3);
    let file = d.join("ckpt.safetensors");
    let mut commits: Vec<(ObjectId, Vec<u8>, Vec<u8>)> = Vec::new();
    for _ in 0..6 {
        run.step();
        let thin = run.write(&d.join("thin.safetensors"), false);
        let full = run.write(&file, true);
        let c = commit(&repo, &file, &reverse(), &NoProgress).unwrap();
        commits.push((c.id, full, thin));
    }
    mdl::refs::create_tag(&repo, "keep", Some(&commits[1].0.to_hex()), None, "t").unwrap();
    let out = gc(
        &repo,
        &GcOptions {
            prune_older_than: Duration::ZERO,
            ..Default::default()
        },
        &NoProgress,
    )
    .unwrap();
    // c0, c2, c3 thinned: c4 and c5 are the last two, c1 is tagged.
    assert_eq!(out.thinned_commits, 3, "{out:?}");
    assert_eq!(out.expired, 6);
    assert_eq!(out.commits, 0);

    let report = assert_sound(&repo);
    assert_eq!(report.expired, 6);
    for (i, (id, full, thin)) in commits.iter().enumerate() {
        let shown = mdl::show::show(&repo, &id.to_hex()).unwrap();
        if [0, 2, 3].contains(&i) {
            assert_eq!(shown.expired_tensors, 2);
            let err = checkout_bytes(&repo, id, d).unwrap_err();
            match &err {
                Error::Expired { tensors, .. } => {
                    assert_eq!(tensors, &["optim.w.exp_avg", "optim.w.exp_avg_sq"])
                }
                e => panic!("expected an expired error, got {e}"),
            }
            assert!(err.to_string().contains("optim.w.exp_avg"));
            let out = d.join("skip.safetensors");
            let o = CheckoutOptions {
                skip_expired: true,
                ..Default::default()
            };
            let done = checkout(&repo, &id.to_hex(), &out, &o, &NoProgress).unwrap();
            assert_eq!(done.skipped.len(), 2);
            let written = std::fs::read(&out).unwrap();
            std::fs::remove_file(&out).unwrap();
            // The weights are intact; the file parses and holds exactly them.
            let (header_len, rest) = written.split_at(8);
            let n = u64::from_le_bytes(header_len.try_into().unwrap()) as usize;
            assert_eq!(&rest[n..], &thin[thin.len() - N * 4..]);
            let json: serde_json::Value = serde_json::from_slice(&rest[..n]).unwrap();
            assert_eq!(json.as_object().unwrap().len(), 1, "{json}");
        } else {
            assert_eq!(shown.expired_tensors, 0, "commit {i}");
            assert!(&checkout_bytes(&repo, id, d).unwrap() == full);
        }
    }
    let log = mdl::log::log(&repo, None, None).unwrap();
    let thinned: Vec<u32> = log.iter().map(|e| e.expired_tensors).collect();
    assert_eq!(thinned, vec![0, 0, 2, 2, 0, 2]);

    // Committing a thinned checkpoint again stores its moments again: no longer expired.
    std::fs::write(&file, &commits[2].1).unwrap();
    let again = commit(&repo, &file, &reverse(), &NoProgress).unwrap();
    assert!(checkout_bytes(&repo, &again.id, d).unwrap() == commits[2].1);
    assert!(checkout_bytes(&repo, &commits[2].0, d).unwrap() == commits[2].1);
    assert_sound(&repo);
}

#[test]
fn commits_racing_gc_in_one_process_are_never_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let d: PathBuf = dir.path().to_path_buf();
    let repo = Repository::init(&d).unwrap();
    mdl::config::set_config(&repo, "retention.keep_last", "2").unwrap();
    let now = gc_now();
    let done = std::sync::atomic::AtomicBool::new(false);
    let committed = std::thread::scope(|s| {
        let committer = s.spawn(|| {
            let mut run = Run::new(11);
            let mut out = Vec::new();
            for i in 0..8 {
                run.step();
                let file = d.join(format!("c{i}.safetensors"));
                let bytes = run.write(&file, true);
                let o = reverse();
                let c = commit(&repo, &file, &o, &NoProgress).unwrap();
                out.push((c.id, bytes));
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            out
        });
        let mut runs = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            gc(&repo, &now, &NoProgress).unwrap();
            compact_to(&repo, 1, false);
            runs += 1;
        }
        assert!(runs > 0);
        committer.join().unwrap()
    });
    gc(&repo, &now, &NoProgress).unwrap();
    assert_sound(&repo);
    // The last two are kept in full; the older ones keep their weights.
    let n = committed.len();
    for (id, bytes) in &committed[n - 2..] {
        assert!(&checkout_bytes(&repo, id, &d).unwrap() == bytes);
    }
    for (id, _) in &committed[..n - 2] {
        let o = CheckoutOptions {
            skip_expired: true,
            force: true,
            ..Default::default()
        };
        checkout(
            &repo,
            &id.to_hex(),
            &d.join("x.safetensors"),
            &o,
            &NoProgress,
        )
        .unwrap();
    }
}

#[test]
fn restore_cost_cap_starts_new_bases() {
    let chain_cost = |repo: &Repository| {
        let index: std::collections::HashMap<_, _> =
            mdl::inspect::objects(repo).unwrap().into_iter().collect();
        index
            .values()
            .filter(|e| e.base.is_some())
            .map(|e| {
                let mut cost = e.stored_len;
                let mut at = *e;
                while let Some(b) = at.base {
                    at = index[&b];
                    cost += at.stored_len;
                }
                cost as f64 / e.content_len as f64
            })
            .fold(0.0, f64::max)
    };
    let mut worst = Vec::new();
    for cap in [None, Some(2.0)] {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let mut o = opts(DeltaMode::Forward, 100, false);
        o.delta.as_mut().unwrap().max_restore_cost = cap;
        series(&repo, dir.path(), 10, &o);
        worst.push((chain_cost(&repo), *depths(&repo).iter().max().unwrap()));
    }
    assert!(worst[0].0 > 2.0, "uncapped chains read more: {worst:?}");
    assert!(worst[1].0 <= 2.0, "capped: {worst:?}");
    assert!(worst[1].1 < worst[0].1);
}
