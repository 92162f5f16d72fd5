//! How long each phase of a commit took, logged when it ends (at debug level, target
//! `mdl::phase`: `MDL_LOG=mdl::phase=debug`) — what `bench/phases` reads, at one thread and at
//! two, to tell which phases stay serial. Nothing is timed unless that target is enabled.

use std::time::Instant;

/// Target of the phase lines.
const TARGET: &str = "mdl::phase";

/// A phase under way: logged with its wall time when dropped.
pub(super) struct Phase {
    name: &'static str,
    started: Option<Instant>,
}

impl Phase {
    /// Starts phase `name`.
    pub(super) fn start(name: &'static str) -> Phase {
        let timed = tracing::enabled!(target: TARGET, tracing::Level::DEBUG);
        Phase {
            name,
            started: timed.then(Instant::now),
        }
    }
}

impl Drop for Phase {
    fn drop(&mut self) {
        if let Some(started) = self.started {
            let wall_us = started.elapsed().as_micros() as u64;
            tracing::debug!(target: TARGET, phase = self.name, wall_us);
        }
    }
}
