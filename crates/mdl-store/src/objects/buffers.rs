//! Read buffers kept for the next read: record buffers and the window buffers of
//! [`super::windows`]. Bounded by the machine, not by the number of threads reading (a server's
//! blocking threads are many): a process keeps at most [`PER_CORE`] buffers a core and at most
//! cores × [`KEEP`] bytes of them, whatever number of requests it serves.
use std::sync::{Mutex, OnceLock};

/// Buffers up to this capacity are kept, and this much a core in all.
pub(super) const KEEP: usize = 64 << 20;

/// Buffers kept a core, at most: a window read along a delta chain takes two a level (a chain
/// of the default depth cap, 16, takes 32); the bytes bound is what bounds memory.
pub(super) const PER_CORE: usize = 16;

static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

fn most() -> usize {
    static MOST: OnceLock<usize> = OnceLock::new();
    *MOST.get_or_init(|| std::thread::available_parallelism().map_or(4, |n| n.get()))
}

/// The largest spare buffer, holding whatever its last read left (its bytes are initialized,
/// so growing it back zeroes nothing; taking the largest keeps small reads from growing small
/// buffers into fresh memory).
pub(super) fn take() -> Vec<u8> {
    let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
    let largest = (0..spare.len()).max_by_key(|&i| spare[i].len());
    largest.map(|i| spare.swap_remove(i)).unwrap_or_default()
}

/// Keeps `buf` for a later read if it is small enough and the bounds leave room.
pub(super) fn give_back(buf: Vec<u8>) {
    if buf.capacity() == 0 || buf.capacity() > KEEP {
        return;
    }
    let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
    let kept: usize = spare.iter().map(Vec::capacity).sum();
    if spare.len() < PER_CORE * most() && kept + buf.capacity() <= KEEP * most() {
        spare.push(buf);
    }
}

/// A buffer from [`take`], given back when dropped.
#[derive(Default)]
pub(super) struct Pooled(pub Vec<u8>);

impl Pooled {
    /// A buffer as [`take`] gives it.
    pub(super) fn take() -> Pooled {
        Pooled(take())
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.0));
    }
}

/// Buffers kept now and their capacity in all (for tests).
#[cfg(test)]
pub(super) fn kept() -> (usize, usize) {
    let spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
    (spare.len(), spare.iter().map(Vec::capacity).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_kept_is_bounded_by_the_cores_whatever_the_threads() {
        // Buffers of 1 MiB bounded by their number, then of 40 MiB by their bytes.
        for size in [1 << 20, 40 << 20] {
            kept_after_threads(size);
        }
    }

    fn kept_after_threads(size: usize) {
        let threads: Vec<_> = (0..4 * PER_CORE * most() + 8)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut b = take();
                    b.resize(size, 1);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    give_back(b);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        give_back(Vec::with_capacity(KEEP + 1));
        let (count, bytes) = kept();
        assert!(count > 0, "nothing kept");
        assert!(
            count <= PER_CORE * most(),
            "{count} buffers kept on {} cores",
            most()
        );
        assert!(
            bytes <= KEEP * most(),
            "{bytes} bytes kept on {} cores",
            most()
        );
    }
}
