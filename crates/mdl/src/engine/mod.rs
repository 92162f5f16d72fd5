//! Where the codec kernels run: `--engine auto|cpu|gpu` on commit and checkout, or the
//! `engine` configuration key (default `auto`). The engines produce identical bytes, so the
//! choice changes speed only. `auto` takes the GPU that [`mdl_gpu::probe`] finds for each side
//! of the codecs (encoding for commits, decoding for checkouts) only where it measured faster
//! than the CPU on this machine ([`calibration`]), and says why.

mod calibration;
mod split;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use mdl_codec::engine::{CpuEngine, Engine};

use calibration::{Measured, Source, MARGIN};

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
    };
    Ok(match choice {
        EngineChoice::Cpu => cpu("chosen".into()),
        EngineChoice::Auto => match mdl_gpu::probe() {
            Ok((gpu, line)) => {
                let gpu: Arc<dyn Engine> = Arc::new(gpu);
                match calibration::measured(&crate::user_cache_dir(), &*gpu, &line) {
                    Ok((m, source)) => by_measurement(gpu, &line, m, source),
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
            }
        }
    })
}

/// `auto`'s engine for a measured GPU: each side of the codecs where it measured faster.
fn by_measurement(gpu: Arc<dyn Engine>, line: &str, m: Measured, source: Source) -> Selected {
    let cpu: Arc<dyn Engine> = Arc::new(CpuEngine);
    let (engine, which): (Arc<dyn Engine>, &str) = match (m.encode_on_gpu(), m.decode_on_gpu()) {
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
        Source::Now => "measured now",
        Source::Kept => "as measured before",
    };
    Selected {
        engine,
        why: format!(
            "{which}: {line}; {when}, encoding {:.2} GB/s on the GPU against {:.2} on the CPU, \
             decoding {:.2} against {:.2} (the GPU takes a side at {MARGIN}× the CPU)",
            m.encode_gpu, m.encode_cpu, m.decode_gpu, m.decode_cpu
        ),
    }
}
