//! One commit or manifest read from a pack stream, verified against its id and never stored,
//! or one tensor record's header: what a checkout from a server checks the files it downloads
//! against, without a repository of its own.

use std::io::Read;

use mdl_codec::CodecTag;
use mdl_format::record::{self, RecordHeader, MAX_HEADER_LEN, MAX_META_CONTENT, TRAILER_LEN};
use mdl_format::{Commit, Manifest, ObjectId, ObjectKind};

use super::PACK_MAGIC;
use crate::{Error, Result};

/// Longest record read: a manifest of the longest content stored raw.
const MAX_RECORD: u64 = MAX_META_CONTENT + (MAX_HEADER_LEN + TRAILER_LEN) as u64;

/// Reads a pack stream's start and its first frame's head, which must be `id`'s; the
/// record's length.
fn first_frame(r: &mut dyn Read, id: &ObjectId, what: &str) -> Result<u64> {
    let bad = |why: String| Error::BadTransfer(format!("{what} {id}: {why}"));
    let mut head = [0u8; 48];
    r.read_exact(&mut head)
        .map_err(|e| bad(format!("the pack ends early ({e})")))?;
    if &head[..8] != PACK_MAGIC {
        return Err(bad("not an mdl pack stream".into()));
    }
    if head[8..40] != id.as_bytes()[..] {
        return Err(bad("the pack sends another object".into()));
    }
    Ok(u64::from_le_bytes(
        head[40..48].try_into().expect("8 bytes"),
    ))
}

/// The header of tensor `id`'s record, from a pack stream that sends that record first (the
/// rest of the record is not read): what a checkout from a server checks a coarsened
/// tensor's bytes against.
pub fn read_tensor_header(r: &mut dyn Read, id: &ObjectId) -> Result<RecordHeader> {
    let bad = |why: String| Error::BadTransfer(format!("tensor {id}: {why}"));
    let len = first_frame(r, id, "tensor")?;
    let mut head = Vec::new();
    let want = len.min(MAX_HEADER_LEN as u64);
    r.take(want)
        .read_to_end(&mut head)
        .map_err(|e| bad(format!("the pack ends early ({e})")))?;
    let (header, _) = RecordHeader::decode(&head).map_err(|e| bad(e.to_string()))?;
    if header.kind != ObjectKind::Tensor {
        return Err(bad(format!("a {} record", header.kind)));
    }
    Ok(header)
}

/// Reads the first frame of a pack stream, which must be the record of `id`, a `kind` object;
/// returns its content, its checksum verified and its hash equal to `id`.
fn read_single(r: &mut dyn Read, id: &ObjectId, kind: ObjectKind) -> Result<Vec<u8>> {
    let bad = |why: String| Error::BadTransfer(format!("{kind} {id}: {why}"));
    let len = first_frame(r, id, kind.name())?;
    if len > MAX_RECORD {
        return Err(bad(format!("a record of {len} bytes")));
    }
    let mut bytes = Vec::new();
    r.take(len)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(format!("the pack ends early ({e})")))?;
    if bytes.len() as u64 != len {
        return Err(bad("the pack ends early".into()));
    }
    let (header, payload, trailer) = record::decode(&bytes).map_err(|e| bad(e.to_string()))?;
    if header.kind != kind || header.base.is_some() || header.coarsened.is_some() {
        return Err(bad(format!("a {} record", header.kind)));
    }
    record::check_content_len(&header, payload.len() as u64, trailer.content_len)
        .map_err(|e| bad(e.to_string()))?;
    let codec = CodecTag::try_from(header.codec).map_err(|e| bad(e.to_string()))?;
    let content = mdl_codec::decode_to_vec(codec, payload, trailer.content_len)
        .map_err(|e| bad(e.to_string()))?;
    if ObjectId::hash(&content) != *id {
        return Err(bad("its content does not hash to its id".into()));
    }
    Ok(content)
}

/// The commit `id`, from a pack stream that sends its record first.
pub fn read_commit(r: &mut dyn Read, id: &ObjectId) -> Result<Commit> {
    let bytes = read_single(r, id, ObjectKind::Commit)?;
    Commit::decode(&bytes).map_err(|source| Error::Corrupt { id: *id, source })
}

/// The manifest `id`, from a pack stream that sends its record first.
pub fn read_manifest(r: &mut dyn Read, id: &ObjectId) -> Result<Manifest> {
    let bytes = read_single(r, id, ObjectKind::Manifest)?;
    Manifest::decode(&bytes).map_err(|source| Error::Corrupt { id: *id, source })
}
