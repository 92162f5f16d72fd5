//! Where the codec kernels run: `--engine auto|cpu|gpu` on commit and checkout, or the
//! `engine` configuration key (default `auto`). The engines produce identical bytes, so the
//! choice changes speed only. `auto` takes the GPU that [`mdl_gpu::probe`] finds for each side
//! of the codecs (encoding for commits, decoding for checkouts and loads) only where real
//! operations measured it faster than the CPU on this machine (`observed.rs`; until they have,
//! the CPU, and the GPU once where the calibration tensor of `calibration.rs` says so), and
//! says why.

mod calibration;
mod observed;
mod split;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use mdl_codec::engine::{CpuEngine, Engine};

use calibration::{Measured, Source, MARGIN};
pub use observed::{Side, OBSERVED_MIN};

use crate::{Error, Repository, Result};

/// Configuration key of the default engine.
pub const ENGINE_KEY: &str = "engine";

/// Which engine to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineChoice {
    /// The GPU when one is usable, else the CPU.
    #[default]
    Auto,
    /// The CPU (rayon over all cores).
    Cpu,
    /// The GPU; an error when there is none.
    Gpu,
}

impl FromStr for EngineChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(EngineChoice::Auto),
            "cpu" => Ok(EngineChoice::Cpu),
            "gpu" => Ok(EngineChoice::Gpu),
            _ => Err(Error::InvalidConfig {
                key: ENGINE_KEY.into(),
                value: s.into(),
                expected: "auto, cpu or gpu",
            }),
        }
    }
}

impl fmt::Display for EngineChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EngineChoice::Auto => "auto",
            EngineChoice::Cpu => "cpu",
            EngineChoice::Gpu => "gpu",
        })
    }
}

/// The engine chosen, with a line saying which and why (for `-v`).
pub struct Selected {
    /// The engine.
    pub engine: Arc<dyn Engine>,
    /// Which engine and why, such as "gpu: NVIDIA H100 …" or "cpu: no GPU engine (…)".
    pub why: String,
    /// Where a GPU engine was found: where this machine's measurements are kept and which
    /// side runs on the GPU, for recording what real operations measure
    /// ([`Selected::observe`]).
    machine: Option<Machine>,
}

/// A machine with a GPU engine, as [`Selected`] records real operations on it.
struct Machine {
    /// The cache folder the measurements are kept in.
    dir: PathBuf,
    /// The machine's key there ([`calibration::machine_key`]).
    key: String,
    /// Whether each [`Side`] runs on the GPU.
    on_gpu: [bool; 2],
}

impl Selected {
    /// Records that an operation ran `side` of the codecs over `bytes` of tensors in
    /// `seconds` with this engine: what `auto` decides from on this machine from then on
    /// (`observed.rs`). Nothing is recorded without a GPU engine, or for an operation smaller
    /// than [`OBSERVED_MIN`].
    pub fn observe(&self, side: Side, bytes: u64, seconds: f64) {
        if let Some(m) = &self.machine {
            let on_gpu = m.on_gpu[side as usize];
            observed::record(&m.dir, &m.key, side, on_gpu, bytes, seconds);
        }
    }
}

/// Resolves `choice` (or, without one, the repository's `engine` setting) to an engine.
pub fn select(repo: &Repository, choice: Option<EngineChoice>) -> Result<Selected> {
    let choice = match choice {
        Some(c) => c,
        None => match repo.store().meta().read()?.config(ENGINE_KEY)? {
            Some(v) => v.parse()?,
            None => EngineChoice::default(),
        },
    };
    let cpu = |why: String| Selected {
        engine: Arc::new(CpuEngine),
        why: format!("cpu: {why}"),
        machine: None,
    };
    let dir = crate::user_cache_dir();
    Ok(match choice {
        EngineChoice::Cpu => {
            // With a GPU engine at hand (already probed), the CPU's real speed is recorded.
            let machine = mdl_gpu::probed().map(|line| Machine {
                dir: dir.clone(),
                key: calibration::machine_key(&line),
                on_gpu: [false; 2],
            });
            Selected {
                machine,
                ..cpu("chosen".into())
            }
        }
        EngineChoice::Auto => match mdl_gpu::probe() {
            Ok((gpu, line)) => {
                let gpu: Arc<dyn Engine> = Arc::new(gpu);
                match calibration::measured(&dir, &*gpu, &line) {
                    Ok((m, source)) => by_measurement(gpu, &line, m, source, &dir),
                    Err(why) => cpu(format!("the GPU engine ({line}) is not used: {why}")),
                }
            }
            Err(why) => cpu(format!("no GPU engine ({why})")),
        },
        EngineChoice::Gpu => {
            let (gpu, line) = mdl_gpu::probe().map_err(|why| Error::GpuUnavailable(why.0))?;
            Selected {
                engine: Arc::new(gpu),
                why: format!("gpu: {line}"),
                machine: Some(Machine {
                    dir,
                    key: calibration::machine_key(&line),
                    on_gpu: [true; 2],
                }),
            }
        }
    })
}

/// `auto`'s engine for a measured GPU: each side of the codecs on the GPU where real
/// operations (or, until they have, the calibration tensor) say it is faster ([`observed`]).
fn by_measurement(
    gpu: Arc<dyn Engine>,
    line: &str,
    m: Measured,
    source: Source,
    dir: &Path,
) -> Selected {
    let key = calibration::machine_key(line);
    let seen = observed::read(dir, &key);
    let (encode, why_encode) = seen
        .of(Side::Encode)
        .choice(Side::Encode, (m.encode_gpu, m.encode_cpu));
    let (decode, why_decode) = seen
        .of(Side::Decode)
        .choice(Side::Decode, (m.decode_gpu, m.decode_cpu));
    let cpu: Arc<dyn Engine> = Arc::new(CpuEngine);
    let (engine, which): (Arc<dyn Engine>, &str) = match (encode, decode) {
        (true, true) => (gpu, "gpu"),
        (false, false) => (cpu, "cpu"),
        (true, false) => (
            Arc::new(split::Split::new(gpu, cpu)),
            "gpu for commits, cpu for checkouts",
        ),
        (false, true) => (
            Arc::new(split::Split::new(cpu, gpu)),
            "cpu for commits, gpu for checkouts",
        ),
    };
    let when = match source {
        Source::Now => "calibrated now",
        Source::Kept => "calibrated before",
    };
    Selected {
        engine,
        why: format!(
            "{which}: {line} ({when}); encoding: {why_encode}; decoding: {why_decode} (the GPU \
             takes a side at {MARGIN}× the CPU)"
        ),
        machine: Some(Machine {
            dir: dir.to_path_buf(),
            key,
            on_gpu: [encode, decode],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_each_side_to_the_engine_real_operations_found_faster() {
        let dir = tempfile::tempdir().unwrap();
        // The calibration tensor says the GPU, twice as fast on both sides.
        let m = Measured {
            encode_cpu: 1.0,
            encode_gpu: 2.0,
            decode_cpu: 1.0,
            decode_gpu: 2.0,
        };
        // The CPU engine stands in for the GPU's: the choice is what is tested.
        let gpu: Arc<dyn Engine> = Arc::new(CpuEngine);
        let choose = || by_measurement(gpu.clone(), "a device", m, Source::Kept, dir.path());
        let first = choose();
        assert!(first.why.starts_with("cpu: "), "{}", first.why);
        // A commit and a checkout on the CPU; then the GPU is tried on each side.
        first.observe(Side::Encode, 1 << 30, 1.0);
        first.observe(Side::Decode, 1 << 30, 0.5);
        let trial = choose();
        assert!(trial.why.starts_with("gpu: ") && trial.why.contains("trying the GPU"));
        // The GPU commits slower end to end and checks out faster: a side each.
        trial.observe(Side::Encode, 1 << 30, 2.0);
        trial.observe(Side::Decode, 1 << 30, 0.1);
        let decided = choose();
        assert!(
            decided
                .why
                .starts_with("cpu for commits, gpu for checkouts: "),
            "{}",
            decided.why
        );
        // Small operations are not evidence.
        decided.observe(Side::Encode, 1 << 20, 1e-4);
        assert!(choose().why.starts_with("cpu for commits"));
    }
}
