//! Helpers shared by the library's integration tests.

// Tests, examples and benchmarks write their own files (checkpoints, outputs, damage done on
// purpose); the rule that repository writes go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

use std::path::Path;

#[allow(dead_code)] // only the fault tests fail a disk on purpose
pub(crate) mod faulty;

use mdl::checkout::Placed;
use mdl::commit::{CommitOutcome, DeviceCopy};
use mdl::{OpenOptions, Repository};

/// Tensors of a safetensors file by name: (dtype, shape, bytes).
#[allow(dead_code)] // not every test binary reads files back
pub(crate) fn read_safetensors(
    path: &Path,
) -> std::collections::HashMap<String, (mdl_format::Dtype, Vec<u64>, Vec<u8>)> {
    use mdl_format::safetensors;
    let bytes = std::fs::read(path).unwrap();
    let hl = safetensors::header_len(&bytes[..8], bytes.len() as u64).unwrap() as usize;
    let layout = safetensors::parse(&bytes[8..8 + hl], bytes.len() as u64).unwrap();
    layout
        .tensors
        .iter()
        .map(|t| {
            let start = (layout.data_start() + t.offset) as usize;
            let data = bytes[start..start + t.len as usize].to_vec();
            (
                t.name.clone(),
                (t.header.dtype, t.header.shape.clone(), data),
            )
        })
        .collect()
}

/// Writes a safetensors file holding `(name, dtype, shape, bytes)` tensors in order.
#[allow(dead_code)] // not every test binary writes files
pub(crate) fn write_safetensors(path: &Path, tensors: &[(&str, &str, Vec<u64>, Vec<u8>)]) {
    std::fs::write(path, safetensors_bytes(tensors)).unwrap();
}

/// The bytes of a safetensors file holding `(name, dtype, shape, bytes)` tensors in order.
pub(crate) fn safetensors_bytes(tensors: &[(&str, &str, Vec<u64>, Vec<u8>)]) -> Vec<u8> {
    let mut header = String::from("{");
    let mut data = Vec::new();
    for (i, (name, dtype, shape, bytes)) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            r#""{name}":{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[{},{}]}}"#,
            data.len(),
            data.len() + bytes.len()
        ));
        data.extend_from_slice(bytes);
    }
    header.push('}');
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&data);
    file
}

/// xorshift64* with Box–Muller normals: deterministic, no dependencies.
#[allow(dead_code)] // not every test binary draws numbers
pub(crate) struct Rng(pub u64);

#[allow(dead_code)]
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(crate) fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    pub(crate) fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// One Adam-like step (β 0.9 / 0.999, no bias correction) of weights `w` with moments `m`, `v`:
/// the training-like drift the tests commit. `grad` draws each gradient from its weight.
#[allow(dead_code)]
pub(crate) fn adam_step(
    w: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    lr: f32,
    mut grad: impl FnMut(f32) -> f32,
) {
    for i in 0..w.len() {
        let g = grad(w[i]);
        m[i] = 0.9 * m[i] + 0.1 * g;
        v[i] = 0.999 * v[i] + 0.001 * g * g;
        w[i] -= lr * m[i] / (v[i].sqrt() + 1e-8);
    }
}

/// Checks out every `(file, commit)` into `dir` and compares it with the file byte for byte,
/// then checks that fsck finds nothing wrong and no old record generation is left.
#[allow(dead_code)]
pub(crate) fn checks_out_exactly(
    repo: &Repository,
    commits: &[(std::path::PathBuf, mdl::ObjectId)],
    dir: &Path,
) {
    use mdl::checkout::{checkout, CheckoutOptions};
    for (i, (path, id)) in commits.iter().enumerate() {
        let out = dir.join(format!("out{i}.safetensors"));
        checkout(
            repo,
            &id.to_hex(),
            &out,
            &CheckoutOptions::default(),
            &mdl::NoProgress,
        )
        .unwrap();
        assert!(
            std::fs::read(&out).unwrap() == std::fs::read(path).unwrap(),
            "commit {i} differs"
        );
        std::fs::remove_file(&out).unwrap();
    }
    let report = mdl::fsck::fsck(repo, false).unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(report.unindexed_records, 0, "old generations are removed");
}

/// A tensor of a commit as stored: its object id, codec and stored size.
#[allow(dead_code)]
pub(crate) type Record = (String, String, u64);

/// Each commit's stored size (when it landed), and every tensor's [`Record`] as the repository
/// at `root` shows it now.
#[allow(dead_code)]
pub(crate) fn stored_layout(root: &Path, outcomes: &[CommitOutcome]) -> Vec<(u64, Vec<Record>)> {
    let repo = Repository::open(root, &OpenOptions::default()).unwrap();
    outcomes
        .iter()
        .map(|o| {
            let shown = mdl::show::show(&repo, &o.id.to_hex()).unwrap();
            let tensors = shown
                .tensors
                .iter()
                .map(|t| (t.id.to_hex(), t.codec.clone(), t.stored_bytes))
                .collect();
            (o.stored_bytes, tensors)
        })
        .collect()
}

/// Device memory for each of `placed`'s tensors, as a load's CUDA tensors are: filled with a
/// pattern no tensor holds.
#[allow(dead_code)] // only the device tests load into device memory
pub(crate) fn device_targets(
    gpu: &mdl_gpu::GpuEngine,
    placed: &[&Placed],
) -> Vec<mdl_gpu::DeviceBuffer> {
    placed
        .iter()
        .map(|p| {
            gpu.device_buffer(&vec![0xa5u8; p.entry.content_len as usize])
                .expect("device memory")
        })
        .collect()
}

/// Each of `placed`'s tensors with the device copy naming its memory in `targets`.
#[allow(dead_code)]
pub(crate) fn into_targets<'a>(
    placed: &[&'a Placed],
    targets: &[mdl_gpu::DeviceBuffer],
) -> Vec<(&'a Placed, DeviceCopy)> {
    placed
        .iter()
        .zip(targets)
        .map(|(&p, d)| {
            let copy = DeviceCopy {
                ordinal: 0,
                address: d.address(),
            };
            (p, copy)
        })
        .collect()
}

/// A committer at `root` (a new repository) keeping the last commit warm, its commits' kernels
/// on `engine`. The re-encodes the commits defer stay queued: their work reads the store, not
/// the state committed.
#[allow(dead_code)] // only the device tests commit through a committer on an engine
pub(crate) fn committer(
    root: &Path,
    engine: std::sync::Arc<dyn mdl_codec::engine::Engine>,
) -> mdl::background::Committer {
    use mdl::background::{failure, Committer};
    Repository::init(root).unwrap();
    let at = root.to_path_buf();
    Committer::storing(
        move |staged, opts| {
            let mut repo = Repository::open(&at, &OpenOptions::default()).map_err(failure)?;
            repo.set_engine(engine.clone());
            mdl::commit::commit_staged(&repo, staged, opts, &mdl::NoProgress).map_err(failure)
        },
        1 << 30,
    )
}

/// A copy of a safetensors `file`'s tensors on the device, in a buffer of its own as PyTorch's
/// snapshot is, and the run of the file it holds (what `MemoryFile::on_device` takes).
#[allow(dead_code)]
pub(crate) fn device_snapshot(
    gpu: &mdl_gpu::GpuEngine,
    file: &[u8],
) -> (mdl_gpu::DeviceBuffer, mdl::commit::OnDevice) {
    let start = 8 + u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let device = gpu.device_buffer(&file[start..]).expect("device memory");
    let run = mdl::commit::OnDevice {
        start,
        len: file.len() - start,
        copy: DeviceCopy {
            ordinal: 0,
            address: device.address(),
        },
    };
    (device, run)
}

/// How [`trained_series`] makes its checkpoints.
#[allow(dead_code)] // only the transfer tests make one
pub(crate) struct SeriesShape {
    /// The generator's seed.
    pub(crate) seed: u64,
    /// Elements of the weight vector `w`.
    pub(crate) len: usize,
    /// Every this-many-th element moves a little each step.
    pub(crate) every: usize,
    /// A small tensor `b` (`w`'s first 64 elements) beside it.
    pub(crate) bias: bool,
}

/// A repository at `dir/src` with `n` commits of a slowly changing f32 checkpoint (so its
/// tensors are deltas) and a step counter, the reverse deltas the commits deferred done; the
/// commits' ids, oldest first.
#[allow(dead_code)] // only the transfer tests make one
pub(crate) fn trained_series(
    dir: &Path,
    n: usize,
    shape: &SeriesShape,
) -> (Repository, Vec<mdl::ObjectId>) {
    use mdl::commit::{commit, CommitOptions};
    let repo = Repository::init(&dir.join("src")).unwrap();
    let mut rng = Rng(shape.seed);
    let mut w: Vec<f32> = (0..shape.len)
        .map(|_| (rng.normal() * 0.02) as f32)
        .collect();
    let mut ids = Vec::new();
    for step in 0..n {
        for x in w.iter_mut().step_by(shape.every) {
            *x += (rng.normal() * 1e-4) as f32;
        }
        let f = dir.join(format!("c{step}.safetensors"));
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let mut tensors = vec![("w", "F32", vec![w.len() as u64], f32s(&w))];
        if shape.bias {
            tensors.push(("b", "F32", vec![64], f32s(&w[..64])));
        }
        tensors.push(("step", "I64", vec![], (step as i64).to_le_bytes().to_vec()));
        write_safetensors(&f, &tensors);
        let opts = CommitOptions {
            message: format!("step {step}"),
            ..CommitOptions::default()
        };
        ids.push(commit(&repo, &f, &opts, &mdl::NoProgress).unwrap().id);
    }
    mdl::commit::run_deferred(&repo, None, &|| false).unwrap();
    (repo, ids)
}
