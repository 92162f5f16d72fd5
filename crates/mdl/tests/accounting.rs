//! `mdl stats --lossy`: a series' bytes by role and its ratios under DynaQuant's and ExCP's
//! accountings, checked against what `mdl show` says of each tensor.

// Tests write their own checkpoints.
#![allow(clippy::disallowed_methods)]

use std::collections::HashSet;

use mdl::commit::{commit, CommitOptions};
use mdl::{NoProgress, Repository};

mod common;
use common::{adam_step, write_safetensors, Rng};

const N: usize = 64 * 64;

/// Three checkpoints of one matrix trained with Adam, as a mixed-precision run writes them
/// (the weights twice: bf16-sized f32 model copy and a master), moments and a step counter.
fn series(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut rng = Rng(7);
    let mut w: Vec<f32> = (0..N).map(|_| (rng.normal() * 0.02) as f32).collect();
    let (mut m, mut v) = (vec![0f32; N], vec![0f32; N]);
    let f32s = |x: &[f32]| x.iter().flat_map(|y| y.to_le_bytes()).collect::<Vec<u8>>();
    (0..3)
        .map(|k| {
            adam_step(&mut w, &mut m, &mut v, 1e-3, |x| {
                (rng.normal() * 0.01 + x as f64 * 0.1) as f32
            });
            let half: Vec<f32> = w.iter().map(|x| x * 0.5).collect();
            let path = dir.join(format!("c{k}.safetensors"));
            write_safetensors(
                &path,
                &[
                    ("model.w", "F32", vec![64, 64], f32s(&half)),
                    ("optim.w.master", "F32", vec![64, 64], f32s(&w)),
                    ("optim.w.exp_avg", "F32", vec![64, 64], f32s(&m)),
                    ("optim.w.exp_avg_sq", "F32", vec![64, 64], f32s(&v)),
                    (
                        "optim.step",
                        "I64",
                        vec![],
                        (k as i64 + 1).to_le_bytes().to_vec(),
                    ),
                ],
            );
            path
        })
        .collect()
}

/// Stored bytes of the tensors of `commits` (oldest first) whose names `role` takes, each
/// object counted at the first commit naming it: per commit.
fn stored_by_commit(repo: &Repository, commits: &[String], role: fn(&str) -> bool) -> Vec<u64> {
    let mut seen = HashSet::new();
    commits
        .iter()
        .map(|c| {
            let shown = mdl::show::show(repo, c).unwrap();
            shown
                .tensors
                .iter()
                .filter(|t| role(&t.name) && seen.insert(t.id))
                .map(|t| t.stored_bytes)
                .sum()
        })
        .collect()
}

#[test]
fn stats_counts_a_series_as_the_papers_do() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(&dir.path().join("repo")).unwrap();
    assert_eq!(mdl::stats::stats(&repo, true).unwrap().lossy, None);
    let commits: Vec<String> = series(dir.path())
        .iter()
        .map(|f| {
            let c = commit(&repo, f, &CommitOptions::default(), &NoProgress).unwrap();
            c.id.to_string()
        })
        .collect();
    let s = mdl::stats::stats(&repo, true).unwrap();
    let a = s.lossy.clone().expect("a series");
    assert_eq!(a.commits, 3);
    // Both copies of the weights are weights; the step counter is not.
    assert_eq!(a.weights.elements, 3 * 2 * N as u64);
    assert_eq!(a.exp_avg.elements, 3 * N as u64);
    assert_eq!(a.exp_avg_sq.elements, 3 * N as u64);
    assert_eq!(a.other.elements, 3);
    assert_eq!(a.weights.raw_bytes, 4 * a.weights.elements);
    let weights = |n: &str| n == "model.w" || n == "optim.w.master";
    let first = |n: &str| n.ends_with(".exp_avg");
    let second = |n: &str| n.ends_with(".exp_avg_sq");
    let w = stored_by_commit(&repo, &commits, weights);
    let m = stored_by_commit(&repo, &commits, first);
    let v = stored_by_commit(&repo, &commits, second);
    assert_eq!(a.weights.stored_bytes, w.iter().sum::<u64>());
    assert_eq!(a.exp_avg.stored_bytes, m.iter().sum::<u64>());
    assert_eq!(a.exp_avg_sq.stored_bytes, v.iter().sum::<u64>());
    let dynaquant = (4 * 3 * 2 * N) as f64 / a.weights.stored_bytes as f64;
    assert!((a.dynaquant - dynaquant).abs() < 1e-9 * dynaquant);
    // ExCP's: the commits after the first, weights and both moments.
    let later: u64 = (1..3).map(|k| w[k] + m[k] + v[k]).sum();
    let excp = (4 * 2 * 4 * N) as f64 / later as f64;
    assert!(
        (a.excp - excp).abs() < 1e-9 * excp,
        "{} against {excp}",
        a.excp
    );
    // One branch, nothing unreachable: mdl's ratio of the series is the repository's.
    assert!((a.ratio - s.ratio).abs() < 1e-9 * s.ratio, "{a:?} {s:?}");
    // Without asking, nothing is read for it.
    assert_eq!(mdl::stats::stats(&repo, false).unwrap().lossy, None);
}
