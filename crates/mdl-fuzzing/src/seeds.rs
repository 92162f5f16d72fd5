//! Valid inputs for every target — the starting points of fuzzing (`scripts/fuzz.sh` writes
//! them into cargo-fuzz's corpus) and of the mutations the tests try.

use std::path::Path;

use mdl_codec::engine::CpuEngine;
use mdl_codec::float;
use mdl_format::Dtype;

/// Small f32 values (compressible exponents), deterministically.
fn floats(count: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..count)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            ((x as f32 / u32::MAX as f32 - 0.5) * 0.02).to_le_bytes()
        })
        .collect()
}

fn float_split(data: &[u8], dtype: Dtype) -> Vec<u8> {
    let a = float::analyze(&CpuEngine, dtype, data, None).expect("valid lengths");
    let mut payload = Vec::new();
    float::encode(&CpuEngine, dtype, data, None, &a.plain, &mut payload).expect("encodes");
    payload
}

/// A masked delta payload of `n` f32 elements against the base the `float_payload` target
/// decodes against (every byte 0x5a), every tenth element changed.
fn masked(n: usize) -> Vec<u8> {
    let base = vec![0x5au8; n * 4];
    let mut data = base.clone();
    data.chunks_exact_mut(4).step_by(10).for_each(|e| e[0] ^= 3);
    float::encode_masked(Dtype::F32, &data, &base)
        .expect("valid lengths")
        .expect("few changed")
        .payload
}

/// [`masked`]'s changes (every tenth f32 element, byte 0 XOR 3) as a payload whose mask is
/// coded as runs (first byte 9), every sequence stored as it is: spelled from `docs/FORMAT.md`,
/// since writers choose this form for masks of millions of elements only.
fn masked_runs(n: usize) -> Vec<u8> {
    let changed = n.div_ceil(10);
    let mut flags = vec![0u8; n.div_ceil(8)];
    (0..n)
        .step_by(10)
        .for_each(|i| flags[i / 8] |= 1 << (i % 8));
    let (mut marks, mut gaps, mut zeros) = (Vec::new(), Vec::new(), 0u8);
    for f in flags {
        match f {
            0 => zeros += 1,
            _ => {
                gaps.push(zeros);
                marks.push(f);
                zeros = 0;
            }
        }
    }
    let stored = |out: &mut Vec<u8>, symbols: &[u8]| {
        assert!(symbols.len() < 128, "one-byte varints");
        out.extend_from_slice(&[0, symbols.len() as u8]);
        out.extend_from_slice(symbols);
    };
    assert!(changed < 128 && zeros < 32);
    let mut payload = vec![9, changed as u8, marks.len() as u8, gaps.len() as u8];
    stored(&mut payload, &gaps);
    stored(&mut payload, &marks);
    stored(&mut payload, &vec![3; changed]);
    for _ in 1..4 {
        stored(&mut payload, &vec![0; changed]);
    }
    payload
}

/// A safetensors file of two tensors.
fn safetensors_file() -> Vec<u8> {
    let a = floats(64, 1);
    let b = floats(32, 2);
    let mut header = format!(
        "{{\"__metadata__\":{{\"step\":\"3\"}},\"a\":{{\"dtype\":\"F32\",\"shape\":[8,8],\"data_offsets\":[0,{}]}},\"b\":{{\"dtype\":\"F32\",\"shape\":[32],\"data_offsets\":[{},{}]}}}}",
        a.len(),
        a.len(),
        a.len() + b.len()
    );
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&a);
    file.extend_from_slice(&b);
    file
}

/// A repository's commit, manifest, a tensor record and a pack of everything, from two
/// commits (the second with a delta).
// The checkpoint file the seeds are committed from, in a temporary folder.
#[allow(clippy::disallowed_methods)]
fn repository_objects() -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let repo = mdl::Repository::init(&dir.path().join("r")).expect("a repository");
    let file = dir.path().join("c.safetensors");
    let mut tip = None;
    for step in 0..2u8 {
        let mut bytes = safetensors_file();
        let last = bytes.len() - 1;
        bytes[last] ^= step;
        std::fs::write(&file, &bytes).expect("written");
        let opts = mdl::commit::CommitOptions::default();
        tip = Some(commit(&repo, &file, &opts).id);
    }
    let tip = tip.expect("committed");
    let commit_bytes = mdl::inspect::content(&repo, &tip).expect("the commit");
    let c = mdl_format::Commit::decode(&commit_bytes).expect("a commit");
    let manifest_bytes = mdl::inspect::content(&repo, &c.manifest).expect("the manifest");
    let m = mdl_format::Manifest::decode(&manifest_bytes).expect("a manifest");
    let record = mdl::inspect::record(&repo, &m.tensors().next().expect("a tensor").1.id)
        .expect("the record");
    let whole = mdl::transfer::Shallow::WHOLE;
    let plan = mdl::transfer::plan(&repo, &[tip], &|_| false, &whole).expect("a plan");
    let ids: Vec<_> = plan.iter().map(|p| p.id).collect();
    let mut pack = Vec::new();
    mdl::transfer::write_pack(&repo, &ids, &mut pack).expect("a pack");
    (commit_bytes, manifest_bytes, record, pack)
}

fn commit(
    repo: &mdl::Repository,
    file: &Path,
    opts: &mdl::commit::CommitOptions,
) -> mdl::commit::CommitOutcome {
    mdl::commit::commit(repo, file, opts, &mdl::NoProgress).expect("a commit")
}

/// Valid inputs for the target `name`.
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    let with = |sel: u8, rest: &[u8]| [&[sel][..], rest].concat();
    match name {
        "entropy_stream" => {
            // Plane 0 (exponents, Huffman-coded) of a float-split payload of 2113·k elements.
            (1..4)
                .map(|k| {
                    let payload = float_split(&floats(2113 * k, k as u32), Dtype::F32);
                    let len0 = u64::from_le_bytes(payload[2..10].try_into().unwrap()) as usize;
                    let start = 2 + 8 * payload[0] as usize;
                    with(k as u8, &payload[start..start + len0])
                })
                .collect()
        }
        "float_payload" => vec![
            with(2 | (3 << 3), &float_split(&floats(3 * 97, 3), Dtype::F32)),
            with(2 | 4 | (3 << 3), &masked(3 * 97)),
            with(2 | 4 | (3 << 3), &masked_runs(3 * 97)),
            with(6, &floats(200, 4)),
            with(0, &floats(100, 5)),
        ],
        "quant_payload" => vec![with(7, &[1, 2, 3, 4, 5, 0, 0, 0, 9]), with(130, &[0; 64])],
        "residual_payload" => vec![
            with(
                2,
                &[
                    3, 1, 1, 37, 4, 0, 1, 1, 0x40, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 1, 0,
                ],
            ),
            with(9, &(0..=255).collect::<Vec<u8>>()),
            classed_residual(),
            stepped_residual(),
        ],
        "cast_payload" => vec![
            with(8, &[0]),
            with(9, &[2, 3, 1, 0x80, 0x3f, 0x00, 0x40]),
        ],
        "safetensors_header" => {
            let file = safetensors_file();
            let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
            let data = (file.len() - 8 - n) as u16;
            vec![[&data.to_le_bytes()[..], &file[8..8 + n]].concat()]
        }
        "manifest" => vec![repository_objects().1],
        // Archives written by the real torch.save (tests/fixtures/torch/make.py).
        "torch_archive" => vec![
            include_bytes!("../../../tests/fixtures/torch/optimizer.pt").to_vec(),
            include_bytes!("../../../tests/fixtures/torch/dtypes.pt").to_vec(),
            include_bytes!("../../../tests/fixtures/torch/lightning.ckpt").to_vec(),
            include_bytes!("../../../tests/fixtures/torch/unsupported-opcode.pt").to_vec(),
        ],
        "commit" => vec![repository_objects().0],
        "record" => vec![repository_objects().2],
        "pack_stream" => vec![repository_objects().3],
        "revision" => [
            "main",
            "main~2^1",
            "HEAD~",
            "v1^0~3",
            "abcd1234",
            "refs/heads/x",
            "main~é",
            "é^2",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect(),
        // A safetensors file, the real torch.save archives, and one cut short.
        "checkpoint_file" => {
            let pt = include_bytes!("../../../tests/fixtures/torch/optimizer.pt");
            vec![
                with(0, &safetensors_file()),
                with(1, pt),
                with(
                    2,
                    include_bytes!("../../../tests/fixtures/torch/lightning.ckpt"),
                ),
                with(1, &pt[..pt.len() / 2]),
                with(3, b"import site"),
                with(4, &[0x80, 2, 0x7d, 0x71, 0, 0x2e]),
            ]
        }
        "tensor_name" => [
            "model.layers.0.self_attn.q_proj.weight",
            "state.0.exp_avg",
            "encoder/block.1",
            "../x",
            "a\u{1b}[2Jb",
            "/etc/passwd",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect(),
        "range_header" => ["bytes=0-9", "bytes=5-", "bytes=-3", "bytes=1-2,4-5"]
            .iter()
            .map(|s| [&100u16.to_le_bytes()[..], s.as_bytes()].concat())
            .collect(),
        "query_params" => vec![
            b"branch=exp&message=hi%20there&step=3&metric=loss%3D0.5".to_vec(),
            b"lossy=true&epsilon=0.001&moments=exp_avg".to_vec(),
        ],
        "server_answer" => vec![
            with(0, br#"{"head":"main","refs":[{"name":"refs/heads/main","target":"ab"}]}"#),
            with(
                0,
                format!(
                    r#"{{"head":"main","refs":[{{"name":"refs/tags/../heads/x","target":"{0}"}},{{"name":"refs/heads/main","target":"{0}","tagger":"t","time_ms":1,"message":"m\u001b"}}]}}"#,
                    "ab".repeat(32)
                )
                .as_bytes(),
            ),
            with(
                1,
                format!(r#"{{"objects":[{{"id":"{}","size":1}}]}}"#, "cd".repeat(32)).as_bytes(),
            ),
            with(
                2,
                format!(
                    r#"{{"commit":"{0}","files":[{{"path":"../x","size":1,"etag":"{0}","tensors":0,"lossy_tensors":0,"executable":false}}]}}"#,
                    "ef".repeat(32)
                )
                .as_bytes(),
            ),
            with(3, br#"{"code":"not_found","message":"no \u001b[2J such"}"#),
            with(3, "x\u{7}y".repeat(200).as_bytes()),
        ],
        other => panic!("no fuzz target {other}"),
    }
}

/// A linear f32 payload of 8 × 37 elements (the target's first byte 29) against the target's
/// reference, its codes by classes of rows (width 3).
fn classed_residual() -> Vec<u8> {
    use mdl_codec::residual;
    let (rows, n) = (8, 8 * 37);
    let reference: Vec<u8> = (0..n * 4).map(|i| (i * 29 % 251) as u8 | 0x01).collect();
    let values: Vec<u8> = (0..n)
        .flat_map(|i| {
            let r = mdl_codec::scalar::value(Dtype::F32, &reference, i);
            let moved = r + ((i * 7 % 5) as f64 - 2.0) * (1 + i / 37 % 4) as f64;
            (moved as f32).to_le_bytes()
        })
        .collect();
    let (payload, _) = residual::encode(
        Dtype::F32,
        &values,
        Some(&reference),
        residual::Mode::Linear,
        1.0,
    );
    let classed = residual::context_code(Dtype::F32, payload, (rows, 37));
    let parts = residual::parse(Dtype::F32, &classed, Some(n * 4), n * 4).expect("a payload");
    assert!(matches!(parts.codes, residual::Codes::Classed(_)));
    [&[29u8][..], &classed].concat()
}

/// [`classed_residual`]'s tensor as a stepped payload (format 14), its steps fitted to a second
/// moment with row and column structure.
fn stepped_residual() -> Vec<u8> {
    use mdl_codec::residual;
    let (rows, cols) = (8, 37);
    let n = rows * cols;
    let reference: Vec<u8> = (0..n * 4).map(|i| (i * 29 % 251) as u8 | 0x01).collect();
    let values: Vec<u8> = (0..n)
        .flat_map(|i| {
            let r = mdl_codec::scalar::value(Dtype::F32, &reference, i);
            ((r + ((i * 7 % 5) as f64 - 2.0)) as f32).to_le_bytes()
        })
        .collect();
    let v: Vec<u8> = (0..n)
        .flat_map(|i| (2f32.powi((i / cols) as i32 - (i % cols % 5) as i32)).to_le_bytes())
        .collect();
    let steps = residual::Steps::fit(Dtype::F32, &v, (rows, cols), 0.1).expect("factors");
    let (payload, _) = residual::encode_stepped(Dtype::F32, &values, Some(&reference), &steps, 1.0);
    assert_eq!(payload[0], residual::STEPPED);
    [&[29u8][..], &payload].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spelled run-coded seed decodes, as an xor-delta, to [`masked`]'s changes.
    #[test]
    fn the_run_coded_seed_decodes_to_its_changes() {
        let n = 3 * 97;
        let base = vec![0x5au8; n * 4];
        let mut data = base.clone();
        data.chunks_exact_mut(4).step_by(10).for_each(|e| e[0] ^= 3);
        let mut out = vec![0u8; n * 4];
        let payload = masked_runs(n);
        float::decode(&CpuEngine, Dtype::F32, &payload, Some(&base), &mut out).unwrap();
        assert_eq!((payload[0], out), (9, data));
    }
}
