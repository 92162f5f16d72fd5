//! [`RecordFile`]: a record's bytes, wherever they lie — a loose record file whole, or a
//! range of a pack — read at offsets from the record's start.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// An open record: `len` bytes of `file` from `start`.
pub(crate) struct RecordFile {
    file: File,
    /// The file (the pack, for a packed record), for errors.
    pub(crate) path: PathBuf,
    start: u64,
    /// The record's length.
    pub(crate) len: u64,
}

impl RecordFile {
    /// A whole loose record file.
    pub(crate) fn whole(file: File, path: PathBuf) -> io::Result<RecordFile> {
        let len = file.metadata()?.len();
        Ok(RecordFile {
            file,
            path,
            start: 0,
            len,
        })
    }

    /// The `len` bytes of a pack from `start`: an error if the pack is shorter.
    pub(crate) fn range(file: File, path: PathBuf, start: u64, len: u64) -> io::Result<RecordFile> {
        let file_len = file.metadata()?.len();
        if start.checked_add(len).is_none_or(|end| end > file_len) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the pack holds {file_len} bytes, short of the record's end"),
            ));
        }
        Ok(RecordFile {
            file,
            path,
            start,
            len,
        })
    }

    /// Fills `buf` from offset `at` of the record; an error past its end.
    pub(crate) fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        if at
            .checked_add(buf.len() as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "a read past the record's end",
            ));
        }
        self.file.read_exact_at(buf, self.start + at)
    }

    /// Reads what there is of the record at `at`, at most `buf.len()` bytes.
    pub(crate) fn read_at(&self, buf: &mut [u8], at: u64) -> io::Result<usize> {
        let n = (buf.len() as u64).min(self.len.saturating_sub(at)) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.file.read_at(&mut buf[..n], self.start + at)
    }

    /// The whole record into `out` (replacing what it held).
    pub(crate) fn read_all(&self, out: &mut Vec<u8>) -> io::Result<()> {
        let n = usize::try_from(self.len).map_err(io::Error::other)?;
        out.clear();
        out.try_reserve_exact(n).map_err(io::Error::other)?;
        out.resize(n, 0);
        self.read_exact_at(out, 0)
    }

    /// Another handle on the same record.
    pub(crate) fn try_clone(&self) -> io::Result<RecordFile> {
        Ok(RecordFile {
            file: self.file.try_clone()?,
            path: self.path.clone(),
            start: self.start,
            len: self.len,
        })
    }
}
