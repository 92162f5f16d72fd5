//! The one atomic record writer: a temporary file, written in one pass, renamed into place;
//! a batch fsyncs what it wrote before the index publishes it.

use std::collections::BTreeSet;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use mdl_codec::{CodecTag, EncodeOptions};
use mdl_format::record::{self, Coarsened, RecordHeader, Trailer};
use mdl_format::{FormatError, ObjectId, ObjectKind, TensorHasher, TensorHeader, Timestamp};

use crate::fs::StorageFile;
use crate::{IndexEntry, Store, StoreError};

use super::sync::{Syncer, Target};
use super::unpublished::{Ledger, Unpublished};
use super::{Placement, TEMP_PREFIX};

/// The result of storing one object.
#[derive(Clone, Copy, Debug)]
pub struct PutOutcome {
    /// The object.
    pub id: ObjectId,
    /// Its new index entry.
    pub entry: IndexEntry,
}

/// Records written for one operation. They are made durable by [`ObjectBatch::finish`], which
/// must precede the index transaction that publishes them.
pub struct ObjectBatch<'s> {
    store: &'s Store,
    /// Records written, as (id, generation): their directories are synced by
    /// [`ObjectBatch::finish`]; [`Unpublished`] takes them back if the operation fails.
    written: Ledger,
    /// Syncs each record file once it is in place, and the directories at the end; `None`
    /// for a batch made durable by one sync of the file system ([`Store::bulk_batch`]).
    syncer: Option<Syncer>,
    /// Packs written ([`ObjectBatch::put_packed`]), made durable with the records.
    packs: std::sync::Mutex<Vec<PathBuf>>,
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// A number no other temporary file of this process has.
pub(crate) fn next_temp() -> u64 {
    TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
}

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
    /// Starts a batch of record writes.
    pub fn batch(&self) -> ObjectBatch<'_> {
        ObjectBatch {
            store: self,
            written: Ledger::default(),
            syncer: Some(Syncer::new(self.storage())),
            packs: Default::default(),
        }
    }

    /// A batch of many records arriving at once (a transfer's): made durable by one sync of
    /// the file system that holds the store when it finishes, not a sync of each file and
    /// directory. That call also flushes whatever else is waiting to be written there, so it
    /// is for batches of many records, not a commit's few.
    pub fn bulk_batch(&self) -> ObjectBatch<'_> {
        ObjectBatch {
            store: self,
            written: Ledger::default(),
            syncer: None,
            packs: Default::default(),
        }
    }
}

impl<'s> ObjectBatch<'s> {
    /// The records this batch writes, removed again unless the operation marks them
    /// [`Unpublished::published`] (see there for who may use it).
    pub fn unpublished(&self) -> Unpublished<'s> {
        Unpublished::new(self.store, self.written.clone())
    }

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
                None,
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
        self.put_coarsened(id, header, codec, placement, None, payload)
    }

    /// Stores a tensor payload that `body` writes (encoded by the caller, possibly from
    /// several places, such as the planes of a tensor too large to hold). The caller has
    /// verified that what it encoded hashes to `id`.
    pub fn put_written(
        &self,
        id: &ObjectId,
        header: &TensorHeader,
        codec: CodecTag,
        placement: Placement,
        body: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
    ) -> Result<PutOutcome, StoreError> {
        self.put_body(id, header, codec, placement, None, body)
    }

    /// [`Self::put_payload`] for a record that may decode to other content than `id` names
    /// (retention's coarsening): `coarsened` names that content's hash and the added error.
    /// The caller has decoded `payload` and hashed the result.
    pub fn put_coarsened(
        &self,
        id: &ObjectId,
        header: &TensorHeader,
        codec: CodecTag,
        placement: Placement,
        coarsened: Option<Coarsened>,
        payload: &[&[u8]],
    ) -> Result<PutOutcome, StoreError> {
        self.put_body(id, header, codec, placement, coarsened, &mut |w| {
            payload.iter().try_for_each(|piece| w.write_all(piece))
        })
    }

    fn put_body(
        &self,
        id: &ObjectId,
        header: &TensorHeader,
        codec: CodecTag,
        placement: Placement,
        coarsened: Option<Coarsened>,
        body: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
    ) -> Result<PutOutcome, StoreError> {
        let content_len = header.data_len().unwrap_or(0);
        self.write_record(
            id,
            ObjectKind::Tensor,
            codec,
            placement,
            &header.canonical(),
            coarsened,
            content_len,
            u64::MAX,
            body,
            &mut || Ok(()),
        )
        .map_err(WriteError::into_store)
    }

    /// Stores a manifest or commit (its canonical bytes), zstd-compressed when that is smaller
    /// and within what a record of its kind may expand to
    /// ([`record::check_content_len`], the rule every reader and every transfer applies), else
    /// raw: a manifest of many identical entries compresses far better than a reader lets a
    /// record claim, and must still travel. Bytes over [`record::MAX_META_CONTENT`] are
    /// refused.
    pub fn put_blob(&self, kind: ObjectKind, bytes: &[u8]) -> Result<PutOutcome, StoreError> {
        let content_len = bytes.len() as u64;
        if content_len > record::MAX_META_CONTENT {
            return Err(StoreError::TooLarge {
                what: kind.name(),
                len: content_len,
                limit: record::MAX_META_CONTENT,
            });
        }
        let id = ObjectId::hash(bytes);
        let mut zstd = Vec::new();
        mdl_codec::encode(CodecTag::Zstd, bytes, &EncodeOptions::default(), &mut zstd)
            .map_err(StoreError::Output)?;
        let header = RecordHeader::new(kind, CodecTag::Zstd as u8, None, Vec::new());
        let compressed = zstd.len() < bytes.len()
            && record::check_content_len(&header, zstd.len() as u64, content_len).is_ok();
        let (codec, payload) = if compressed {
            (CodecTag::Zstd, zstd.as_slice())
        } else {
            (CodecTag::Raw, bytes)
        };
        self.write_record(
            &id,
            kind,
            codec,
            Placement::default(),
            &[],
            None,
            content_len,
            u64::MAX,
            &mut |w| w.write_all(payload),
            &mut || Ok(()),
        )
        .map_err(WriteError::into_store)
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
        self.put_record_with(id, &header, trailer.content_len, depth, &mut |w| {
            w.write_all(payload)
        })
    }

    /// [`Self::put_record`] of a record whose payload `payload` writes as it arrives (a received
    /// frame, never held whole): the caller has checked `header` and the claimed `content_len`
    /// ([`record::check_content_len`]) and checks what arrived against its checksum inside
    /// `payload`, failing it if they differ; the content is the caller's to verify, as for
    /// [`Self::put_record`].
    pub fn put_record_with(
        &self,
        id: &ObjectId,
        header: &RecordHeader,
        content_len: u64,
        depth: u32,
        payload: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
    ) -> Result<PutOutcome, StoreError> {
        let mut w = self.open_received(id, header, content_len, depth, None)?;
        payload(&mut w).map_err(|e| w.failed("write", e))?;
        w.finish()
    }

    /// Opens a record received from another repository, written as it arrives by the caller
    /// and then [`RecordWriter::finish`]ed: the checks and duties of [`Self::put_record_with`].
    /// Written into `tmp` where given (a file of the caller's under `.mdl`, on the objects'
    /// file system, which stays if the process dies, or is [`RecordWriter::keep`]), else into a
    /// temporary file of the store's.
    pub fn open_received(
        &self,
        id: &ObjectId,
        header: &RecordHeader,
        content_len: u64,
        depth: u32,
        tmp: Option<&Path>,
    ) -> Result<RecordWriter<'_, 's>, StoreError> {
        let (codec, placement) = received_placement(id, header, depth)?;
        self.open_record(
            Some(id),
            header.kind,
            codec,
            placement,
            &header.prefix,
            header.coarsened,
            content_len,
            tmp,
        )
    }

    /// The store the batch writes into.
    pub(super) fn store(&self) -> &'s Store {
        self.store
    }

    /// Notes a pack written into place, to be made durable by [`Self::finish`].
    pub(super) fn wrote_pack(&self, path: PathBuf) {
        if let Some(syncer) = &self.syncer {
            syncer.push(path.clone(), Target::File);
        }
        self.packs.lock().unwrap().push(path);
    }

    /// The one helper that writes into `.mdl/objects`: a [`RecordWriter`] that `body` writes
    /// the payload into (capped at `cap` bytes), checked by `verify` before it is finished.
    #[allow(clippy::too_many_arguments)]
    fn write_record(
        &self,
        id: &ObjectId,
        kind: ObjectKind,
        codec: CodecTag,
        placement: Placement,
        prefix: &[u8],
        coarsened: Option<Coarsened>,
        content_len: u64,
        cap: u64,
        body: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
        verify: &mut dyn FnMut() -> Result<(), StoreError>,
    ) -> Result<PutOutcome, WriteError> {
        let mut w = self.open_record(
            Some(id),
            kind,
            codec,
            placement,
            prefix,
            coarsened,
            content_len,
            None,
        )?;
        let sink = w.sink.as_mut().expect("an open record");
        sink.cap = sink.written.saturating_add(cap);
        body(&mut w).map_err(|e| {
            if is_not_smaller(&e) {
                WriteError::NotSmaller
            } else {
                w.failed("write", e).into()
            }
        })?;
        verify()?;
        Ok(w.finish()?)
    }

    /// Opens a tensor record that the caller writes the payload of, in order, and then
    /// [`RecordWriter::finish`]es (the caller has verified that what it encodes hashes to
    /// `id`). Dropped unfinished, nothing of it stays.
    pub fn open_written(
        &self,
        id: &ObjectId,
        header: &TensorHeader,
        codec: CodecTag,
        placement: Placement,
    ) -> Result<RecordWriter<'_, 's>, StoreError> {
        self.open_tensor(Some(id), header, codec, placement)
    }

    /// [`Self::open_written`] of a record whose id is known only once it is written (the
    /// hash of what it encodes, found as it is encoded): [`RecordWriter::finish_as`] names it.
    pub fn open_unnamed(
        &self,
        header: &TensorHeader,
        codec: CodecTag,
        placement: Placement,
    ) -> Result<RecordWriter<'_, 's>, StoreError> {
        self.open_tensor(None, header, codec, placement)
    }

    fn open_tensor(
        &self,
        id: Option<&ObjectId>,
        header: &TensorHeader,
        codec: CodecTag,
        placement: Placement,
    ) -> Result<RecordWriter<'_, 's>, StoreError> {
        let content_len = header.data_len().unwrap_or(0);
        let prefix = header.canonical();
        self.open_record(
            id,
            ObjectKind::Tensor,
            codec,
            placement,
            &prefix,
            None,
            content_len,
            None,
        )
    }

    /// A temporary file in the record's directory (or, not named yet, in [`UNNAMED_DIR`]; or
    /// `tmp`, where given), its header written.
    #[allow(clippy::too_many_arguments)]
    fn open_record(
        &self,
        id: Option<&ObjectId>,
        kind: ObjectKind,
        codec: CodecTag,
        placement: Placement,
        prefix: &[u8],
        coarsened: Option<Coarsened>,
        content_len: u64,
        tmp: Option<&Path>,
    ) -> Result<RecordWriter<'_, 's>, StoreError> {
        let fs = self.store.storage();
        let path = id.map(|id| self.store.record_path(id, placement.generation));
        let dir = match &path {
            Some(path) => path
                .parent()
                .expect("record path has a parent")
                .to_path_buf(),
            None => self.store.dir().join("objects").join(UNNAMED_DIR),
        };
        fs.create_dir_all(&dir)
            .map_err(StoreError::io("create", &dir))?;
        let tmp = tmp.map_or_else(
            || {
                dir.join(format!(
                    "{TEMP_PREFIX}{}-{}",
                    std::process::id(),
                    next_temp()
                ))
            },
            Path::to_path_buf,
        );
        let file = fs
            .create_new(&tmp)
            .map_err(StoreError::io("create", &tmp))?;
        let mut w = RecordWriter {
            batch: self,
            sink: Some(RecordSink {
                inner: BufWriter::with_capacity(1 << 20, file),
                crc: crc32fast::Hasher::new(),
                written: 0,
                cap: u64::MAX,
            }),
            id: id.copied(),
            kind,
            codec,
            placement,
            content_len,
            start: 0,
            tmp,
            path,
        };
        let mut header = RecordHeader::new(kind, codec as u8, placement.base, prefix.to_vec());
        header.coarsened = coarsened;
        let header = header.encode();
        let sink = w.sink.as_mut().expect("an open record");
        if let Err(e) = sink.write_all(&header) {
            return Err(w.failed("write", e));
        }
        w.start = header.len() as u64;
        Ok(w)
    }

    /// Makes the records, and their directory entries, durable. Call before publishing them
    /// in the index.
    ///
    /// Records are renamed into place unsynced as they are written and fsynced by a pool of
    /// threads meanwhile (`sync.rs`); here every touched directory joins the pool, and all of
    /// it is waited for. Many fsyncs in flight let the file system merge them into few journal
    /// commits. Only this batch's files are flushed, not whatever else is dirty on the disk.
    /// A [`Store::bulk_batch`] is made durable by one `syncfs` instead.
    pub fn finish(self) -> Result<(), StoreError> {
        // Read in place: the ledger stays whole, for the operation to take the records back
        // if it fails after this.
        let written = self.written.lock().unwrap();
        let dirs: BTreeSet<PathBuf> = written
            .iter()
            .filter_map(|(id, g)| Some(self.store.record_path(id, *g).parent()?.to_path_buf()))
            .collect();
        drop(written);
        let packed = !self.packs.lock().unwrap().is_empty();
        let objects = self.store.dir().join("objects");
        let Some(syncer) = self.syncer else {
            return match dirs.is_empty() && !packed {
                true => Ok(()),
                false => self
                    .store
                    .storage()
                    .sync_filesystem(&objects)
                    .map_err(StoreError::io("sync", &objects)),
            };
        };
        if !dirs.is_empty() {
            for dir in dirs {
                syncer.push(dir, Target::Dir);
            }
            syncer.push(objects, Target::Dir);
        }
        if packed {
            syncer.push(self.store.dir().join(super::PACKS_DIR), Target::Dir);
        }
        syncer.finish()
    }
}

/// A record being written ([`ObjectBatch::open_written`]): a temporary file until
/// [`Self::finish`] renames it into place; removed if dropped before.
pub struct RecordWriter<'b, 's> {
    batch: &'b ObjectBatch<'s>,
    /// `None` once finished.
    sink: Option<RecordSink>,
    /// `None` until named.
    id: Option<ObjectId>,
    kind: ObjectKind,
    codec: CodecTag,
    placement: Placement,
    content_len: u64,
    /// Where the payload starts.
    start: u64,
    tmp: PathBuf,
    path: Option<PathBuf>,
}

/// Where records not named yet are written (`.mdl/objects/unnamed`): a directory of the
/// objects' file system, so naming one is a rename; fsck lists leftovers as temporary files.
pub(super) const UNNAMED_DIR: &str = "unnamed";

impl Write for RecordWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sink.as_mut().expect("an open record").write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.sink.as_mut().expect("an open record").write_all(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.sink.as_mut().expect("an open record").flush()
    }
}

impl RecordWriter<'_, '_> {
    /// The error of a failed `op` on the temporary file.
    pub fn failed(&self, op: &'static str, source: io::Error) -> StoreError {
        StoreError::Io {
            op,
            path: self.tmp.clone(),
            source,
        }
    }

    /// Writes the trailer and renames the record into place (synced in the background from
    /// here on, and its directory by [`ObjectBatch::finish`], before the index names it; until
    /// then a crash can only leave unindexed files).
    pub fn finish(mut self) -> Result<PutOutcome, StoreError> {
        let (Some(id), Some(path)) = (self.id, self.path.clone()) else {
            unreachable!("a record opened unnamed is finished by finish_as");
        };
        let mut sink = self.sink.take().expect("an open record");
        let payload_len = sink.written - self.start;
        sink.cap = u64::MAX;
        let fs = self.batch.store.storage();
        let written = (|| {
            sink.write_all(&Trailer::lengths(self.content_len, payload_len))?;
            let crc = sink.crc.clone().finalize();
            sink.write_all(&crc.to_le_bytes())?;
            sink.inner.into_inner().map_err(|e| e.into_error())
        })();
        let stored_len = self.start + payload_len + record::TRAILER_LEN as u64;
        let renamed = match written {
            Ok(file) => {
                drop(file);
                fs.rename(&self.tmp, &path)
                    .map_err(StoreError::io("rename", &self.tmp))
            }
            Err(e) => Err(self.failed("write", e)),
        };
        if let Err(e) = renamed {
            let _ = fs.remove_file(&self.tmp);
            return Err(e);
        }
        let batch = self.batch;
        if let Some(syncer) = &batch.syncer {
            syncer.push(path, Target::File);
        }
        batch
            .written
            .lock()
            .unwrap()
            .push((id, self.placement.generation));
        let entry = IndexEntry {
            kind: self.kind,
            codec: self.codec as u8,
            generation: self.placement.generation,
            base: self.placement.base,
            depth: self.placement.depth,
            stored_len,
            content_len: self.content_len,
            created: Timestamp::now(),
            pack: None,
        };
        Ok(PutOutcome { id, entry })
    }

    /// Leaves what was written of an unfinished record (its header and the start of its
    /// payload: a received record cut off) in its temporary file, unsynced, for a later
    /// transfer to go on from: only for one opened into a file of the caller's
    /// ([`ObjectBatch::open_received`]). The bytes left.
    pub fn keep(mut self) -> Result<u64, StoreError> {
        let sink = self.sink.take().expect("an open record");
        let kept = sink.written;
        match sink.inner.into_inner() {
            Ok(_) => Ok(kept),
            Err(e) => {
                let _ = self.batch.store.storage().remove_file(&self.tmp);
                Err(self.failed("write", e.into_error()))
            }
        }
    }

    /// Names a record opened by [`ObjectBatch::open_unnamed`] `id` and finishes it.
    pub fn finish_as(mut self, id: &ObjectId) -> Result<PutOutcome, StoreError> {
        let path = self.batch.store.record_path(id, self.placement.generation);
        let dir = path.parent().expect("record path has a parent");
        self.batch
            .store
            .storage()
            .create_dir_all(dir)
            .map_err(StoreError::io("create", dir))?;
        self.id = Some(*id);
        self.path = Some(path);
        self.finish()
    }
}

impl Drop for RecordWriter<'_, '_> {
    fn drop(&mut self) {
        if self.sink.take().is_some() {
            let _ = self.batch.store.storage().remove_file(&self.tmp);
        }
    }
}

/// The codec and placement of a record received from another repository, its header
/// checked: a codec mdl knows, a base exactly where the codec has one, and never itself.
pub(super) fn received_placement(
    id: &ObjectId,
    header: &RecordHeader,
    depth: u32,
) -> Result<(CodecTag, Placement), StoreError> {
    let bad = |source| StoreError::Corrupt {
        id: *id,
        kind: "received",
        source,
    };
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
    Ok((codec, placement))
}

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
