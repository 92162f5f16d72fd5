//! `--engine` and the `engine` setting: every engine writes the same repository, `gpu` without
//! a GPU is a clear error that changes nothing, and `-v` says which engine ran and why (with a
//! GPU, `auto`'s measurement of both engines).

use crate::journeys::nudged;
use crate::util::*;

#[test]
fn engines_write_the_same_bytes_and_a_missing_gpu_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("ckpt");
    std::fs::create_dir(&src).unwrap();
    // A short training series: 2 MiB of f32 weights moving a little, bf16 moments, a counter.
    let mut w = floats(3, 512 * 1024);
    let mut files = Vec::new();
    for i in 0..3u64 {
        let f = src.join(format!("c{i}.safetensors"));
        let t = vec![
            T {
                name: "model.w".into(),
                dtype: "F32",
                shape: vec![512, 1024],
                data: w.clone(),
            },
            tensor("model.b", "BF16", &[300_000], 10 + i),
            tensor("optim.step", "I64", &[], i),
        ];
        write_safetensors(&f, &t, &[]);
        files.push(f);
        w = nudged(&w, 50 + i);
    }
    let repo = |name: &str, engine: &str| {
        let d = dir.path().join(name);
        ok(&d, &["init"]);
        for (i, f) in files.iter().enumerate() {
            let msg = format!("step {i}");
            ok(
                &d,
                &[
                    "commit",
                    f.to_str().unwrap(),
                    "-m",
                    &msg,
                    "--engine",
                    engine,
                ],
            );
        }
        // The re-encodes the commits deferred, whether or not their background run did them.
        ok(&d, &["maintenance"]);
        d
    };
    let cpu = repo("cpu", "cpu");
    let auto = repo("auto", "auto");
    let mut gpu_present = false;
    // Same codecs and stored sizes for every tensor of every commit (ids match too: they
    // are content hashes), and the same checkouts.
    for rev in ["HEAD", "HEAD~1", "HEAD~2"] {
        let (a, b) = (json(&cpu, &["show", rev]), json(&auto, &["show", rev]));
        assert_eq!(a["tensors"], b["tensors"], "{rev}");
        for (d, engine) in [(&cpu, "gpu"), (&auto, "auto")] {
            let out = d.join("out.safetensors");
            let v = mdl(
                d,
                &[
                    "-v",
                    "checkout",
                    rev,
                    "-o",
                    out.to_str().unwrap(),
                    "--force",
                    "--engine",
                    engine,
                ],
            );
            if !v.status.success() {
                // Only `gpu` may fail, and only for want of a GPU.
                assert_eq!(engine, "gpu");
                assert!(String::from_utf8_lossy(&v.stderr).contains("no GPU engine"));
                continue;
            }
            gpu_present |= engine == "gpu";
            let n = ["HEAD", "HEAD~1", "HEAD~2"]
                .iter()
                .position(|r| *r == rev)
                .unwrap();
            assert_eq!(
                std::fs::read(&out).unwrap(),
                std::fs::read(&files[2 - n]).unwrap()
            );
        }
    }
    // A lossy commit (weights with their Adam moments) takes the same decisions, and stores
    // the same bytes, on every engine: with a GPU (or the emulated one), forced onto it, so
    // that the residual search and encode run there whatever `auto` would pick.
    let lossy = dir.path().join("lossy.safetensors");
    let f32s = |name: &str, data: Vec<u8>| T {
        name: name.into(),
        dtype: "F32",
        shape: vec![512, 1024],
        data,
    };
    let m = floats(12, 512 * 1024);
    let v = m
        .chunks(4)
        .flat_map(|c| {
            let x = f32::from_le_bytes(c.try_into().unwrap());
            (x * x).to_le_bytes()
        })
        .collect();
    let t = vec![
        f32s("model.w", nudged(&w, 99)),
        f32s("optim.w.exp_avg", m),
        f32s("optim.w.exp_avg_sq", v),
    ];
    write_safetensors(&lossy, &t, &[]);
    let mut outs = Vec::new();
    let other = if gpu_present { "gpu" } else { "auto" };
    for (d, engine) in [(&cpu, "cpu"), (&auto, other)] {
        let c = json(
            d,
            &[
                "commit",
                lossy.to_str().unwrap(),
                "--lossy",
                "--metric",
                "loss=2.0",
                "-m",
                "lossy",
                "--engine",
                engine,
            ],
        );
        assert!(c["lossy_tensors"].as_u64().unwrap() >= 1, "{c}");
        let out = d.join("lossy-out.safetensors");
        ok(
            d,
            &[
                "checkout",
                "HEAD",
                "-o",
                out.to_str().unwrap(),
                "--engine",
                engine,
            ],
        );
        outs.push(std::fs::read(&out).unwrap());
    }
    let (a, b) = (
        json(&cpu, &["show", "HEAD"]),
        json(&auto, &["show", "HEAD"]),
    );
    assert_eq!(a["tensors"], b["tensors"]);
    assert!(outs[0] == outs[1], "lossy checkouts differ between engines");

    // -v says which engine and why.
    let v = mdl(
        &auto,
        &["-v", "commit", files[0].to_str().unwrap(), "-m", "again"],
    );
    assert!(v.status.success());
    let err = String::from_utf8_lossy(&v.stderr);
    // Without a GPU: why not. With one (a real or the emulated device): which side of the
    // codecs each engine takes, and the measurement that decided it.
    let has_gpu = !err.contains("engine: cpu: no GPU engine (");
    if has_gpu {
        let line = err
            .lines()
            .find(|l| l.starts_with("engine: "))
            .unwrap_or("");
        assert!(
            line.contains(" GB/s on the GPU against ") && line.contains("decoding"),
            "{err}"
        );
    }

    // Bad choices: one-line errors, nothing changed.
    let before = state(&cpu);
    fails(
        &cpu,
        &["commit", files[0].to_str().unwrap(), "--engine", "fast"],
        "expected auto, cpu or gpu",
    );
    fails(
        &cpu,
        &["config", "engine", "fast"],
        "expected auto, cpu or gpu",
    );
    if !has_gpu {
        fails(
            &cpu,
            &["commit", files[1].to_str().unwrap(), "--engine", "gpu"],
            "no GPU engine",
        );
        ok(&cpu, &["config", "engine", "gpu"]);
        fails(
            &cpu,
            &["commit", files[1].to_str().unwrap()],
            "no GPU engine",
        );
        ok(&cpu, &["config", "engine", "auto"]);
    }
    assert_eq!(state(&cpu), before);
}
