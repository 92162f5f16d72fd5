//! What real operations measured of each engine on this machine: `auto`'s evidence beyond the
//! calibration tensor. A commit of a checkpoint and a checkout of one are what the user waits
//! for, and a 16 MiB tensor coded alone judged them wrongly (the GPU engine measured faster on
//! it and slower end to end on the H100 and H200 runs). So each lossless commit, checkout and
//! load (Python's) of at least [`OBSERVED_MIN`] bytes of tensors records its throughput under
//! the engine that did that side of the codecs, and `auto` decides each side from the medians of the last [`KEEP`] of each
//! engine ([`Sides::choice`]). Kept in `engines-observed.json` in the user's cache folder,
//! under the calibration's key (device, CPU threads, mdl's version).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::calibration::MARGIN;

/// Operations smaller than this say more about fixed costs than about the engines.
pub const OBSERVED_MIN: u64 = 64 << 20;
/// Throughputs kept an engine and side (the median decides).
const KEEP: usize = 5;
/// The file in the cache folder.
const FILE: &str = "engines-observed.json";

/// A side of the codecs: what a commit runs, or what a checkout or load runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Counting and coding (commits).
    Encode,
    /// Decoding (checkouts and loads).
    Decode,
}

impl Side {
    fn operation(self) -> &'static str {
        match self {
            Side::Encode => "commit",
            Side::Decode => "checkout",
        }
    }
}

/// The last throughputs (GB/s of tensor bytes) real operations measured of one engine on one
/// side, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Rates(Vec<f64>);

impl Rates {
    fn median(&self) -> Option<f64> {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[v.len() / 2])
    }

    fn push(&mut self, gbps: f64) {
        self.0.push(gbps);
        if self.0.len() > KEEP {
            self.0.remove(0);
        }
    }
}

/// One side's throughputs on each engine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Engines {
    pub(super) cpu: Rates,
    pub(super) gpu: Rates,
}

impl Engines {
    /// Whether this side goes to the GPU, and why. The CPU until real operations have
    /// measured it; then the GPU once, where the calibration tensor (`calibrated`, its
    /// throughputs on the GPU and on the CPU) says the GPU is faster; then whichever of the two
    /// the medians of real operations say, the GPU only beyond [`MARGIN`].
    pub(super) fn choice(&self, side: Side, calibrated: (f64, f64)) -> (bool, String) {
        let op = side.operation();
        let (g, c) = calibrated;
        match (self.cpu.median(), self.gpu.median()) {
            (Some(c), Some(g)) => (
                g > MARGIN * c,
                format!(
                    "real {op}s ran at {g:.2} GB/s on the GPU against {c:.2} on the CPU \
                     (medians of {} and {})",
                    self.gpu.0.len(),
                    self.cpu.0.len()
                ),
            ),
            (Some(c_real), None) if g > MARGIN * c => (
                true,
                format!(
                    "trying the GPU on a real {op} (the CPU ran one at {c_real:.2} GB/s; \
                     the calibration tensor {g:.2} GB/s on the GPU against {c:.2} on the CPU)"
                ),
            ),
            (Some(_), None) => (
                false,
                format!(
                    "the calibration tensor ran at {g:.2} GB/s on the GPU against {c:.2} on \
                     the CPU"
                ),
            ),
            (None, _) => (
                false,
                format!(
                    "the CPU until a real {op} has measured it (the calibration tensor: \
                     {g:.2} GB/s on the GPU against {c:.2} on the CPU)"
                ),
            ),
        }
    }
}

/// Both sides' throughputs on one machine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Sides {
    pub(super) encode: Engines,
    pub(super) decode: Engines,
}

impl Sides {
    pub(super) fn of(&self, side: Side) -> &Engines {
        match side {
            Side::Encode => &self.encode,
            Side::Decode => &self.decode,
        }
    }

    fn of_mut(&mut self, side: Side) -> &mut Engines {
        match side {
            Side::Encode => &mut self.encode,
            Side::Decode => &mut self.decode,
        }
    }
}

/// What real operations measured on the machine `key` names (nothing when the file is missing
/// or unreadable: then the CPU goes first again).
pub(super) fn read(dir: &Path, key: &str) -> Sides {
    read_all(&dir.join(FILE)).remove(key).unwrap_or_default()
}

fn read_all(path: &Path) -> BTreeMap<String, Sides> {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Records that a real operation ran `side` of `bytes` of tensors in `seconds` on the GPU
/// (`on_gpu`) or the CPU. Smaller than [`OBSERVED_MIN`], it is not recorded; a file that cannot
/// be written is left as it was (logged).
pub(super) fn record(dir: &Path, key: &str, side: Side, on_gpu: bool, bytes: u64, seconds: f64) {
    if bytes < OBSERVED_MIN || seconds <= 0.0 {
        return;
    }
    let path = dir.join(FILE);
    let mut all = read_all(&path);
    let engines = all.entry(key.to_string()).or_default().of_mut(side);
    let rates = if on_gpu {
        &mut engines.gpu
    } else {
        &mut engines.cpu
    };
    rates.push(bytes as f64 / seconds / 1e9);
    if let Err(e) = super::calibration::write_json(dir, FILE, &all) {
        tracing::debug!(
            "a real operation's speed was not kept in {}: {e}",
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(v: &[f64]) -> Rates {
        Rates(v.to_vec())
    }

    #[test]
    fn the_cpu_goes_first_the_gpu_is_tried_once_then_the_medians_decide() {
        let gpu_faster_on_the_tensor = (2.0, 1.0);
        let none = Engines::default();
        assert!(!none.choice(Side::Encode, gpu_faster_on_the_tensor).0);
        let cpu_seen = Engines {
            cpu: rates(&[1.5]),
            gpu: Rates::default(),
        };
        let (gpu, why) = cpu_seen.choice(Side::Encode, gpu_faster_on_the_tensor);
        assert!(gpu && why.contains("trying the GPU"), "{why}");
        // The calibration tensor says the CPU, or the GPU by less than the noise: the GPU is
        // not tried.
        assert!(!cpu_seen.choice(Side::Encode, (1.0, 1.0)).0);
        assert!(!cpu_seen.choice(Side::Encode, (1.1, 1.0)).0);
        // Real commits: the GPU slower end to end, whatever the tensor said.
        let both = Engines {
            cpu: rates(&[1.5, 1.6, 9.0]),
            gpu: rates(&[1.2]),
        };
        let (gpu, why) = both.choice(Side::Encode, gpu_faster_on_the_tensor);
        assert!(
            !gpu && why.contains("1.20 GB/s on the GPU against 1.60"),
            "{why}"
        );
        let faster = Engines {
            cpu: rates(&[1.5]),
            gpu: rates(&[1.6, 3.0, 3.1]),
        };
        assert!(faster.choice(Side::Decode, (1.0, 1.0)).0);
    }

    #[test]
    fn recorded_speeds_are_kept_five_an_engine_and_small_operations_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        record(dir.path(), "m", Side::Encode, true, 1 << 20, 0.001);
        assert_eq!(read(dir.path(), "m"), Sides::default());
        for s in 1..=7 {
            record(dir.path(), "m", Side::Encode, false, 1 << 30, s as f64);
        }
        record(dir.path(), "m", Side::Decode, true, 2 << 30, 1.0);
        let sides = read(dir.path(), "m");
        assert_eq!(sides.encode.cpu.0.len(), KEEP);
        let newest = (1u64 << 30) as f64 / 7.0 / 1e9;
        assert_eq!(sides.encode.cpu.0.last(), Some(&newest));
        assert_eq!(sides.decode.gpu.0, [(2u64 << 30) as f64 / 1e9]);
        assert!(sides.encode.gpu.0.is_empty() && sides.decode.cpu.0.is_empty());
        assert_eq!(read(dir.path(), "another machine"), Sides::default());
    }
}
