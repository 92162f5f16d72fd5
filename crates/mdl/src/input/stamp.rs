//! Whether a file read for a commit stayed as it was: its stamp (inode, length, modification
//! and change times) taken when it is opened and again when the commit has read it, equal
//! stamps meaning nobody wrote it in between. Or a private copy taken at once (a background
//! commit, whose caller may write the file again as soon as the call returns).
//!
//! A write sets a file's times from the kernel's coarse clock, cut to the filesystem's
//! granularity; a write in the very tick that the first stamp was taken in could leave the
//! times as they were. So before reading, [`settle`] waits (git's "racy" case) until the
//! clock is past the newest time stamped by more than that granularity: from then on, any
//! write moves a time. Where it can fail: a filesystem whose times are not the local clock's
//! (a network mount with a clock of its own), a clock stepped back while the commit reads, or
//! a writer that keeps the times as they were (`touch -d`, a restored mtime) and the length
//! and inode too.

use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{Error, Result};

/// What a file's metadata says of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

impl From<&Metadata> for Stamp {
    fn from(m: &Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            modified: (m.mtime(), m.mtime_nsec()),
            changed: (m.ctime(), m.ctime_nsec()),
        }
    }
}

impl Stamp {
    /// The stamp of the open `file`, read at `path`.
    pub(crate) fn of(file: &File, path: &Path) -> Result<Stamp> {
        let m = file.metadata().map_err(|source| Error::Input {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Stamp::from(&m))
    }

    /// The file's length when stamped.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Whether `other` is a stamp of the same file (device and inode), whatever its bytes.
    pub(crate) fn same_file(&self, other: &Stamp) -> bool {
        (self.dev, self.ino) == (other.dev, other.ino)
    }

    /// An error naming `path` unless `file` still has this stamp.
    pub(crate) fn check(&self, file: &File, path: &Path) -> Result<()> {
        if Stamp::of(file, path)? == *self {
            Ok(())
        } else {
            Err(Error::Changed {
                path: path.to_path_buf(),
            })
        }
    }

    /// `e`, a failure to read or parse the open `file` (at `path`); or, where the file is being
    /// written (its stamp moves within a clock tick or two of the failure), that: the cause of
    /// `e`, most likely — a file cut short or half rewritten.
    pub(crate) fn explain(&self, file: &File, path: &Path, e: Error) -> Error {
        wait_a_tick(self);
        match self.check(file, path) {
            Err(changed @ Error::Changed { .. }) => changed,
            _ => e,
        }
    }

    /// The later of its two times.
    fn newest(&self) -> SystemTime {
        let (s, ns) = self.modified.max(self.changed);
        match u64::try_from(s) {
            Ok(s) => UNIX_EPOCH + Duration::new(s, ns as u32),
            Err(_) => UNIX_EPOCH,
        }
    }

    /// When a write to the file must give it a different stamp.
    fn settled(&self) -> SystemTime {
        self.newest() + self.granularity()
    }

    /// How far apart two times this file's filesystem records can be and still be equal:
    /// whole seconds where both times have none (two for FAT's sake), otherwise the kernel's
    /// coarse clock tick (at most 10 ms) with room to spare.
    fn granularity(&self) -> Duration {
        if self.modified.1 == 0 && self.changed.1 == 0 {
            Duration::from_secs(2)
        } else {
            TICK
        }
    }
}

/// The kernel's coarse clock tick (at most 10 ms), with room to spare.
const TICK: Duration = Duration::from_millis(20);

/// The longest [`settle`] waits: a time further ahead than this is another clock's (a network
/// filesystem's), which no wait here would pass.
const SETTLE_MAX: Duration = Duration::from_secs(3);

/// Waits until a write to any of the files stamped would change its stamp (see the module's
/// text): at most a clock tick for a file written just now, nothing for an older one.
pub(crate) fn settle<'a>(stamps: impl IntoIterator<Item = &'a Stamp>) {
    if let Some(until) = stamps.into_iter().map(Stamp::settled).max() {
        wait_until(until);
    }
}

/// Waits a clock tick and more (at least until `stamp` is settled): a writer at work on the
/// file has moved its stamp by then.
pub(crate) fn wait_a_tick(stamp: &Stamp) {
    wait_until(stamp.settled().max(SystemTime::now() + TICK));
}

/// Sleeps until `until`, unless that is further off than [`SETTLE_MAX`].
fn wait_until(until: SystemTime) {
    loop {
        match until.duration_since(SystemTime::now()) {
            Ok(left) if left <= SETTLE_MAX && !left.is_zero() => std::thread::sleep(left),
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    // The tests write the files they stamp (not a repository's).
    #![allow(clippy::disallowed_methods)]
    use super::*;
    use std::io::Write;

    #[test]
    fn a_write_after_settling_changes_the_stamp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        for round in 0..50u8 {
            std::fs::write(&path, [round; 64]).unwrap();
            let file = File::open(&path).unwrap();
            let stamp = Stamp::of(&file, &path).unwrap();
            settle([&stamp]);
            // The same length, in place: only the times can tell.
            let mut w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            w.write_all(&[round.wrapping_add(1); 64]).unwrap();
            drop(w);
            assert!(
                matches!(stamp.check(&file, &path), Err(Error::Changed { .. })),
                "round {round}"
            );
        }
    }

    #[test]
    fn an_untouched_file_keeps_its_stamp_and_an_old_one_needs_no_wait() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let file = File::open(&path).unwrap();
        let old = SystemTime::now() - Duration::from_secs(60);
        file.set_modified(old).unwrap();
        let stamp = Stamp::of(&file, &path).unwrap();
        let started = std::time::Instant::now();
        settle([&stamp]);
        // Its change time is now (set_modified changed it), so at most one settling.
        assert!(started.elapsed() < Duration::from_secs(1));
        let _ = std::fs::read(&path).unwrap();
        stamp.check(&file, &path).unwrap();
    }
}
