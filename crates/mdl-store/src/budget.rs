//! A process-wide budget of bytes for decoded objects: what concurrent work (a server's
//! requests) may hold of decoded tensors at once. Unlimited unless a process sets a limit
//! ([`set_limit`]; `mdl serve --decode-memory`).
//!
//! A unit of work reserves everything it will hold *before* it decodes anything — a window of
//! tensors and their delta bases — and keeps the reservation until it lets go of the bytes, so
//! reservations never wait while holding part of what they need (no deadlock between units).
//! A reservation larger than the whole budget waits until it can have all of it. Reserve on a
//! thread of your own, never inside a rayon worker: decoding itself runs on rayon.

use std::sync::{Condvar, Mutex};

use crate::IndexEntry;

struct State {
    limit: u64,
    used: u64,
}

static STATE: Mutex<State> = Mutex::new(State {
    limit: u64::MAX,
    used: 0,
});
static FREED: Condvar = Condvar::new();

/// Sets the budget (bytes). Reservations already held are kept.
pub fn set_limit(bytes: u64) {
    lock().limit = bytes.max(1);
    FREED.notify_all();
}

/// The budget (bytes; `u64::MAX` when unlimited).
pub fn limit() -> u64 {
    lock().limit
}

/// Bytes reserved now.
pub fn in_use() -> u64 {
    lock().used
}

fn lock() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Bytes held against the budget, given back when dropped.
#[derive(Debug)]
pub struct Reservation(u64);

/// Waits until `bytes` (at most the whole budget) are free, and reserves them.
pub fn reserve(bytes: u64) -> Reservation {
    let mut s = lock();
    let want = bytes.min(s.limit);
    while s.used > 0 && s.used.saturating_add(want) > s.limit {
        s = FREED.wait(s).unwrap_or_else(|p| p.into_inner());
    }
    s.used += want;
    Reservation(want)
}

/// [`reserve`], where `bytes` fit the whole budget; `None` (at once) where they never could: a
/// request that would hold more than the budget alone is refused rather than let past it.
pub fn reserve_within(bytes: u64) -> Option<Reservation> {
    (bytes <= limit()).then(|| reserve(bytes))
}

impl Reservation {
    /// Moves `bytes` (at most what this holds) into a reservation of their own, without
    /// waiting: e.g. a window's reservation divided among its tensors.
    pub fn split_off(&mut self, bytes: u64) -> Reservation {
        let moved = bytes.min(self.0);
        self.0 -= moved;
        Reservation(moved)
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.0
    }

    /// Holds `bytes` in all: fewer than now are given back at once; for more, everything held
    /// is given back first and the whole amount waited for as a new reservation. So a holder
    /// never waits while holding part of the budget, and two holders that both want more
    /// cannot wait for each other (a comparison holding its manifests that then reads a
    /// tensor's windows). While it waits, what it holds in memory is not counted.
    pub fn resize(&mut self, bytes: u64) {
        if bytes <= self.0 {
            self.shrink_to(bytes);
        } else {
            *self = Reservation(0);
            *self = reserve(bytes);
        }
    }

    /// Gives back all but `keep` bytes (what is still held once decoding is done).
    pub fn shrink_to(&mut self, keep: u64) {
        if keep < self.0 {
            let mut s = lock();
            s.used -= self.0 - keep;
            self.0 = keep;
            FREED.notify_all();
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.0 > 0 {
            lock().used -= self.0;
            FREED.notify_all();
        }
    }
}

/// What decoding the object of `entry` holds at its peak: its bytes, one buffer per delta base
/// on its chain, and the record being read (one at a time; a record is at most about its
/// content's size, since raw is every codec's fallback).
pub fn decode_cost(entry: &IndexEntry) -> u64 {
    entry
        .content_len
        .saturating_mul(u64::from(entry.depth).saturating_add(2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// The budget is the process's: one test at a time sets it.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Two holders that each want more than is left once both hold theirs: neither waits
    /// for the other (a wait while holding would block both for ever).
    #[test]
    fn holders_that_grow_do_not_wait_for_each_other() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        set_limit(100);
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let mut held = reserve(45);
                    barrier.wait();
                    held.resize(80);
                    assert_eq!(held.bytes(), 80);
                    held.resize(10);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(in_use(), 0);
        set_limit(u64::MAX);
    }

    #[test]
    fn reservations_never_exceed_the_limit_together() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        set_limit(100);
        let peak = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let peak = peak.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let mut r = reserve(30 + i * 5);
                        peak.fetch_max(in_use(), Ordering::Relaxed);
                        r.shrink_to(10);
                        peak.fetch_max(in_use(), Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // More than the whole budget waits for all of it.
        let big = reserve(1000);
        assert_eq!(in_use(), 100);
        drop(big);
        assert_eq!(in_use(), 0);
        assert!(peak.load(Ordering::Relaxed) <= 100);
        set_limit(u64::MAX);
    }
}
