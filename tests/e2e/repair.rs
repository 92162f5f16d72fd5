//! `meta.redb` is not a single point of failure: no command writes into `.mdl/`, a lost or
//! damaged database is rebuilt by `mdl fsck --repair` from the object records and the journal,
//! and a damaged one is a clear error, never a panic.

use std::path::Path;

use crate::maintenance::{checkpoint, data_and_names};
use crate::util::*;

/// A repository with two branches, a lightweight and an annotated tag, delta chains, a lossy
/// commit, thinned commits (retention and gc), and settings. Returns the commit ids of main,
/// newest first.
fn rich_repository(d: &Path) -> Vec<String> {
    ok(d, &["init"]);
    ok(d, &["config", "delta.max_depth", "8"]);
    ok(d, &["config", "retention.keep_last", "2"]);
    for n in 0..4 {
        let f = d.join(format!("f{n}.safetensors"));
        checkpoint(&f, n, true);
        let mut args = vec!["commit", f.to_str().unwrap(), "-m", "step"];
        if n == 3 {
            args.push("--lossy");
        }
        ok(d, &args);
        if n == 1 {
            ok(d, &["tag", "v1"]);
            ok(d, &["branch", "exp"]);
        }
    }
    let f = d.join("e.safetensors");
    checkpoint(&f, 10, true);
    ok(
        d,
        &[
            "commit",
            f.to_str().unwrap(),
            "-b",
            "exp",
            "-m",
            "experiment",
        ],
    );
    ok(d, &["tag", "v2", "exp", "-m", "the experiment"]);
    let gc = json(d, &["gc", "--prune-older-than", "0s"]);
    assert!(
        gc["expired"].as_u64().unwrap() > 0,
        "nothing was thinned: {gc}"
    );
    json(d, &["log"])
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

/// Everything a user sees of the repository: refs, histories, settings, what each commit
/// holds, and each commit's checkout (thinned ones without their expired tensors).
fn everything(d: &Path, ids: &[String]) -> Vec<String> {
    let mut seen = vec![
        state(d),
        ok(d, &["log", "exp", "--json"]),
        ok(d, &["config"]),
    ];
    let out = d.join("everything.out");
    for id in ids.iter().chain([&"exp".to_string()]) {
        let shown = json(d, &["show", id]);
        seen.push(shown.to_string());
        let mut args = vec!["checkout", id, "-o", out.to_str().unwrap(), "--force"];
        if shown["expired_tensors"].as_u64().unwrap() > 0 {
            args.push("--skip-expired");
        }
        ok(d, &args);
        let bytes = std::fs::read(&out).unwrap();
        seen.push(format!("{:?}", data_and_names(&bytes)));
    }
    seen
}

#[test]
fn no_output_lands_inside_mdl() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = d.join("a.safetensors");
    write_safetensors(&f, &mixed(1), &[]);
    ok(d, &["init"]);
    ok(d, &["commit", f.to_str().unwrap()]);
    let before = state(d);
    let meta = std::fs::read(d.join(".mdl/meta.redb")).unwrap();
    for target in [
        ".mdl/meta.redb",
        ".mdl/objects/x.safetensors",
        ".mdl/new.safetensors",
    ] {
        let out = d.join(target);
        fails(
            d,
            &["checkout", "main", "-o", out.to_str().unwrap(), "--force"],
            "inside the repository's .mdl directory",
        );
    }
    // Through a symlinked directory too.
    std::os::unix::fs::symlink(d.join(".mdl"), d.join("link")).unwrap();
    let out = d.join("link/meta.redb");
    fails(
        d,
        &["checkout", "main", "-o", out.to_str().unwrap(), "--force"],
        "inside the repository's .mdl directory",
    );
    assert!(std::fs::read(d.join(".mdl/meta.redb")).unwrap() == meta);
    assert_eq!(state(d), before);
    assert_fsck_clean(d);
}

#[test]
fn a_lost_database_is_rebuilt_from_records_and_journal() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ids = rich_repository(d);
    let before = everything(d, &ids);
    assert_fsck_clean(d);

    std::fs::remove_file(d.join(".mdl/meta.redb")).unwrap();
    fails(d, &["log"], "mdl fsck --repair");
    let repaired = json(d, &["fsck", "--repair"]);
    assert_eq!(repaired["ok"], true, "{repaired}");
    assert!(repaired["rebuilt"]["journal"].as_bool().unwrap());
    assert!(repaired["rebuilt"]["unusable"]
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(everything(d, &ids), before);
    assert_fsck_clean(d);
    // The repository goes on working: a commit on top, and the journal still agrees.
    let f = d.join("g.safetensors");
    checkpoint(&f, 20, true);
    ok(d, &["commit", f.to_str().unwrap(), "-m", "after repair"]);
    assert_fsck_clean(d);

    // Overwritten by something else entirely (a checkpoint copied over it by mistake).
    std::fs::copy(&f, d.join(".mdl/meta.redb")).unwrap();
    let err = fails(d, &["log"], "mdl fsck --repair");
    assert!(err.contains("damaged"), "{err}");
    let ids = json(d, &["fsck", "--repair"]);
    assert_eq!(ids["ok"], true, "{ids}");
    assert!(ids["rebuilt"]["moved_aside"].is_string());
    assert_fsck_clean(d);
}

#[test]
fn a_damaged_database_is_an_error_and_repairable_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ids = rich_repository(d);
    let before = everything(d, &ids);
    let before_state = state(d);
    let meta_path = d.join(".mdl/meta.redb");
    let good = std::fs::read(&meta_path).unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let (mut damaged, mut clean) = (0, 0);
    for _ in 0..300 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut bad = good.clone();
        let at = (x % bad.len() as u64) as usize;
        bad[at] ^= 1 << ((x >> 32) % 8);
        std::fs::write(&meta_path, &bad).unwrap();
        let out = mdl(d, &["fsck"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("panicked") && out.status.code().is_some_and(|c| c <= 3),
            "flip at {at}: {err}"
        );
        if out.status.success() {
            // A flip fsck calls harmless changed nothing anyone sees (checked on a sample).
            clean += 1;
            if clean % 5 == 0 {
                assert_eq!(state(d), before_state, "flip at {at} passed fsck");
            }
            continue;
        }
        damaged += 1;
        assert_eq!(err.trim_end().lines().count(), 1, "flip at {at}: {err}");
        // Every damage that fsck reports, repair undoes.
        let repaired = mdl(d, &["fsck", "--repair"]);
        assert!(
            repaired.status.success(),
            "flip at {at}: repair failed: {}{}",
            String::from_utf8_lossy(&repaired.stdout),
            String::from_utf8_lossy(&repaired.stderr)
        );
        assert_eq!(everything(d, &ids), before, "flip at {at}");
    }
    eprintln!(
        "300 single-bit flips in meta.redb: {damaged} reported and repaired, {clean} harmless"
    );
    assert!(damaged > 0, "no flip was detected ({clean} clean)");
}

/// A tree upload a killed server left unpacked in `.mdl/incoming/` is swept like a lone upload:
/// by gc once it is old, by `fsck --repair` at once; a young one stays for gc.
#[test]
fn an_abandoned_tree_upload_is_swept() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    let f = d.join("a.safetensors");
    write_safetensors(&f, &mixed(1), &[]);
    ok(d, &["commit", f.to_str().unwrap()]);
    let left = |name: &str, age: std::time::Duration| {
        let tree = d.join(".mdl/incoming").join(name);
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::write(tree.join("sub/model.safetensors"), [7u8; 1000]).unwrap();
        let then = std::time::SystemTime::now() - age;
        for p in [
            tree.join("sub/model.safetensors"),
            tree.join("sub"),
            tree.clone(),
        ] {
            std::fs::File::open(&p).unwrap().set_modified(then).unwrap();
        }
        tree
    };
    let old = left(".tree-old", std::time::Duration::from_secs(7 * 86_400));
    let young = left(".tree-young", std::time::Duration::ZERO);
    let gc = json(d, &["gc", "--prune-older-than", "0s"]);
    assert!(!old.exists(), "{gc}");
    assert!(young.exists(), "a tree being received was swept");
    let repaired = json(d, &["fsck", "--repair"]);
    assert!(!young.exists(), "{repaired}");
}
