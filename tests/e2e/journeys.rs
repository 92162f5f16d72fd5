//! The user journeys of the store: commit, branch, inspect, check out byte-identical.

use crate::util::*;

#[test]
fn commit_checkout_round_trip_every_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    let f1 = d.join("a.safetensors");
    let bytes1 = write_safetensors(&f1, &mixed(1), &[("step", "1"), ("lr", "0.001")]);
    let c = json(
        d,
        &[
            "commit",
            f1.to_str().unwrap(),
            "-m",
            "first",
            "--step",
            "1",
            "--metric",
            "loss=2.5",
        ],
    );
    let id1 = c["id"].as_str().unwrap().to_string();
    assert_eq!(c["branch"], "main");
    assert_eq!(c["raw_bytes"].as_u64().unwrap(), bytes1.len() as u64);
    assert!(c["stored_bytes"].as_u64().unwrap() > 0);
    assert!(c["seconds"].as_f64().is_some());

    // Second checkpoint: everything changes but one frozen tensor, which is stored once.
    let f2 = d.join("b.safetensors");
    let bytes2 = write_safetensors(&f2, &mixed(100), &[]);
    let c2 = json(
        d,
        &[
            "commit",
            f2.to_str().unwrap(),
            "-m",
            "second",
            "--step",
            "2",
        ],
    );
    let s = json(d, &["show", "HEAD"]);
    assert_eq!(s["id"], c2["id"]);
    assert_eq!(s["parents"][0], id1.as_str());
    let tensors = s["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 8);
    for t in tensors {
        for key in ["name", "dtype", "shape", "codec", "stored_bytes", "lossy"] {
            assert!(!t[key].is_null(), "show tensor lacks {key}");
        }
        assert_eq!(t["lossy"], false);
    }
    let s1 = json(d, &["show", &id1]);
    let frozen = |s: &serde_json::Value| {
        s["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "frozen")
            .unwrap()["id"]
            .clone()
    };
    assert_eq!(frozen(&s), frozen(&s1));
    // 8 + 6 tensors (frozen and the empty tensor are shared), 2 manifests, 2 commits.
    assert_eq!(
        json(d, &["stats"])["objects"].as_u64().unwrap(),
        8 + 6 + 2 + 2
    );

    for (rev, want) in [
        ("HEAD~1", &bytes1),
        (&id1[..8], &bytes1),
        ("main", &bytes2),
        ("HEAD^0", &bytes2),
    ] {
        let out = d.join("out.safetensors");
        ok(
            d,
            &["checkout", rev, "-o", out.to_str().unwrap(), "--force"],
        );
        assert_eq!(
            &std::fs::read(&out).unwrap(),
            want,
            "checkout {rev} differs"
        );
    }
    assert_fsck_clean(d);
}

#[test]
fn branches_tags_log_diff() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    let f = |n: u64| {
        let p = d.join(format!("c{n}.safetensors"));
        write_safetensors(&p, &mixed(n), &[]);
        p.to_str().unwrap().to_string()
    };
    let a = json(
        d,
        &[
            "commit",
            &f(1),
            "-m",
            "a",
            "--step",
            "10",
            "--metric",
            "loss=3",
        ],
    )["id"]
        .as_str()
        .unwrap()
        .to_string();
    let b = json(d, &["commit", &f(2), "-m", "b", "--step", "20"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    // A new branch via commit -b starts at HEAD's commit and does not move HEAD.
    let c = json(d, &["commit", &f(3), "-b", "exp", "-m", "c"]);
    assert_eq!(c["branch"], "exp");
    let log = json(d, &["log", "exp"]);
    let ids: Vec<&str> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [c["id"].as_str().unwrap(), &b, &a]);
    let first = &log[2];
    assert_eq!(first["step"], 10);
    assert_eq!(first["metrics"]["loss"], 3.0);
    assert_eq!(first["message"], "a");
    assert!(first["time"].as_str().unwrap().ends_with('Z'));
    assert_eq!(json(d, &["log", "-n", "1"]).as_array().unwrap().len(), 1);
    assert_eq!(json(d, &["log"])[0]["id"], b.as_str(), "HEAD stays on main");

    ok(d, &["branch", "lr-low", "main~1"]);
    ok(d, &["switch", "lr-low"]);
    let e = json(d, &["commit", &f(4), "-m", "e"]);
    let branches = json(d, &["branch"]);
    let cur: Vec<_> = branches
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["current"] == true)
        .collect();
    assert_eq!(cur.len(), 1);
    assert_eq!(cur[0]["name"], "lr-low");
    assert_eq!(json(d, &["show", "lr-low^"])["id"], a.as_str());
    let graph = ok(d, &["log", "--graph", "lr-low"]);
    let lines: Vec<&str> = graph.lines().collect();
    assert!(
        lines[0].contains("COMMIT") && lines[0].contains("STORED / RAW"),
        "{graph}"
    );
    assert!(lines[1].starts_with("* "), "{graph}");
    // --all draws both branches, joining where lr-low forked from main.
    let all = ok(d, &["log", "--all", "--graph"]);
    assert!(all.contains("(lr-low)") && all.contains("(main"), "{all}");
    assert!(all.lines().any(|l| l == "|/"), "{all}");
    let ids: Vec<serde_json::Value> = json(d, &["log", "--all"])
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].clone())
        .collect();
    for b in json(d, &["branch"]).as_array().unwrap() {
        assert!(ids.contains(&b["target"]), "{b} not in log --all");
    }

    ok(d, &["tag", "v1", &b, "-m", "release"]);
    ok(d, &["tag", "v0", &a]);
    let tags = json(d, &["tag"]);
    assert_eq!(tags[1]["name"], "v1");
    assert_eq!(tags[1]["message"], "release");
    assert_eq!(json(d, &["show", "v1"])["id"], b.as_str());

    let diff = json(d, &["diff", "v0", "v1"]);
    // Each commit was of a file of another name: one removed, one added, and the tensors
    // matched across them by name.
    let files = diff["files"].as_array().unwrap();
    assert_eq!(files.len(), 2, "{diff}");
    assert_eq!(files[0]["change"], "removed");
    assert_eq!(files[1]["change"], "added");
    let by = |n: &str| {
        diff["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == n)
            .unwrap()
            .clone()
    };
    assert_eq!(by("frozen")["unchanged"], serde_json::Value::Null);
    assert!(
        by("model.embed.weight")["changed"]["rel_l2"]
            .as_f64()
            .unwrap()
            > 0.1
    );
    assert_eq!(
        by("frozen"),
        serde_json::json!({"name": "frozen", "unchanged": null})
            .get("name")
            .map(|_| by("frozen"))
            .unwrap()
    );
    assert!(ok(d, &["diff", "v0", "v1"]).contains("unchanged"));
    // --changed lists only what changed; the summary line still counts everything.
    let only = ok(d, &["diff", "--changed", "v0", "v1"]);
    let mut lines = only.lines();
    assert!(lines.next().unwrap().contains("unchanged"), "{only}");
    assert!(lines.all(|l| !l.contains("unchanged")), "{only}");
    let names = |args: &[&str]| -> Vec<String> {
        json(d, args)["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(names(&["diff", "v0", "v1"]).contains(&"frozen".to_string()));
    let changed = names(&["diff", "--changed", "v0", "v1"]);
    assert!(!changed.is_empty() && !changed.contains(&"frozen".to_string()));

    // exp's commit is on no other branch: -d refuses, -D deletes, and its reflog still says
    // where it was, so the branch can be made again.
    let tip = json(d, &["show", "exp"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    fails(
        d,
        &["branch", "-d", "exp"],
        "branch exp has 1 commit that no other branch or tag reaches; delete it anyway with -D",
    );
    ok(d, &["branch", "-D", "exp"]);
    fails(d, &["show", "exp"], "unknown revision");
    let log = json(d, &["reflog", "exp"]);
    assert_eq!(log["ref"], "refs/heads/exp");
    let entries = log["entries"].as_array().unwrap();
    assert_eq!(
        (
            &entries[0]["old"],
            &entries[0]["new"],
            &entries[0]["message"]
        ),
        (
            &serde_json::json!(tip),
            &serde_json::Value::Null,
            &serde_json::json!("deleted")
        )
    );
    assert!(ok(d, &["reflog", "exp"]).contains(&format!("{} -> ------------", &tip[..12])));
    ok(d, &["branch", "exp", &tip[..12]]);
    assert_eq!(
        json(d, &["show", "exp"])["id"]
            .as_str()
            .unwrap()
            .to_string(),
        tip
    );
    // A branch whose commits another branch holds goes with -d.
    ok(d, &["branch", "also-exp", "exp"]);
    ok(d, &["branch", "-d", "exp"]);
    fails(
        d,
        &["reflog", "nope"],
        "no branch, tag or remote branch named nope",
    );
    fails(d, &["branch", "-d", "lr-low"], "current branch");
    ok(d, &["tag", "-d", "v0"]);
    let _ = e;
    assert_fsck_clean(d);
}

#[test]
fn concurrent_commits_both_land() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    let mut files = Vec::new();
    for n in 0..2u64 {
        let p = d.join(format!("big{n}.safetensors"));
        let ts: Vec<T> = (0..8)
            .map(|i| tensor(&format!("t{i}"), "F32", &[1 << 18], n * 100 + i))
            .collect();
        write_safetensors(&p, &ts, &[]);
        files.push(p);
    }
    let children: Vec<_> = files
        .iter()
        .map(|f| {
            std::process::Command::new(mdl_bin())
                .arg("-C")
                .arg(d)
                .args(["commit", f.to_str().unwrap(), "--json"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let ids: Vec<String> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success());
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            v["id"].as_str().unwrap().to_string()
        })
        .collect();
    let log = json(d, &["log"]);
    let logged: Vec<&str> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(logged.len(), 2);
    for id in &ids {
        assert!(logged.contains(&id.as_str()));
    }
    assert_fsck_clean(d);
}

/// A slightly trained copy of `weights`: every value nudged by a relative 1e-4.
pub(crate) fn nudged(weights: &[u8], seed: u64) -> Vec<u8> {
    weights
        .chunks(4)
        .zip(noise(seed, weights.len()).chunks(4))
        .flat_map(|(w, r)| {
            let w = f32::from_le_bytes(w.try_into().unwrap());
            let r = u32::from_le_bytes(r.try_into().unwrap()) as f32 / u32::MAX as f32 - 0.5;
            (w * (1.0 + 2e-4 * r)).to_le_bytes()
        })
        .collect()
}

#[test]
fn float_codecs_deltas_and_config() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);

    // Configuration: defaults listed, bad values refused with nothing changed.
    let cfg = json(d, &["config"]);
    let keys: Vec<_> = cfg
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].clone())
        .collect();
    assert_eq!(
        keys,
        [
            "delta.mode",
            "delta.max_depth",
            "delta.max_restore_cost",
            "delta.defer",
            "retention.keep_last",
            "retention.coarsen_after",
            "engine",
            "limits.tensors",
            "limits.files",
            "limits.header_bytes",
            "remote.connect-timeout",
            "remote.idle-timeout",
            "remote.request-timeout",
            "remote.min-speed",
            "codec.default",
            "codec.epsilon",
            "codec.trim_bits",
            "quant.moments",
            "quant.embeddings",
            "quant.adam_betas",
            "quant.curvature",
            "quant.moment_residuals",
            "quant.tips",
            "quant.row_col_steps",
            "quant.exp_avg_drop",
            "quant.exp_avg_sq_hold",
            "quant.exp_avg",
            "quant.exp_avg_sq"
        ]
    );
    assert_eq!(cfg[0]["value"], "reverse");
    assert_eq!(cfg[0]["default"], true);
    fails(
        d,
        &["config", "delta.mode", "sideways"],
        "expected reverse, forward or off",
    );
    fails(d, &["config", "delta.max_depth", "many"], "delta.max_depth");
    fails(d, &["config", "delta.max_depth", "100000"], "from 0 to 512");
    fails(
        d,
        &["config", "retention.keep_last", "0"],
        "retention.keep_last",
    );
    fails(
        d,
        &["config", "delta.max_restore_cost", "0.5"],
        "delta.max_restore_cost",
    );
    fails(d, &["gc", "--prune-older-than", "soon"], "invalid duration");
    fails(
        d,
        &["config", "no.such.key", "1"],
        "unknown configuration key",
    );
    fails(d, &["config", "no.such.key"], "unknown configuration key");
    assert_eq!(json(d, &["config"]), cfg);
    ok(d, &["config", "delta.max_depth", "3"]);
    let cfg = json(d, &["config", "delta.max_depth"]);
    assert_eq!(cfg[0]["value"], "3");
    assert_eq!(cfg[0]["default"], false);

    // Three checkpoints of slowly changing weights: the newest is self-contained, the older
    // ones are reverse deltas against their successors.
    let mut weights = floats(7, 64 * 1024);
    let mut files = Vec::new();
    for i in 0..3u64 {
        let f = d.join(format!("c{i}.safetensors"));
        let t = vec![
            T {
                name: "model.w".into(),
                dtype: "F32",
                shape: vec![256, 256],
                data: weights.clone(),
            },
            tensor("optim.step", "I64", &[], i),
        ];
        files.push((f.clone(), write_safetensors(&f, &t, &[])));
        ok(
            d,
            &["commit", f.to_str().unwrap(), "-m", &format!("step {i}")],
        );
        weights = nudged(&weights, 100 + i);
    }
    // The re-encodes the commits deferred (done in the background too; this waits for it).
    ok(d, &["maintenance"]);
    let w = |rev: &str| {
        let s = json(d, &["show", rev]);
        s["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "model.w")
            .unwrap()
            .clone()
    };
    let (newest, middle, oldest) = (w("HEAD"), w("HEAD~1"), w("HEAD~2"));
    assert_eq!(newest["codec"], "float-split");
    assert_eq!(newest["depth"], 0);
    assert!(newest["stored_bytes"].as_u64().unwrap() < 256 * 256 * 4);
    // Smoothly changing weights: the integer difference codes smaller than the XOR.
    assert_eq!(middle["codec"], "sub-delta");
    assert_eq!(middle["base"], newest["id"]);
    assert_eq!(middle["depth"], 1);
    assert_eq!(oldest["base"], middle["id"]);
    assert_eq!(oldest["depth"], 2);
    assert!(middle["stored_bytes"].as_u64().unwrap() < newest["stored_bytes"].as_u64().unwrap());
    let text = ok(d, &["show", "HEAD~2"]);
    assert!(
        text.contains("sub-delta") && text.contains("depth 2"),
        "{text}"
    );

    for (i, (_, bytes)) in files.iter().enumerate() {
        let out = d.join("out.safetensors");
        let rev = format!("HEAD~{}", 2 - i);
        ok(
            d,
            &[
                "checkout",
                &rev,
                "-o",
                out.to_str().unwrap(),
                "--force",
                "--sync",
            ],
        );
        assert_eq!(&std::fs::read(&out).unwrap(), bytes, "checkout {rev}");
    }
    assert_fsck_clean(d);
}

/// f32 bytes times `k` (squared after scaling when `square`).
fn scaled(bytes: &[u8], k: f32, square: bool) -> Vec<u8> {
    bytes
        .chunks(4)
        .flat_map(|c| {
            let x = f32::from_le_bytes(c.try_into().unwrap()) * k;
            (if square { x * x } else { x }).to_le_bytes()
        })
        .collect()
}

#[test]
fn lossy_commits_are_marked_and_bad_settings_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    let ckpt = |i: u64| {
        let f = d.join(format!("c{i}.safetensors"));
        let mut w = floats(11, 128 * 256);
        for _ in 0..i {
            w = nudged(&w, 50 + i);
        }
        let t = vec![
            T {
                name: "model.w".into(),
                dtype: "F32",
                shape: vec![128, 256],
                data: w,
            },
            // Moments of a gradient about 1e-5 in size.
            T {
                name: "optim.w.exp_avg".into(),
                dtype: "F32",
                shape: vec![128, 256],
                data: scaled(&floats(12 + i, 128 * 256), 1e-5, false),
            },
            T {
                name: "optim.w.exp_avg_sq".into(),
                dtype: "F32",
                shape: vec![128, 256],
                data: scaled(&floats(13 + i, 128 * 256), 1e-5, true),
            },
            tensor("optim.step", "I64", &[], i),
        ];
        write_safetensors(&f, &t, &[("step", &format!("{}", 10 * (i + 1)))]);
        f
    };
    let f0 = ckpt(0);
    let f0s = f0.to_str().unwrap();

    // Bad lossy settings: refused, nothing committed.
    let before = state(d);
    fails(
        d,
        &["commit", f0s, "--lossy", "--epsilon", "0"],
        "codec.epsilon",
    );
    fails(
        d,
        &["commit", f0s, "--lossy", "--epsilon", "2"],
        "codec.epsilon",
    );
    fails(d, &["commit", f0s, "--trim-bits", "40"], "codec.trim_bits");
    fails(
        d,
        &["commit", f0s, "--lossy", "--moments", "model.x"],
        "quant.moments",
    );
    fails(
        d,
        &["commit", f0s, "--eval-cmd", "exit 1"],
        "evaluation command",
    );
    fails(
        d,
        &["config", "codec.default", "sloppy"],
        "lossless, lossy or trim",
    );
    fails(
        d,
        &["config", "quant.exp_avg", "bins=1000"],
        "quant.exp_avg",
    );
    assert_eq!(state(d), before);

    // A lossy commit, then a lossless one.
    let c = json(
        d,
        &[
            "commit", f0s, "--lossy", "--metric", "loss=2.0", "-m", "lossy",
        ],
    );
    assert_eq!(c["lossy_tensors"], 3);
    assert!(c["search"]["est_delta_loss"].as_f64().unwrap() <= 2.0 * 0.0005);
    let f1 = ckpt(1);
    ok(d, &["commit", f1.to_str().unwrap(), "-m", "exact"]);
    let log = ok(d, &["log"]);
    let lines: Vec<&str> = log.lines().skip(1).collect();
    assert!(
        !lines[0].contains("[lossy]") && lines[1].contains("[lossy]"),
        "{log}"
    );
    assert_eq!(json(d, &["log"])[1]["lossy_tensors"], 3);

    // show: settings and errors per tensor.
    let s = json(d, &["show", "HEAD~1"]);
    let w = &s["tensors"][0];
    assert_eq!(w["lossy"], true);
    assert!(["quant-base", "quant-delta"].contains(&w["codec"].as_str().unwrap()));
    let info = &w["lossy_info"];
    assert!(info["bins"].as_u64().unwrap() >= 4);
    assert!(info["prune"].is_number() && info["protect"].is_number());
    assert_eq!(info["sensitivity"], "moments");
    assert!(info["max_abs_error"].as_f64().unwrap() > 0.0);
    assert!(info["rel_error"].as_f64().unwrap() > 0.0);
    assert!(info["est_delta_loss"].as_f64().unwrap() >= 0.0);
    assert_eq!(s["tensors"][3]["lossy"], false);
    let text = ok(d, &["show", "HEAD~1"]);
    assert!(text.contains("est. ΔL") && text.contains("bins="), "{text}");

    // checkout says it wrote reconstructions, in the original dtypes and shapes.
    let out = d.join("out.safetensors");
    let said = ok(d, &["checkout", "HEAD~1", "-o", out.to_str().unwrap()]);
    assert!(said.contains("lossy commit"), "{said}");
    let j = json(
        d,
        &["checkout", "HEAD~1", "-o", out.to_str().unwrap(), "--force"],
    );
    assert_eq!(j["lossy"], true);
    let bytes = std::fs::read(&out).unwrap();
    let orig = std::fs::read(&f0).unwrap();
    assert_eq!(bytes.len(), orig.len());
    let hl = 8 + u64::from_le_bytes(orig[..8].try_into().unwrap()) as usize;
    assert_eq!(
        bytes[..hl],
        orig[..hl],
        "same header: names, dtypes, shapes"
    );
    assert_ne!(bytes, orig);
    let j = json(
        d,
        &["checkout", "HEAD", "-o", out.to_str().unwrap(), "--force"],
    );
    assert_eq!(j["lossy"], false);
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&f1).unwrap());

    // Trim as the repository default.
    ok(d, &["config", "codec.default", "trim"]);
    ok(d, &["config", "codec.trim_bits", "3"]);
    let c = json(d, &["commit", ckpt(2).to_str().unwrap()]);
    assert_eq!(c["lossy_tensors"], 3);
    let s = json(d, &["show", "HEAD"]);
    assert_eq!(s["tensors"][0]["codec"], "mantissa-trim");
    assert_eq!(s["tensors"][0]["lossy_info"]["trim_bits"], 3);
    // --lossless overrides the default.
    let c = json(d, &["commit", ckpt(3).to_str().unwrap(), "--lossless"]);
    assert_eq!(c["lossy_tensors"], 0);
    assert_fsck_clean(d);
}

/// A checked-out or downloaded checkpoint is an ordinary new file: the permissions any file
/// the user creates there gets (the umask's), not a temporary file's 0600; and `--force` over
/// a symlink replaces the link, never writes through it.
#[test]
fn outputs_are_ordinary_files_and_never_written_through_links() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = &dir.path().join("srv");
    ok(d, &["init"]);
    let f = d.join("a.safetensors");
    let bytes = write_safetensors(&f, &mixed(3), &[]);
    ok(d, &["commit", f.to_str().unwrap()]);
    let ordinary = d.join("ordinary");
    std::fs::File::create(&ordinary).unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;

    let out = d.join("out.safetensors");
    ok(d, &["checkout", "main", "-o", out.to_str().unwrap()]);
    assert_eq!(mode(&out), mode(&ordinary), "checkout's permissions");

    let server = crate::server::Server::start(&["-C", d.to_str().unwrap()], dir.path());
    let url = format!("{}/srv", server.base);
    let pulled = d.join("pulled.safetensors");
    let token = crate::server::READ;
    let got = std::process::Command::new(mdl_bin())
        .args(["-C", &url, "--token", token, "checkout", "main", "-o"])
        .arg(&pulled)
        .output()
        .unwrap();
    assert!(got.status.success(), "{got:?}");
    assert!(std::fs::read(&pulled).unwrap() == bytes);
    assert_eq!(mode(&pulled), mode(&ordinary), "download's permissions");
    server.stop();

    // A link at the output: replaced by the checkpoint, its target untouched.
    let victim = d.join("victim");
    std::fs::write(&victim, b"keep me").unwrap();
    let link = d.join("link.safetensors");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    ok(
        d,
        &["checkout", "main", "-o", link.to_str().unwrap(), "--force"],
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
    assert!(!std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::read(&link).unwrap() == bytes);
}

#[test]
fn the_author_defaults_to_gits_then_the_login_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    let f = d.join("a.safetensors");
    write_safetensors(&f, &mixed(2), &[]);
    let gitconfig = d.join("gitconfig");
    std::fs::write(
        &gitconfig,
        "[user]\n\tname = Ada Lovelace\n\temail = ada@example.org\n",
    )
    .unwrap();
    let author = |git: Option<&std::path::Path>, user: Option<&str>| -> String {
        let mut c = std::process::Command::new(mdl_bin());
        c.current_dir(d)
            .args(["--json", "commit", f.to_str().unwrap(), "-m", "x"])
            .env_remove("MDL_AUTHOR")
            .env_remove("LOGNAME")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", d.join("no-home"))
            .env("GIT_CONFIG_GLOBAL", git.unwrap_or(&d.join("none")));
        match user {
            Some(u) => c.env("USER", u),
            None => c.env_remove("USER"),
        };
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        json(d, &["show", &id])["author"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        author(Some(&gitconfig), Some("ada")),
        "Ada Lovelace <ada@example.org>"
    );
    // A name set twice counts as git's `--get` reads it: the last; without an email, the name.
    let twice = d.join("gitconfig-twice");
    std::fs::write(&twice, "[user]\n\tname = First\n\tname = Ada Second\n").unwrap();
    assert_eq!(author(Some(&twice), Some("ada")), "Ada Second");
    assert_eq!(author(None, Some("ada")), "ada");
    assert_eq!(author(None, None), "unknown");
}
