//! Every decoder of untrusted bytes in mdl, as one function per fuzz target. Each must never
//! panic on any input; where an input is valid, each also checks a property (a round trip, a
//! bound). `fuzz/` runs them under libFuzzer (`scripts/fuzz.sh`); this crate's tests run them
//! over seeds and a few thousand generated inputs on the stock toolchain, so they compile and
//! run in CI and cannot rot.

use std::sync::{Mutex, OnceLock};

use mdl_codec::engine::CpuEngine;
use mdl_codec::planes::{PlaneSpec, Transform};
use mdl_codec::qrecord::{rle_decode, rle_encode, QuantTensor};
use mdl_codec::{cast, float, huffman, residual};
use mdl_format::record::{self, RecordHeader};
use mdl_format::{Commit, Dtype, Manifest};

mod seeds;
pub use seeds::seeds;

/// What a fuzz target runs on one input.
pub type Check = fn(&[u8]);

/// The fuzz targets, by name.
pub const TARGETS: &[(&str, Check)] = &[
    ("entropy_stream", entropy_stream),
    ("float_payload", float_payload),
    ("quant_payload", quant_payload),
    ("residual_payload", residual_payload),
    ("cast_payload", cast_payload),
    ("safetensors_header", safetensors_header),
    ("torch_archive", torch_archive),
    ("manifest", manifest),
    ("commit", commit),
    ("record", record),
    ("pack_stream", pack_stream),
    ("revision", revision),
    ("tensor_name", tensor_name),
    ("checkpoint_file", checkpoint_file),
    ("range_header", range_header),
    ("query_params", query_params),
    ("server_answer", server_answer),
];

/// A `torch.save` archive: the zip directory and the pickle read without executing anything;
/// every storage found lies inside the input, in order, none overlapping another, its length
/// its header's.
pub fn torch_archive(input: &[u8]) {
    if let Ok(a) = mdl_format::torch::split(input) {
        let mut end = 0u64;
        for s in &a.storages {
            let len = s.header.data_len().expect("a storage's size fits");
            assert!(s.offset >= end, "storages overlap or are out of order");
            end = s.offset + len;
            assert!(end <= input.len() as u64, "a storage past the end");
        }
        for &(at, len) in &a.others {
            assert!(at + len <= input.len() as u64, "an entry past the end");
        }
    }
}

/// An entropy stream: a stream that decodes decodes the same chunk by chunk as whole, and each
/// Huffman chunk decodes the same (or is refused alike) by the fast decoder, whose inner loop
/// runs without bounds checks, and by the checked reference.
pub fn entropy_stream(input: &[u8]) {
    let Some((&n, bytes)) = input.split_first() else {
        return;
    };
    // Symbol counts up to a few chunks, so chunk tables and lanes are exercised.
    let n = (n as usize) * 2113;
    let Ok(stream) = huffman::Stream::parse(bytes, n as u64) else {
        return;
    };
    let mut out = vec![0u8; n];
    if huffman::decode_stream(bytes, &mut out).is_ok() {
        let mut again = vec![0u8; n];
        for (i, c) in again.chunks_mut(stream.chunk_len()).enumerate() {
            stream
                .decode_chunk(i, c)
                .expect("chunks decoded once already");
        }
        assert_eq!(out, again);
    }
    if let huffman::StreamBody::Coded {
        lanes,
        decoder,
        values: None,
        offsets,
        data,
    } = stream.body()
    {
        let chunk_len = stream.chunk_len();
        for (i, w) in offsets.windows(2).enumerate() {
            let m = chunk_len.min(n - i * chunk_len);
            let (mut fast, mut checked) = (vec![0u8; m], vec![0u8; m]);
            let chunk = &data[w[0]..w[1]];
            let a = decoder.decode_chunk(*lanes, chunk, &mut fast);
            let b = decoder.decode_chunk_checked(*lanes, chunk, &mut checked);
            assert_eq!(a.is_ok(), b.is_ok(), "chunk {i}: {a:?} against {b:?}");
            if a.is_ok() {
                assert_eq!(fast, checked, "chunk {i}");
            }
        }
    }
}

const FLOATS: [Dtype; 4] = [Dtype::BF16, Dtype::F16, Dtype::F32, Dtype::F64];

/// A float-split, xor-delta or sub-delta payload (plain, framed or masked) of every float
/// dtype; data built from the bytes round-trips bit for bit, plain and as a masked delta.
pub fn float_payload(input: &[u8]) {
    let Some((&sel, rest)) = input.split_first() else {
        return;
    };
    let e = &CpuEngine;
    let dtype = FLOATS[(sel & 3) as usize];
    let with_base = sel & 4 != 0;
    let w = dtype.size();
    // As a payload: any bytes, for a tensor of a size derived from the selector.
    let n = (sel as usize >> 3) * 97;
    let base = vec![0x5au8; n * w];
    let mut out = vec![0u8; n * w];
    let _ = float::decode(e, dtype, rest, with_base.then_some(&base[..]), &mut out);
    let _ = float::decode_sub(e, dtype, rest, &base, &mut out);
    // As a masked payload turned round, or patched into a tensor in place.
    for spec in [PlaneSpec::planes(dtype, 0), PlaneSpec::sub(dtype)] {
        let _ = float::invert_masked(spec, out.len() as u64, rest);
        if let Ok(m) = float::MaskedDelta::open(spec, out.len() as u64, rest) {
            let mut live = base.clone();
            m.patch(&mut live).expect("the tensor's length");
            m.unpatch(&mut live).expect("the tensor's length");
            assert_eq!(live, base, "undone exactly");
        }
    }
    // As data: encoding then decoding gives back every bit.
    let data = &rest[..rest.len() / w * w];
    let base: Vec<u8> = data.iter().rev().copied().collect();
    let b = with_base.then_some(&base[..]);
    let a = float::analyze(e, dtype, data, b).expect("valid lengths");
    let choice = match (&a.delta, with_base) {
        (Some(d), true) => d,
        _ => &a.plain,
    };
    let mut payload = Vec::new();
    let b = (choice.xor_mask != 0).then_some(&base[..]);
    float::encode(e, dtype, data, b, choice, &mut payload).expect("encodes");
    let mut back = vec![0u8; data.len()];
    float::decode(e, dtype, &payload, b, &mut back).expect("decodes what it encoded");
    assert_eq!(back, data);
    let sub = float::analyze_sub(e, dtype, data, &base).expect("valid lengths");
    let mut payload = Vec::new();
    float::encode(e, dtype, data, Some(&base), &sub, &mut payload).expect("encodes");
    float::decode_sub(e, dtype, &payload, &base, &mut back).expect("decodes what it encoded");
    assert_eq!(back, data);
    // As a masked delta: against a base that differs in every seventh element.
    let mut near = data.to_vec();
    near.chunks_exact_mut(w).step_by(7).for_each(|x| x[0] ^= 1);
    if let Some(m) = float::encode_masked(dtype, data, &near).expect("valid lengths") {
        match m.transform {
            Transform::Sub => float::decode_sub(e, dtype, &m.payload, &near, &mut back),
            Transform::Planes => float::decode(e, dtype, &m.payload, Some(&near), &mut back),
        }
        .expect("decodes what it encoded");
        assert_eq!(back, data);
        let spec = match m.transform {
            Transform::Sub => PlaneSpec::sub(dtype),
            Transform::Planes => PlaneSpec::planes(dtype, 0),
        };
        let turned = float::invert_masked(spec, data.len() as u64, &m.payload).expect("inverts");
        let mut was = vec![0u8; data.len()];
        let mut d = float::MaskedDelta::open(spec, data.len() as u64, &turned).expect("opens");
        d.apply_next(data, &mut was).expect("applies");
        assert_eq!(was, near, "turned round, it gives the base back");
    }
}

/// A quant-base or quant-delta payload (and the run-length stream inside a delta); quantized
/// tensors built from the bytes round-trip through both record kinds.
pub fn quant_payload(input: &[u8]) {
    const DTYPES: [Dtype; 3] = [Dtype::BF16, Dtype::F16, Dtype::F32];
    let Some((&sel, rest)) = input.split_first() else {
        return;
    };
    let dtype = DTYPES[(sel % 3) as usize];
    let n = (sel as usize >> 2) * 61;
    let base_codes: Vec<u8> = (0..n).map(|i| (i % 7) as u8).collect();
    let _ = QuantTensor::decode(&CpuEngine, dtype, n, rest, None);
    let _ = QuantTensor::decode(&CpuEngine, dtype, n, rest, Some(&base_codes));
    let _ = rle_decode(rest, n, 9);
    let bins = 1 + (sel as usize % 33);
    let size = dtype.size();
    let codes: Vec<u8> = rest.iter().map(|&b| b % bins as u8).collect();
    let protected: Vec<u64> = (0..codes.len() as u64).filter(|i| i % 13 == 5).collect();
    let q = QuantTensor {
        dtype,
        table: (0..bins * size).map(|i| i as u8).collect(),
        protected_values: vec![0xab; protected.len() * size],
        protected,
        codes,
    };
    let len = q.codes.len();
    let back = QuantTensor::decode(&CpuEngine, dtype, len, &q.encode_base(), None).expect("base");
    assert_eq!(back, q);
    let base: Vec<u8> = q.codes.iter().rev().map(|&c| c % 5).collect();
    let delta = q.encode_delta(&CpuEngine, &base, 5);
    let back = QuantTensor::decode(&CpuEngine, dtype, len, &delta, Some(&base)).expect("delta");
    assert_eq!(back, q);
    let small: Vec<u8> = rest.iter().map(|&b| b % 9).collect();
    assert_eq!(
        rle_decode(&rle_encode(&small), small.len(), 9).expect("runs"),
        small
    );
}

/// A quant-residual or quant-uniform payload (the first byte chooses the dtype and the view),
/// predicted second-moment payloads and codes by classes included: decoding with or without a
/// reference never panics, and a predicted payload built from the bytes decodes to what its
/// encoder rendered (its codes recoded by classes too), every element within half a step of its
/// value.
pub fn residual_payload(input: &[u8]) {
    const DTYPES: [Dtype; 3] = [Dtype::BF16, Dtype::F16, Dtype::F32];
    let Some((&sel, rest)) = input.split_first() else {
        return;
    };
    let dtype = DTYPES[(sel % 3) as usize];
    let size = dtype.size();
    let rows = 1 + (sel as usize >> 2) % 8;
    let n = rows * 37;
    let reference: Vec<u8> = (0..n * size).map(|i| (i * 29 % 251) as u8 | 0x01).collect();
    let mut out = vec![0u8; n * size];
    let _ = residual::decode(dtype, rest, None, &mut out);
    let _ = residual::decode(dtype, rest, Some(&reference), &mut out);
    let _ = residual::mode_and_step(rest);
    // Positive values from the bytes, predicted against the reference and without it.
    let values: Vec<u8> = (0..n)
        .flat_map(|i| {
            let b = rest.get(i % rest.len().max(1)).copied().unwrap_or(1);
            let x = (f64::from(b) + 1.0) * 2f64.powi(-((i % 40) as i32));
            let mut e = vec![0u8; size];
            mdl_codec::scalar::put_rounded(dtype, x, &mut e);
            e
        })
        .collect();
    stepped_round_trip(dtype, rest, &reference, (rows, 37));
    let positive = |b: &[u8], i| mdl_codec::scalar::value(dtype, b, i) > 0.0;
    for r in [Some(&reference[..]), None] {
        let r = r.filter(|r| (0..n).all(|i| positive(r, i)));
        let p = residual::Predictor::fit(dtype, &values, r, (rows, 37));
        let prediction = p
            .predict(dtype, r)
            .expect("the reference it was fitted with");
        let (inner, render) =
            residual::encode(dtype, &values, Some(&prediction), residual::Mode::Log, 1.0);
        let payload = p.wrap(&inner);
        residual::decode(dtype, &payload, r, &mut out).expect("decodes what it encoded");
        assert_eq!(out, render);
        // Its codes by classes of rows (or columns) decode to the same.
        let classed = residual::context_code(dtype, payload, (rows, 37));
        residual::decode(dtype, &classed, r, &mut out).expect("decodes its classed form");
        assert_eq!(out, render);
        for i in 0..n {
            let (x, y) = (
                mdl_codec::scalar::value(dtype, &values, i),
                mdl_codec::scalar::value(dtype, &out, i),
            );
            // Half a step, plus the dtype's rounding; below the dtype's normal range the
            // rounding is absolute, half its smallest step.
            let normal = if dtype == Dtype::F16 {
                2f64.powi(-14)
            } else {
                2f64.powi(-126)
            };
            let tiny = if dtype == Dtype::F16 {
                2f64.powi(-25)
            } else {
                2f64.powi(-150)
            };
            assert!(
                (y / x).log2().abs() <= 0.5 + 0.02 || (x < normal && (y - x).abs() <= x + tiny),
                "{x} → {y}"
            );
        }
    }
}

/// Steps by row and column fitted to a second moment made from the bytes: a stepped payload
/// against `reference` decodes to what its encoder rendered, its classed form too.
fn stepped_round_trip(dtype: Dtype, bytes: &[u8], reference: &[u8], (rows, cols): (usize, usize)) {
    let n = rows * cols;
    let byte = |i: usize| bytes.get(i % bytes.len().max(1)).copied().unwrap_or(3);
    let put = |x: f64| {
        let mut e = vec![0u8; dtype.size()];
        mdl_codec::scalar::put_rounded(dtype, x, &mut e);
        e
    };
    let v: Vec<u8> = (0..n)
        .flat_map(|i| put(f64::from(byte(i)) * 2f64.powi(-((i * 7 % 60) as i32))))
        .collect();
    let Some(steps) = residual::Steps::fit(dtype, &v, (rows, cols), 0.1) else {
        return;
    };
    let value = |b: &[u8], i| mdl_codec::scalar::value(dtype, b, i);
    let values: Vec<u8> = (0..n)
        .flat_map(|i| put(value(reference, i) + (f64::from(byte(i + 3)) - 128.0) / 64.0))
        .collect();
    let step = 0.25;
    let (payload, render) = residual::encode_stepped(dtype, &values, Some(reference), &steps, step);
    let mut out = vec![0u8; n * dtype.size()];
    residual::decode(dtype, &payload, Some(reference), &mut out).expect("decodes what it encoded");
    assert_eq!(out, render);
    let classed = residual::context_code(dtype, payload, (rows, cols));
    residual::decode(dtype, &classed, Some(reference), &mut out).expect("its classed form");
    assert_eq!(out, render);
    let (_, inner) = residual::Steps::unwrap(&classed, Some(n)).unwrap().unwrap();
    assert!(residual::mode_and_step(inner).unwrap().0 == residual::Mode::Linear);
}

/// A cast payload (the first byte chooses bf16 or f16 and the length) against a master made
/// from the bytes: decoding never panics, and what it accepts is the master's cast but for the
/// elements the payload names; the payload [`cast::encode`] makes of a copy rebuilds it.
pub fn cast_payload(input: &[u8]) {
    let Some((&sel, rest)) = input.split_first() else {
        return;
    };
    let dtype = [Dtype::BF16, Dtype::F16][(sel & 1) as usize];
    let n = 1 + (sel as usize >> 1) % 97;
    let master: Vec<u8> = (0..n)
        .flat_map(|i| {
            let b = rest.get(i % rest.len().max(1)).copied().unwrap_or(1);
            (f32::from(b) * 0.37 - 40.0).to_le_bytes()
        })
        .collect();
    let mut cast = vec![0u8; 2 * n];
    cast::cast_into(dtype, &master, &mut cast);
    let mut out = vec![0u8; 2 * n];
    if cast::decode(dtype, &master, rest, &mut out).is_ok() {
        let differ = (0..n).filter(|&i| out[2 * i..2 * i + 2] != cast[2 * i..2 * i + 2]);
        assert!(differ.count() <= rest.len() / 3, "more changes than named");
    }
    // The input's bytes as a copy: encoded against the master, decoded back.
    let copy: Vec<u8> = (0..2 * n)
        .map(|i| rest.get(i).copied().unwrap_or(0))
        .collect();
    let payload = cast::encode(dtype, &master, &copy).expect("sizes agree");
    cast::decode(dtype, &master, &payload, &mut out).expect("decodes what it encoded");
    assert_eq!(out, copy);
}

/// A safetensors header (the first two bytes choose the file's length): what validates lies
/// inside the file, in order, without overlaps.
pub fn safetensors_header(input: &[u8]) {
    let Some((len, header)) = input.split_first_chunk::<2>() else {
        return;
    };
    let file_len = 8 + header.len() as u64 + u64::from(u16::from_le_bytes(*len));
    let Ok(layout) = mdl_format::safetensors::parse(header, file_len) else {
        return;
    };
    let data_len = file_len - layout.data_start();
    let mut end = 0;
    for t in &layout.tensors {
        assert!(t.offset >= end, "tensors overlap");
        end = t.offset + t.len;
        assert!(end <= data_len, "a tensor lies past the end of the file");
        assert_eq!(
            Some(t.len),
            t.header.data_len(),
            "length disagrees with dtype and shape"
        );
    }
}

/// A manifest: one that decodes encodes to bytes that decode to the same encoding, and its
/// view (what a server walks) says what the decoded manifest says, every accessor run.
pub fn manifest(input: &[u8]) {
    if let Ok(m) = Manifest::decode(input) {
        let e = m.encode();
        assert_eq!(Manifest::decode(&e).expect("re-decodes").encode(), e);
        let v = mdl_format::ManifestView::parse(input).expect("a view of what decodes");
        // Compared by their Debug text: a NaN error recorded is not equal to itself.
        let same = |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| {
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
        };
        same(&v.to_manifest(), &m);
        for (f, fv) in m.files.iter().zip(v.files()) {
            for (ev, e) in fv.tensors().zip(f.tensors()) {
                same(
                    &(ev.header(), ev.id(), ev.exactness()),
                    &(&e.header, e.id, &e.exactness),
                );
                assert_eq!(ev.is_lossy(), e.exactness.is_lossy());
            }
        }
    }
}

/// A commit: as for manifests.
pub fn commit(input: &[u8]) {
    if let Ok(c) = Commit::decode(input) {
        let e = c.encode();
        assert_eq!(Commit::decode(&e).expect("re-decodes").encode(), e);
    }
}

/// A record: the container, and the content-length check a receiver applies.
pub fn record(input: &[u8]) {
    let _ = RecordHeader::decode(input);
    if let Ok((header, payload, trailer)) = record::decode(input) {
        let _ = record::check_content_len(&header, payload.len() as u64, trailer.content_len);
        assert_eq!(
            record::encode(&header, payload, trailer.content_len),
            input,
            "a record that verifies re-encodes to itself"
        );
    }
}

/// A pack stream as the server receives it (into a repository kept across inputs): refused or
/// stored, never a panic, and what is stored verifies.
pub fn pack_stream(input: &[u8]) {
    static REPO: OnceLock<Mutex<(tempfile::TempDir, mdl::Repository)>> = OnceLock::new();
    let repo = REPO.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let repo = mdl::Repository::init(&dir.path().join("r")).expect("a repository");
        Mutex::new((dir, repo))
    });
    let guard = repo.lock().unwrap_or_else(|p| p.into_inner());
    let _ = mdl::transfer::receive_pack(&guard.1, &mut &input[..], input.len() as u64);
}

/// Names a checkpoint file is committed under, chosen by an input's first byte.
pub const CHECKPOINT_NAMES: [&str; 5] = [
    "model.safetensors",
    "optimizer.pt",
    "last.ckpt",
    "rng_state.pth",
    "data.bin",
];

/// A file committed as a checkpoint (named by the first byte, [`CHECKPOINT_NAMES`]) into a
/// repository kept across inputs, whose limits are small (`limits.tensors` 64,
/// `limits.header_bytes` 4096): refused, or committed and checked out byte for byte. So the
/// readers of safetensors and `torch.save` files, the damaged-checkpoint rule and the limits
/// never panic, and never store a file as something that does not give it back.
#[allow(clippy::disallowed_methods)] // the target's own temporary folder
pub fn checkpoint_file(input: &[u8]) {
    static REPO: OnceLock<Mutex<(tempfile::TempDir, mdl::Repository)>> = OnceLock::new();
    let Some((&which, bytes)) = input.split_first() else {
        return;
    };
    let repo = REPO.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let repo = mdl::Repository::init(&dir.path().join("r")).expect("a repository");
        mdl::config::set_config(&repo, "limits.tensors", "64").expect("a limit");
        mdl::config::set_config(&repo, "limits.header_bytes", "4096").expect("a limit");
        Mutex::new((dir, repo))
    });
    let guard = repo.lock().unwrap_or_else(|p| p.into_inner());
    let (dir, repo) = (&guard.0, &guard.1);
    let name = CHECKPOINT_NAMES[usize::from(which) % CHECKPOINT_NAMES.len()];
    let file = dir.path().join(name);
    std::fs::write(&file, bytes).expect("written");
    let opts = mdl::commit::CommitOptions::default();
    let Ok(done) = mdl::commit::commit(repo, &file, &opts, &mdl::NoProgress) else {
        return;
    };
    let out = dir.path().join("out");
    let checkout = mdl::checkout::CheckoutOptions {
        force: true,
        ..Default::default()
    };
    mdl::checkout::checkout(repo, &done.id.to_hex(), &out, &checkout, &mdl::NoProgress)
        .expect("a commit checks out");
    assert!(
        std::fs::read(&out).expect("checked out") == bytes,
        "{name}: the checkout differs from what was committed"
    );
}

/// A revision: parsed without panicking; a base is never empty.
pub fn revision(input: &[u8]) {
    if let Ok(text) = std::str::from_utf8(input) {
        if let Ok((base, _)) = mdl::revision::parse(text) {
            assert!(!base.is_empty() && text.starts_with(base));
        }
    }
}

/// A tensor name, as commit and the server's tensor route check it: a name accepted is one a
/// URL path can carry and a checkout cannot be steered by (no control character, not
/// absolute, no `..` component, not empty).
pub fn tensor_name(input: &[u8]) {
    if let Ok(name) = std::str::from_utf8(input) {
        if mdl_format::check_tensor_name(name).is_ok() {
            assert!(!name.is_empty() && !name.starts_with('/'));
            assert!(!name.chars().any(char::is_control));
            assert!(name.split('/').all(|c| c != ".."));
        }
    }
}

/// A Range header for a file of a length taken from the first two bytes: a range that is
/// honoured lies inside the file.
pub fn range_header(input: &[u8]) {
    let Some((len, rest)) = input.split_first_chunk::<2>() else {
        return;
    };
    let len = u64::from(u16::from_le_bytes(*len));
    if let Ok(text) = std::str::from_utf8(rest) {
        if let Ok(Some((start, end))) = mdl_server::parse_range(Some(text), len) {
            assert!(start < end && end <= len, "{start}..{end} of {len}");
        }
    }
}

/// A commit upload's query string, parsed as the server parses it.
pub fn query_params(input: &[u8]) {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let Ok(uri) = format!("/?{text}").parse::<axum::http::Uri>() else {
        return;
    };
    use axum::extract::Query;
    if let Ok(Query(params)) = Query::<Vec<(String, String)>>::try_from_uri(&uri) {
        let _ = mdl_protocol::params::decode(&params);
    }
}

/// What a client reads from a server, chosen by the first byte: refs, a plan, a listing or an
/// error answer, parsed and checked as `mdl` checks them. Never a panic; refs accepted name
/// only branches and tags with safe names, a listing accepted only paths that stay inside the
/// folder they are written into, and an error's message reaches a terminal with no control
/// character and at most 300 characters and an ellipsis.
pub fn server_answer(input: &[u8]) {
    use mdl_protocol::body;
    let Some((&which, rest)) = input.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            if let Ok(refs) = serde_json::from_slice::<body::Refs>(rest) {
                if mdl_remote::check_refs("http://fuzz/r", &refs).is_ok() {
                    for r in &refs.refs {
                        assert!(mdl_format::names::check_ref(&r.name).is_ok(), "{}", r.name);
                        assert!(!r.name.chars().any(char::is_control));
                    }
                }
            }
        }
        1 => {
            let _ = serde_json::from_slice::<body::Plan>(rest);
        }
        2 => {
            if let Ok(files) = serde_json::from_slice::<body::Files>(rest) {
                let paths = files.files.iter().map(|f| f.path.as_str());
                if mdl_format::names::check_tree(paths).is_ok() {
                    for f in &files.files {
                        assert!(!f.path.starts_with('/'));
                        assert!(f
                            .path
                            .split('/')
                            .all(|c| !matches!(c, "" | "." | ".." | ".mdl")));
                        assert!(!f.path.chars().any(char::is_control));
                    }
                }
            }
        }
        _ => {
            if let mdl_client::Error::Server { message, .. } = mdl_client::error_answer(500, rest) {
                assert!(!message.chars().any(char::is_control), "{message:?}");
                assert!(message.chars().count() <= 301, "{message:?}");
            }
        }
    }
}
