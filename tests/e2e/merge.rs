//! `mdl merge`: a commit with every merged commit as a parent, the strategy recorded, float
//! tensors combined, identical and non-float ones taken as they are, training state left out;
//! a refused merge changes nothing. (Bit-exactness of every strategy against a numpy
//! reference: tests/python/test_merge.py.)

use std::path::Path;

use crate::trees::torch_fixture;
use crate::util::*;

/// A checkpoint folder: `model.safetensors` of `mixed(1)` with the tensors of `changes`
/// replaced (name, seed), and a real `torch.save` optimizer.
fn checkpoint(dir: &Path, changes: &[(&str, u64)]) {
    std::fs::create_dir_all(dir).unwrap();
    let tensors: Vec<T> = mixed(1)
        .into_iter()
        .map(|t| match changes.iter().find(|(n, _)| *n == t.name) {
            Some((_, seed)) => tensor(&t.name, t.dtype, &t.shape, *seed),
            None => t,
        })
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors, &[]);
    std::fs::copy(torch_fixture("optimizer.pt"), dir.join("optimizer.pt")).unwrap();
}

/// A repository with a base on `main` and branches `a` and `b` from it, each changing tensors.
fn two_fine_tunes(tmp: &Path, b_changes: &[(&str, u64)]) -> std::path::PathBuf {
    let repo = tmp.join("repo");
    ok(tmp, &["init", repo.to_str().unwrap()]);
    checkpoint(&tmp.join("base"), &[]);
    ok(
        &repo,
        &["commit", tmp.join("base").to_str().unwrap(), "-m", "base"],
    );
    checkpoint(
        &tmp.join("a"),
        &[("model.embed.weight", 2), ("optim.step", 9)],
    );
    ok(
        &repo,
        &[
            "commit",
            tmp.join("a").to_str().unwrap(),
            "--branch",
            "a",
            "-m",
            "a",
        ],
    );
    checkpoint(&tmp.join("b"), b_changes);
    ok(
        &repo,
        &[
            "commit",
            tmp.join("b").to_str().unwrap(),
            "--branch",
            "b",
            "-m",
            "b",
        ],
    );
    repo
}

fn tensor_ids(repo: &Path, rev: &str) -> std::collections::HashMap<String, String> {
    json(repo, &["show", rev])["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["file"] == "model.safetensors")
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn a_merge_has_every_parent_records_how_and_leaves_training_state_out() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = two_fine_tunes(
        tmp.path(),
        &[("model.embed.weight", 3), ("model.h.0.bf16", 4)],
    );
    let id = |rev: &str| {
        json(&repo, &["show", rev])["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (base, a, b) = (id("main"), id("a"), id("b"));

    let m = json(&repo, &["merge", "a", "b"]);
    assert_eq!(m["left_out"], serde_json::json!(["optimizer.pt"]));
    // embed and bf16 differ between a and b; optim.step (an integer) is a's.
    assert_eq!(m["computed"], 2, "{m}");
    assert_eq!(
        m["from_first"],
        serde_json::json!(["model.safetensors:optim.step"])
    );
    assert_eq!(m["commit"]["branch"], "main");

    let shown = json(&repo, &["show", "HEAD"]);
    let parents: Vec<&str> = shown["parents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(parents, [base.as_str(), a.as_str(), b.as_str()]);
    let props = &shown["properties"];
    assert_eq!(props["merge.strategy"], "linear");
    assert_eq!(props["merge.of"], "a,b");
    assert_eq!(props["merge.weights"], "0.5,0.5");
    assert_eq!(props["merge.optimizer"], "left-out");
    assert_eq!(shown["message"], "merge a, b (linear)");

    // Tensors equal everywhere keep their object; the integer comes from the first branch.
    let (merged, base_ids, a_ids) = (
        tensor_ids(&repo, "HEAD"),
        tensor_ids(&repo, "main~1"),
        tensor_ids(&repo, "a"),
    );
    assert_eq!(merged["frozen"], base_ids["frozen"]);
    assert_eq!(merged["model.h.0.f16"], base_ids["model.h.0.f16"]);
    assert_eq!(merged["optim.step"], a_ids["optim.step"]);

    // The tree: no optimizer, and the average computed in fp32 (0.5·a + 0.5·b).
    let files: Vec<&str> = shown["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["model.safetensors"]);
    let out = tmp.path().join("merged.safetensors");
    ok(&repo, &["checkout", "HEAD", "-o", out.to_str().unwrap()]);
    let embed = |seed| f32s(&tensor("e", "F32", &[64, 32], seed).data);
    let want: Vec<u8> = embed(2)
        .iter()
        .zip(embed(3))
        .flat_map(|(x, y)| (0.5f32 * x + 0.5f32 * y).to_le_bytes())
        .collect();
    let file = std::fs::read(&out).unwrap();
    assert!(
        file.windows(want.len()).any(|w| w == want.as_slice()),
        "the averaged tensor is not in the file"
    );

    // log --graph draws a three-parent merge.
    let graph = ok(&repo, &["log", "--graph", "--all"]);
    assert!(graph.contains("|\\"), "{graph}");
    assert_fsck_clean(&repo);

    // --optimizer keeps the optimizer; TIES over the common ancestor records it.
    let m = json(
        &repo,
        &[
            "merge",
            "a",
            "b",
            "--strategy",
            "ties",
            "--density",
            "0.5",
            "--optimizer",
            "--branch",
            "soup",
        ],
    );
    assert_eq!(m["left_out"], serde_json::json!([]));
    assert_eq!(m["base"].as_str(), Some(base.as_str()));
    let props = json(&repo, &["show", "soup"])["properties"].clone();
    assert_eq!(props["merge.density"], "0.5");
    assert_eq!(props["merge.base"].as_str(), Some(base.as_str()));
    assert_eq!(props["merge.optimizer"], "averaged");
}

#[test]
fn a_refused_merge_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = two_fine_tunes(tmp.path(), &[("model.embed.weight", 3)]);
    // A branch whose embedding has another shape.
    let c = tmp.path().join("c");
    std::fs::create_dir_all(&c).unwrap();
    let mut tensors = mixed(1);
    tensors[0] = tensor("model.embed.weight", "F32", &[32, 64], 5);
    write_safetensors(&c.join("model.safetensors"), &tensors, &[]);
    ok(
        &repo,
        &["commit", c.to_str().unwrap(), "--branch", "c", "-m", "c"],
    );

    let before = state(&repo);
    let refused: [(&[&str], &str); 7] = [
        (
            &["merge", "a", "a"],
            "is the same commit as another one named",
        ),
        (
            &["merge", "a", "b", "--weights", "1"],
            "1 weights for 2 commits",
        ),
        (&["merge", "a", "b", "--weights", "1,-1"], "sum to 0"),
        (&["merge", "a", "nope"], "unknown revision"),
        (
            &["merge", "a", "b", "--strategy", "ties", "--density", "0"],
            "density 0 is out of range",
        ),
        (
            &["merge", "a", "b", "--strategy", "soup"],
            "unknown merge strategy",
        ),
        (
            &["merge", "a", "c"],
            "only tensors of one dtype and shape merge",
        ),
    ];
    for (args, want) in refused {
        fails(&repo, args, want);
        assert_eq!(state(&repo), before, "mdl {args:?} changed the repository");
    }
    assert_fsck_clean(&repo);
}
