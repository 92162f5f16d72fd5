use crate::id::{ObjectId, ParseIdError};

/// Errors from decoding or validating persisted bytes.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The input ended before a complete value could be read.
    #[error("truncated {what}: needed {needed} more bytes")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// How many bytes were missing.
        needed: usize,
    },
    /// A stable enum tag had a value this version does not know.
    #[error("unknown {what} tag {tag}")]
    UnknownTag {
        /// Which enum.
        what: &'static str,
        /// The value found.
        tag: u8,
    },
    /// A structure declared a version newer than this build understands.
    #[error("{what} has format version {found}, this build reads up to {supported}")]
    UnsupportedVersion {
        /// Which structure.
        what: &'static str,
        /// Version found in the bytes.
        found: u16,
        /// Newest version this build reads.
        supported: u16,
    },
    /// The bytes violate an invariant of the format.
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// Which structure.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A record's checksum does not match its bytes.
    #[error("checksum mismatch in record (stored {stored:08x}, computed {computed:08x})")]
    Checksum {
        /// The checksum stored in the record.
        stored: u32,
        /// The checksum of the bytes as read.
        computed: u32,
    },
    /// Decoded content does not hash to the id it was stored under.
    #[error("object {expected} is corrupt: its content hashes to {actual}")]
    HashMismatch {
        /// The id the object was requested by.
        expected: ObjectId,
        /// The hash of what was decoded.
        actual: ObjectId,
    },
}

impl FormatError {
    /// An [`FormatError::Invalid`] with the given detail.
    pub fn invalid(what: &'static str, detail: impl Into<String>) -> Self {
        FormatError::Invalid {
            what,
            detail: detail.into(),
        }
    }
}

impl From<ParseIdError> for FormatError {
    fn from(e: ParseIdError) -> Self {
        FormatError::Invalid {
            what: e.what,
            detail: e.detail,
        }
    }
}
