//! What a commit records of where it came from, looked up while it is being made: its default
//! author (`author.rs`) and its training code's git commit (`source.rs`) — each a `git`
//! process, a few milliseconds the commit would otherwise wait at its end, run on a thread of
//! its own ([`Soon`]).

use std::thread::JoinHandle;

mod author;
mod source;

pub(crate) use author::author_soon;
pub use author::default_author;
pub use source::source_properties;
pub(super) use source::source_soon;

/// A value being looked up on a thread of its own: [`Soon::get`] when the commit is made.
/// Dropped before that (the commit failed), it waits for the lookup: a `git` process, between
/// its fork and its exec, holds copies of this process's descriptors, the repository lock's
/// among them, and the lock must be free once the failed commit returns.
pub(crate) struct Soon<T>(Option<JoinHandle<T>>);

impl<T: Send + 'static> Soon<T> {
    /// `lookup` started now.
    pub(crate) fn spawn(lookup: impl FnOnce() -> T + Send + 'static) -> Soon<T> {
        Soon(Some(std::thread::spawn(lookup)))
    }

    /// Nothing to look up.
    pub(crate) fn none() -> Soon<T> {
        Soon(None)
    }

    /// The value looked up (`None`: nothing was, or the lookup panicked).
    pub(crate) fn get(mut self) -> Option<T> {
        self.0.take().and_then(|h| h.join().ok())
    }
}

impl<T> Drop for Soon<T> {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            let _ = h.join();
        }
    }
}
