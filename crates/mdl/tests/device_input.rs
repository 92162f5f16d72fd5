//! Device-resident input: a file whose tensors also lie on the GPU (what `commit_state`'s
//! device snapshot hands over) is committed from there. Nothing of the state is copied to the
//! device, the next commit's deltas are taken against the warm set's device copies, and every
//! record is what the CPU engine stores from the same bytes.
//!
//! Needs the GPU engine: a CUDA device, or mdl-gpu's emulated one (`.ci/run` runs it so:
//! `cargo test -p mdl --features mdl-gpu/emulate --test device_input -- --include-ignored`).

#![allow(clippy::disallowed_methods)]

use std::sync::{Arc, Mutex, MutexGuard};

use mdl::checkout::{checkout, CheckoutOptions, Mirror, Piece, Placed};
use mdl::commit::{CommitOptions, DeviceCopy, MemoryFile, OnDevice, Staged};
use mdl::{NoProgress, OpenOptions, Repository};
use mdl_codec::engine::CpuEngine;
use mdl_gpu::GpuEngine;

mod common;
use common::{
    committer, device_snapshot, device_targets, into_targets, safetensors_bytes,
    stored_layout as layout, Rng,
};

/// Step `step` of a small training state: drifting f32 weights (2 MiB), bf16 moments (2 MiB),
/// a frozen 64 MiB f32 embedding (read a window at a time) and a bias too small for the GPU.
fn state(step: u64) -> Vec<u8> {
    let mut rng = Rng(7);
    let mut floats = |n: usize, scale: f32, drift: f32| -> Vec<u8> {
        (0..n)
            .flat_map(|i| {
                let x = rng.normal() as f32 * scale + drift * step as f32 * ((i % 5) as f32);
                x.to_le_bytes()
            })
            .collect()
    };
    let w = floats(512 * 1024, 0.02, 1e-6);
    let big = floats(16 << 20, 0.02, 0.0);
    let m: Vec<u8> = floats(1 << 20, 1e-3, 1e-5)
        .chunks(4)
        .flat_map(|f| [f[2], f[3]])
        .collect();
    let b = floats(1000, 0.1, 1e-4);
    safetensors_bytes(&[
        ("b", "F32", vec![1000], b),
        ("big", "F32", vec![16 << 10, 1024], big),
        ("m", "BF16", vec![1 << 20], m),
        ("w", "F32", vec![512, 1024], w),
    ])
}

/// Held by each test that counts the GPU's uploads: the engine (and its count) is one per
/// process.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The GPU engine (tensors of a megabyte or more go to the device), with the lock that keeps
/// other tests' uploads out of its count, and its description.
fn gpu_alone() -> (MutexGuard<'static, ()>, GpuEngine, String) {
    let alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (gpu, line) = mdl_gpu::probe().expect("a GPU engine");
    (alone, gpu.with_min_bytes(1 << 20), line)
}

/// Step `step`'s options: reverse deltas made by the commit itself (against the warm set),
/// not deferred.
fn eager(step: u64) -> CommitOptions {
    CommitOptions {
        step: Some(step),
        message: format!("step {step}"),
        delta: Some(mdl::policy::DeltaPolicy {
            defer: false,
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
#[ignore = "needs the GPU engine: a CUDA device, or --features mdl-gpu/emulate"]
fn a_device_snapshot_is_read_where_it_lies_and_stores_what_the_cpu_stores() {
    let (_alone, gpu, line) = gpu_alone();
    let dir = tempfile::tempdir().unwrap();
    let (on_cpu, on_gpu) = (dir.path().join("cpu"), dir.path().join("gpu"));
    let cpu_commits = committer(&on_cpu, Arc::new(CpuEngine));
    let gpu_commits = committer(&on_gpu, Arc::new(gpu.clone()));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for step in 1..=3 {
        let file = state(step);
        // The tensors' copy on the device: a buffer of its own, as PyTorch's snapshot is.
        let (device, run) = device_snapshot(&gpu, &file);
        let staged = |on_device: bool| {
            let f = MemoryFile::new("model.safetensors", file.clone());
            let f = if on_device {
                f.on_device(run).unwrap()
            } else {
                f
            };
            Staged::memory(vec![f], &[]).unwrap()
        };
        a.push(
            cpu_commits
                .submit(staged(false), eager(step))
                .unwrap()
                .wait()
                .unwrap(),
        );
        let before = gpu.uploaded();
        b.push(
            gpu_commits
                .submit(staged(true), eager(step))
                .unwrap()
                .wait()
                .unwrap(),
        );
        // Read where it lies: none of the tensors crossed to the device, nor the bases of
        // the deltas (the warm set keeps them there).
        assert_eq!(gpu.uploaded() - before, 0, "step {step} ({line})");
        assert_eq!(gpu.fallbacks(), 0, "step {step}");
        drop(device);
    }
    assert_eq!(layout(&on_cpu, &a), layout(&on_gpu, &b));
    let deltas = layout(&on_gpu, &b)
        .iter()
        .flat_map(|(_, t)| t.clone())
        .filter(|(_, codec, _)| codec.ends_with("-delta"))
        .count();
    assert!(deltas > 0, "the later commits store deltas");
    // And it checks out byte for byte (a commit of one file, to that path).
    let out = dir.path().join("out.safetensors");
    let repo = Repository::open(&on_gpu, &OpenOptions::default()).unwrap();
    checkout(
        &repo,
        "main",
        &out,
        &CheckoutOptions::default(),
        &NoProgress,
    )
    .unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), state(3));
}

#[test]
fn a_device_run_outside_its_file_is_refused() {
    let file = MemoryFile::new("model.safetensors", vec![0u8; 100]);
    let run = OnDevice {
        start: 90,
        len: 20,
        copy: DeviceCopy {
            ordinal: 0,
            address: 4096,
        },
    };
    let err = file.on_device(run).err().expect("refused");
    assert!(err.to_string().contains("outside"), "{err}");
}

#[test]
#[ignore = "needs the GPU engine: a CUDA device, or --features mdl-gpu/emulate"]
fn a_tensor_loaded_into_device_memory_is_decoded_there() {
    let (_alone, gpu, line) = gpu_alone();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    let commits = committer(&root, Arc::new(CpuEngine));
    for step in 1..=2 {
        let staged = Staged::memory(vec![MemoryFile::new("model.safetensors", state(step))], &[]);
        commits
            .submit(staged.unwrap(), eager(step))
            .unwrap()
            .wait()
            .unwrap();
    }
    drop(commits);
    let mut repo = Repository::open(&root, &OpenOptions::default()).unwrap();
    repo.set_engine(Arc::new(gpu.clone()));
    // HEAD holds whole records, HEAD~1 deltas against them (reverse deltas).
    for (rev, step) in [("HEAD", 2), ("HEAD~1", 1)] {
        let file = state(step);
        let layout = mdl::checkout::layout(&repo, rev).unwrap();
        for piece in &layout.single().unwrap().pieces {
            let Piece::Object(placed) = piece else {
                continue;
            };
            let at = placed.offset as usize;
            let want = &file[at..at + placed.entry.content_len as usize];
            let mut host = vec![0u8; want.len()];
            // The tensor's memory on the device, filled with a pattern no tensor holds.
            let device = gpu
                .device_buffer(&vec![0xa5u8; want.len()])
                .expect("device memory");
            let copy = DeviceCopy {
                ordinal: 0,
                address: device.address(),
            };
            let before = gpu.uploaded();
            let mirror = placed.load_mirrored(&repo, &mut host, copy).unwrap();
            assert_eq!(device.read(), want, "{rev} {} ({mirror:?})", placed.name);
            if mirror != Mirror::Written {
                // Decoded on the host, and copied over.
                assert_eq!(host, want, "{rev} {}", placed.name);
            }
            if rev == "HEAD" && placed.name != "b" {
                // Decoded in place and verified there: only the coded bytes crossed to the
                // device, and the id came back.
                assert_eq!(mirror, Mirror::Written, "{} ({line})", placed.name);
                assert_eq!(gpu.uploaded(), before, "{}", placed.name);
            }
            assert_ne!(mirror, Mirror::NotMine, "{rev} {}", placed.name);
        }
    }
    // All of a commit's tensors at once, tensor-parallel: decoded in place, nothing handed
    // back.
    let file = state(2);
    let layout = mdl::checkout::layout(&repo, "HEAD").unwrap();
    let placed: Vec<&Placed> = layout.single().unwrap().objects().collect();
    let devices = device_targets(&gpu, &placed);
    let tensors = into_targets(&placed, &devices);
    let back = mdl::checkout::load_all_mirrored(&repo, &tensors).unwrap();
    assert!(back.iter().all(Option::is_none));
    for (p, d) in placed.iter().zip(&devices) {
        let (at, got) = (p.offset as usize, d.read());
        assert_eq!(got, &file[at..at + got.len()], "{}", p.name);
    }
    // A device the engine is not on: the caller copies.
    let layout = mdl::checkout::layout(&repo, "HEAD").unwrap();
    let placed = layout.single().unwrap().objects().next().unwrap();
    let mut host = vec![0u8; placed.entry.content_len as usize];
    let elsewhere = DeviceCopy {
        ordinal: 7,
        address: 4096,
    };
    let mirror = placed.load_mirrored(&repo, &mut host, elsewhere).unwrap();
    assert_eq!(mirror, Mirror::NotMine);
}
