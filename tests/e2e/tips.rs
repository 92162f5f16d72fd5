//! Decoded tips (`.mdl/tips`): a lossy commit keeps its residual tensors decoded, and a read
//! of them is the file checked against its record's hash — never a different answer.

use std::path::{Path, PathBuf};

use crate::util::{floats, json, ok, snapshot, write_safetensors, T};

/// Checkpoint `step` of a drifting series: two weight matrices that move the same small way
/// each step (so each commit's residual against the last is smaller than a fresh quantization).
fn checkpoint(path: &Path, step: u64) {
    let tensors: Vec<T> = (0..2)
        .map(|k| {
            let base = floats(100 + k, 1 << 16);
            let drift = floats(1_000 + k, 1 << 16);
            let data = base
                .chunks(4)
                .zip(drift.chunks(4))
                .map(|(b, d)| {
                    let f = |x: &[u8]| f32::from_le_bytes(x.try_into().unwrap());
                    f(b) + f(d) * 0.02 * step as f32
                })
                .flat_map(f32::to_le_bytes)
                .collect();
            T {
                name: format!("layer{k}.weight"),
                dtype: "F32",
                shape: vec![256, 256],
                data,
            }
        })
        .collect();
    write_safetensors(path, &tensors, &[]);
}

/// A repository holding a lossy series of `commits` checkpoints.
fn lossy_series(dir: &Path, commits: u64) -> (PathBuf, PathBuf) {
    let repo = dir.join("repo");
    ok(dir, &["init", "repo"]);
    let file = dir.join("ckpt.safetensors");
    for step in 0..commits {
        checkpoint(&file, step);
        ok(&repo, &["commit", file.to_str().unwrap(), "--lossy"]);
    }
    (repo, file)
}

fn tips(repo: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(repo.join(".mdl/tips"))
        .map(|l| l.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    out.sort();
    out
}

fn checkout(repo: &Path, rev: &str, out: &Path) -> Vec<u8> {
    let _ = std::fs::remove_file(out);
    ok(repo, &["checkout", rev, "-o", out.to_str().unwrap()]);
    std::fs::read(out).unwrap()
}

#[test]
fn a_lossy_series_keeps_its_newest_residuals_decoded_and_reads_them_only_when_they_hash_right() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, file) = lossy_series(dir.path(), 3);
    // The newest commit's two residual tensors, not the older ones'.
    let kept = tips(&repo);
    assert_eq!(kept.len(), 2, "{kept:?}");
    let stats = json(&repo, &["stats"]);
    let on_disk: u64 = kept.iter().map(|p| p.metadata().unwrap().len()).sum();
    assert_eq!(stats["tips_bytes"].as_u64(), Some(on_disk));
    assert_eq!(on_disk, 2 * (4 << 16), "two tensors of 64 Ki f32");

    let out = dir.path().join("out.safetensors");
    let with_tips = checkout(&repo, "main", &out);
    let older = checkout(&repo, "main~1", &out);
    let records = || snapshot(&repo.join(".mdl/objects"));
    let records_before = records();

    // Damaged tips (a flipped byte, a truncated file, a link elsewhere) are read past: the
    // checkout decodes the chains and gives the same bytes, and nothing else changes.
    let mut flipped = std::fs::read(&kept[0]).unwrap();
    flipped[12345] ^= 0x40;
    std::fs::write(&kept[0], &flipped).unwrap();
    std::fs::write(&kept[1], b"short").unwrap();
    assert_eq!(checkout(&repo, "main", &out), with_tips);
    std::fs::remove_file(&kept[1]).unwrap();
    std::os::unix::fs::symlink(&file, &kept[1]).unwrap();
    assert_eq!(checkout(&repo, "main", &out), with_tips);
    std::fs::remove_dir_all(repo.join(".mdl/tips")).unwrap();
    assert_eq!(checkout(&repo, "main", &out), with_tips);
    assert_eq!(checkout(&repo, "main~1", &out), older);
    assert_eq!(records(), records_before);
}

#[test]
fn a_commit_stores_the_same_records_whether_its_references_come_from_tips_or_chains() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, file) = lossy_series(dir.path(), 3);
    let copy = dir.path().join("copy");
    let cp = std::process::Command::new("cp")
        .args(["-a", repo.to_str().unwrap(), copy.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(cp.success());
    // The copy's tips are planted with other content of the right length: its next commit
    // must take its references from the chains, and store exactly what the original does.
    for tip in tips(&copy) {
        let len = tip.metadata().unwrap().len() as usize;
        std::fs::write(&tip, vec![7u8; len]).unwrap();
    }
    checkpoint(&file, 3);
    for r in [&repo, &copy] {
        ok(r, &["commit", file.to_str().unwrap(), "--lossy"]);
    }
    let manifest = |r: &Path| json(r, &["show", "main"])["manifest"].clone();
    assert_eq!(manifest(&repo), manifest(&copy));
    let out = dir.path().join("out.safetensors");
    assert_eq!(checkout(&repo, "main", &out), checkout(&copy, "main", &out));
    // Each now keeps the new commit's tips only, and the copy's are the right ones.
    assert_eq!(tips(&repo).len(), 2);
    for (a, b) in tips(&repo).iter().zip(tips(&copy)) {
        assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    }
}

#[test]
fn no_tips_are_kept_with_quant_tips_off() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    ok(dir.path(), &["init", "repo"]);
    ok(&repo, &["config", "quant.tips", "off"]);
    let file = dir.path().join("ckpt.safetensors");
    let out = dir.path().join("out.safetensors");
    for step in 0..3 {
        checkpoint(&file, step);
        ok(&repo, &["commit", file.to_str().unwrap(), "--lossy"]);
    }
    assert!(tips(&repo).is_empty());
    assert_eq!(json(&repo, &["stats"])["tips_bytes"].as_u64(), Some(0));
    // The same series with tips checks out the same bytes.
    let other = tempfile::tempdir().unwrap();
    let (with_tips, _) = lossy_series(other.path(), 3);
    assert_eq!(tips(&with_tips).len(), 2);
    assert_eq!(
        checkout(&repo, "main", &out),
        checkout(&with_tips, "main", &out)
    );
}

#[test]
fn gc_removes_the_tips_of_objects_the_index_no_longer_names() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _) = lossy_series(dir.path(), 2);
    let kept = tips(&repo);
    assert_eq!(kept.len(), 2);
    let stranger = repo.join(".mdl/tips").join("ab".repeat(32));
    std::fs::write(&stranger, b"not a tip").unwrap();
    ok(&repo, &["gc"]);
    assert_eq!(tips(&repo), kept);
}
