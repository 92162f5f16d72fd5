//! The one atomic record writer: a temporary file, written in one pass, renamed into place;
//! a batch fsyncs what it wrote before the index publishes it.

use std::collections::BTreeSet;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use mdl_codec::{CodecTag, EncodeOptions};
use mdl_format::record::{self, Coarsened, RecordHeader, Trailer};
use mdl_format::{FormatError, ObjectId, ObjectKind, TensorHasher, TensorHeader, Timestamp};

use crate::fs::StorageFile;
use crate::{IndexEntry, Store, StoreError};

use super::sync::{Syncer, Target};
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
    /// Record files written (their directories are synced by [`ObjectBatch::finish`]).
    files: Mutex<Vec<PathBuf>>,
    /// Syncs each record file once it is in place, and the directories at the end.
    syncer: Syncer,
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
            files: Mutex::new(Vec::new()),
            syncer: Syncer::new(self.storage()),
        }
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
            None,
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
                    None,
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
            header.coarsened,
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
        coarsened: Option<Coarsened>,
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
            next_temp()
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
            let mut header = RecordHeader::new(kind, codec as u8, placement.base, prefix.to_vec());
            header.coarsened = coarsened;
            let header = header.encode();
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
            // The file is synced in the background from here on and its directory by `finish`,
            // before the index names it; until then a crash can only leave unindexed files.
            drop(file);
            fs.rename(&tmp, &path)
                .map_err(StoreError::io("rename", &tmp))?;
            Ok(total)
        })();
        match result {
            Ok(stored_len) => {
                self.syncer.push(path.clone(), Target::File);
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
    /// Records are renamed into place unsynced as they are written and fsynced by a pool of
    /// threads meanwhile (`sync.rs`); here every touched directory joins the pool, and all of
    /// it is waited for. Many fsyncs in flight let the file system merge them into few journal
    /// commits. Only this batch's files are flushed, not whatever else is dirty on the disk.
    pub fn finish(self) -> Result<(), StoreError> {
        let files = self.files.into_inner().unwrap();
        if !files.is_empty() {
            let dirs: BTreeSet<&Path> = files.iter().filter_map(|f| f.parent()).collect();
            for dir in dirs {
                self.syncer.push(dir.to_path_buf(), Target::Dir);
            }
            self.syncer
                .push(self.store.dir().join("objects"), Target::Dir);
        }
        self.syncer.finish()
    }
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
