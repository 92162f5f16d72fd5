//! Buffers a commit's tensors are read and split into, kept for the next tensors: a fresh
//! buffer of a tensor's size is page-faulted in and handed back to the kernel each time, which
//! cost a fifth of a commit of many small tensors.

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

/// Spare buffers of type `T` (a tensor's bytes, or its planes), for as long as the commit runs.
pub(in crate::commit) struct Spare<T>(Mutex<Vec<T>>);

impl<T: Default> Spare<T> {
    pub(in crate::commit) fn new() -> Self {
        Spare(Mutex::new(Vec::new()))
    }

    /// Keeps `buf` for a later tensor.
    pub(in crate::commit) fn give(&self, buf: T) {
        self.0.lock().unwrap().push(buf);
    }

    /// A buffer an earlier tensor used (its contents unspecified), or an empty one; given back
    /// when dropped.
    pub(in crate::commit) fn take(&self) -> Taken<'_, T> {
        let buf = self.0.lock().unwrap().pop().unwrap_or_default();
        Taken {
            spare: self,
            buf: Some(buf),
        }
    }
}

/// A buffer out of [`Spare`], given back when dropped unless [`Taken::keep`] keeps it.
pub(in crate::commit) struct Taken<'s, T: Default> {
    spare: &'s Spare<T>,
    buf: Option<T>,
}

impl<T: Default> Taken<'_, T> {
    /// The buffer itself, not given back.
    pub(in crate::commit) fn keep(mut self) -> T {
        self.buf.take().unwrap_or_default()
    }
}

impl<T: Default> Deref for Taken<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.buf.as_ref().expect("taken until dropped")
    }
}

impl<T: Default> DerefMut for Taken<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.buf.as_mut().expect("taken until dropped")
    }
}

impl<T: Default> Drop for Taken<'_, T> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.spare.0.lock().unwrap().push(buf);
        }
    }
}
