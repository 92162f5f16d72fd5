//! What one commit may hold (`limits.*`): bounds no real checkpoint meets, so that a commit
//! that is cheap to upload and store cannot make every later read of its manifest costly
//! (`docs/RELIABILITY.md`). The largest real models have tens of thousands of tensors; a
//! sharded save of one with its optimizer moments a few hundred thousand.

use crate::input::Input;
use crate::{Error, Repository, Result};

/// One limit: its configuration key, its default, and what it counts.
pub(crate) struct Limit {
    pub(crate) key: &'static str,
    pub(crate) default: u64,
    what: &'static str,
}

/// `limits.tensors`: tensors and stored byte runs in one commit (the manifest's entries).
pub(crate) const TENSORS: Limit = Limit {
    key: "limits.tensors",
    default: 1 << 20,
    what: "tensors and byte objects",
};

/// `limits.files`: files in one commit's tree.
pub(crate) const FILES: Limit = Limit {
    key: "limits.files",
    default: 100_000,
    what: "files",
};

/// `limits.header_bytes`: the header of one safetensors file (the reference reader's own
/// limit is 100 MB).
pub(crate) const HEADER_BYTES: Limit = Limit {
    key: "limits.header_bytes",
    default: 100_000_000,
    what: "header bytes",
};

/// Every limit.
pub(crate) const ALL: [&Limit; 3] = [&TENSORS, &FILES, &HEADER_BYTES];

impl Limit {
    /// Parses a value: a whole number, at least 1.
    pub(crate) fn parse(&self, v: &str) -> Result<u64> {
        v.parse::<u64>()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| Error::InvalidConfig {
                key: self.key.into(),
                value: v.into(),
                expected: "a whole number, at least 1",
            })
    }

    /// The repository's value, or the default.
    fn configured(&self, repo: &Repository) -> Result<u64> {
        let value = repo.store().meta().read()?.config(self.key)?;
        value.map_or(Ok(self.default), |v| self.parse(&v))
    }

    fn check(&self, count: u64, limit: u64, of: &str) -> Result<()> {
        if count <= limit {
            return Ok(());
        }
        Err(Error::TooLarge(format!(
            "{of} holds {count} {}, over the repository's limit of {limit} (`mdl config {} N` raises it)",
            self.what, self.key
        )))
    }
}

/// Refuses `input` when it holds more than the repository allows; checked before anything of
/// it is stored.
pub(crate) fn check(repo: &Repository, input: &Input) -> Result<()> {
    FILES.check(
        input.files.len() as u64,
        FILES.configured(repo)?,
        "the commit",
    )?;
    TENSORS.check(
        input.pieces.len() as u64,
        TENSORS.configured(repo)?,
        "the commit",
    )?;
    let header_limit = HEADER_BYTES.configured(repo)?;
    for f in &input.files {
        let of = format!("{}'s header", crate::error::shown(&f.source));
        HEADER_BYTES.check(f.header_len, header_limit, &of)?;
    }
    Ok(())
}
