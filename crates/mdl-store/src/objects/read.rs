//! Verified reads: records opened, checked and decoded, delta chains resolved, every byte
//! verified against its checksum and its id.

use std::io::{self, Write};
use std::path::PathBuf;

use mdl_codec::qrecord::QuantTensor;
use mdl_codec::{float, CodecTag};
use mdl_format::record::{self, RecordHeader, Trailer};
use mdl_format::{FormatError, ObjectId, TensorHeader};

use crate::{IndexEntry, Store, StoreError};

use super::{buffers, zeroed, RecordFile, MAX_CHAIN};

impl Store {
    /// Runs a read of `id` starting from `entry`; if a record file is gone because compaction
    /// or gc re-encoded the object (or a base) after `entry` was read, or the chain read does
    /// not hold together because maintenance turned it round meanwhile (a forward delta
    /// re-encoded as a reverse one: the stale entry and a fresh base then point at each
    /// other), runs it again from the index's current entries. A reader never fails because
    /// maintenance ran beside it; a record truly damaged is reported after a few tries.
    pub(super) fn reread<R>(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        mut read: impl FnMut(&IndexEntry) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut current = *entry;
        let mut attempts = 0;
        loop {
            match read(&current) {
                Err(e @ (StoreError::Missing(_) | StoreError::Corrupt { .. }))
                    if attempts < REREADS =>
                {
                    attempts += 1;
                    match self.meta().read()?.object(id)? {
                        Some(fresh) => current = fresh,
                        None => return Err(e),
                    }
                }
                other => return other,
            }
        }
    }

    /// Decodes an object into `out`, verifying the record checksum and the content hash.
    ///
    /// Bytes reach `out` while decoding proceeds; if verification fails at the end an error is
    /// returned and the caller must discard what was written.
    pub fn read_object(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        out: &mut dyn Write,
    ) -> Result<u64, StoreError> {
        // A window at a time: memory stays bounded whatever the object's size. Every record
        // is opened (and a moved one found again) before anything reaches `out`.
        let mut buf = Vec::new();
        self.tensor_windows(id, entry)?
            .for_each(&mut buf, |_, bytes| {
                out.write_all(bytes).map_err(StoreError::Output)
            })?;
        Ok(entry.content_len)
    }

    /// Decodes a tensor into memory, resolving its delta chain; every record's checksum and the
    /// final content hash are verified. Tensors of any codec are accepted.
    pub fn load_tensor(&self, id: &ObjectId, entry: &IndexEntry) -> Result<Vec<u8>, StoreError> {
        let mut out = zeroed(entry.content_len)?;
        self.load_tensor_into(id, entry, &mut out)?;
        Ok(out)
    }

    /// Like [`Self::load_tensor`], decoding into `out` (exactly the content length), e.g. a
    /// slice of a memory-mapped output file. On error `out` holds garbage.
    pub fn load_tensor_into(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        out: &mut [u8],
    ) -> Result<(), StoreError> {
        if out.len() as u64 != entry.content_len {
            return Err(StoreError::Output(io::Error::other(
                "output size differs from the object's",
            )));
        }
        self.reread(id, entry, |e| self.materialize(id, e, chain_budget(e), out))
    }

    /// Decodes `id` into `out`, its delta chain bottom up: the object the chain ends at first,
    /// then each level against the one below, through two buffers whatever the chain's depth.
    /// `budget`: the base steps allowed before the chain counts as a cycle.
    fn materialize(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        budget: u32,
        out: &mut [u8],
    ) -> Result<(), StoreError> {
        // A chain's end may be kept decoded (`tips.rs`): then it is read, and checked against
        // the hash its own record names.
        if entry.base.is_some()
            && self.tip_into(id, entry, out, || {
                self.with_record(id, entry, |bytes| {
                    let (header, _) = check_any_record(id, entry, bytes)?;
                    Ok((header.prefix.clone(), header.content_id(id)))
                })
            })?
        {
            return Ok(());
        }
        // From `id` down: each level's base is the next, the last decodes on its own.
        let mut chain = vec![(*id, *entry, budget)];
        loop {
            let &(top_id, top, left) = chain.last().expect("the object itself");
            if decodes_alone(&top) {
                break;
            }
            if left == 0 {
                return Err(corrupt(&top_id, &top)(FormatError::invalid(
                    "delta chain",
                    "longer than the index records (a cycle?)",
                )));
            }
            let Some(base_id) = top.base else { break };
            let base = self.base_entry(&top_id, &top, &base_id)?;
            chain.push((base_id, base, left - 1));
        }
        let (bottom, upper) = chain.split_last().expect("the object itself");
        if upper.is_empty() {
            return self.decode_level(bottom, None, out, Verify::Content);
        }
        let mut below = zeroed(entry.content_len)?;
        self.decode_level(bottom, None, &mut below, Verify::Content)?;
        let mut spare = Vec::new();
        for level in upper[1..].iter().rev() {
            if spare.is_empty() {
                spare = zeroed(entry.content_len)?;
            }
            // Levels between the bottom and the top: their records' checksums are checked,
            // their content is vouched for by the top's hash (DECISIONS, "A chain is verified
            // at its top").
            self.decode_level(level, Some(&below), &mut spare, Verify::Record)?;
            std::mem::swap(&mut below, &mut spare);
        }
        self.decode_level(&upper[0], Some(&below), out, Verify::Content)
    }

    /// Decodes one level of a chain into `out`: against `base` (the level below, decoded), or
    /// on its own where [`decodes_alone`] says so or the object has no base. A level decoded
    /// on its own always has its content hashed; one decoded against its base, as `verify`
    /// says.
    fn decode_level(
        &self,
        &(id, entry, budget): &(ObjectId, IndexEntry, u32),
        base: Option<&[u8]>,
        out: &mut [u8],
        verify: Verify,
    ) -> Result<(), StoreError> {
        let corrupt = corrupt(&id, &entry);
        let codec = CodecTag::try_from(entry.codec).map_err(corrupt)?;
        if in_memory_stream(codec, &entry) {
            return self.with_record(&id, &entry, |bytes| {
                let (header, payload) = check_any_record(&id, &entry, bytes)?;
                mdl_codec::decode_into(codec, payload, out)
                    .map_err(|e| corrupt(FormatError::invalid("payload", e.to_string())))?;
                let expected = header.content_id(&id);
                self.verify_content(&id, &entry, &header.prefix, &expected, out)
            });
        }
        if codec.is_streaming() && entry.base.is_none() {
            let mut w = &mut out[..];
            self.read_object(&id, &entry, &mut w)?;
            return Ok(());
        }
        if codec.is_quant() {
            let (q, prefix) = self.load_quant_chain(&id, &entry, budget)?;
            q.render(out);
            return self.verify_content(&id, &entry, &prefix, &id, out);
        }
        if codec == CodecTag::Cast {
            return self.decode_cast(&id, &entry, out);
        }
        self.with_record(&id, &entry, |bytes| {
            self.decode_record(&id, &entry, bytes, base, out, verify)
        })
    }

    /// Decodes a `cast` record into `out`: its base (the fp32 master, twice its size) read
    /// whole and verified, cast, its exceptions applied, the result hashed. The base's chain
    /// is read with its own entry's budget: a chain of casts ends, each base being twice the
    /// size of what casts from it.
    fn decode_cast(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        out: &mut [u8],
    ) -> Result<(), StoreError> {
        let corrupt = corrupt(id, entry);
        let base_id = entry
            .base
            .ok_or(corrupt(FormatError::invalid("cast", "record has no base")))?;
        let base_entry = self
            .meta()
            .read()?
            .object(&base_id)?
            .ok_or(StoreError::Missing(base_id))?;
        if base_entry.content_len != 2 * entry.content_len {
            return Err(corrupt(FormatError::invalid(
                "cast",
                "base is not twice the object's size",
            )));
        }
        let master = self.load_tensor(&base_id, &base_entry)?;
        self.with_record(id, entry, |bytes| {
            let (header, payload, tensor) = self.check_record(id, entry, bytes)?;
            mdl_codec::cast::decode(tensor.dtype, &master, payload, out).map_err(corrupt)?;
            self.verify_content(id, entry, &header.prefix, &header.content_id(id), out)
        })
    }

    /// The index entry of `id`'s base, checked to be the same size.
    pub(super) fn base_entry(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        base_id: &ObjectId,
    ) -> Result<IndexEntry, StoreError> {
        let base_entry = self
            .meta()
            .read()?
            .object(base_id)?
            .ok_or(StoreError::Missing(*base_id))?;
        if base_entry.content_len != entry.content_len {
            return Err(corrupt(id, entry)(FormatError::invalid(
                "delta",
                "base size differs from the object's",
            )));
        }
        Ok(base_entry)
    }

    /// Checks that `prefix` (a canonical tensor header) followed by `out` hashes to `expected`
    /// (object `id`'s own id, or the content a coarsened record of it names). The engine
    /// hashes: where it decoded `out` onto a device, the device's bytes are what is checked.
    fn verify_content(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        prefix: &[u8],
        expected: &ObjectId,
        out: &[u8],
    ) -> Result<(), StoreError> {
        let actual = self.engine().content_id(prefix, out);
        if actual != *expected {
            return Err(corrupt(id, entry)(FormatError::HashMismatch {
                expected: *expected,
                actual,
            }));
        }
        Ok(())
    }

    /// Runs `f` on the bytes of `id`'s record file.
    fn with_record<R>(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        f: impl FnOnce(&[u8]) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let file = self.open_record_file(id, entry)?;
        // Record bytes go through a reused buffer (nested reads take their own): fresh large
        // buffers cost a page fault per 4 KiB.
        let mut bytes = buffers::take();
        let result = match file.read_all(&mut bytes) {
            Ok(()) => f(&bytes),
            Err(e) => Err(StoreError::Io {
                op: "read",
                path: file.path,
                source: e,
            }),
        };
        buffers::give_back(bytes);
        result
    }

    /// Decodes a quantized tensor (codes, table, protected values), resolving its chain of
    /// quant deltas: each delta applies to its base's codes. Record checksums are verified at
    /// every level; the content hash is verified by whoever renders the result
    /// ([`Self::load_tensor`] does).
    pub fn load_quant(&self, id: &ObjectId, entry: &IndexEntry) -> Result<QuantTensor, StoreError> {
        self.reread(id, entry, |e| {
            Ok(self.load_quant_chain(id, e, chain_budget(e))?.0)
        })
    }

    /// [`Self::load_quant`] with a chain budget; also returns the record's canonical tensor
    /// header (what the content hash starts with).
    fn load_quant_chain(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        budget: u32,
    ) -> Result<(QuantTensor, Vec<u8>), StoreError> {
        let corrupt = corrupt(id, entry);
        let codec = CodecTag::try_from(entry.codec).map_err(corrupt)?;
        if !codec.is_quant() {
            return Err(corrupt(FormatError::invalid(
                "quant chain",
                format!("{codec} record where a quantized one was expected"),
            )));
        }
        if budget == 0 {
            return Err(corrupt(FormatError::invalid(
                "delta chain",
                "longer than the index records (a cycle?)",
            )));
        }
        let base = match &entry.base {
            Some(base_id) => {
                let base_entry = self.base_entry(id, entry, base_id)?;
                Some(self.load_quant_chain(base_id, &base_entry, budget - 1)?.0)
            }
            None => None,
        };
        self.with_record(id, entry, |bytes| {
            let (header, payload, tensor) = self.check_record(id, entry, bytes)?;
            if header.coarsened.is_some() {
                // Its codes are what quant-delta records build on: they must render to the id.
                return Err(corrupt(FormatError::invalid(
                    "record",
                    "a quant record cannot be coarsened",
                )));
            }
            let n = (entry.content_len / tensor.dtype.size() as u64) as usize;
            let q = QuantTensor::decode(
                self.engine(),
                tensor.dtype,
                n,
                payload,
                base.as_ref().map(|b| &b.codes[..]),
            )
            .map_err(corrupt)?;
            Ok((q, header.prefix))
        })
    }

    /// Parses a whole in-memory record and checks it against the index entry.
    fn check_record<'b>(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        bytes: &'b [u8],
    ) -> Result<(RecordHeader, &'b [u8], TensorHeader), StoreError> {
        let (header, payload) = check_any_record(id, entry, bytes)?;
        let tensor = tensor_header(&header, entry).map_err(corrupt(id, entry))?;
        Ok((header, payload, tensor))
    }

    /// Decodes a whole in-memory record of a chunked codec into `out`, verifying it.
    fn decode_record(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        bytes: &[u8],
        base: Option<&[u8]>,
        out: &mut [u8],
        verify: Verify,
    ) -> Result<(), StoreError> {
        let corrupt = corrupt(id, entry);
        let codec = CodecTag::try_from(entry.codec).map_err(corrupt)?;
        let (header, payload, tensor) = self.check_record(id, entry, bytes)?;
        match codec {
            CodecTag::FloatSplit | CodecTag::XorDelta | CodecTag::MantissaTrim => {
                float::decode(self.engine(), tensor.dtype, payload, base, out).map_err(corrupt)?
            }
            CodecTag::SubDelta => {
                let base = base.ok_or(corrupt(FormatError::invalid(
                    "sub-delta",
                    "record has no base",
                )))?;
                float::decode_sub(self.engine(), tensor.dtype, payload, base, out)
                    .map_err(corrupt)?
            }
            CodecTag::QuantResidual => {
                let base = base.ok_or(corrupt(FormatError::invalid(
                    "quant-residual",
                    "record has no base",
                )))?;
                self.engine()
                    .residual_decode(tensor.dtype, payload, Some(base), out)
                    .map_err(corrupt)?
            }
            CodecTag::QuantUniform => self
                .engine()
                .residual_decode(tensor.dtype, payload, None, out)
                .map_err(corrupt)?,
            CodecTag::Raw
            | CodecTag::Zstd
            | CodecTag::QuantBase
            | CodecTag::QuantDelta
            | CodecTag::Cast => {
                return Err(corrupt(FormatError::invalid(
                    "record",
                    format!("{codec} records are not decoded here"),
                )))
            }
        }
        match verify {
            Verify::Content => {
                self.verify_content(id, entry, &header.prefix, &header.content_id(id), out)
            }
            Verify::Record => Ok(()),
        }
    }

    /// The header of an object's record (kind, codec, base, and for tensors the canonical tensor
    /// header), read without the payload. Nothing is verified beyond the header's own format.
    pub fn record_header(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
    ) -> Result<RecordHeader, StoreError> {
        // A record re-encoded meanwhile is read where the index now says.
        self.reread(id, entry, |e| Ok(self.open_record(id, e)?.header))
    }

    /// Opens an object's record file and parses its header.
    pub(super) fn open_record(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
    ) -> Result<OpenRecord, StoreError> {
        let file = self.open_record_file(id, entry)?;
        let (path, len) = (file.path.clone(), file.len);
        let (header, header_len, head) = read_header(&file, len).map_err(|e| match e {
            HeaderError::Io(source) => StoreError::io("read", &path)(source),
            HeaderError::Format(f) => corrupt(id, entry)(f),
        })?;
        Ok(OpenRecord {
            file,
            path,
            len,
            header,
            header_len,
            head,
        })
    }

    /// The bytes of an object's record file, as stored (for sending it to another repository).
    /// The checksum is verified; the content is verified by the receiver.
    pub fn read_record(&self, id: &ObjectId, entry: &IndexEntry) -> Result<Vec<u8>, StoreError> {
        Ok(self.read_current_record(id, entry)?.0)
    }

    /// [`Self::read_record`] of the record the index names now, with its entry: `entry`'s, or,
    /// where a re-encode (a deferred reverse delta, gc) replaced that record meanwhile, the
    /// new one's. A sender takes the codec and base it describes from that entry.
    pub fn read_current_record(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
    ) -> Result<(Vec<u8>, IndexEntry), StoreError> {
        self.reread(id, entry, |e| {
            let file = self.open_record_file(id, e)?;
            let mut bytes = Vec::new();
            file.read_all(&mut bytes)
                .map_err(StoreError::io("read", &file.path))?;
            record::decode(&bytes).map_err(corrupt(id, e))?;
            Ok((bytes, *e))
        })
    }

    /// Decodes a whole object into memory (manifests, commits, tensors for diffs).
    pub fn read_object_vec(&self, id: &ObjectId) -> Result<Vec<u8>, StoreError> {
        let entry = self
            .meta()
            .read()?
            .object(id)?
            .ok_or(StoreError::Missing(*id))?;
        let mut out = Vec::with_capacity(entry.content_len.min(1 << 30) as usize);
        self.read_object(id, &entry, &mut out)?;
        Ok(out)
    }
}

/// Checks a whole record of any kind of object against its checksum and the index; returns
/// its header and payload.
fn check_any_record<'b>(
    id: &ObjectId,
    entry: &IndexEntry,
    bytes: &'b [u8],
) -> Result<(RecordHeader, &'b [u8]), StoreError> {
    let corrupt = corrupt(id, entry);
    let codec = CodecTag::try_from(entry.codec).map_err(corrupt)?;
    let (header, payload, trailer) = record::decode(bytes).map_err(corrupt)?;
    agrees_with_index(&header, &trailer, None, entry, codec).map_err(corrupt)?;
    Ok((header, payload))
}

/// What a decoded level is checked against: its record's checksum always ([`Verify::Record`]),
/// and with [`Verify::Content`] the hash of the content it decoded to.
#[derive(Clone, Copy)]
enum Verify {
    Record,
    Content,
}

/// Whether an object decodes without its base's content (a quantized object resolves its own
/// chain of code deltas, a cast reads its master itself); an unknown codec counts as one, for
/// its level to report it.
fn decodes_alone(entry: &IndexEntry) -> bool {
    CodecTag::try_from(entry.codec).map_or(true, |codec| {
        (codec.is_streaming() && entry.base.is_none())
            || codec.is_quant()
            || codec == CodecTag::Cast
    })
}

/// Whether `entry`, a record of `codec`, is a small record of a streaming codec, read and
/// decoded whole in memory: streaming one costs a read buffer and a decoder context larger
/// than the tensor.
pub(super) fn in_memory_stream(codec: CodecTag, entry: &IndexEntry) -> bool {
    codec.is_streaming()
        && entry.base.is_none()
        && entry.content_len <= mdl_codec::IN_MEMORY_STREAM
        && entry.stored_len <= mdl_codec::IN_MEMORY_STREAM
}

/// How many delta steps a read of `entry` may follow: a chain can never be longer than the
/// index says; the budget also stops cycles in a damaged index.
pub(super) fn chain_budget(entry: &IndexEntry) -> u32 {
    entry.depth.saturating_add(1).min(MAX_CHAIN)
}

/// How often a read starts again after a record moved under it.
const REREADS: u32 = 3;

/// Maps a format error in `id`'s record to [`StoreError::Corrupt`] naming the object.
pub(super) fn corrupt(
    id: &ObjectId,
    entry: &IndexEntry,
) -> impl Fn(FormatError) -> StoreError + Copy {
    let (id, kind) = (*id, entry.kind.name());
    move |source| StoreError::Corrupt { id, kind, source }
}

/// Checks a record's header and trailer against its index entry (and, where the caller
/// measured it, its payload length against the trailer's).
pub(crate) fn agrees_with_index(
    header: &RecordHeader,
    trailer: &Trailer,
    payload_len: Option<u64>,
    entry: &IndexEntry,
    codec: CodecTag,
) -> Result<(), FormatError> {
    if payload_len.is_some_and(|n| n != trailer.payload_len)
        || trailer.content_len != entry.content_len
        || header.kind != entry.kind
        || header.codec != entry.codec
        || header.base != entry.base
        || header.base.is_some() != codec.has_base()
    {
        return Err(FormatError::invalid(
            "record",
            "codec, base, lengths or kind disagree with the index",
        ));
    }
    Ok(())
}

/// The tensor header a record's prefix holds, checked against the entry's content length.
pub(super) fn tensor_header(
    header: &RecordHeader,
    entry: &IndexEntry,
) -> Result<TensorHeader, FormatError> {
    let tensor = TensorHeader::from_canonical(&header.prefix)?;
    if tensor.data_len() != Some(entry.content_len) {
        return Err(FormatError::invalid(
            "record",
            "tensor shape disagrees with the content length",
        ));
    }
    Ok(tensor)
}

/// A record file opened and its header parsed.
pub(super) struct OpenRecord {
    pub(super) file: RecordFile,
    pub(super) path: PathBuf,
    /// The record's length.
    pub(super) len: u64,
    pub(super) header: RecordHeader,
    /// Bytes the encoded header takes.
    pub(super) header_len: usize,
    /// The first bytes of the file, read to parse the header.
    pub(super) head: Vec<u8>,
}

enum HeaderError {
    Io(io::Error),
    Format(FormatError),
}

fn read_header(file: &RecordFile, len: u64) -> Result<(RecordHeader, usize, Vec<u8>), HeaderError> {
    let mut want = len.min(1024) as usize;
    loop {
        let mut head = vec![0u8; want];
        file.read_exact_at(&mut head, 0).map_err(HeaderError::Io)?;
        match RecordHeader::decode(&head) {
            Ok((h, n)) => return Ok((h, n, head)),
            Err(FormatError::Truncated { .. })
                if (want as u64) < len && want < record::MAX_HEADER_LEN =>
            {
                want = len.min(record::MAX_HEADER_LEN as u64) as usize;
            }
            Err(e) => return Err(HeaderError::Format(e)),
        }
    }
}
