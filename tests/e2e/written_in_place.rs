//! A checkpoint written in place while `mdl commit` reads it (`dd conv=notrunc`, or opened
//! with `"wb"` as `torch.save` and `save_file` do): every commit that succeeds holds one whole
//! version of the file, never a mix of two; one that does not fails with one line and records
//! nothing. (The Python package's background commits, which copy the file first, are in
//! tests/python/test_written_in_place.py.)

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::util::*;

/// Versions of one checkpoint, each as long as the others (a safetensors file whose tensors'
/// values differ): a mix of two is as long as either and parses as well.
fn versions(scratch: &Path, count: u64) -> Vec<Vec<u8>> {
    (0..count)
        .map(|v| {
            let t = [
                tensor("layer.0.weight", "F32", &[512, 512], 100 + v),
                tensor("layer.1.weight", "F32", &[512, 512], 200 + v),
                tensor("layer.1.bias", "F32", &[512], 300 + v),
            ];
            write_safetensors(&scratch.join(format!("v{v}")), &t, &[])
        })
        .collect()
}

/// Writes `bytes` over `path` a MiB at a time: in place, or truncated first.
fn overwrite(path: &Path, bytes: &[u8], truncate: bool) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(truncate)
        .open(path)
        .unwrap();
    for chunk in bytes.chunks(1 << 20) {
        f.write_all(chunk).unwrap();
        std::thread::sleep(Duration::from_micros(300));
    }
}

#[test]
fn a_file_rewritten_while_committed_is_recorded_whole_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init", "repo"]);
    let repo = d.join("repo");
    std::fs::create_dir(d.join("scratch")).unwrap();
    let versions = versions(&d.join("scratch"), 6);
    let path = d.join("ck.safetensors");
    std::fs::write(&path, &versions[0]).unwrap();
    let path_s = path.to_str().unwrap().to_string();

    let stop = AtomicBool::new(false);
    let (mut landed, mut refused) = (Vec::new(), 0);
    std::thread::scope(|s| {
        // Stops the writer however the rounds end (a failed assertion included).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = Stop(&stop);
        s.spawn(|| {
            let mut round = 0usize;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                // One round in three as `torch.save` writes; the others as `dd conv=notrunc`.
                overwrite(
                    &path,
                    &versions[round % versions.len()],
                    round.is_multiple_of(3),
                );
                std::thread::sleep(Duration::from_millis(20 + (round * 37 % 60) as u64));
            }
        });
        for round in 0..100 {
            let out = mdl(
                &repo,
                &["--json", "commit", &path_s, "-m", &format!("round {round}")],
            );
            if out.status.success() {
                let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                landed.push(doc["id"].as_str().unwrap().to_string());
            } else {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let lines: Vec<&str> = stderr.lines().collect();
                assert_eq!(lines.len(), 1, "round {round}: {stderr}");
                assert!(
                    lines[0].contains("changed while it was being committed")
                        || lines[0].contains("was cut short meanwhile"),
                    "round {round}: {stderr}"
                );
                refused += 1;
            }
        }
    });
    // About two thirds land on a quiet machine; under load fewer may, which is no fault.
    eprintln!("{} commits landed, {refused} refused", landed.len());
    assert!(refused > 0, "the writer and the commits never met");

    // What was refused recorded nothing; what landed is one whole version.
    let log = json(&repo, &["log"]);
    assert_eq!(log.as_array().unwrap().len(), landed.len());
    for (i, id) in landed.iter().enumerate() {
        let out = d.join(format!("out{i}"));
        ok(&repo, &["checkout", id, "-o", out.to_str().unwrap()]);
        // A one-file tree checks out as that file.
        let got = std::fs::read(&out).unwrap();
        assert!(
            versions.contains(&got),
            "commit {id} holds none of the versions written"
        );
    }
    assert_fsck_clean(&repo);
}
