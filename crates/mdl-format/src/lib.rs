//! The object model of mdl and every byte format it persists.
//!
//! This crate is pure: it performs no I/O. It defines
//!
//! - [`ObjectId`], the blake3 hash of an object's canonical content, and [`TensorHasher`];
//! - [`Dtype`] and [`TensorHeader`], the canonical description of a tensor;
//! - [`safetensors`], strict validation of a safetensors header into a [`safetensors::Layout`];
//! - [`Manifest`] (a tree of files cut into regions) and [`Commit`], with their canonical
//!   (hashed) serialisations;
//! - [`torch`], a reader of `torch.save` archives that never executes their pickle;
//! - [`record`], the container every stored object lives in (codec tag, base, checksum);
//! - [`RefName`], validated branch and tag names, and [`names`], the one rule for every name
//!   that comes from elsewhere (tree paths, refs, remotes).
//!
//! Byte layouts are documented in `docs/FORMAT.md`; [`FORMAT_VERSION`] names the version that
//! document describes, and a test keeps the two in step.
//!
//! ```
//! use mdl_format::{Dtype, ObjectId, TensorHeader};
//! let header = TensorHeader::new(Dtype::F32, vec![2]);
//! let id = header.object_id(&[0u8; 8]);
//! assert_eq!(id, id.to_hex().parse::<ObjectId>().unwrap());
//! ```

mod commit;
mod dtype;
mod error;
mod id;
mod manifest;
pub mod names;
pub mod record;
mod refname;
pub mod safetensors;
mod tensor;
mod time;
pub mod torch;
mod wire;

pub use commit::{Commit, CommitStats};
pub use dtype::Dtype;
pub use error::FormatError;
pub use id::{IdPrefix, ObjectId, ParseIdError, TensorHasher};
pub use manifest::{
    bytes_header, Entry, EntryView, Exactness, FileFormat, FileView, Lossy, Manifest, ManifestView,
    MomentPair, PairSource, Region, RegionView, TreeFile, V1_FILE_PATH,
};
pub use names::{check_path, check_tensor_name, MAX_PATH_LEN};
pub use refname::{Ref, RefName, RefNameError};
pub use tensor::TensorHeader;
pub use time::Timestamp;

/// The version of the persisted formats described in `docs/FORMAT.md`.
///
/// Bumped whenever any byte layout in this crate changes; readers accept every version up to
/// and including this one.
pub const FORMAT_VERSION: u16 = 14;

/// Which kind of object a record or an id refers to. Stable tags, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum ObjectKind {
    /// A tensor: canonical header plus the bytes a checkout writes.
    Tensor = 1,
    /// A checkpoint's table of contents.
    Manifest = 2,
    /// A commit: manifest, parents, author, message, metrics.
    Commit = 3,
}

impl ObjectKind {
    /// The lowercase name used in messages and JSON.
    pub fn name(self) -> &'static str {
        match self {
            ObjectKind::Tensor => "tensor",
            ObjectKind::Manifest => "manifest",
            ObjectKind::Commit => "commit",
        }
    }
}

impl TryFrom<u8> for ObjectKind {
    type Error = FormatError;
    fn try_from(v: u8) -> Result<Self, FormatError> {
        match v {
            1 => Ok(ObjectKind::Tensor),
            2 => Ok(ObjectKind::Manifest),
            3 => Ok(ObjectKind::Commit),
            other => Err(FormatError::UnknownTag {
                what: "object kind",
                tag: other,
            }),
        }
    }
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    /// `docs/FORMAT.md` must describe the version this build writes.
    #[test]
    fn format_doc_matches_version() {
        let doc = include_str!("../../../docs/FORMAT.md");
        assert!(
            doc.contains(&format!("FORMAT_VERSION: {}", super::FORMAT_VERSION)),
            "docs/FORMAT.md does not state FORMAT_VERSION {}",
            super::FORMAT_VERSION
        );
        assert!(
            doc.contains(&format!("- {} (", super::FORMAT_VERSION)),
            "version history lacks this version"
        );
    }
}
