//! Record read buffers kept for the next read: at most one per core, each at most
//! [`KEEP`]. Bounded by the machine, not by the number of threads reading (a
//! server's blocking threads are many): what a process keeps here is at most cores × 64 MiB,
//! whatever number of requests it serves.
use std::sync::{Mutex, OnceLock};

/// Buffers up to this capacity are kept.
pub const KEEP: usize = 64 << 20;

static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

fn most() -> usize {
    static MOST: OnceLock<usize> = OnceLock::new();
    *MOST.get_or_init(|| std::thread::available_parallelism().map_or(4, |n| n.get()))
}

/// An empty buffer, with the capacity of an earlier read when one is spare.
pub fn take() -> Vec<u8> {
    let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
    spare.pop().unwrap_or_default()
}

/// Keeps `buf` for a later read if it is small enough and fewer than one per core are kept.
pub fn give_back(mut buf: Vec<u8>) {
    if buf.capacity() == 0 || buf.capacity() > KEEP {
        return;
    }
    buf.clear();
    let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
    if spare.len() < most() {
        spare.push(buf);
    }
}

/// Buffers kept now (for tests).
#[cfg(test)]
pub fn kept() -> (usize, usize) {
    let spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
    (
        spare.len(),
        spare.iter().map(Vec::capacity).max().unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_more_than_one_buffer_per_core_is_kept_whatever_the_threads() {
        let threads: Vec<_> = (0..4 * most() + 8)
            .map(|_| {
                std::thread::spawn(|| {
                    let mut b = take();
                    b.resize(1 << 20, 1);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    give_back(b);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        give_back(Vec::with_capacity(KEEP + 1));
        let (count, largest) = kept();
        assert!(count <= most(), "{count} buffers kept on {} cores", most());
        assert!(largest <= KEEP);
    }
}
