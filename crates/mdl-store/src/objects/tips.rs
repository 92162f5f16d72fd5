//! Decoded tips: the content of a tensor at the end of a delta chain, kept beside the store
//! (`.mdl/tips/<id>`) so that the next read of it is a file read and a hash, not the chain's
//! decode. A lossy commit keeps its residual tensors here (each one a chain as deep as the
//! series); the next commit reads its references from here, and a checkout of the newest
//! commit its tensors.
//!
//! A tip is a cache, never the truth: it is used only when its bytes hash to what the object's
//! own record says its content hashes to (the id, or a coarsened record's content id), so a
//! stale, torn or planted file is read past, never returned. Writes are best effort and not
//! made durable (a crash leaves a torn file, which fails its hash); readers never remove one;
//! gc removes the tips of objects the index no longer names.

use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;

use mdl_format::ObjectId;

use crate::{IndexEntry, Store, StoreError};

/// The folder of decoded tips, in the `.mdl` directory.
const TIPS: &str = "tips";

/// Suffix of a tip being written.
const WRITING: &str = ".writing";

impl Store {
    fn tip_path(&self, id: &ObjectId) -> PathBuf {
        self.dir.join(TIPS).join(id.to_hex())
    }

    /// Keeps `content`, the decoded content of object `id`, as its tip. Best effort: a tip
    /// that cannot be written is left out (the object still decodes from its records).
    pub fn keep_tip(&self, id: &ObjectId, content: &[u8]) {
        let dir = self.dir.join(TIPS);
        let path = self.tip_path(id);
        let tmp = dir.join(format!("{}.{}{WRITING}", id.to_hex(), std::process::id()));
        let fs = self.storage();
        let written = fs.create_dir_all(&dir).and_then(|()| {
            let _ = fs.remove_file(&tmp);
            let mut f = fs.create_new(&tmp)?;
            f.write_all(content)?;
            drop(f);
            fs.rename(&tmp, &path)
        });
        if let Err(e) = written {
            tracing::debug!(%id, "tip not kept: {e}");
            let _ = fs.remove_file(&tmp);
        }
    }

    /// Removes the tips of `ids` (best effort).
    pub fn forget_tips<'a>(&self, ids: impl IntoIterator<Item = &'a ObjectId>) {
        if !self.dir.join(TIPS).exists() {
            return;
        }
        for id in ids {
            let _ = self.storage().remove_file(&self.tip_path(id));
        }
    }

    /// Removes every tip (and tip being written) whose object `keep` does not accept; returns
    /// the bytes removed.
    pub fn prune_tips(&self, keep: impl Fn(&ObjectId) -> bool) -> u64 {
        let mut bytes = 0;
        for (path, id, len) in self.tip_files() {
            if !id.as_ref().is_some_and(&keep) && self.storage().remove_file(&path).is_ok() {
                bytes += len;
            }
        }
        bytes
    }

    /// Bytes of the tips kept.
    pub fn tips_bytes(&self) -> u64 {
        self.tip_files().iter().map(|(_, _, len)| len).sum()
    }

    /// Every file in the tips folder: its path, the object it is the tip of (`None`: a tip
    /// being written, or a stranger), its length.
    fn tip_files(&self) -> Vec<(PathBuf, Option<ObjectId>, u64)> {
        let Ok(list) = std::fs::read_dir(self.dir.join(TIPS)) else {
            return Vec::new();
        };
        list.flatten()
            .map(|f| {
                let id = f.file_name().to_str().and_then(|n| n.parse().ok());
                (f.path(), id, f.metadata().map_or(0, |m| m.len()))
            })
            .collect()
    }

    /// Reads object `id`'s tip into `out` when there is one that hashes to what its record
    /// names: `named` gives the record's canonical header and the id its content hashes to,
    /// read only when a tip of the right length is there.
    pub(super) fn tip_into(
        &self,
        id: &ObjectId,
        entry: &IndexEntry,
        out: &mut [u8],
        named: impl FnOnce() -> Result<(Vec<u8>, ObjectId), StoreError>,
    ) -> Result<bool, StoreError> {
        // A plain file of the content's length only: no link, no device or pipe to block on.
        let path = self.tip_path(id);
        let read = std::fs::symlink_metadata(&path).and_then(|m| {
            if !m.is_file() || m.len() != entry.content_len {
                return Ok(false);
            }
            File::open(&path)?.read_exact(out)?;
            Ok(true)
        });
        if !matches!(read, Ok(true)) {
            return Ok(false);
        }
        let (prefix, expected) = named()?;
        Ok(self.engine().content_id(&prefix, out) == expected)
    }
}
