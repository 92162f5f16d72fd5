//! Decoded windows on their way into the output files: one writer of a file at a time, and no
//! decoding thread waiting for it.
//!
//! Parallel `pwrite`s of one file serialise on its inode lock in the kernel, and the waiters
//! spin there; a mutex around each write made the waiters sleep instead, but a thread asleep
//! is not decoding either. Here a thread with a decoded window queues it for its file: if no
//! thread is writing that file it becomes the writer and writes the file's queue until it is
//! empty; otherwise it takes a spare buffer and goes back to decoding. Windows queued at once
//! are bounded ([`Writes::new`]); a thread that would exceed the bound waits for room.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Condvar, Mutex, MutexGuard};

/// A window waiting to be written: its file, its offset, a buffer and the length in it.
struct Window {
    file: usize,
    at: u64,
    buf: Vec<u8>,
    len: usize,
}

#[derive(Default)]
struct State {
    queued: Vec<Window>,
    /// Whether some thread is writing each file.
    writing: Vec<bool>,
    /// Buffers written out, kept for the next windows (their bytes initialized).
    spare: Vec<Vec<u8>>,
    /// The first failed write: its file and error.
    failed: Option<(usize, io::ErrorKind, String)>,
}

/// The output files of a checkout batch and the windows queued for them.
pub(super) struct Writes<'f> {
    files: Vec<&'f File>,
    state: Mutex<State>,
    room: Condvar,
    most: usize,
}

impl<'f> Writes<'f> {
    /// Writes to `files`, with at most `most` windows queued at once.
    pub(super) fn new(files: Vec<&'f File>, most: usize) -> Writes<'f> {
        let state = State {
            writing: vec![false; files.len()],
            ..State::default()
        };
        Writes {
            files,
            state: Mutex::new(state),
            room: Condvar::new(),
            most: most.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of at least `len` bytes: a spare one when there is one.
    pub(super) fn buffer(&self, len: usize) -> Vec<u8> {
        let mut buf = self.lock().spare.pop().unwrap_or_default();
        if buf.len() < len {
            buf.resize(len, 0);
        }
        buf
    }

    /// Writes `buf[..len]` at `at` in file `file`, now (this thread becoming the file's writer)
    /// or later (by the thread writing it). Fails with the error of a write of the file that
    /// failed, or with `file`'s index when a write of another file failed.
    pub(super) fn write(
        &self,
        file: usize,
        at: u64,
        buf: Vec<u8>,
        len: usize,
    ) -> Result<(), WriteError> {
        let mut state = self.lock();
        while state.queued.len() >= self.most && state.failed.is_none() {
            state = self.room.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        if let Some(failed) = &state.failed {
            return Err(WriteError::of(failed));
        }
        state.queued.push(Window { file, at, buf, len });
        if state.writing[file] {
            return Ok(());
        }
        state.writing[file] = true;
        while let Some(i) = state.queued.iter().position(|w| w.file == file) {
            let w = state.queued.swap_remove(i);
            drop(state);
            let result = self.files[file].write_all_at(&w.buf[..w.len], w.at);
            state = self.lock();
            state.spare.push(w.buf);
            self.room.notify_all();
            if let Err(e) = result {
                state.failed.get_or_insert((file, e.kind(), e.to_string()));
                state.writing[file] = false;
                return Err(WriteError { file, source: e });
            }
        }
        state.writing[file] = false;
        Ok(())
    }

    /// The first write that failed, once every thread is done.
    pub(super) fn finish(self) -> Result<(), WriteError> {
        let state = self.state.into_inner().unwrap_or_else(|p| p.into_inner());
        match &state.failed {
            Some(failed) => Err(WriteError::of(failed)),
            None => Ok(()),
        }
    }
}

/// A write of an output file that failed.
#[derive(Debug)]
pub(super) struct WriteError {
    /// The file's index.
    pub file: usize,
    pub source: io::Error,
}

impl WriteError {
    fn of((file, kind, message): &(usize, io::ErrorKind, String)) -> WriteError {
        WriteError {
            file: *file,
            source: io::Error::new(*kind, message.clone()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // files of a test's own folder, no repository
mod tests {
    use super::*;

    /// Windows written from many threads land at their offsets, every byte.
    #[test]
    fn windows_from_many_threads_land_at_their_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<File> = (0..3)
            .map(|i| File::create(dir.path().join(format!("f{i}"))).unwrap())
            .collect();
        let writes = Writes::new(files.iter().collect(), 2);
        let window = 1000;
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let writes = &writes;
                s.spawn(move || {
                    for k in 0..30u64 {
                        let file = (k % 3) as usize;
                        let at = (k / 3 * 4 + t as u64) * window as u64;
                        let mut buf = writes.buffer(window);
                        buf[..window].fill(t.wrapping_mul(31).wrapping_add(k as u8));
                        writes.write(file, at, buf, window).unwrap();
                    }
                });
            }
        });
        writes.finish().unwrap();
        for (file, _) in files.iter().enumerate() {
            let bytes = std::fs::read(dir.path().join(format!("f{file}"))).unwrap();
            assert_eq!(bytes.len(), 40 * window);
            for k in (file as u64..30).step_by(3) {
                for t in 0..4u8 {
                    let at = ((k / 3 * 4 + t as u64) * window as u64) as usize;
                    let want = t.wrapping_mul(31).wrapping_add(k as u8);
                    assert!(bytes[at..at + window].iter().all(|&b| b == want));
                }
            }
        }
    }

    /// A write that fails is reported to its writer, to every later write and by `finish`.
    #[test]
    fn a_failed_write_is_reported_to_everyone_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let read_only = File::open(&path).unwrap();
        let writable = File::create(dir.path().join("g")).unwrap();
        let writes = Writes::new(vec![&read_only, &writable], 4);
        let e = writes.write(0, 0, vec![1; 10], 10).unwrap_err();
        assert_eq!(e.file, 0);
        let later = writes.write(1, 0, vec![1; 10], 10).unwrap_err();
        assert_eq!((later.file, later.source.kind()), (0, e.source.kind()));
        assert_eq!(writes.finish().unwrap_err().file, 0);
    }
}
