//! Helpers: generate safetensors files, run `mdl`, compare repository state.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub(crate) fn mdl_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mdl"))
}

/// Runs `mdl -C dir args…` and returns the output.
pub(crate) fn mdl(dir: &Path, args: &[&str]) -> Output {
    Command::new(mdl_bin())
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("MDL_AUTHOR", "tester")
        .output()
        .expect("run mdl")
}

/// Runs mdl and asserts success; returns stdout.
pub(crate) fn ok(dir: &Path, args: &[&str]) -> String {
    let out = mdl(dir, args);
    assert!(
        out.status.success(),
        "mdl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// [`ok`] with `MDL_NO_BACKGROUND` set: a commit leaves its deferred re-encodes queued instead
/// of starting `mdl maintenance --background`.
pub(crate) fn ok_queued(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(mdl_bin())
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("MDL_AUTHOR", "tester")
        .env("MDL_NO_BACKGROUND", "1")
        .output()
        .expect("run mdl");
    assert!(
        out.status.success(),
        "mdl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs mdl, asserts failure with a one-line error containing `want`.
pub(crate) fn fails(dir: &Path, args: &[&str], want: &str) -> String {
    let out = mdl(dir, args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "mdl {args:?} should fail");
    assert!(
        err.contains(want),
        "mdl {args:?}: error {err:?} lacks {want:?}"
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "error is not one line: {err:?}"
    );
    err
}

/// The string field `key` of each object of the JSON array `list` (a log's ids, a listing's
/// names).
pub(crate) fn column<'a>(list: &'a serde_json::Value, key: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|v| v[key].as_str().unwrap())
        .collect()
}

pub(crate) fn json(dir: &Path, args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json");
    serde_json::from_str(&ok(dir, &a)).unwrap()
}

/// A tensor to put in a generated file.
pub(crate) struct T {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

pub(crate) fn elem_size(dtype: &str) -> usize {
    match dtype {
        "BOOL" | "U8" | "I8" => 1,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "F32" | "I32" | "U32" => 4,
        _ => 8,
    }
}

/// Deterministic pseudo-random bytes (xorshift).
pub(crate) fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// Float-like data: small-magnitude f32 values (compressible exponents).
pub(crate) fn floats(seed: u64, count: usize) -> Vec<u8> {
    noise(seed, count * 4)
        .chunks(4)
        .flat_map(|c| {
            ((u32::from_le_bytes(c.try_into().unwrap()) as f32 / u32::MAX as f32 - 0.5) * 0.02)
                .to_le_bytes()
        })
        .collect()
}

pub(crate) fn tensor(name: &str, dtype: &'static str, shape: &[u64], seed: u64) -> T {
    let n: u64 = shape.iter().product();
    let len = n as usize * elem_size(dtype);
    let data = match dtype {
        "F32" => floats(seed, n as usize),
        "BOOL" => noise(seed, len).into_iter().map(|b| b & 1).collect(),
        _ => noise(seed, len),
    };
    T {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        data,
    }
}

/// Writes a safetensors file; `metadata` becomes `__metadata__`. The header is padded with
/// spaces to a multiple of 8 bytes, as the reference writer does.
pub(crate) fn write_safetensors(path: &Path, tensors: &[T], metadata: &[(&str, &str)]) -> Vec<u8> {
    let mut header = String::from("{");
    if !metadata.is_empty() {
        let m: Vec<String> = metadata
            .iter()
            .map(|(k, v)| format!("{}:{}", json_str(k), json_str(v)))
            .collect();
        header.push_str(&format!("\"__metadata__\":{{{}}},", m.join(",")));
    }
    let mut off = 0u64;
    let mut parts = Vec::new();
    for t in tensors {
        let end = off + t.data.len() as u64;
        parts.push(format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":{:?},\"data_offsets\":[{off},{end}]}}",
            json_str(&t.name),
            t.dtype,
            t.shape
        ));
        off = end;
    }
    header.push_str(&parts.join(","));
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    for t in tensors {
        bytes.extend_from_slice(&t.data);
    }
    std::fs::write(path, &bytes).unwrap();
    bytes
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// Floats of every width, an integer scalar, a bool tensor, an empty tensor and one that never
/// changes.
pub(crate) fn mixed(seed: u64) -> Vec<T> {
    vec![
        tensor("model.embed.weight", "F32", &[64, 32], seed),
        tensor("model.h.0.bf16", "BF16", &[16, 8], seed + 1),
        tensor("model.h.0.f16", "F16", &[4, 4, 2], seed + 2),
        tensor("model.h.0.f64", "F64", &[10], seed + 3),
        tensor("optim.step", "I64", &[], seed + 4),
        tensor("mask", "BOOL", &[7], seed + 5),
        tensor("empty", "F32", &[0, 3], seed + 6),
        tensor("frozen", "F32", &[128], 42),
    ]
}

/// Repository state a failed command must leave untouched: branches, tags, HEAD, history.
pub(crate) fn state(dir: &Path) -> String {
    let b = ok(dir, &["branch", "--json"]);
    let t = ok(dir, &["tag", "--json"]);
    let l = mdl(dir, &["log", "--json"]);
    format!("{b}{t}{}", String::from_utf8_lossy(&l.stdout))
}

pub(crate) fn assert_fsck_clean(dir: &Path) {
    let out = mdl(dir, &["fsck"]);
    assert!(
        out.status.success(),
        "fsck: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Peak resident memory of a running process, in KiB.
pub(crate) fn peak_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

/// Resident memory of process `pid` now, in KiB.
pub(crate) fn resident_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Every file under `dir` by relative path, with its bytes and whether it is executable.
pub(crate) fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, bool)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (Vec<u8>, bool)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_string();
                let exec = std::fs::metadata(&p).unwrap().permissions().mode() & 0o100 != 0;
                out.insert(rel, (std::fs::read(&p).unwrap(), exec));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}
