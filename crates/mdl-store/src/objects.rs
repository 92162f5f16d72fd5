//! Object records: the one atomic write helper, and verified streaming reads.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use mdl_codec::qrecord::QuantTensor;
use mdl_codec::{float, CodecTag, EncodeOptions};
use mdl_format::record::{self, RecordHeader, Trailer, TRAILER_LEN};
use mdl_format::{FormatError, ObjectId, ObjectKind, TensorHasher, TensorHeader, Timestamp};

use crate::fs::StorageFile;
use crate::{IndexEntry, Store, StoreError};

/// Prefix of temporary files in object directories; anything named so is an interrupted write.
pub const TEMP_PREFIX: &str = ".tmp-";

/// The result of storing one object.
#[derive(Clone, Copy, Debug)]
pub struct PutOutcome {
    /// The object.
    pub id: ObjectId,
    /// Its new index entry.
    pub entry: IndexEntry,
}

/// Records written for one operation. Their directories are made durable by
/// [`ObjectBatch::finish`], which must precede the index transaction that publishes them.
pub struct ObjectBatch<'s> {
    store: &'s Store,
    /// Record files written, to be made durable by [`ObjectBatch::finish`].
    files: Mutex<Vec<PathBuf>>,
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

#[derive(Debug)]
struct NotSmaller;

impl std::fmt::Display for NotSmaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("encoding is not smaller than raw")
    }
}

impl std::error::Error for NotSmaller {}

fn is_not_smaller(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<NotSmaller>())
}

/// Counts and checksums what is written, refusing to exceed a payload cap.
struct RecordSink {
    inner: BufWriter<Box<dyn StorageFile>>,
    crc: crc32fast::Hasher,
    written: u64,
    cap: u64,
}

impl Write for RecordSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.written + buf.len() as u64 > self.cap {
            return Err(io::Error::other(NotSmaller));
        }
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Store {
    /// Path of an object's record file of the given generation.
    pub fn record_path(&self, id: &ObjectId, generation: u32) -> PathBuf {
        let hex = id.to_hex();
        self.dir
            .join("objects")
            .join(&hex[..2])
            .join(format!("{}.{generation}", &hex[2..]))
    }

    /// Starts a batch of record writes.
    pub fn batch(&self) -> ObjectBatch<'_> {
        ObjectBatch {
            store: self,
            files: Mutex::new(Vec::new()),
        }
    }

    /// Runs a read of `id` starting from `entry`; if a record file is gone because compaction
    /// or gc re-encoded the object (or a base) after `entry` was read, runs it again from the
    /// index's current entries. A reader never fails because maintenance ran beside it.
    fn reread<R>(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        mut read: impl FnMut(&IndexEntry) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut current = *entry;
        let mut attempts = 0;
        loop {
            match read(&current) {
                Err(StoreError::Missing(gone)) if attempts < REREADS => {
                    attempts += 1;
                    match self.meta().read()?.object(id)? {
                        Some(fresh) => current = fresh,
                        None => return Err(StoreError::Missing(gone)),
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
        // A missing record is found when it is opened, before anything reaches `out`.
        self.reread(id, entry, |e| self.read_object_once(id, e, out))
    }

    fn read_object_once(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        out: &mut dyn Write,
    ) -> Result<u64, StoreError> {
        let corrupt = corrupt(id, entry);
        // Deltas and the chunked codecs decode whole tensors in memory; the index says which
        // before the record is opened (and the record is checked against it there).
        if entry.base.is_some()
            || !CodecTag::try_from(entry.codec)
                .map_err(corrupt)?
                .is_streaming()
        {
            let mut data = zeroed(entry.content_len)?;
            self.materialize(id, entry, chain_budget(entry), &mut data)?;
            out.write_all(&data).map_err(StoreError::Output)?;
            return Ok(data.len() as u64);
        }
        let OpenRecord {
            file,
            path,
            len,
            header,
            header_len: hlen,
            head,
        } = self.open_record(id, entry)?;
        if (len as usize) < hlen + TRAILER_LEN {
            return Err(corrupt(FormatError::Truncated {
                what: "record",
                needed: hlen + TRAILER_LEN - len as usize,
            }));
        }
        let mut tbytes = [0u8; TRAILER_LEN];
        file.read_exact_at(&mut tbytes, len - TRAILER_LEN as u64)
            .map_err(StoreError::io("read", &path))?;
        let trailer = Trailer::decode(&tbytes).map_err(corrupt)?;
        let payload_len = len - hlen as u64 - TRAILER_LEN as u64;
        if trailer.payload_len != payload_len
            || trailer.content_len != entry.content_len
            || header.kind != entry.kind
        {
            return Err(corrupt(FormatError::invalid(
                "record",
                "lengths or kind disagree with the index",
            )));
        }
        let codec = CodecTag::try_from(header.codec).map_err(corrupt)?;
        if header.base != entry.base || header.codec != entry.codec {
            return Err(corrupt(FormatError::invalid(
                "record",
                "codec or base disagrees with the index",
            )));
        }

        let mut crc = crc32fast::Hasher::new();
        crc.update(&head[..hlen]);
        let mut reader = BufReader::with_capacity(1 << 18, &file);
        io::Seek::seek(&mut reader, io::SeekFrom::Start(hlen as u64))
            .map_err(StoreError::io("seek", &path))?;
        let mut payload = CrcReader {
            inner: reader.take(payload_len),
            crc,
        };
        let mut hasher = TensorHasher::new(&header.prefix);
        let mut total = 0u64;
        {
            let mut dec = mdl_codec::decoder(codec, Box::new(&mut payload), trailer.content_len)
                .map_err(|e| corrupt(FormatError::invalid("payload", e.to_string())))?;
            let mut buf = vec![0u8; 1 << 18];
            loop {
                let n = match dec.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(corrupt(FormatError::invalid("payload", e.to_string()))),
                };
                hasher.update(&buf[..n]);
                out.write_all(&buf[..n]).map_err(StoreError::Output)?;
                total += n as u64;
            }
        }
        // Checksum the rest of the payload the decoder did not need to look at.
        io::copy(&mut payload, &mut io::sink()).map_err(StoreError::io("read", &path))?;
        let mut crc = payload.crc;
        crc.update(&tbytes[..16]);
        let computed = crc.finalize();
        if computed != trailer.crc {
            return Err(corrupt(FormatError::Checksum {
                stored: trailer.crc,
                computed,
            }));
        }
        let actual = hasher.finalize();
        if actual != *id {
            return Err(corrupt(FormatError::HashMismatch {
                expected: *id,
                actual,
            }));
        }
        Ok(total)
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

    fn materialize(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        budget: u32,
        out: &mut [u8],
    ) -> Result<(), StoreError> {
        let corrupt = corrupt(id, entry);
        let codec = CodecTag::try_from(entry.codec).map_err(corrupt)?;
        if codec.is_streaming() && entry.base.is_none() {
            let mut w = &mut out[..];
            self.read_object(id, entry, &mut w)?;
            return Ok(());
        }
        if budget == 0 {
            return Err(corrupt(FormatError::invalid(
                "delta chain",
                "longer than the index records (a cycle?)",
            )));
        }
        if codec.is_quant() {
            let (q, prefix) = self.load_quant_chain(id, entry, budget)?;
            q.render(out);
            return verify_content(id, entry, &prefix, out);
        }
        // The base first, so its record buffer is gone before this one is read.
        let base = match &entry.base {
            Some(base_id) => {
                let base_entry = self.base_entry(id, entry, base_id)?;
                let mut b = zeroed(base_entry.content_len)?;
                self.materialize(base_id, &base_entry, budget - 1, &mut b)?;
                Some(b)
            }
            None => None,
        };
        self.with_record(id, entry, |bytes| {
            self.decode_record(id, entry, bytes, base.as_deref(), out)
        })
    }

    /// The index entry of `id`'s base, checked to be the same size.
    fn base_entry(
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

    /// Runs `f` on the bytes of `id`'s record file.
    fn with_record<R>(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        f: impl FnOnce(&[u8]) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let path = self.record_path(id, entry.generation);
        // Record bytes go through a reused buffer (nested reads take their own): fresh large
        // buffers cost a page fault per 4 KiB.
        let mut bytes = spare_buffers::take();
        let read = File::open(&path).and_then(|mut f| f.read_to_end(&mut bytes));
        let result = match read {
            Ok(_) => f(&bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(StoreError::Missing(*id)),
            Err(e) => Err(StoreError::Io {
                op: "read",
                path: path.clone(),
                source: e,
            }),
        };
        spare_buffers::give_back(bytes);
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
        let corrupt = corrupt(id, entry);
        let codec = CodecTag::try_from(entry.codec).map_err(corrupt)?;
        let (header, payload, trailer) = record::decode(bytes).map_err(corrupt)?;
        if trailer.content_len != entry.content_len
            || header.kind != entry.kind
            || header.codec != entry.codec
            || header.base != entry.base
            || header.base.is_some() != codec.has_base()
        {
            return Err(corrupt(FormatError::invalid(
                "record",
                "codec, base, lengths or kind disagree with the index",
            )));
        }
        let tensor = TensorHeader::from_canonical(&header.prefix).map_err(corrupt)?;
        if tensor.data_len() != Some(entry.content_len) {
            return Err(corrupt(FormatError::invalid(
                "record",
                "tensor shape disagrees with the content length",
            )));
        }
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
            CodecTag::Raw | CodecTag::Zstd | CodecTag::QuantBase | CodecTag::QuantDelta => {
                return Err(corrupt(FormatError::invalid(
                    "record",
                    format!("{codec} records are not decoded here"),
                )))
            }
        }
        verify_content(id, entry, &header.prefix, out)
    }

    /// Deletes a record file that the index no longer points to (an older generation after a
    /// re-encode). Best effort: a leftover file is only an unindexed record, reported by fsck.
    pub fn remove_record(&self, id: &ObjectId, generation: u32) {
        let _ = self
            .storage()
            .remove_file(&self.record_path(id, generation));
    }

    /// The header of an object's record (kind, codec, base, and for tensors the canonical tensor
    /// header), read without the payload. Nothing is verified beyond the header's own format.
    pub fn record_header(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
    ) -> Result<RecordHeader, StoreError> {
        Ok(self.open_record(id, entry)?.header)
    }

    /// Opens an object's record file and parses its header.
    fn open_record(&self, id: &ObjectId, entry: &IndexEntry) -> Result<OpenRecord, StoreError> {
        let path = self.record_path(id, entry.generation);
        let file = File::open(&path).map_err(StoreError::record_io(id, "open", &path))?;
        let len = file
            .metadata()
            .map_err(StoreError::io("stat", &path))?
            .len();
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
        let path = self.record_path(id, entry.generation);
        let bytes = std::fs::read(&path).map_err(StoreError::record_io(id, "read", &path))?;
        record::decode(&bytes).map_err(corrupt(id, entry))?;
        Ok(bytes)
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

    /// Lists leftover temporary files in the object directories (interrupted writes).
    pub fn temp_files(&self) -> Result<Vec<PathBuf>, StoreError> {
        let mut out = Vec::new();
        let objects = self.dir.join("objects");
        for dir in std::fs::read_dir(&objects).map_err(StoreError::io("list", &objects))? {
            let dir = dir.map_err(StoreError::io("list", &objects))?.path();
            if !dir.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&dir).map_err(StoreError::io("list", &dir))? {
                let f = f.map_err(StoreError::io("list", &dir))?;
                if f.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                    out.push(f.path());
                }
            }
        }
        Ok(out)
    }

    /// Lists every record file, as (id, generation), whether indexed or not.
    pub fn record_files(&self) -> Result<Vec<(ObjectId, u32)>, StoreError> {
        record_files(&self.dir)
    }
}

/// Every record file in the `.mdl` directory `dir`, as (id, generation).
pub(crate) fn record_files(dir: &Path) -> Result<Vec<(ObjectId, u32)>, StoreError> {
    {
        let mut out = Vec::new();
        let objects = dir.join("objects");
        for dir in std::fs::read_dir(&objects).map_err(StoreError::io("list", &objects))? {
            let dir = dir.map_err(StoreError::io("list", &objects))?;
            let prefix = dir.file_name().to_string_lossy().to_string();
            if prefix.len() != 2 || !dir.path().is_dir() {
                continue;
            }
            for f in std::fs::read_dir(dir.path()).map_err(StoreError::io("list", &dir.path()))? {
                let name = f.map_err(StoreError::io("list", &dir.path()))?.file_name();
                let name = name.to_string_lossy();
                let Some((rest, generation)) = name.split_once('.') else {
                    continue;
                };
                if let (Ok(id), Ok(generation)) = (
                    format!("{prefix}{rest}").parse::<ObjectId>(),
                    generation.parse(),
                ) {
                    out.push((id, generation));
                }
            }
        }
        Ok(out)
    }
}

/// A buffer of `len` zero bytes, or [`StoreError::OutOfMemory`] where a plain allocation would
/// abort the process (a length from a damaged index, or more than the machine has).
pub fn zeroed(len: u64) -> Result<Vec<u8>, StoreError> {
    let n = usize::try_from(len).map_err(|_| StoreError::OutOfMemory(len))?;
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| StoreError::OutOfMemory(len))?;
    v.resize(n, 0);
    Ok(v)
}

/// How many delta steps a read of `entry` may follow: a chain can never be longer than the
/// index says; the budget also stops cycles in a damaged index.
fn chain_budget(entry: &IndexEntry) -> u32 {
    entry.depth.saturating_add(1).min(MAX_CHAIN)
}

/// How often a read starts again after a record moved under it.
const REREADS: u32 = 3;

/// Checks that `prefix` (a canonical tensor header) followed by `out` hashes to `id`.
fn verify_content(
    id: &ObjectId,
    entry: &IndexEntry,
    prefix: &[u8],
    out: &[u8],
) -> Result<(), StoreError> {
    let mut hasher = TensorHasher::new(prefix);
    hasher.update(out);
    let actual = hasher.finalize();
    if actual != *id {
        return Err(corrupt(id, entry)(FormatError::HashMismatch {
            expected: *id,
            actual,
        }));
    }
    Ok(())
}

/// Maps a format error in `id`'s record to [`StoreError::Corrupt`] naming the object.
fn corrupt(id: &ObjectId, entry: &IndexEntry) -> impl Fn(FormatError) -> StoreError + Copy {
    let (id, kind) = (*id, entry.kind.name());
    move |source| StoreError::Corrupt { id, kind, source }
}

/// A record file opened and its header parsed.
struct OpenRecord {
    file: File,
    path: PathBuf,
    /// The file's length.
    len: u64,
    header: RecordHeader,
    /// Bytes the encoded header takes.
    header_len: usize,
    /// The first bytes of the file, read to parse the header.
    head: Vec<u8>,
}

enum HeaderError {
    Io(io::Error),
    Format(FormatError),
}

fn read_header(file: &File, len: u64) -> Result<(RecordHeader, usize, Vec<u8>), HeaderError> {
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

struct CrcReader<R> {
    inner: R,
    crc: crc32fast::Hasher,
}

impl<R: Read> Read for CrcReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }
}

impl ObjectBatch<'_> {
    /// Stores a tensor under the smallest of the candidate codecs (raw if none pays).
    ///
    /// The bytes are hashed as they are encoded; if they do not hash to `id` (the input changed
    /// after `id` was computed) nothing is stored and [`StoreError::InputChanged`] is returned.
    pub fn put_tensor(
        &self,
        id: &ObjectId,
        header: &TensorHeader,
        data: &[u8],
        opts: &EncodeOptions,
    ) -> Result<PutOutcome, StoreError> {
        self.put_tensor_at(id, header, data, opts, Placement::default())
    }

    /// [`Self::put_tensor`] of a self-contained record at a given generation (re-encoding an
    /// object that is already stored).
    pub fn put_tensor_at(
        &self,
        id: &ObjectId,
        header: &TensorHeader,
        data: &[u8],
        opts: &EncodeOptions,
        placement: Placement,
    ) -> Result<PutOutcome, StoreError> {
        let prefix = header.canonical();
        let len = data.len() as u64;
        let candidates = mdl_codec::candidates(header.dtype, len)
            .iter()
            .map(|&c| (c, len.saturating_sub(1)));
        for (codec, cap) in candidates.chain([(CodecTag::Raw, u64::MAX)]) {
            let hasher = std::cell::RefCell::new(TensorHasher::new(&prefix));
            let written = self.write_record(
                id,
                ObjectKind::Tensor,
                codec,
                placement,
                &prefix,
                len,
                cap,
                &mut |w| {
                    mdl_codec::encode_observed(codec, data, opts, w, &mut |chunk| {
                        hasher.borrow_mut().update(chunk)
                    })
                    .map(drop)
                },
                &mut || {
                    if hasher.borrow().finalize() == *id {
                        Ok(())
                    } else {
                        Err(StoreError::InputChanged(*id))
                    }
                },
            );
            match written {
                Ok(out) => return Ok(out),
                Err(WriteError::NotSmaller) => continue,
                Err(WriteError::Store(e)) => return Err(e),
            }
        }
        unreachable!("raw records have no size cap")
    }

    /// Stores a tensor payload encoded by the caller (the in-memory float codecs), given as the
    /// pieces it was produced in. The caller has verified that `data`'s hash is `id` and
    /// encoded from those same bytes.
    pub fn put_payload(
        &self,
        id: &ObjectId,
        header: &TensorHeader,
        codec: CodecTag,
        placement: Placement,
        payload: &[&[u8]],
    ) -> Result<PutOutcome, StoreError> {
        let content_len = header.data_len().unwrap_or(0);
        self.write_record(
            id,
            ObjectKind::Tensor,
            codec,
            placement,
            &header.canonical(),
            content_len,
            u64::MAX,
            &mut |w| payload.iter().try_for_each(|piece| w.write_all(piece)),
            &mut || Ok(()),
        )
        .map_err(WriteError::into_store)
    }

    /// Stores a manifest or commit (its canonical bytes), zstd-compressed when that is smaller.
    pub fn put_blob(&self, kind: ObjectKind, bytes: &[u8]) -> Result<PutOutcome, StoreError> {
        let id = ObjectId::hash(bytes);
        let opts = EncodeOptions::default();
        let cap = (bytes.len() as u64).saturating_sub(1);
        match self.write_record(
            &id,
            kind,
            CodecTag::Zstd,
            Placement::default(),
            &[],
            bytes.len() as u64,
            cap,
            &mut |w| mdl_codec::encode(CodecTag::Zstd, bytes, &opts, w).map(drop),
            &mut || Ok(()),
        ) {
            Ok(out) => Ok(out),
            Err(WriteError::NotSmaller) => self
                .write_record(
                    &id,
                    kind,
                    CodecTag::Raw,
                    Placement::default(),
                    &[],
                    bytes.len() as u64,
                    u64::MAX,
                    &mut |w| w.write_all(bytes),
                    &mut || Ok(()),
                )
                .map_err(WriteError::into_store),
            Err(WriteError::Store(e)) => Err(e),
        }
    }

    /// Stores a record received from another repository (push, fetch) as it is: its header and
    /// checksum are verified here, its content by the caller (decoding it, which needs its base
    /// indexed first) before the index names it. `depth` is one more than the base's, or 0.
    pub fn put_record(
        &self,
        id: &ObjectId,
        record: &[u8],
        depth: u32,
    ) -> Result<PutOutcome, StoreError> {
        let bad = |source| StoreError::Corrupt {
            id: *id,
            kind: "received",
            source,
        };
        let (header, payload, trailer) = record::decode(record).map_err(bad)?;
        record::check_content_len(&header, payload.len() as u64, trailer.content_len)
            .map_err(bad)?;
        let codec = CodecTag::try_from(header.codec).map_err(bad)?;
        if header.base.is_some() != codec.has_base() || header.base == Some(*id) {
            return Err(bad(FormatError::invalid(
                "record",
                "base flag disagrees with the codec",
            )));
        }
        let placement = Placement {
            generation: 0,
            base: header.base,
            depth,
        };
        self.write_record(
            id,
            header.kind,
            codec,
            placement,
            &header.prefix,
            trailer.content_len,
            u64::MAX,
            &mut |w| w.write_all(payload),
            &mut || Ok(()),
        )
        .map_err(WriteError::into_store)
    }

    /// The one helper that writes into `.mdl/objects`: temporary file in the record's directory,
    /// checksum while streaming, fsync, rename. The directory is fsynced by [`Self::finish`].
    #[allow(clippy::too_many_arguments)]
    fn write_record(
        &self,
        id: &ObjectId,
        kind: ObjectKind,
        codec: CodecTag,
        placement: Placement,
        prefix: &[u8],
        content_len: u64,
        cap: u64,
        body: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
        verify: &mut dyn FnMut() -> Result<(), StoreError>,
    ) -> Result<PutOutcome, WriteError> {
        let fs = self.store.storage();
        let path = self.store.record_path(id, placement.generation);
        let dir = path
            .parent()
            .expect("record path has a parent")
            .to_path_buf();
        fs.create_dir_all(&dir)
            .map_err(StoreError::io("create", &dir))?;
        let tmp = dir.join(format!(
            "{TEMP_PREFIX}{}-{}",
            std::process::id(),
            TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| -> Result<u64, WriteError> {
            let file = fs
                .create_new(&tmp)
                .map_err(StoreError::io("create", &tmp))?;
            let mut sink = RecordSink {
                inner: BufWriter::with_capacity(1 << 20, file),
                crc: crc32fast::Hasher::new(),
                written: 0,
                cap: u64::MAX,
            };
            let header =
                RecordHeader::new(kind, codec as u8, placement.base, prefix.to_vec()).encode();
            sink.write_all(&header)
                .map_err(StoreError::io("write", &tmp))?;
            let start = sink.written;
            sink.cap = start.saturating_add(cap);
            body(&mut sink).map_err(|e| {
                if is_not_smaller(&e) {
                    WriteError::NotSmaller
                } else {
                    StoreError::Io {
                        op: "write",
                        path: tmp.clone(),
                        source: e,
                    }
                    .into()
                }
            })?;
            verify()?;
            let payload_len = sink.written - start;
            sink.cap = u64::MAX;
            sink.write_all(&Trailer::lengths(content_len, payload_len))
                .map_err(StoreError::io("write", &tmp))?;
            let crc = sink.crc.clone().finalize();
            sink.write_all(&crc.to_le_bytes())
                .map_err(StoreError::io("write", &tmp))?;
            let total = sink.written;
            let file = sink.inner.into_inner().map_err(|e| StoreError::Io {
                op: "write",
                path: tmp.clone(),
                source: e.into_error(),
            })?;
            // Durability comes from `finish` (one syncfs for the whole batch, before the index
            // names any of these records); until then a crash can only leave unindexed files.
            drop(file);
            fs.rename(&tmp, &path)
                .map_err(StoreError::io("rename", &tmp))?;
            Ok(total)
        })();
        match result {
            Ok(stored_len) => {
                self.files.lock().unwrap().push(path);
                let entry = IndexEntry {
                    kind,
                    codec: codec as u8,
                    generation: placement.generation,
                    base: placement.base,
                    depth: placement.depth,
                    stored_len,
                    content_len,
                    created: Timestamp::now(),
                };
                Ok(PutOutcome { id: *id, entry })
            }
            Err(e) => {
                let _ = fs.remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Makes the records, and their directory entries, durable. Call before publishing them
    /// in the index.
    ///
    /// Records are renamed into place unsynced as they are written; here every record file and
    /// then every touched directory is fsynced, many at a time so the file system can merge
    /// them into few journal commits (the calls wait on the disk, not the CPU). Only this
    /// batch's files are flushed, not whatever else is dirty on the disk.
    pub fn finish(self) -> Result<(), StoreError> {
        let fs = self.store.storage();
        let files = self.files.into_inner().unwrap();
        if files.is_empty() {
            return Ok(());
        }
        let mut dirs: Vec<PathBuf> = files
            .iter()
            .filter_map(|f| f.parent().map(Path::to_path_buf))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        dirs.push(self.store.dir().join("objects"));
        let sync_all = |paths: &[PathBuf], op: &(dyn Fn(&Path) -> io::Result<()> + Sync)| {
            let next = AtomicU64::new(0);
            std::thread::scope(|scope| {
                let workers: Vec<_> = (0..SYNC_THREADS.min(paths.len()))
                    .map(|_| {
                        scope.spawn(|| loop {
                            let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                            let Some(p) = paths.get(i) else {
                                return Ok(());
                            };
                            op(p).map_err(StoreError::io("sync", p))?;
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .try_for_each(|w| w.join().expect("sync thread panicked"))
            })
        };
        sync_all(&files, &|p| fs.sync_file(p))?;
        sync_all(&dirs, &|p| fs.sync_dir(p))
    }
}

/// Where a record goes: its generation (0 for a new object; the next one when an object is
/// re-encoded), and its delta base with the resulting chain depth.
#[derive(Clone, Copy, Debug, Default)]
pub struct Placement {
    /// Record file generation.
    pub generation: u32,
    /// Delta base.
    pub base: Option<ObjectId>,
    /// Decode steps to reconstruct the object (0 without a base).
    pub depth: u32,
}

/// Record read buffers kept for the next read: at most one per core, each at most
/// [`spare_buffers::KEEP`]. Bounded by the machine, not by the number of threads reading (a
/// server's blocking threads are many): what a process keeps here is at most cores × 64 MiB,
/// whatever number of requests it serves.
mod spare_buffers {
    use std::sync::{Mutex, OnceLock};

    /// Buffers up to this capacity are kept.
    pub const KEEP: usize = 64 << 20;

    static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

    fn most() -> usize {
        static MOST: OnceLock<usize> = OnceLock::new();
        *MOST.get_or_init(|| std::thread::available_parallelism().map_or(4, |n| n.get()))
    }

    /// An empty buffer, with the capacity of an earlier read when one is spare.
    pub fn take() -> Vec<u8> {
        let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
        spare.pop().unwrap_or_default()
    }

    /// Keeps `buf` for a later read if it is small enough and fewer than one per core are kept.
    pub fn give_back(mut buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > KEEP {
            return;
        }
        buf.clear();
        let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < most() {
            spare.push(buf);
        }
    }

    /// Buffers kept now (for tests).
    #[cfg(test)]
    pub fn kept() -> (usize, usize) {
        let spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
        (
            spare.len(),
            spare.iter().map(Vec::capacity).max().unwrap_or(0),
        )
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn no_more_than_one_buffer_per_core_is_kept_whatever_the_threads() {
            let threads: Vec<_> = (0..4 * most() + 8)
                .map(|_| {
                    std::thread::spawn(|| {
                        let mut b = take();
                        b.resize(1 << 20, 1);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        give_back(b);
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            give_back(Vec::with_capacity(KEEP + 1));
            let (count, largest) = kept();
            assert!(count <= most(), "{count} buffers kept on {} cores", most());
            assert!(largest <= KEEP);
        }
    }
}

/// fsyncs in flight at once when a batch finishes.
const SYNC_THREADS: usize = 16;

/// No chain is followed further than this, whatever the index says.
pub const MAX_CHAIN: u32 = 1024;

enum WriteError {
    NotSmaller,
    Store(StoreError),
}

impl WriteError {
    fn into_store(self) -> StoreError {
        match self {
            WriteError::Store(e) => e,
            WriteError::NotSmaller => unreachable!("raw records have no size cap"),
        }
    }
}

impl From<StoreError> for WriteError {
    fn from(e: StoreError) -> Self {
        WriteError::Store(e)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use mdl_codec::EncodeOptions;
    use mdl_format::{Dtype, ObjectKind, TensorHeader};

    use crate::{OpenOptions, RealFs, Store, StoreError};

    fn store(dir: &std::path::Path) -> Store {
        let mdl = dir.join(".mdl");
        Store::init(&mdl, Arc::new(RealFs)).unwrap();
        Store::open(&mdl, &OpenOptions::default()).unwrap()
    }

    /// Floats with some structure, so the float codecs have something to gain.
    fn floats(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| ((i % 97) as f32 * 0.01).to_le_bytes())
            .collect()
    }

    #[test]
    fn stored_objects_read_back_exactly_and_damage_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let header = TensorHeader::new(Dtype::F32, vec![4096]);
        let data = floats(4096);
        let id = header.object_id(&data);
        let batch = store.batch();
        let tensor = batch
            .put_tensor(&id, &header, &data, &EncodeOptions::default())
            .unwrap();
        let blob = batch.put_blob(ObjectKind::Manifest, &[7u8; 300]).unwrap();
        batch.finish().unwrap();
        {
            let mut w = store.meta().write().unwrap();
            w.put_object(&tensor.id, &tensor.entry).unwrap();
            w.put_object(&blob.id, &blob.entry).unwrap();
            w.commit_txn().unwrap();
        }
        assert!(
            tensor.entry.stored_len < data.len() as u64,
            "{:?}",
            tensor.entry
        );
        assert_eq!(store.load_tensor(&id, &tensor.entry).unwrap(), data);
        assert_eq!(store.read_object_vec(&blob.id).unwrap(), vec![7u8; 300]);
        let mut listed = store.record_files().unwrap();
        listed.sort();
        let mut want = vec![(id, 0), (blob.id, 0)];
        want.sort();
        assert_eq!(listed, want);

        // One flipped bit anywhere in the record is caught, never returned as data.
        let path = store.record_path(&id, tensor.entry.generation);
        let good = std::fs::read(&path).unwrap();
        for at in [0, 9, good.len() / 2, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            match store.load_tensor(&id, &tensor.entry) {
                Err(StoreError::Corrupt { .. }) => {}
                other => panic!("a flipped bit at {at} read as {other:?}"),
            }
        }
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            store.load_tensor(&id, &tensor.entry),
            Err(StoreError::Missing(_))
        ));
    }
}
