//! `auto`'s first measurement. Where a GPU engine is found, each side of the codecs — encoding,
//! what a commit runs, and decoding, what a checkout runs — is tried on the GPU only where the
//! GPU measured faster than the CPU engine on this machine; real operations decide after that
//! (`observed.rs`). The measurement codes a synthetic f32
//! tensor of [`BYTES`] with each engine (analysis and encoding, then decoding; the best of
//! [`RUNS`] each) and checks that both engines produced the same bytes. It runs the first time a
//! device is seen (about 2.5 s on the emulated device), and is kept in `engines.json` in
//! the user's cache folder ([`crate::user_cache_dir`]) under a key naming the device, the CPU
//! threads and mdl's version and [`ENGINES_REVISION`], so a machine measures once per build of
//! the engines.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use mdl_codec::engine::{CpuEngine, Engine};
use mdl_codec::float;
use mdl_format::Dtype;
use serde::{Deserialize, Serialize};

/// Bytes of the synthetic tensor: large enough for a device's copies and launches to count as
/// they do on a checkpoint's tensors, small enough to take a fraction of a second.
const BYTES: usize = 16 << 20;
/// Timed runs per engine and side (the best counts), after the first one warms the engine up.
const RUNS: usize = 2;
/// How much faster the GPU must measure to be taken: a margin over the measurement's noise.
pub(super) const MARGIN: f64 = 1.15;
/// Raise when either engine's speed changes enough that earlier measurements no longer hold.
const ENGINES_REVISION: u32 = 1;
/// The file in the cache folder.
const FILE: &str = "engines.json";

/// Throughputs measured on one machine, in GB/s of tensor bytes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Measured {
    /// Analysis and encoding (a commit's side) on the CPU engine.
    pub encode_cpu: f64,
    /// The same on the GPU engine.
    pub encode_gpu: f64,
    /// Decoding (a checkout's side) on the CPU engine.
    pub decode_cpu: f64,
    /// The same on the GPU engine.
    pub decode_gpu: f64,
}

/// Where a measurement came from, for `-v`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// Measured by this process (and kept, if the cache folder could be written).
    Now,
    /// Read from the cache folder.
    Kept,
}

/// The measurement of `gpu` (whose probe described it as `line`) on this machine: the one kept
/// in `dir`, else one made now and kept there. `Err` says why the GPU engine is not to be used
/// (it failed the measurement, or coded differently from the CPU engine).
pub(super) fn measured(
    dir: &Path,
    gpu: &dyn Engine,
    line: &str,
) -> Result<(Measured, Source), String> {
    let key = machine_key(line);
    let path = dir.join(FILE);
    let mut kept = read(&path);
    if let Some(m) = kept.get(&key) {
        return Ok((*m, Source::Kept));
    }
    let m = measure(gpu)?;
    kept.insert(key, m);
    if let Err(e) = write_json(dir, FILE, &kept) {
        tracing::debug!(
            "the engines' calibration was not kept in {}: {e}",
            dir.display()
        );
    }
    Ok((m, Source::Now))
}

/// What names this machine's measurements: the device (`line`, as its probe describes it), the
/// CPU threads, and this build of the engines.
pub(super) fn machine_key(line: &str) -> String {
    format!(
        "{line}; {} CPU threads; mdl {} engines {ENGINES_REVISION}",
        rayon::current_num_threads(),
        env!("CARGO_PKG_VERSION"),
    )
}

/// The measurements kept in `path`; none when it is missing or unreadable (measured again).
fn read(path: &Path) -> BTreeMap<String, Measured> {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Keeps `value` as `file` in `dir`, replacing it at once (a temporary file renamed over it).
// The user's cache folder, not a repository: nothing here goes through mdl-store.
#[allow(clippy::disallowed_methods)]
pub(super) fn write_json(dir: &Path, file: &str, value: &impl Serialize) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let json = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    let tmp = tempfile::Builder::new()
        .prefix(".engines-")
        .tempfile_in(dir)?;
    std::fs::write(tmp.path(), json)?;
    tmp.persist(dir.join(file)).map(|_| ()).map_err(|e| e.error)
}

/// Codes the synthetic tensor with both engines: GB/s of each side.
fn measure(gpu: &dyn Engine) -> Result<Measured, String> {
    let data = synthetic_weights(BYTES / 4);
    let failed = |e: mdl_format::FormatError| format!("it failed its calibration: {e}");
    let (encode_cpu, payload) = best(|| encode(&CpuEngine, &data)).map_err(failed)?;
    let (encode_gpu, theirs) = best(|| encode(gpu, &data)).map_err(failed)?;
    if theirs != payload {
        return Err("it coded the calibration tensor differently from the CPU engine".into());
    }
    let mut out = vec![0u8; data.len()];
    let (decode_cpu, ()) =
        best(|| float::decode(&CpuEngine, Dtype::F32, &payload, None, &mut out)).map_err(failed)?;
    out.fill(0);
    let (decode_gpu, ()) =
        best(|| float::decode(gpu, Dtype::F32, &payload, None, &mut out)).map_err(failed)?;
    if out != data {
        return Err("it decoded the calibration tensor wrongly".into());
    }
    let gbps = |s: f64| data.len() as f64 / s / 1e9;
    Ok(Measured {
        encode_cpu: gbps(encode_cpu),
        encode_gpu: gbps(encode_gpu),
        decode_cpu: gbps(decode_cpu),
        decode_gpu: gbps(decode_gpu),
    })
}

/// A commit's work on one tensor: the analysis, then the payload of the plain choice.
fn encode(engine: &dyn Engine, data: &[u8]) -> Result<Vec<u8>, mdl_format::FormatError> {
    let analysis = float::analyze(engine, Dtype::F32, data, None)?;
    let mut out = Vec::new();
    float::encode(engine, Dtype::F32, data, None, &analysis.plain, &mut out)?;
    Ok(out)
}

/// The shortest of [`RUNS`] timed runs of `f`, after one untimed run, with the last result.
fn best<T, E>(mut f: impl FnMut() -> Result<T, E>) -> Result<(f64, T), E> {
    let mut last = f()?;
    let mut shortest = f64::INFINITY;
    for _ in 0..RUNS {
        let t = Instant::now();
        last = f()?;
        shortest = shortest.min(t.elapsed().as_secs_f64());
    }
    Ok((shortest, last))
}

/// `n` f32 values spread like a layer's weights (about N(0, 0.02²)), always the same.
fn synthetic_weights(n: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .flat_map(|_| {
            // The sum of four uniforms, centred: close enough to a normal for the exponents.
            let z = (uniform() + uniform() + uniform() + uniform() - 2.0) * 3f64.sqrt();
            ((z * 0.02) as f32).to_le_bytes()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measurement_is_kept_and_a_damaged_file_is_measured_again() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        // The CPU engine stands in for a GPU: same bytes, about the same speed.
        let (first, source) = measured(&cache, &CpuEngine, "test device").unwrap();
        assert_eq!(source, Source::Now);
        assert!(
            first.encode_cpu > 0.0 && first.decode_gpu > 0.0,
            "{first:?}"
        );
        let (again, source) = measured(&cache, &CpuEngine, "test device").unwrap();
        assert_eq!(source, Source::Kept);
        // JSON keeps the numbers to within a unit in the last place.
        let all = |m: Measured| [m.encode_cpu, m.encode_gpu, m.decode_cpu, m.decode_gpu];
        let close = all(again)
            .into_iter()
            .zip(all(first))
            .all(|(a, b)| (a - b).abs() <= 1e-12 * b.abs());
        assert!(close, "{again:?} {first:?}");
        // Another device is measured on its own, beside the first.
        let (_, source) = measured(&cache, &CpuEngine, "another device").unwrap();
        assert_eq!(source, Source::Now);
        assert_eq!(read(&cache.join(FILE)).len(), 2);
        #[allow(clippy::disallowed_methods)]
        std::fs::write(cache.join(FILE), b"{ not json").unwrap();
        let (_, source) = measured(&cache, &CpuEngine, "test device").unwrap();
        assert_eq!(source, Source::Now);
        assert_eq!(read(&cache.join(FILE)).len(), 1);
    }
}
