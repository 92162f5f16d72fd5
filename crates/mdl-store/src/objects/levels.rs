//! The levels a tensor is read through a window at a time ([`super::windows`]): a float
//! record's planes read at their offsets or frame by frame, a masked delta applied to its base's
//! window, a streaming record, a record decoded whole; and what every level checks (its
//! record's checksum, the content hash at the top).

use std::cell::RefCell;
use std::io::{self, Read};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use mdl_codec::float::{Frames, MaskedDelta, PayloadIndex};
use mdl_format::record::TRAILER_LEN;
use mdl_format::{FormatError, ObjectId, TensorHasher};

use crate::{IndexEntry, Store, StoreError};

use super::buffers::Pooled;
use super::read::corrupt;
use super::RecordFile;

/// One record of a chain.
pub(super) enum Level<'s> {
    Float(FloatLevel<'s>),
    Framed(FramedLevel<'s>),
    Masked(MaskedLevel<'s>),
    Stream(StreamLevel),
    /// Decoded whole: a record decoded so.
    Memory {
        data: Arc<Vec<u8>>,
        at: usize,
    },
    /// A base the caller holds decoded ([`Held`]).
    Held {
        data: &'s [u8],
        at: usize,
    },
}

impl Level<'_> {
    pub(super) fn next_into(&mut self, out: &mut [u8]) -> Result<(), StoreError> {
        match self {
            Level::Float(f) => f.next_into(out),
            Level::Framed(f) => f.next_into(out),
            Level::Masked(m) => m.next_into(out),
            Level::Stream(s) => s.next_into(out),
            Level::Memory { .. } | Level::Held { .. } => {
                let window = self.next_in_place(out.len())?;
                out.copy_from_slice(window);
                Ok(())
            }
        }
    }

    pub(super) fn finish(self) -> Result<(), StoreError> {
        match self {
            Level::Float(f) => f.finish(),
            Level::Framed(f) => f.finish(),
            Level::Masked(m) => m.finish(),
            Level::Stream(s) => s.finish(),
            Level::Memory { .. } | Level::Held { .. } => Ok(()),
        }
    }

    /// Its next `len` bytes, without a copy: only for a level held decoded (in memory, or
    /// lent).
    fn next_in_place(&mut self, len: usize) -> Result<&[u8], StoreError> {
        let (data, at): (&[u8], &mut usize) = match self {
            Level::Memory { data, at } => (data.as_slice(), at),
            Level::Held { data, at } => (data, at),
            _ => unreachable!("a level decoded whole"),
        };
        let window = data.get(*at..*at + len).ok_or_else(|| {
            StoreError::Output(io::Error::other("base window past the tensor's end"))
        })?;
        *at += len;
        Ok(window)
    }
}

/// What every streamed level checks at the end.
pub(super) struct Common {
    pub(super) id: ObjectId,
    pub(super) entry: IndexEntry,
    /// The content hash so far; `None` for a level below the one read.
    pub(super) hasher: Option<TensorHasher>,
    pub(super) expected: ObjectId,
    /// The record's trailer.
    pub(super) trailer: [u8; TRAILER_LEN],
    /// Checksum of the record's header.
    pub(super) crc: crc32fast::Hasher,
}

impl Common {
    pub(super) fn hash(&mut self, bytes: &[u8]) {
        if let Some(h) = &mut self.hasher {
            h.update(bytes);
        }
    }

    /// Checks the record checksum (`payload`: of the payload's bytes) and the content hash.
    fn finish(self, payload: &crc32fast::Hasher) -> Result<(), StoreError> {
        let bad = corrupt(&self.id, &self.entry);
        let mut crc = self.crc;
        crc.combine(payload);
        crc.update(&self.trailer[..TRAILER_LEN - 4]);
        let computed = crc.finalize();
        let stored =
            u32::from_le_bytes(self.trailer[TRAILER_LEN - 4..].try_into().expect("4 bytes"));
        if computed != stored {
            return Err(bad(FormatError::Checksum { stored, computed }));
        }
        let Some(hasher) = self.hasher else {
            return Ok(());
        };
        let actual = hasher.finalize();
        if actual != self.expected {
            return Err(bad(FormatError::HashMismatch {
                expected: self.expected,
                actual,
            }));
        }
        Ok(())
    }
}

/// A float record, its planes read a window of chunks at a time.
pub(super) struct FloatLevel<'s> {
    pub(super) store: &'s Store,
    pub(super) common: Common,
    pub(super) file: RecordFile,
    pub(super) path: PathBuf,
    /// Where the payload starts in the file.
    pub(super) payload_at: u64,
    pub(super) index: PayloadIndex,
    /// Checksums of the payload's head and each plane stream's head.
    pub(super) heads: Vec<crc32fast::Hasher>,
    /// Checksums of each plane's chunks read so far.
    pub(super) data: Vec<crc32fast::Hasher>,
    /// The current window's bytes of every plane, one after another (a pooled buffer:
    /// fresh ones cost a page fault and a zeroing a page, tensor after tensor).
    pub(super) bytes: Pooled,
    /// Bytes an element.
    pub(super) width: u64,
    pub(super) next_chunk: usize,
    pub(super) base: BaseWindows<'s>,
}

impl FloatLevel<'_> {
    fn next_into(&mut self, out: &mut [u8]) -> Result<(), StoreError> {
        let bad = corrupt(&self.common.id, &self.common.entry);
        let chunk = (1u64 << mdl_codec::huffman::CHUNK_LOG2) * self.width;
        let count = (out.len() as u64).div_ceil(chunk) as usize;
        let ranges: Vec<_> = (0..self.index.planes())
            .map(|p| self.index.plane_range(p, self.next_chunk, count))
            .collect();
        let total = ranges.iter().map(|r| (r.end - r.start) as usize).sum();
        if self.bytes.0.len() < total {
            self.bytes.0.reserve_exact(total - self.bytes.0.len());
            self.bytes.0.resize(total, 0);
        }
        let mut planes: Vec<&[u8]> = Vec::with_capacity(ranges.len());
        let mut rest = &mut self.bytes.0[..total];
        for (r, crc) in ranges.iter().zip(&mut self.data) {
            let (buf, tail) = rest.split_at_mut((r.end - r.start) as usize);
            self.file
                .read_exact_at(buf, self.payload_at + r.start)
                .map_err(StoreError::io("read", &self.path))?;
            crc.update(buf);
            planes.push(buf);
            rest = tail;
        }
        let base = self.base.next(out.len())?;
        self.index
            .decode(self.store.engine(), self.next_chunk, &planes, base, out)
            .map_err(bad)?;
        self.common.hash(out);
        self.next_chunk += count;
        Ok(())
    }

    fn finish(self) -> Result<(), StoreError> {
        self.base.finish()?;
        // The payload's pieces in file order: its head, then each stream's head and chunks.
        let mut heads = self.heads.into_iter();
        let mut payload = heads.next().expect("the payload head");
        for (head, data) in heads.zip(&self.data) {
            payload.combine(&head);
            payload.combine(data);
        }
        self.common.finish(&payload)
    }
}

/// The base level below a delta, read a window at a time beside it.
pub(super) struct BaseWindows<'s> {
    pub(super) level: Option<Box<Level<'s>>>,
    pub(super) buf: Pooled,
}

impl<'s> BaseWindows<'s> {
    pub(super) fn new(level: Option<Box<Level<'s>>>) -> Self {
        BaseWindows {
            level,
            buf: Pooled::take(),
        }
    }

    /// The base's next `len` bytes (`None` without a base): where it, too, is held decoded,
    /// those bytes themselves, not a copy.
    fn next(&mut self, len: usize) -> Result<Option<&[u8]>, StoreError> {
        let Some(level) = &mut self.level else {
            return Ok(None);
        };
        if matches!(**level, Level::Memory { .. } | Level::Held { .. }) {
            return level.next_in_place(len).map(Some);
        }
        if self.buf.0.len() < len {
            // A pooled buffer grows to the window exactly, not to twice its old capacity.
            self.buf.0.reserve_exact(len - self.buf.0.len());
            self.buf.0.resize(len, 0);
        }
        let window = &mut self.buf.0[..len];
        level.next_into(window)?;
        Ok(Some(window))
    }

    /// Writes the base's next `out.len()` bytes into `out` (decoded there, or copied from
    /// where it is held); false without a base.
    fn fill(&mut self, out: &mut [u8]) -> Result<bool, StoreError> {
        match &mut self.level {
            Some(level) => level.next_into(out).map(|()| true),
            None => Ok(false),
        }
    }

    fn finish(self) -> Result<(), StoreError> {
        match self.level {
            Some(level) => level.finish(),
            None => Ok(()),
        }
    }
}

/// A framed float record: its frames read and decoded in file order.
pub(super) struct FramedLevel<'s> {
    pub(super) store: &'s Store,
    pub(super) common: Common,
    pub(super) file: RecordFile,
    pub(super) path: PathBuf,
    /// Where the payload starts in the file.
    pub(super) payload_at: u64,
    pub(super) frames: Frames,
    /// Checksum of the payload bytes read so far.
    pub(super) crc: crc32fast::Hasher,
    /// The current frame's bytes.
    pub(super) bytes: Pooled,
    pub(super) base: BaseWindows<'s>,
}

impl FramedLevel<'_> {
    fn next_into(&mut self, out: &mut [u8]) -> Result<(), StoreError> {
        let bad = corrupt(&self.common.id, &self.common.entry);
        let base = self.base.next(out.len())?;
        let (file, path, at) = (&self.file, &self.path, self.payload_at);
        let mut read = |offset: u64, buf: &mut [u8]| {
            file.read_exact_at(buf, at + offset)
                .map_err(|e| FormatError::invalid("record", format!("{}: {e}", path.display())))
        };
        let crc = &mut self.crc;
        self.frames
            .decode_next(
                self.store.engine(),
                &mut read,
                &mut self.bytes.0,
                base,
                out,
                &mut |bytes| crc.update(bytes),
            )
            .map_err(bad)?;
        self.common.hash(out);
        Ok(())
    }

    fn finish(self) -> Result<(), StoreError> {
        self.base.finish()?;
        let bad = corrupt(&self.common.id, &self.common.entry);
        self.frames.finish().map_err(bad)?;
        self.common.finish(&self.crc)
    }
}

/// A masked delta record (format 11): its mask and changed elements decoded at open, applied
/// to the base a window at a time.
pub(super) struct MaskedLevel<'s> {
    pub(super) common: Common,
    pub(super) delta: MaskedDelta,
    /// Bytes an element.
    pub(super) width: u64,
    /// Checksum of the payload (read whole at open).
    pub(super) crc: crc32fast::Hasher,
    pub(super) base: BaseWindows<'s>,
}

impl MaskedLevel<'_> {
    fn next_into(&mut self, out: &mut [u8]) -> Result<(), StoreError> {
        let bad = corrupt(&self.common.id, &self.common.entry);
        // The base's window decoded (or copied) where the result goes, the changed elements
        // written over it: a chain of masked deltas costs one pass a window, not one a level.
        if !self.base.fill(out)? {
            return Err(bad(FormatError::invalid(
                "masked delta",
                "a record without a base",
            )));
        }
        self.delta.apply_next_in_place(out).map_err(bad)?;
        self.common.hash(out);
        Ok(())
    }

    fn finish(self) -> Result<(), StoreError> {
        self.check().0
    }

    /// Checks the record and the content read; the delta back whatever the outcome.
    pub(super) fn check(self) -> (Result<(), StoreError>, MaskedDelta) {
        let MaskedLevel {
            common,
            delta,
            crc,
            base,
            ..
        } = self;
        let bad = corrupt(&common.id, &common.entry);
        let read = base.finish().and_then(|()| delta.finish().map_err(bad));
        (read.and_then(|()| common.finish(&crc)), delta)
    }
}

/// A raw or zstd record, decoded as it streams.
pub(super) struct StreamLevel {
    pub(super) common: Common,
    pub(super) decoder: Box<dyn Read>,
    /// Checksum and count of the payload bytes the decoder has taken so far.
    pub(super) payload: Rc<RefCell<(crc32fast::Hasher, u64)>>,
    /// The payload, for checksumming what the decoder did not need.
    pub(super) rest: ReadAt,
}

impl StreamLevel {
    fn next_into(&mut self, out: &mut [u8]) -> Result<(), StoreError> {
        let bad = corrupt(&self.common.id, &self.common.entry);
        self.decoder
            .read_exact(out)
            .map_err(|e| bad(FormatError::invalid("payload", e.to_string())))?;
        self.common.hash(out);
        Ok(())
    }

    fn finish(mut self) -> Result<(), StoreError> {
        let bad = corrupt(&self.common.id, &self.common.entry);
        // The decoder must be at its end, and the payload checksummed to its end.
        let mut rest = [0u8; 1];
        if self
            .decoder
            .read(&mut rest)
            .map_err(|e| bad(FormatError::invalid("payload", e.to_string())))?
            != 0
        {
            return Err(bad(FormatError::invalid(
                "payload",
                "longer than the tensor",
            )));
        }
        drop(self.decoder);
        let (mut payload, taken) = self.payload.borrow().clone();
        self.rest.at += taken;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = self.rest.read(&mut buf).map_err(|e| StoreError::Io {
                op: "read",
                path: self.rest.path.clone(),
                source: e,
            })?;
            if n == 0 {
                break;
            }
            payload.update(&buf[..n]);
        }
        self.common.finish(&payload)
    }
}

/// Reads a file's range `at..end` sequentially with positioned reads.
pub(super) struct ReadAt {
    pub(super) file: RecordFile,
    pub(super) at: u64,
    pub(super) end: u64,
    pub(super) path: PathBuf,
}

impl Read for ReadAt {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (buf.len() as u64).min(self.end - self.at) as usize;
        let got = self
            .file
            .read_at(&mut buf[..n], self.at)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.path.display())))?;
        self.at += got as u64;
        Ok(got)
    }
}

/// Checksums and counts what passes through, into a state shared with the level.
pub(super) struct CrcReader<R> {
    pub(super) inner: R,
    pub(super) seen: Rc<RefCell<(crc32fast::Hasher, u64)>>,
}

impl<R: Read> Read for CrcReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut seen = self.seen.borrow_mut();
        seen.0.update(&buf[..n]);
        seen.1 += n as u64;
        Ok(n)
    }
}
