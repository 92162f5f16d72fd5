//! Packs: the records a transfer receives together, kept in one file
//! (`.mdl/packs/<16 hex digits>.pack`) instead of a file each. A clone of a checkpoint series
//! receives hundreds of small records (biases, norms, deltas); one file for them costs one
//! create and one directory entry where a file each costs hundreds, the larger part of a
//! clone's time on some file systems. Records a commit writes, and any record re-encoded
//! later, stay loose files.
//!
//! A pack is `MAGIC`, the records back to back (each exactly as a loose record file holds it,
//! checksummed), then a table naming each (id, generation, offset, length) and a footer:
//! `table offset u64 ‖ records u64 ‖ crc32 of the table u32 ‖ TABLE_MAGIC`. The index names a
//! packed record by pack number and offset ([`crate::Packed`]); the table lets fsck, gc and
//! an index rebuild find what a pack holds without the index. A pack is written whole under a
//! temporary name and renamed into place before the index names any of it, like a loose
//! record; gc removes a pack none of whose records is indexed, and moves the live records of
//! one mostly unindexed out into loose files first (see `docs/FORMAT.md`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use mdl_format::record::{self, RecordHeader, Trailer};
use mdl_format::{ObjectId, Timestamp};

use crate::fs::StorageFile;
use crate::{IndexEntry, Packed, Store, StoreError};

use super::write::{next_temp, received_placement, ObjectBatch, PutOutcome};
use super::{PACKS_DIR, TEMP_PREFIX};

const MAGIC: &[u8; 8] = b"MDLPACK\x01";
const TABLE_MAGIC: &[u8; 8] = b"MDLPTBL\x01";
/// id, generation, offset, length.
const ENTRY_LEN: usize = 32 + 4 + 8 + 8;
const FOOTER_LEN: usize = 8 + 8 + 4 + 8;

/// One record of a pack, as its table names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackEntry {
    /// The object.
    pub id: ObjectId,
    /// The record's generation.
    pub generation: u32,
    /// Where the record starts in the pack.
    pub offset: u64,
    /// The record's length.
    pub len: u64,
}

/// A record received whole, for [`ObjectBatch::put_packed`]: its parsed header (checked by the
/// caller, as for [`ObjectBatch::put_record_with`]), the length it decodes to, its chain depth
/// and its payload (checked against the sender's checksum by the caller).
pub struct ReceivedRecord<'a> {
    /// The object.
    pub id: ObjectId,
    /// The record's header as sent.
    pub header: &'a RecordHeader,
    /// What the record decodes to.
    pub content_len: u64,
    /// One more than its base's depth, or 0.
    pub depth: u32,
    /// The payload.
    pub payload: &'a [u8],
}

impl Store {
    /// Path of pack `pack`.
    pub fn pack_path(&self, pack: u64) -> PathBuf {
        pack_path(&self.dir, pack)
    }

    /// Every pack file, as (number, path); temporary files are not packs.
    pub fn pack_files(&self) -> Result<Vec<(u64, PathBuf)>, StoreError> {
        pack_files(&self.dir)
    }

    /// The table of pack `pack`: what it holds, checked against the file's length.
    pub fn pack_table(&self, pack: u64) -> Result<Vec<PackEntry>, StoreError> {
        let path = self.pack_path(pack);
        let file = File::open(&path).map_err(StoreError::io("open", &path))?;
        read_table(&file, &path)
    }

    /// Removes pack `pack` (the caller has made sure the index names none of its records,
    /// or moved them out). Best effort, like [`Store::remove_record`].
    pub fn remove_pack(&self, pack: u64) {
        let _ = self.storage().remove_file(&self.pack_path(pack));
    }
}

fn pack_path(dir: &Path, pack: u64) -> PathBuf {
    dir.join(PACKS_DIR).join(format!("{pack:016x}.pack"))
}

/// The packs in the `.mdl` directory `dir`.
pub(crate) fn pack_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let packs = dir.join(PACKS_DIR);
    let listing = match std::fs::read_dir(&packs) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::io("list", &packs)(e)),
    };
    let mut out = Vec::new();
    for f in listing {
        let f = f.map_err(StoreError::io("list", &packs))?;
        let name = f.file_name();
        let Some(hex) = name.to_str().and_then(|n| n.strip_suffix(".pack")) else {
            continue;
        };
        if hex.len() == 16 {
            if let Ok(n) = u64::from_str_radix(hex, 16) {
                out.push((n, f.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Reads and checks the table of the pack open as `file`.
pub(crate) fn read_table(file: &File, path: &Path) -> Result<Vec<PackEntry>, StoreError> {
    let damaged = |why: &str| StoreError::Damaged(format!("pack {}: {why}", path.display()));
    let len = file.metadata().map_err(StoreError::io("stat", path))?.len();
    if len < (MAGIC.len() + FOOTER_LEN) as u64 {
        return Err(damaged("shorter than a pack's head and footer"));
    }
    let mut head = [0u8; 8];
    file.read_exact_at(&mut head, 0)
        .map_err(StoreError::io("read", path))?;
    let mut footer = [0u8; FOOTER_LEN];
    file.read_exact_at(&mut footer, len - FOOTER_LEN as u64)
        .map_err(StoreError::io("read", path))?;
    if &head != MAGIC || &footer[20..] != TABLE_MAGIC {
        return Err(damaged("not a pack (its magic numbers are wrong)"));
    }
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let (table_at, count) = (u64_at(&footer, 0), u64_at(&footer, 8));
    let crc = u32::from_le_bytes(footer[16..20].try_into().unwrap());
    let table_len = count.checked_mul(ENTRY_LEN as u64);
    if table_len.and_then(|t| t.checked_add(table_at)) != Some(len - FOOTER_LEN as u64)
        || table_at < MAGIC.len() as u64
    {
        return Err(damaged("its table does not fit the file"));
    }
    let mut table = vec![0u8; (len - FOOTER_LEN as u64 - table_at) as usize];
    file.read_exact_at(&mut table, table_at)
        .map_err(StoreError::io("read", path))?;
    if crc32fast::hash(&table) != crc {
        return Err(damaged("its table's checksum does not match"));
    }
    let mut out = Vec::with_capacity(count as usize);
    let mut end = MAGIC.len() as u64;
    for e in table.chunks_exact(ENTRY_LEN) {
        let entry = PackEntry {
            id: ObjectId::from_bytes(e[..32].try_into().unwrap()),
            generation: u32::from_le_bytes(e[32..36].try_into().unwrap()),
            offset: u64_at(e, 36),
            len: u64_at(e, 44),
        };
        let fits = entry.offset >= end
            && entry
                .offset
                .checked_add(entry.len)
                .is_some_and(|e| e <= table_at);
        if !fits {
            return Err(damaged(
                "a record in its table overlaps another or the table",
            ));
        }
        end = entry.offset + entry.len;
        out.push(entry);
    }
    Ok(out)
}

impl ObjectBatch<'_> {
    /// Stores records received whole in one new pack, in order (see the module's
    /// documentation): what [`Self::put_record_with`] does for each, with one file for all of
    /// them. Each record's header is checked as there; the content is the caller's to verify
    /// before the index names it. Nothing is left behind on an error.
    pub fn put_packed(
        &self,
        records: &[ReceivedRecord<'_>],
    ) -> Result<Vec<PutOutcome>, StoreError> {
        let placements = records
            .iter()
            .map(|r| received_placement(&r.id, r.header, r.depth))
            .collect::<Result<Vec<_>, _>>()?;
        let store = self.store();
        let fs = store.storage();
        let dir = store.dir().join(PACKS_DIR);
        fs.create_dir_all(&dir)
            .map_err(StoreError::io("create", &dir))?;
        let tmp = dir.join(format!(
            "{TEMP_PREFIX}{}-{}",
            std::process::id(),
            next_temp()
        ));
        let file = fs
            .create_new(&tmp)
            .map_err(StoreError::io("create", &tmp))?;
        let mut w = PackFile {
            out: BufWriter::with_capacity(1 << 20, file),
            at: 0,
        };
        let mut table = Vec::with_capacity(records.len() * ENTRY_LEN);
        let mut out = Vec::with_capacity(records.len());
        let pack = pack_number(store, &tmp);
        let written = (|| -> std::io::Result<()> {
            w.put(MAGIC)?;
            for (r, (codec, placement)) in records.iter().zip(&placements) {
                let offset = w.at;
                let mut header = RecordHeader::new(
                    r.header.kind,
                    *codec as u8,
                    placement.base,
                    r.header.prefix.clone(),
                );
                header.coarsened = r.header.coarsened;
                let header = header.encode();
                let lengths = Trailer::lengths(r.content_len, r.payload.len() as u64);
                let mut crc = crc32fast::Hasher::new();
                for part in [&header[..], r.payload, &lengths] {
                    crc.update(part);
                    w.put(part)?;
                }
                w.put(&crc.finalize().to_le_bytes())?;
                let len = w.at - offset;
                debug_assert_eq!(
                    len,
                    (header.len() + r.payload.len() + record::TRAILER_LEN) as u64
                );
                table.extend_from_slice(r.id.as_bytes());
                table.extend_from_slice(&placement.generation.to_le_bytes());
                table.extend_from_slice(&offset.to_le_bytes());
                table.extend_from_slice(&len.to_le_bytes());
                out.push(PutOutcome {
                    id: r.id,
                    entry: IndexEntry {
                        kind: r.header.kind,
                        codec: *codec as u8,
                        generation: placement.generation,
                        base: placement.base,
                        depth: placement.depth,
                        stored_len: len,
                        content_len: r.content_len,
                        created: Timestamp::now(),
                        pack: Some(Packed { pack, offset }),
                    },
                });
            }
            let table_at = w.at;
            w.put(&table)?;
            w.put(&table_at.to_le_bytes())?;
            w.put(&(records.len() as u64).to_le_bytes())?;
            w.put(&crc32fast::hash(&table).to_le_bytes())?;
            w.put(TABLE_MAGIC)?;
            w.out.flush()
        })();
        drop(w);
        let path = store.pack_path(pack);
        let placed = written
            .map_err(StoreError::io("write", &tmp))
            .and_then(|()| {
                fs.rename(&tmp, &path)
                    .map_err(StoreError::io("rename", &tmp))
            });
        if let Err(e) = placed {
            let _ = fs.remove_file(&tmp);
            return Err(e);
        }
        self.wrote_pack(path);
        Ok(out)
    }
}

/// A pack being written, and how far.
struct PackFile {
    out: BufWriter<Box<dyn StorageFile>>,
    at: u64,
}

impl PackFile {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.out.write_all(bytes)?;
        self.at += bytes.len() as u64;
        Ok(())
    }
}

/// A number for a new pack that no pack in `store` has: drawn from the process, the time and
/// the temporary file's name, and drawn again while it names an existing pack.
fn pack_number(store: &Store, tmp: &Path) -> u64 {
    let mut seed = format!(
        "{}:{}:{}",
        std::process::id(),
        Timestamp::now().0,
        tmp.display()
    );
    loop {
        let id = ObjectId::hash(seed.as_bytes());
        let n = u64::from_le_bytes(id.as_bytes()[..8].try_into().unwrap());
        if !store.pack_path(n).exists() {
            return n;
        }
        seed.push('+');
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use mdl_codec::CodecTag;
    use mdl_format::record::{self, RecordHeader};
    use mdl_format::{ObjectId, ObjectKind};

    use super::ReceivedRecord;
    use crate::{OpenOptions, RealFs, Store, StoreError};

    #[test]
    fn a_pack_holds_records_as_loose_files_would_and_its_table_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let mdl = dir.path().join(".mdl");
        Store::init(&mdl, Arc::new(RealFs)).unwrap();
        let store = Store::open(&mdl, &OpenOptions::default()).unwrap();
        let header = RecordHeader::new(ObjectKind::Manifest, CodecTag::Raw as u8, None, Vec::new());
        let payloads = [b"first".to_vec(), vec![7u8; 3000], Vec::new()];
        let ids: Vec<ObjectId> = payloads.iter().map(|p| ObjectId::hash(p)).collect();
        let records: Vec<ReceivedRecord<'_>> = ids
            .iter()
            .zip(&payloads)
            .map(|(id, p)| ReceivedRecord {
                id: *id,
                header: &header,
                content_len: p.len() as u64,
                depth: 0,
                payload: p,
            })
            .collect();
        let batch = store.batch();
        let puts = batch.put_packed(&records).unwrap();
        batch.finish().unwrap();
        let pack = puts[0].entry.pack.unwrap().pack;
        let table = store.pack_table(pack).unwrap();
        assert_eq!(table.len(), 3);
        for ((put, t), p) in puts.iter().zip(&table).zip(&payloads) {
            let at = put.entry.pack.unwrap();
            assert_eq!((at.pack, t.id, t.offset), (pack, put.id, at.offset));
            assert_eq!(t.len, put.entry.stored_len);
            // Byte for byte the record a loose file would hold.
            let want = record::encode(&header, p, p.len() as u64);
            assert_eq!(store.read_record(&put.id, &put.entry).unwrap(), want);
        }
        let path = store.pack_path(pack);
        let good = std::fs::read(&path).unwrap();
        // A flipped byte in the table, or a pack cut short, is damage the table reports.
        let table_byte = good.len() - 28 - 10;
        for bad in [
            {
                let mut b = good.clone();
                b[table_byte] ^= 1;
                b
            },
            good[..good.len() - 3].to_vec(),
        ] {
            std::fs::write(&path, &bad).unwrap();
            assert!(matches!(
                store.pack_table(pack),
                Err(StoreError::Damaged(_))
            ));
        }
        // Cut inside the last record: that record cannot be read; the first still reads.
        let last = &puts[1];
        let cut = (last.entry.pack.unwrap().offset + 100) as usize;
        std::fs::write(&path, &good[..cut]).unwrap();
        assert!(store.read_record(&last.id, &last.entry).is_err());
        assert!(store.read_record(&puts[0].id, &puts[0].entry).is_ok());
    }
}
