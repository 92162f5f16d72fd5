/// Receives progress of long operations (bytes or items processed), for a progress bar.
pub trait Progress: Sync {
    /// Work of `total` bytes begins.
    fn start(&self, what: &str, total: u64);
    /// Work of `total` items (objects, chains) begins; [`Self::advance`] then counts items.
    fn start_count(&self, what: &str, total: u64) {
        self.start(what, total);
    }
    /// `n` more bytes are done.
    fn advance(&self, n: u64);
    /// The work turned out `n` bytes less than its total said (a record came coded against
    /// what the receiver holds, or from where a cut transfer stopped).
    fn lessen(&self, _n: u64) {}
    /// The work is over.
    fn finish(&self);
}

/// Reports nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}

/// A reader that reports the bytes read through it to a [`Progress`] (a pack arriving or
/// leaving).
pub struct Counting<'p, R> {
    inner: R,
    progress: &'p dyn Progress,
}

impl<'p, R> Counting<'p, R> {
    /// Counts what is read from `inner`.
    pub fn new(inner: R, progress: &'p dyn Progress) -> Self {
        Counting { inner, progress }
    }
}

impl<R: std::io::Read> std::io::Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.advance(n as u64);
        Ok(n)
    }
}
