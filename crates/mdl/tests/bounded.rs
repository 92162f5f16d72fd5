//! A checkpoint whose tensor is larger than the memory the process may allocate commits (twice,
//! the previous version re-encoded against the new one after the second commit, as deferred)
//! and checks out byte for byte: commit, the deferred re-encode and checkout read such tensors
//! a window at a time. The cap is `RLIMIT_DATA` (heap and
//! every private writable mapping; the read-only input mapping is not counted), so this file
//! holds one test and runs as a process of its own.

#![allow(clippy::disallowed_methods)]

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;

use mdl::checkout::{checkout, CheckoutOptions};
use mdl::commit::{commit, CommitOptions};
use mdl::{NoProgress, Repository};

mod common;
use common::Rng;

/// Elements of the large tensor: 192 MiB of f32.
const N: usize = 48 << 20;
/// What the process may allocate once the files are written: less than the tensor. (It was
/// 128 MiB until frames got a writer thread of their own: glibc keeps freed memory per thread
/// arena, and with commits, the re-encode and checkouts in one process 128 MiB failed on a
/// loaded 2-core machine; each of them alone stays under 100 MiB resident.)
const CAP: u64 = 160 << 20;

/// Writes a safetensors file with the large tensor `w` (weights, drifted by `step` small
/// updates) and a small one, generating the weights 1 Mi elements at a time.
fn write_checkpoint(path: &Path, step: u32) {
    let bytes = N * 4;
    let header = format!(
        r#"{{"b":{{"dtype":"F32","shape":[1024],"data_offsets":[0,4096]}},"w":{{"dtype":"F32","shape":[{N}],"data_offsets":[4096,{}]}}}}"#,
        4096 + bytes
    );
    let mut f = BufWriter::new(File::create(path).unwrap());
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    f.write_all(&[0u8; 4096]).unwrap();
    let (mut weights, mut drift) = (Rng(7), Rng(1000 + step as u64));
    let mut buf = Vec::with_capacity(4 << 20);
    for _ in 0..N >> 20 {
        buf.clear();
        for _ in 0..1 << 20 {
            let mut w = (weights.normal() * 0.02) as f32;
            for _ in 0..step {
                w += (drift.normal() * 1e-4) as f32;
            }
            buf.extend_from_slice(&w.to_le_bytes());
        }
        f.write_all(&buf).unwrap();
    }
    f.flush().unwrap();
}

/// Whether two files hold the same bytes, compared 1 MiB at a time.
fn same_file(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (File::open(a).unwrap(), File::open(b).unwrap());
    if fa.metadata().unwrap().len() != fb.metadata().unwrap().len() {
        return false;
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = fa.read(&mut ba).unwrap();
        if n == 0 {
            return true;
        }
        fb.read_exact(&mut bb[..n]).unwrap();
        if ba[..n] != bb[..n] {
            return false;
        }
    }
}

#[test]
fn a_tensor_larger_than_memory_commits_and_checks_out() {
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = (
        dir.path().join("v1.safetensors"),
        dir.path().join("v2.safetensors"),
    );
    write_checkpoint(&v1, 0);
    write_checkpoint(&v2, 1);
    let repo = Repository::init(&dir.path().join("repo")).unwrap();

    let cap = libc::rlimit {
        rlim_cur: CAP,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit with a valid struct; it only lowers this process's own soft limit.
    #[allow(unsafe_code)]
    let set = unsafe { libc::setrlimit(libc::RLIMIT_DATA, &cap) };
    assert_eq!(set, 0, "setrlimit");

    let opts = CommitOptions::default();
    commit(&repo, &v1, &opts, &NoProgress).unwrap();
    commit(&repo, &v2, &opts, &NoProgress).unwrap();
    // The re-encode the second commit deferred, both versions read a window at a time.
    let report = mdl::commit::run_deferred(&repo, None, &|| false).unwrap();
    assert_eq!(
        (report.commits, report.rewritten, report.pending),
        (1, 1, 0)
    );

    // The new version is whole; the previous one was re-encoded as a delta against it.
    let newest = mdl::show::show(&repo, "main").unwrap();
    let oldest = mdl::show::show(&repo, "main~1").unwrap();
    let w = |s: &mdl::show::Shown| s.tensors.iter().find(|t| t.name == "w").unwrap().clone();
    let (new_w, old_w) = (w(&newest), w(&oldest));
    assert_eq!(new_w.codec, "float-split");
    assert_eq!(old_w.base, Some(new_w.id), "{}", old_w.codec);
    assert!(old_w.stored_bytes < new_w.stored_bytes);

    for (rev, want) in [("main", &v2), ("main~1", &v1)] {
        let out = dir
            .path()
            .join(format!("out-{}.safetensors", rev.replace('~', "-")));
        checkout(&repo, rev, &out, &CheckoutOptions::default(), &NoProgress).unwrap();
        assert!(same_file(&out, want), "{rev} checks out byte for byte");
        std::fs::remove_file(&out).unwrap();
    }
    let report = mdl::fsck::fsck(&repo, false).unwrap();
    assert!(report.ok(), "{:?}", report.problems);
}
