//! Progress bars on stderr, on a terminal only (never under `--json` or when stderr is piped):
//! transfers and fsck show one from the start, commits, checkouts and maintenance once they
//! have run for a second.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long a commit or checkout runs before its bar appears.
const QUIET_FOR: Duration = Duration::from_secs(1);

/// The bar of the work under way: hidden until it has run for the bar's `quiet_for`.
struct Current {
    bar: ProgressBar,
    started: Instant,
    shown: bool,
}

/// Shows a bar when enabled and the work takes long enough to wait for.
pub(crate) struct Bar {
    enabled: bool,
    quiet_for: Duration,
    current: Mutex<Option<Current>>,
}

impl Bar {
    /// A bar that appears once the work has run for a second.
    pub(crate) fn new(enabled: bool) -> Self {
        Bar {
            enabled,
            quiet_for: QUIET_FOR,
            current: Mutex::new(None),
        }
    }

    /// A bar that appears at once (transfers, fsck: work a person waits for by choice).
    pub(crate) fn at_once(enabled: bool) -> Self {
        Bar {
            quiet_for: Duration::ZERO,
            ..Bar::new(enabled)
        }
    }

    fn begin(&self, what: &str, total: u64, template: &str) {
        if !self.enabled {
            return;
        }
        let shown = self.quiet_for.is_zero();
        let target = if shown {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        bar.set_style(
            ProgressStyle::with_template(template)
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(what.to_string());
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(Current {
            bar,
            started: Instant::now(),
            shown,
        });
    }
}

impl mdl::Progress for Bar {
    fn start(&self, what: &str, total: u64) {
        self.begin(
            what,
            total,
            "{msg:>11} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        );
    }
    fn start_count(&self, what: &str, total: u64) {
        self.begin(what, total, "{msg:>11} [{bar:30}] {pos}/{len} {eta}");
    }
    fn advance(&self, n: u64) {
        if let Some(c) = &mut *self.current.lock().unwrap_or_else(|p| p.into_inner()) {
            c.bar.inc(n);
            if !c.shown && c.started.elapsed() >= self.quiet_for {
                c.shown = true;
                c.bar.set_draw_target(ProgressDrawTarget::stderr());
            }
        }
    }
    fn lessen(&self, n: u64) {
        if let Some(c) = &*self.current.lock().unwrap_or_else(|p| p.into_inner()) {
            let total = c.bar.length().unwrap_or(0);
            c.bar
                .set_length(total.saturating_sub(n).max(c.bar.position()));
        }
    }
    fn finish(&self) {
        if let Some(c) = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            c.bar.finish_and_clear();
        }
    }
}
