//! Object records: where they live (`record_path`), listing them and what interrupted writes
//! left (`temp_files`, `record_files`), removing one; writing in `write.rs` (made durable by
//! `sync.rs`; taken back after a failure by `unpublished.rs`), reading in `read.rs`,
//! tensors read a window at a time in `windows.rs`, the read buffers kept between reads in
//! `buffers.rs`, decoded chain ends kept beside the records in `tips.rs`.

use std::path::{Path, PathBuf};

use mdl_format::ObjectId;

use crate::{Store, StoreError};

/// Prefix of temporary files in object directories; anything named so is an interrupted write.
pub(crate) const TEMP_PREFIX: &str = ".tmp-";

/// The folder of packs inside `.mdl` (`packs.rs`).
pub const PACKS_DIR: &str = "packs";

impl Store {
    /// Path of an object's record file of the given generation.
    pub fn record_path(&self, id: &ObjectId, generation: u32) -> PathBuf {
        let hex = id.to_hex();
        self.dir
            .join("objects")
            .join(&hex[..2])
            .join(format!("{}.{generation}", &hex[2..]))
    }

    /// Deletes a record file: one the index no longer points to (an older generation after a
    /// re-encode), or one a [`crate::source::RecordSource`] holds too (a cache's eviction).
    /// Best effort: a leftover file is only an unindexed record, reported by fsck.
    pub fn remove_record(&self, id: &ObjectId, generation: u32) {
        let _ = self
            .storage()
            .remove_file(&self.record_path(id, generation));
    }

    /// Lists leftover temporary files in the object directories and `packs/` (interrupted
    /// writes).
    pub fn temp_files(&self) -> Result<Vec<PathBuf>, StoreError> {
        let mut out = Vec::new();
        let objects = self.dir.join("objects");
        let mut dirs: Vec<PathBuf> = Vec::new();
        for dir in std::fs::read_dir(&objects).map_err(StoreError::io("list", &objects))? {
            dirs.push(dir.map_err(StoreError::io("list", &objects))?.path());
        }
        let packs = self.dir.join(PACKS_DIR);
        if packs.is_dir() {
            dirs.push(packs);
        }
        for dir in dirs {
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

/// No chain is followed further than this, whatever the index says.
pub const MAX_CHAIN: u32 = 1024;

mod buffers;
mod levels;
mod packs;
mod patch;
mod read;
mod record_file;
mod sync;
mod tips;
mod unpublished;
mod windows;
mod write;

pub(crate) use packs::{pack_files, read_table};
pub use packs::{PackEntry, ReceivedRecord};
pub use patch::MaskedOver;
pub(crate) use read::agrees_with_index;
pub(crate) use record_file::RecordFile;
pub use unpublished::Unpublished;
pub use windows::{windowed_cost, TensorWindows, WINDOW_CHUNKS};

/// Tensors decoded and verified already, by id, lent by the caller: a delta over one of them
/// decodes against these bytes (read in place) instead of its base's chain — what a transfer
/// verifying a chain a level at a time holds of the level it verified last, or a model's own
/// tensors holding an older commit.
pub type Held<'h> = std::collections::HashMap<ObjectId, &'h [u8]>;
pub(crate) use write::next_temp;
pub use write::{ObjectBatch, PutOutcome, RecordWriter};

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

        // One flipped bit anywhere in a record is caught, never returned as data: a float
        // record, and a small zstd record (decoded whole in memory).
        let blob_path = store.record_path(&blob.id, blob.entry.generation);
        let good = std::fs::read(&blob_path).unwrap();
        for at in [0, 9, good.len() / 2, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            std::fs::write(&blob_path, &bad).unwrap();
            match store.read_object_vec(&blob.id) {
                Err(StoreError::Corrupt { .. }) => {}
                other => panic!("a flipped bit at {at} of the blob read as {other:?}"),
            }
        }
        std::fs::write(&blob_path, &good).unwrap();
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

    /// A tensor's head is its first bytes as a whole read gives them: a chunk of elements of
    /// a float record (at least what was asked), a short tensor whole, any length of a raw one.
    #[test]
    fn a_head_is_the_first_bytes_of_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let chunk = 1usize << mdl_codec::huffman::CHUNK_LOG2;
        let cases = [
            (Dtype::F32, floats(3 * chunk + 5)),
            (Dtype::F32, floats(1000)),
            (Dtype::U8, (0..5000u32).map(|i| (i * 7) as u8).collect()),
        ];
        for (dtype, data) in cases {
            let header = TensorHeader::new(dtype, vec![(data.len() / dtype.size()) as u64]);
            let id = header.object_id(&data);
            let batch = store.batch();
            let t = batch
                .put_tensor(&id, &header, &data, &EncodeOptions::default())
                .unwrap();
            batch.finish().unwrap();
            for at_least in [1, 4 << 15, chunk * 4 + 1] {
                let head = store.tensor_head(&id, &t.entry, at_least).unwrap();
                assert!(
                    head.len() >= at_least.min(data.len()),
                    "{dtype:?} {at_least}"
                );
                assert_eq!(head, data[..head.len()], "{dtype:?} {at_least}");
            }
        }
    }

    /// An index whose delta bases run in a circle (damage no commit writes) is an error naming
    /// an object, found from the index alone, never an endless decode.
    #[test]
    fn a_cycle_of_bases_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let header = TensorHeader::new(Dtype::F32, vec![4096]);
        let (a, b) = (floats(4096), floats(4097)[4..].to_vec());
        let batch = store.batch();
        let opts = EncodeOptions::default();
        let a = batch
            .put_tensor(&header.object_id(&a), &header, &a, &opts)
            .unwrap();
        let b = batch
            .put_tensor(&header.object_id(&b), &header, &b, &opts)
            .unwrap();
        batch.finish().unwrap();
        let delta = |entry: &crate::IndexEntry, base| crate::IndexEntry {
            codec: mdl_codec::CodecTag::XorDelta as u8,
            base: Some(base),
            depth: 1,
            ..*entry
        };
        let (ea, eb) = (delta(&a.entry, b.id), delta(&b.entry, a.id));
        {
            let mut w = store.meta().write().unwrap();
            w.put_object(&a.id, &ea).unwrap();
            w.put_object(&b.id, &eb).unwrap();
            w.commit_txn().unwrap();
        }
        match store.load_tensor(&a.id, &ea) {
            Err(StoreError::Corrupt { id, source, .. }) => {
                assert!(id == a.id || id == b.id);
                assert!(source.to_string().contains("a cycle?"), "{source}");
            }
            other => panic!("a cycle read as {other:?}"),
        }
    }
}
