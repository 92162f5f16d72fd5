//! Tensors read a window at a time: memory bounded by the window, not by the tensor.
//!
//! A float record (float-split, xor-delta, sub-delta, mantissa-trim) is decoded a window of
//! element chunks at a time, each plane's bytes for the window read from the file at their
//! offsets, or (framed, format 7) frame after frame in file order; a delta pulls the same
//! window of its base from the level below, so a chain is resolved window by window too. Raw
//! and zstd records stream, except small ones, which are decoded whole like the quantized
//! records (the lossy codecs): their memory is the tensor's.
//!
//! Every record's checksum (the per-plane pieces combined in file order) and the content hash
//! of the tensor read are checked by [`TensorWindows::finish`], after the last window: like
//! [`Store::read_object`], bytes reach the caller before they are verified. The levels below
//! a delta are not hashed on their own: a wrong byte of theirs would change the top level's.

use std::cell::RefCell;
use std::io::{self, BufReader};
use std::rc::Rc;
use std::sync::Arc;

use mdl_codec::float::{self, Frames, MaskedDelta, PayloadIndex};
use mdl_codec::planes::{PlaneSpec, Transform};
use mdl_codec::CodecTag;
use mdl_format::record::{Trailer, TRAILER_LEN};
use mdl_format::{FormatError, ObjectId, TensorHasher};

use crate::{IndexEntry, Store, StoreError};

use super::buffers::Pooled;
use super::levels::{
    BaseWindows, Common, CrcReader, FloatLevel, FramedLevel, Level, MaskedLevel, ReadAt,
    StreamLevel,
};
use super::read::{agrees_with_index, chain_budget, corrupt, in_memory_stream, tensor_header};
use super::Held;

/// Element chunks in one window (each of `1 << CHUNK_LOG2` elements): 2 Mi elements, 8 MiB of
/// f32. A chain of depth `d` holds `d + 1` windows and their coded bytes. A commit reads its
/// input in windows of the same size, so it reads a stored version beside it in lockstep; a
/// window is a frame of a framed record (format 7), so either is read whole.
pub const WINDOW_CHUNKS: u64 = mdl_codec::float::FRAME_CHUNKS as u64;

/// What decoding the tensor of `entry` a window at a time ([`Store::tensor_windows`]) holds
/// at its peak, for the decode budget: a window (of the widest float, 8 bytes an element) and
/// its coded bytes for each record of its chain, or, for a record decoded whole (the lossy
/// codecs; small raw and zstd records), what decoding it whole holds
/// ([`crate::budget::decode_cost`]), whichever is less.
pub fn windowed_cost(entry: &IndexEntry) -> u64 {
    let whole = crate::budget::decode_cost(entry);
    let windowed = CodecTag::try_from(entry.codec).is_ok_and(|c| {
        matches!(
            c,
            CodecTag::FloatSplit | CodecTag::XorDelta | CodecTag::MantissaTrim | CodecTag::SubDelta
        ) || (c.is_streaming() && entry.base.is_none())
    });
    if !windowed {
        return whole;
    }
    let window = (WINDOW_CHUNKS << mdl_codec::huffman::CHUNK_LOG2) * 8;
    let levels = u64::from(entry.depth) + 1;
    // A masked delta (format 11) holds its mask and its changed elements' words whole: at most
    // a quarter of the elements changed, and a flag bit an element.
    let masked = entry.content_len / 4 + entry.content_len / 16;
    whole.min((2 * window + masked).saturating_mul(levels))
}

/// A tensor being decoded a window at a time ([`Store::tensor_windows`]).
pub struct TensorWindows<'s> {
    level: Level<'s>,
    len: u64,
    window: u64,
    done: u64,
}

impl Store {
    /// Opens `id` (and the records of its delta chain) to be decoded a window at a time.
    pub fn tensor_windows(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
    ) -> Result<TensorWindows<'_>, StoreError> {
        self.held_windows(id, entry, &Held::new())
    }

    /// [`Self::tensor_windows`] where any base in its chain that `held` has is read from there
    /// (decoded and verified already), not decoded from its records.
    pub fn held_windows<'s>(
        &'s self,
        id: &ObjectId,
        entry: &IndexEntry,
        held: &Held<'s>,
    ) -> Result<TensorWindows<'s>, StoreError> {
        let level = self.reread(id, entry, |e| {
            self.open_level(id, e, chain_budget(e), true, held, None)
        })?;
        // Whole chunks of elements (a float record's width), or of bytes.
        let width = match &level {
            Level::Float(f) => f.width,
            Level::Framed(f) => f.frames.width(),
            Level::Masked(m) => m.width,
            _ => 1,
        };
        Ok(TensorWindows {
            window: WINDOW_CHUNKS * (1 << mdl_codec::huffman::CHUNK_LOG2) * width,
            len: entry.content_len,
            done: 0,
            level,
        })
    }

    /// The first bytes of `id`'s tensor, at least `at_least` of them (all of a shorter
    /// tensor): the first window of its record decoded without the rest — whole element chunks
    /// of a float record, its first frame of a framed one. Not verified: the content hash
    /// covers the whole tensor, so these bytes may only steer a choice that the whole content
    /// is checked under, or that changes nothing stored (a re-encode not attempted).
    pub fn tensor_head(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        at_least: usize,
    ) -> Result<Vec<u8>, StoreError> {
        let mut windows = self.tensor_windows(id, entry)?;
        let at_least = at_least as u64;
        let n = match &windows.level {
            Level::Float(f) => {
                let chunk = (1u64 << mdl_codec::huffman::CHUNK_LOG2) * f.width;
                at_least.div_ceil(chunk).max(1) * chunk
            }
            // Whole windows: the base below a masked record may be framed.
            Level::Framed(_) | Level::Masked(_) => {
                at_least.div_ceil(windows.window).max(1) * windows.window
            }
            Level::Stream(_) | Level::Memory { .. } | Level::Held { .. } => at_least,
        }
        .min(windows.len);
        let mut out = vec![0u8; n as usize];
        if n > 0 {
            windows.next_into(&mut out)?;
        }
        Ok(out)
    }

    /// Opens `id`'s record, and its chain below it. Only the level read (`verify`) checks its
    /// content hash: the levels below are checked by their records' checksums, and any
    /// wrong byte of theirs would change the top level's content.
    pub(super) fn open_level<'s>(
        &'s self,
        id: &ObjectId,
        entry: &IndexEntry,
        budget: u32,
        verify: bool,
        held: &Held<'s>,
        omit: Option<&ObjectId>,
    ) -> Result<Level<'s>, StoreError> {
        let bad = corrupt(id, entry);
        let codec = CodecTag::try_from(entry.codec).map_err(bad)?;
        if budget == 0 {
            return Err(bad(FormatError::invalid(
                "delta chain",
                "longer than the index records (a cycle?)",
            )));
        }
        // The float codecs' planes: the value's own (a delta XORs them per its head), or the
        // difference's.
        let transform = match codec {
            CodecTag::FloatSplit | CodecTag::XorDelta | CodecTag::MantissaTrim => {
                Some(Transform::Planes)
            }
            CodecTag::SubDelta => Some(Transform::Sub),
            _ => None,
        };
        let streaming = codec.is_streaming() && entry.base.is_none();
        if in_memory_stream(codec, entry) || (!streaming && transform.is_none()) {
            // Small raw and zstd records, and the lossy codecs: decoded whole.
            return Ok(Level::Memory {
                data: Arc::new(self.load_tensor(id, entry)?),
                at: 0,
            });
        }
        let open = self.open_record(id, entry)?;
        let len = open.len;
        let hlen = open.header_len;
        if len < (hlen + TRAILER_LEN) as u64 {
            return Err(bad(FormatError::Truncated {
                what: "record",
                needed: hlen + TRAILER_LEN - len as usize,
            }));
        }
        let mut tbytes = [0u8; TRAILER_LEN];
        open.file
            .read_exact_at(&mut tbytes, len - TRAILER_LEN as u64)
            .map_err(StoreError::io("read", &open.path))?;
        let trailer = Trailer::decode(&tbytes).map_err(bad)?;
        let header = &open.header;
        let payload_len = len - (hlen + TRAILER_LEN) as u64;
        agrees_with_index(header, &trailer, Some(payload_len), entry, codec).map_err(bad)?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&open.head[..hlen]);
        let common = Common {
            id: *id,
            entry: *entry,
            hasher: verify.then(|| TensorHasher::new(&header.prefix)),
            expected: header.content_id(id),
            trailer: tbytes,
            crc,
        };
        if streaming {
            let payload = Rc::new(RefCell::new((crc32fast::Hasher::new(), 0)));
            let end = len - TRAILER_LEN as u64;
            let reader = ReadAt {
                file: open
                    .file
                    .try_clone()
                    .map_err(StoreError::io("open", &open.path))?,
                at: hlen as u64,
                end,
                path: open.path.clone(),
            };
            let checked = CrcReader {
                inner: BufReader::with_capacity(1 << 18, reader),
                seen: payload.clone(),
            };
            let decoder = mdl_codec::decoder(codec, Box::new(checked), entry.content_len)
                .map_err(|e| bad(FormatError::invalid("payload", e.to_string())))?;
            return Ok(Level::Stream(StreamLevel {
                common,
                decoder,
                payload,
                rest: ReadAt {
                    file: open.file,
                    at: hlen as u64,
                    end,
                    path: open.path,
                },
            }));
        }
        let tensor = tensor_header(header, entry).map_err(bad)?;
        let spec = match transform {
            Some(Transform::Planes) => PlaneSpec::planes(tensor.dtype, 0),
            Some(Transform::Sub) => PlaneSpec::sub(tensor.dtype),
            None => unreachable!("streaming records returned above"),
        };
        let (width, _) = spec
            .shape()
            .ok_or(bad(FormatError::invalid("record", "not a float dtype")))?;
        let mut read = |at: u64, buf: &mut [u8]| {
            open.file
                .read_exact_at(buf, hlen as u64 + at)
                .map_err(|e| FormatError::invalid("record", e.to_string()))
        };
        let mut first = [0u8; 1];
        if payload_len > 0 {
            read(0, &mut first).map_err(bad)?;
        }
        let base = BaseWindows::new(match &entry.base {
            // The caller writes the delta over bytes of its own ([`Store::masked_over`]).
            Some(base_id) if omit == Some(base_id) => None,
            Some(base_id) => match held.get(base_id).copied().or_else(|| self.lent(base_id)) {
                Some(data) if data.len() as u64 == entry.content_len => {
                    Some(Box::new(Level::Held { data, at: 0 }))
                }
                _ => {
                    let base_entry = self.base_entry(id, entry, base_id)?;
                    Some(Box::new(self.open_level(
                        base_id,
                        &base_entry,
                        budget - 1,
                        false,
                        held,
                        None,
                    )?))
                }
            },
            None => None,
        });
        if float::is_masked(&first) {
            let mut payload = vec![0u8; payload_len as usize];
            read(0, &mut payload).map_err(bad)?;
            let mut crc = crc32fast::Hasher::new();
            crc.update(&payload);
            let delta = MaskedDelta::open(spec, entry.content_len, &payload).map_err(bad)?;
            return Ok(Level::Masked(MaskedLevel {
                common,
                delta,
                width: width as u64,
                crc,
                base,
            }));
        }
        if float::is_framed(&first) {
            let frames =
                Frames::open(spec, entry.content_len, payload_len, &mut read).map_err(bad)?;
            let mut crc = crc32fast::Hasher::new();
            crc.update(&frames.head());
            return Ok(Level::Framed(FramedLevel {
                store: self,
                common,
                file: open.file,
                path: open.path,
                payload_at: hlen as u64,
                frames,
                crc,
                bytes: Pooled::take(),
                base,
            }));
        }
        let index = PayloadIndex::open(
            spec,
            entry.content_len,
            payload_len,
            entry.base.is_some(),
            &mut read,
        )
        .map_err(bad)?;
        let heads = index
            .heads()
            .iter()
            .map(|bytes| {
                let mut c = crc32fast::Hasher::new();
                c.update(bytes);
                c
            })
            .collect();
        let planes = index.planes();
        Ok(Level::Float(FloatLevel {
            store: self,
            common,
            file: open.file,
            path: open.path,
            payload_at: hlen as u64,
            heads,
            data: vec![crc32fast::Hasher::new(); planes],
            bytes: Pooled::take(),
            index,
            width: width as u64,
            next_chunk: 0,
            base,
        }))
    }
}

impl TensorWindows<'_> {
    /// Decodes the next `out.len()` bytes into `out`: for a float record, whole chunks of
    /// elements (any multiple of [`WINDOW_CHUNKS`] chunks is), or the rest of the tensor.
    pub fn next_into(&mut self, out: &mut [u8]) -> Result<(), StoreError> {
        let want = out.len() as u64;
        if want > self.len - self.done || want == 0 {
            return Err(StoreError::Output(io::Error::other(
                "window length differs from the tensor's next window",
            )));
        }
        self.level.next_into(out)?;
        self.done += want;
        Ok(())
    }

    /// Checks every record's checksum and the content hash once all windows are read.
    pub fn finish(self) -> Result<(), StoreError> {
        if self.done != self.len {
            return Err(StoreError::Output(io::Error::other(
                "tensor not read to its end",
            )));
        }
        self.level.finish()
    }

    /// Where the next window starts and how long it is; `None` once the tensor is read.
    pub fn next_window(&self) -> Option<(u64, usize)> {
        (self.done < self.len).then(|| (self.done, self.window.min(self.len - self.done) as usize))
    }

    /// Decodes the whole tensor through `buf` (grown to a window as needed), handing each
    /// window and its offset to `f`, then verifies it.
    pub fn for_each(
        mut self,
        buf: &mut Vec<u8>,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let want = self.window.min(self.len) as usize;
        if buf.len() < want {
            buf.resize(want, 0);
        }
        while let Some((at, n)) = self.next_window() {
            self.next_into(&mut buf[..n])?;
            f(at, &buf[..n])?;
        }
        self.finish()
    }
}
