//! The container every stored object lives in.
//!
//! ```text
//! header:  magic "MDLR" | version u16 | kind u8 | codec u8 | flags u8 | [base id 32]
//!          | [content id 32 | max_abs_error f64 | rel_error f64] | prefix_len u16 | prefix
//! payload: codec-specific bytes
//! trailer: content_len u64 | payload_len u64 | crc32 u32 (of every byte before it)
//! ```
//!
//! The trailer comes last so a record can be written in one streaming pass. The object's id is
//! `blake3(prefix ‖ decode(payload))`; the prefix is the tensor's canonical header (empty for
//! manifests and commits), except for a *coarsened* record (retention re-encoded a lossy
//! tensor more coarsely, keeping its id so no commit id changes): it names the hash of what it
//! decodes to, and the error it adds to what the id names. See `docs/FORMAT.md`.

use crate::wire::{Reader, Writer};
use crate::{FormatError, ObjectId, ObjectKind, FORMAT_VERSION};

/// The four bytes every record starts with.
pub const MAGIC: [u8; 4] = *b"MDLR";
/// Length of the trailer.
pub const TRAILER_LEN: usize = 20;
/// Longest header a reader needs to look at.
pub const MAX_HEADER_LEN: usize = 4 + 2 + 3 + 32 + COARSENED_LEN + 2 + u16::MAX as usize;

const FLAG_BASE: u8 = 1;
const FLAG_COARSENED: u8 = 2;
const COARSENED_LEN: usize = 32 + 8 + 8;

/// What a coarsened record decodes to, against the content its object id names.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Coarsened {
    /// `blake3(prefix ‖ decoded content)` of this record.
    pub content: ObjectId,
    /// Largest absolute difference from the content the id names.
    pub max_abs_error: f64,
    /// L2 norm of that difference over the L2 norm of the content the id names.
    pub rel_error: f64,
}

// The errors are finite numbers (the writer checks), so equality is total.
impl Eq for Coarsened {}

/// The front of a record: what it is and how its payload is encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// Format version the record was written with.
    pub version: u16,
    /// Which kind of object.
    pub kind: ObjectKind,
    /// Codec tag (interpreted by the codec crate).
    pub codec: u8,
    /// The object a delta codec is relative to.
    pub base: Option<ObjectId>,
    /// Canonical prefix hashed in front of the decoded data.
    pub prefix: Vec<u8>,
    /// Set on a record that decodes to other content than its id names (tensors only).
    pub coarsened: Option<Coarsened>,
}

impl RecordHeader {
    /// A header for the current format version.
    pub fn new(kind: ObjectKind, codec: u8, base: Option<ObjectId>, prefix: Vec<u8>) -> Self {
        assert!(prefix.len() <= u16::MAX as usize, "record prefix too long");
        RecordHeader {
            version: FORMAT_VERSION,
            kind,
            codec,
            base,
            prefix,
            coarsened: None,
        }
    }

    /// The hash the decoded content must have: the object id, or a coarsened record's own.
    pub fn content_id(&self, id: &ObjectId) -> ObjectId {
        self.coarsened.map_or(*id, |c| c.content)
    }

    /// The header's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.buf.extend_from_slice(&MAGIC);
        w.u16(self.version).u8(self.kind as u8).u8(self.codec);
        let flags = if self.base.is_some() { FLAG_BASE } else { 0 }
            | if self.coarsened.is_some() {
                FLAG_COARSENED
            } else {
                0
            };
        w.u8(flags);
        if let Some(b) = &self.base {
            w.id(b);
        }
        if let Some(c) = &self.coarsened {
            w.id(&c.content)
                .u64(c.max_abs_error.to_bits())
                .u64(c.rel_error.to_bits());
        }
        w.u16(self.prefix.len() as u16);
        w.buf.extend_from_slice(&self.prefix);
        w.buf
    }

    /// Parses a header from the start of `bytes`; returns it and its length.
    pub fn decode(bytes: &[u8]) -> Result<(Self, usize), FormatError> {
        let mut r = Reader::new(bytes, "record header");
        if r.take(4)? != MAGIC {
            return Err(FormatError::invalid(
                "record",
                "bad magic (not an mdl record)",
            ));
        }
        let version = r.u16()?;
        if version == 0 || version > FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: "record",
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let kind = ObjectKind::try_from(r.u8()?)?;
        let codec = r.u8()?;
        let flags = r.u8()?;
        if flags & !(FLAG_BASE | FLAG_COARSENED) != 0 {
            return Err(FormatError::invalid(
                "record",
                format!("unknown flags {flags:#x}"),
            ));
        }
        let base = if flags & FLAG_BASE != 0 {
            Some(r.id()?)
        } else {
            None
        };
        let coarsened = if flags & FLAG_COARSENED != 0 {
            let content = r.id()?;
            let max_abs_error = f64::from_bits(r.u64()?);
            let rel_error = f64::from_bits(r.u64()?);
            let valid = |e: f64| e.is_finite() && e >= 0.0;
            if version < 6
                || kind != ObjectKind::Tensor
                || !valid(max_abs_error)
                || !valid(rel_error)
            {
                return Err(FormatError::invalid(
                    "record",
                    "a coarsened record must be a tensor of format 6 or later with finite errors",
                ));
            }
            Some(Coarsened {
                content,
                max_abs_error,
                rel_error,
            })
        } else {
            None
        };
        let n = r.u16()? as usize;
        let prefix = r.take(n)?.to_vec();
        let len = 4
            + 2
            + 3
            + if base.is_some() { 32 } else { 0 }
            + if coarsened.is_some() {
                COARSENED_LEN
            } else {
                0
            }
            + 2
            + n;
        Ok((
            RecordHeader {
                version,
                kind,
                codec,
                base,
                prefix,
                coarsened,
            },
            len,
        ))
    }
}

/// The end of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trailer {
    /// Length of the decoded data (without the prefix).
    pub content_len: u64,
    /// Length of the payload.
    pub payload_len: u64,
    /// crc32 (IEEE) of every record byte before the checksum field.
    pub crc: u32,
}

impl Trailer {
    /// The 16 bytes covered by the checksum, followed by nothing: the caller appends the crc.
    pub fn lengths(content_len: u64, payload_len: u64) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&content_len.to_le_bytes());
        out[8..].copy_from_slice(&payload_len.to_le_bytes());
        out
    }

    /// Parses the last [`TRAILER_LEN`] bytes of a record.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(bytes, "record trailer");
        let t = Trailer {
            content_len: r.u64()?,
            payload_len: r.u64()?,
            crc: r.u32()?,
        };
        r.finish()?;
        Ok(t)
    }
}

/// Largest decoded manifest or commit a record may claim.
pub const MAX_META_CONTENT: u64 = 256 << 20;
/// How many times its payload a manifest or commit may decode to (text compresses well, but
/// not this well), plus a little for tiny payloads.
pub const MAX_META_EXPANSION: u64 = 64;

/// Checks that a record's claimed decoded length is one its bytes can hold, before anything
/// is allocated for it: a tensor's must equal what its header's dtype and shape say; a
/// manifest's or commit's must be a bounded expansion of its payload.
pub fn check_content_len(
    header: &RecordHeader,
    payload_len: u64,
    content_len: u64,
) -> Result<(), FormatError> {
    let ok = match header.kind {
        ObjectKind::Tensor => {
            let t = crate::TensorHeader::from_canonical(&header.prefix)?;
            t.data_len() == Some(content_len)
        }
        ObjectKind::Manifest | ObjectKind::Commit => {
            header.prefix.is_empty()
                && content_len <= MAX_META_CONTENT
                && content_len <= payload_len.saturating_mul(MAX_META_EXPANSION) + 4096
        }
    };
    if ok {
        Ok(())
    } else {
        Err(FormatError::invalid(
            "record",
            format!(
                "claims {content_len} decoded bytes, which its {} header and {payload_len}-byte payload cannot hold",
                header.kind.name()
            ),
        ))
    }
}

/// A whole record held in memory: header, payload and trailer with its checksum.
pub fn encode(header: &RecordHeader, payload: &[u8], content_len: u64) -> Vec<u8> {
    let mut out = header.encode();
    out.extend_from_slice(payload);
    out.extend_from_slice(&Trailer::lengths(content_len, payload.len() as u64));
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Splits an in-memory record into header, payload and trailer, verifying lengths and checksum.
pub fn decode(bytes: &[u8]) -> Result<(RecordHeader, &[u8], Trailer), FormatError> {
    let (header, hlen) = RecordHeader::decode(bytes)?;
    if bytes.len() < hlen + TRAILER_LEN {
        return Err(FormatError::Truncated {
            what: "record",
            needed: hlen + TRAILER_LEN - bytes.len(),
        });
    }
    let tstart = bytes.len() - TRAILER_LEN;
    let trailer = Trailer::decode(&bytes[tstart..])?;
    if trailer.payload_len != (tstart - hlen) as u64 {
        return Err(FormatError::invalid(
            "record",
            format!(
                "payload is {} bytes, trailer says {}",
                tstart - hlen,
                trailer.payload_len
            ),
        ));
    }
    let computed = crc32fast::hash(&bytes[..bytes.len() - 4]);
    if computed != trailer.crc {
        return Err(FormatError::Checksum {
            stored: trailer.crc,
            computed,
        });
    }
    Ok((header, &bytes[hlen..tstart], trailer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_checksum() {
        let h = RecordHeader::new(
            ObjectKind::Tensor,
            1,
            Some(ObjectId::hash(b"b")),
            vec![1, 2, 3],
        );
        let rec = encode(&h, b"payload", 99);
        let (h2, p, t) = decode(&rec).unwrap();
        assert_eq!(h2, h);
        assert_eq!(p, b"payload");
        assert_eq!(t.content_len, 99);
        for i in 0..rec.len() {
            let mut bad = rec.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "flip at {i} not caught");
        }
        for cut in 0..rec.len() {
            assert!(decode(&rec[..cut]).is_err());
        }
    }

    #[test]
    fn coarsened_records_round_trip_and_are_only_tensors() {
        let mut h = RecordHeader::new(ObjectKind::Tensor, 8, Some(ObjectId::hash(b"b")), vec![7]);
        h.coarsened = Some(Coarsened {
            content: ObjectId::hash(b"c"),
            max_abs_error: 0.25,
            rel_error: 0.01,
        });
        let rec = encode(&h, b"payload", 4);
        let (h2, p, _) = decode(&rec).unwrap();
        assert_eq!(h2, h);
        assert_eq!(p, b"payload");
        assert_eq!(h2.content_id(&ObjectId::hash(b"id")), ObjectId::hash(b"c"));
        let mut m = RecordHeader::new(ObjectKind::Manifest, 1, None, Vec::new());
        m.coarsened = h.coarsened;
        assert!(decode(&encode(&m, b"x", 1)).is_err());
        h.coarsened.as_mut().unwrap().rel_error = f64::NAN;
        assert!(decode(&encode(&h, b"x", 1)).is_err());
    }

    #[test]
    fn content_lengths_are_bounded_by_what_the_record_can_hold() {
        let t = crate::TensorHeader::new(crate::Dtype::F32, vec![4, 4]);
        let h = RecordHeader::new(ObjectKind::Tensor, 2, None, t.canonical());
        assert!(check_content_len(&h, 10, 64).is_ok());
        assert!(check_content_len(&h, 10, 1 << 40).is_err());
        let m = RecordHeader::new(ObjectKind::Manifest, 1, None, Vec::new());
        assert!(check_content_len(&m, 1000, 20_000).is_ok());
        assert!(check_content_len(&m, 100, 1 << 30).is_err());
        let bad = RecordHeader::new(ObjectKind::Tensor, 2, None, vec![9, 9]);
        assert!(check_content_len(&bad, 10, 0).is_err());
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = decode(&bytes);
        }
    }
}
