//! Where the codec kernels run: `--engine auto|cpu|gpu` on commit and checkout, or the
//! `engine` configuration key (default `auto`). The engines produce identical bytes, so the
//! choice changes speed only; `auto` takes the GPU when [`mdl_gpu::probe`] finds one and says
//! why not otherwise.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use mdl_codec::engine::{CpuEngine, Engine};

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
    /// Which engine and why, such as "gpu: NVIDIA H100 …" or "cpu: no CUDA driver …".
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
            Ok((gpu, line)) => Selected {
                engine: Arc::new(gpu),
                why: format!("gpu: {line}"),
            },
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
