//! A pack's table of contents (`docs/FORMAT.md`, "Pack stream"): where each frame's body is
//! and, for a record, what its index entry needs — kind, codec, base, content length. A pack
//! written to object storage carries it after its end frame, so a reader can read the table
//! from the object's end and then only the byte ranges of the records it wants; a reader of
//! the stream itself stops at the end frame and never sees it.

use mdl_format::{ObjectId, ObjectKind};

use crate::{Error, Result};

/// Last bytes of a table of contents.
pub(super) const TOC_MAGIC: &[u8; 8] = b"MDLTOC01";
/// Bytes of the footer that ends a table: `u64 n | u64 start | TOC_MAGIC`.
pub const TOC_FOOTER: u64 = 24;

/// One frame of a pack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The object.
    pub id: ObjectId,
    /// Where the frame's body (its record, or what an expired frame says) starts in the pack.
    pub offset: u64,
    /// The body's length.
    pub len: u64,
    /// What the index needs to name the record without reading it; `None` for an expired
    /// tensor's frame.
    pub record: Option<FrameRecord>,
}

/// What a record's header and trailer say, as the index keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRecord {
    /// Kind of object.
    pub kind: ObjectKind,
    /// Codec tag.
    pub codec: u8,
    /// Delta base.
    pub base: Option<ObjectId>,
    /// Size of the decoded content.
    pub content_len: u64,
}

impl Frame {
    /// Whether the frame is a tensor's record, which an index can name before its bytes are
    /// here (everything else is read with the table).
    pub fn is_tensor(&self) -> bool {
        self.record.is_some_and(|r| r.kind == ObjectKind::Tensor)
    }
}

/// The table of `frames`, to be written at `start` of an object (right after a pack's end
/// frame; 0 for a table kept on its own).
pub fn encode_toc(frames: &[Frame], start: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(frames.len() * 60 + TOC_FOOTER as usize);
    for f in frames {
        v.extend_from_slice(f.id.as_bytes());
        v.extend_from_slice(&f.offset.to_le_bytes());
        v.extend_from_slice(&f.len.to_le_bytes());
        match &f.record {
            None => v.extend_from_slice(&[0, 0, 0]),
            Some(r) => {
                v.extend_from_slice(&[r.kind as u8, r.codec, r.base.is_some() as u8]);
                if let Some(b) = &r.base {
                    v.extend_from_slice(b.as_bytes());
                }
                v.extend_from_slice(&r.content_len.to_le_bytes());
            }
        }
    }
    v.extend_from_slice(&(frames.len() as u64).to_le_bytes());
    v.extend_from_slice(&start.to_le_bytes());
    v.extend_from_slice(TOC_MAGIC);
    v
}

/// What the end of an object says about its table of contents.
#[derive(Debug, PartialEq, Eq)]
pub enum Toc {
    /// It has none (a pack written without one).
    Absent,
    /// It starts at this offset, before the bytes given: read from there.
    From(u64),
    /// The table.
    Frames(Vec<Frame>),
}

/// Reads the table of contents from `tail`, the last bytes of an object of `object_len` bytes.
pub fn read_toc(tail: &[u8], object_len: u64) -> Result<Toc> {
    let bad = |why: &str| Error::BadTransfer(format!("pack table of contents: {why}"));
    let Some(footer_at) = tail.len().checked_sub(TOC_FOOTER as usize) else {
        return Ok(Toc::Absent);
    };
    let footer = &tail[footer_at..];
    if &footer[16..] != TOC_MAGIC {
        return Ok(Toc::Absent);
    }
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
    let (n, start) = (u64_at(footer, 0), u64_at(footer, 8));
    let tail_start = object_len
        .checked_sub(tail.len() as u64)
        .ok_or_else(|| bad("more bytes than the object has"))?;
    if start < tail_start {
        return Ok(Toc::From(start));
    }
    let table_end = object_len - TOC_FOOTER;
    if start > table_end {
        return Err(bad("it starts after its end"));
    }
    let mut b = &tail[(start - tail_start) as usize..footer_at];
    // The smallest entry is 59 bytes: no count can claim more entries than the bytes hold.
    if n > (b.len() / 59) as u64 + 1 {
        return Err(bad("more entries than bytes"));
    }
    let mut take = |k: usize| -> Result<&[u8]> {
        if b.len() < k {
            return Err(bad("it ends early"));
        }
        let (head, rest) = b.split_at(k);
        b = rest;
        Ok(head)
    };
    let id = |b: &[u8]| ObjectId::from_bytes(b.try_into().expect("32 bytes"));
    let mut frames = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let fixed = take(51)?;
        let (offset, len) = (u64_at(fixed, 32), u64_at(fixed, 40));
        offset
            .checked_add(len)
            .ok_or_else(|| bad("a frame past the end"))?;
        let record = match fixed[48] {
            0 => None,
            kind => {
                let kind = ObjectKind::try_from(kind).map_err(|_| bad("unknown object kind"))?;
                let base = match fixed[50] {
                    0 => None,
                    1 => Some(id(take(32)?)),
                    _ => return Err(bad("bad base flag")),
                };
                let content_len = u64_at(take(8)?, 0);
                Some(FrameRecord {
                    kind,
                    codec: fixed[49],
                    base,
                    content_len,
                })
            }
        };
        frames.push(Frame {
            id: id(&fixed[..32]),
            offset,
            len,
            record,
        });
    }
    if !b.is_empty() {
        return Err(bad("bytes after its entries"));
    }
    Ok(Toc::Frames(frames))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames() -> Vec<Frame> {
        let (a, b) = (ObjectId::hash(b"a"), ObjectId::hash(b"b"));
        vec![
            Frame {
                id: a,
                offset: 48,
                len: 100,
                record: Some(FrameRecord {
                    kind: ObjectKind::Tensor,
                    codec: 3,
                    base: None,
                    content_len: 400,
                }),
            },
            Frame {
                id: b,
                offset: 188,
                len: 90,
                record: Some(FrameRecord {
                    kind: ObjectKind::Tensor,
                    codec: 4,
                    base: Some(a),
                    content_len: 400,
                }),
            },
            Frame {
                id: ObjectId::hash(b"x"),
                offset: 318,
                len: 23,
                record: None,
            },
        ]
    }

    #[test]
    fn a_table_reads_back_from_the_whole_object_or_its_end() {
        let body = vec![7u8; 400];
        let mut object = body.clone();
        object.extend(encode_toc(&frames(), body.len() as u64));
        let len = object.len() as u64;
        assert_eq!(read_toc(&object, len).unwrap(), Toc::Frames(frames()));
        // Only the last bytes: where to read from, then the table.
        let short = &object[object.len() - 40..];
        assert_eq!(read_toc(short, len).unwrap(), Toc::From(400));
        let from = &object[400..];
        assert_eq!(read_toc(from, len).unwrap(), Toc::Frames(frames()));
        // A table kept on its own.
        let alone = encode_toc(&frames(), 0);
        let n = alone.len() as u64;
        assert_eq!(read_toc(&alone, n).unwrap(), Toc::Frames(frames()));
    }

    #[test]
    fn packs_without_a_table_and_damaged_tables_are_told_apart() {
        let plain = b"MDLPACK1 and then frames".repeat(3);
        assert_eq!(read_toc(&plain, plain.len() as u64).unwrap(), Toc::Absent);
        assert_eq!(read_toc(b"short", 5).unwrap(), Toc::Absent);
        let good = encode_toc(&frames(), 0);
        for cut in [1, 30, 51] {
            let mut bad = good[cut..].to_vec();
            // Its start still claims 0: the entries are not all there.
            let n = bad.len() as u64;
            let start = &mut bad[(n - 16) as usize..(n - 8) as usize];
            start.copy_from_slice(&0u64.to_le_bytes());
            assert!(read_toc(&bad, n).is_err(), "cut {cut}");
        }
    }
}
