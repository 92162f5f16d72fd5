//! A pack stream read frame by frame: the stream watched for a cut (it ends or fails before the
//! pack's end), a tensor record's payload copied as it arrives and checked against its trailer,
//! the reads every frame makes, and an expired frame's fields.

use std::io::{Read, Write};

use mdl_format::record::{RecordHeader, Trailer, TRAILER_LEN};
use mdl_format::{ObjectId, ObjectKind, Timestamp};
use mdl_store::Expired;

use super::bad_pack;
use super::pack::MAX_RULE_LEN;
use crate::{Error, Result};

/// Bytes of a frame read at a time.
const PIECE: usize = 1 << 20;

/// A pack stream, noting whether it ended or failed before the pack's end (every read is
/// for bytes the pack still owes).
pub(super) struct Watched<'a> {
    pub(super) inner: &'a mut dyn Read,
    pub(super) cut: bool,
}

impl Read for Watched<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf);
        match &read {
            Ok(0) if !buf.is_empty() => self.cut = true,
            Err(e) if e.kind() != std::io::ErrorKind::Interrupted => self.cut = true,
            _ => {}
        }
        read
    }
}

/// A tensor record arriving in a frame: what its first bytes (`head`) said, and what the
/// rest must agree with.
pub(super) struct Sent<'a> {
    pub(super) id: &'a ObjectId,
    pub(super) header: &'a RecordHeader,
    /// The frame's first bytes: the header, and the payload's start.
    pub(super) head: &'a [u8],
    pub(super) header_len: usize,
    pub(super) payload_len: u64,
    pub(super) content_len: u64,
}

/// Why copying a record stopped: the sender's bytes were refused, or writing them here failed.
pub(super) enum Copied {
    /// The sender's bytes were refused.
    Refused(Error),
    /// Writing them here failed.
    Here(std::io::Error),
}

impl Sent<'_> {
    /// Copies the rest of the record's payload from `r` to `w` (what `head` holds of it
    /// first), a piece at a time, then reads its trailer and checks it: the lengths, and the
    /// checksum of every byte before it.
    pub(super) fn copy(
        &self,
        r: &mut dyn Read,
        w: &mut dyn Write,
    ) -> std::result::Result<(), Copied> {
        let mut crc = crc32fast::Hasher::new();
        crc.update(self.head);
        w.write_all(&self.head[self.header_len..])
            .map_err(Copied::Here)?;
        let mut left = self.payload_len - (self.head.len() - self.header_len) as u64;
        let mut buf = vec![0u8; PIECE.min(left as usize)];
        while left > 0 {
            // What arrives is written at once: a stream cut off leaves all of it written.
            let n = read_some(r, &mut buf[..PIECE.min(left as usize)]).map_err(Copied::Refused)?;
            crc.update(&buf[..n]);
            w.write_all(&buf[..n]).map_err(Copied::Here)?;
            left -= n as u64;
        }
        let mut trailer = [0u8; TRAILER_LEN];
        read_exact(r, &mut trailer).map_err(Copied::Refused)?;
        crc.update(&trailer[..TRAILER_LEN - 4]);
        match self.trailer_fault(&trailer, crc.finalize()) {
            Some(why) => Err(Copied::Refused(bad_pack(format!(
                "record of {}: {why}",
                self.id
            )))),
            None => Ok(()),
        }
    }

    /// Appends the record's whole payload to `out` (read straight into it: a receiver's
    /// buffer reused record after record), then reads its trailer and checks it as
    /// [`Self::copy`] does. `out` is as it was on an error.
    pub(super) fn read_into(&self, r: &mut dyn Read, out: &mut Vec<u8>) -> Result<()> {
        let start = out.len();
        let held = &self.head[self.header_len..];
        let mut crc = crc32fast::Hasher::new();
        crc.update(self.head);
        out.extend_from_slice(held);
        let at = out.len();
        out.resize(start + self.payload_len as usize, 0);
        let read = read_exact(r, &mut out[at..]).and_then(|()| {
            crc.update(&out[at..]);
            let mut trailer = [0u8; TRAILER_LEN];
            read_exact(r, &mut trailer)?;
            crc.update(&trailer[..TRAILER_LEN - 4]);
            match self.trailer_fault(&trailer, crc.finalize()) {
                Some(why) => Err(bad_pack(format!("record of {}: {why}", self.id))),
                None => Ok(()),
            }
        });
        if read.is_err() {
            out.truncate(start);
        }
        read
    }

    /// What is wrong with the record's `trailer`, given the checksum of what came before it.
    fn trailer_fault(&self, trailer: &[u8; TRAILER_LEN], crc: u32) -> Option<String> {
        let t = match Trailer::decode(trailer) {
            Err(e) => return Some(e.to_string()),
            Ok(t) => t,
        };
        if t.content_len != self.content_len {
            let claim =
                mdl_format::record::check_content_len(self.header, self.payload_len, t.content_len);
            return Some(claim.err().map_or_else(
                || "its trailer disagrees with its header".into(),
                |e| e.to_string(),
            ));
        }
        if t.payload_len != self.payload_len {
            return Some("its trailer disagrees with its length".into());
        }
        (crc.to_le_bytes() != trailer[TRAILER_LEN - 4..]).then(|| "checksum mismatch".into())
    }
}

/// Reads a frame's record of `len` bytes, holding memory only for bytes that arrive (a
/// length that lies ends in "ends early", not in a huge allocation), and failing cleanly if
/// memory runs out.
pub(super) fn read_frame(r: &mut dyn Read, len: u64) -> Result<Vec<u8>> {
    let mut buf: Vec<u8> = Vec::new();
    let mut left = len;
    while left > 0 {
        let step = left.min(8 << 20) as usize;
        buf.try_reserve(step)
            .map_err(|_| bad_pack(format!("no memory for a record of {len} bytes")))?;
        let start = buf.len();
        buf.resize(start + step, 0);
        read_exact(r, &mut buf[start..])?;
        left -= step as u64;
    }
    Ok(buf)
}

/// Reads and drops `len` bytes (a record the repository already has).
pub(super) fn skip(r: &mut dyn Read, len: u64) -> Result<()> {
    let copied =
        std::io::copy(&mut r.take(len), &mut std::io::sink()).map_err(|e| Error::Input {
            path: "<transfer>".into(),
            source: e,
        })?;
    if copied < len {
        return Err(bad_pack("pack stream ends early"));
    }
    Ok(())
}

/// Reads at least one byte into `buf` (not empty): how many.
fn read_some(r: &mut dyn Read, buf: &mut [u8]) -> Result<usize> {
    loop {
        match r.read(buf) {
            Ok(0) => return Err(bad_pack("pack stream ends early")),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::Input {
                    path: "<transfer>".into(),
                    source: e,
                })
            }
        }
    }
}

pub(super) fn read_exact(r: &mut dyn Read, buf: &mut [u8]) -> Result<()> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => bad_pack("pack stream ends early"),
        _ => Error::Input {
            path: "<transfer>".into(),
            source: e,
        },
    })
}

/// Reads the rest of an expired frame; with its length.
pub(super) fn read_expired(r: &mut dyn Read, id: &ObjectId) -> Result<(Expired, u64)> {
    let mut fixed = [0u8; 19];
    read_exact(r, &mut fixed)?;
    let kind = ObjectKind::try_from(fixed[0])
        .ok()
        .filter(|k| *k == ObjectKind::Tensor)
        .ok_or_else(|| bad_pack(format!("{id}: only tensors expire")))?;
    let content_len = u64::from_le_bytes(fixed[1..9].try_into().expect("8 bytes"));
    let time = Timestamp(i64::from_le_bytes(
        fixed[9..17].try_into().expect("8 bytes"),
    ));
    let n = u16::from_le_bytes(fixed[17..19].try_into().expect("2 bytes")) as usize;
    if n > MAX_RULE_LEN {
        return Err(bad_pack(format!("{id}: expiry rule of {n} bytes")));
    }
    let mut rule = vec![0u8; n];
    read_exact(r, &mut rule)?;
    let rule = String::from_utf8(rule).map_err(|_| bad_pack(format!("{id}: rule not UTF-8")))?;
    let expired = Expired {
        kind,
        content_len,
        time,
        rule,
    };
    Ok((expired, fixed.len() as u64 + n as u64))
}
