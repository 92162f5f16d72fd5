//! Progress bars on stderr for long commits and checkouts.

use indicatif::{ProgressBar, ProgressStyle};
use std::sync::Mutex;

/// Shows a bar when enabled and the work is large enough to wait for.
pub struct Bar {
    enabled: bool,
    bar: Mutex<Option<ProgressBar>>,
}

impl Bar {
    pub fn new(enabled: bool) -> Self {
        Bar {
            enabled,
            bar: Mutex::new(None),
        }
    }
}

impl mdl::Progress for Bar {
    fn start(&self, what: &str, total: u64) {
        if !self.enabled || total < 256 << 20 {
            return;
        }
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:>8} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_message(what.to_string());
        *self.bar.lock().unwrap() = Some(bar);
    }
    fn advance(&self, n: u64) {
        if let Some(b) = &*self.bar.lock().unwrap() {
            b.inc(n);
        }
    }
    fn finish(&self) {
        if let Some(b) = self.bar.lock().unwrap().take() {
            b.finish_and_clear();
        }
    }
}
