//! What one commit may hold (`limits.*`): bounds no real checkpoint meets, so that a commit
//! that is cheap to upload and store cannot make every later read of its manifest costly
//! (`docs/RELIABILITY.md`). The largest real models have tens of thousands of tensors; a
//! sharded save of one with its optimizer moments a few hundred thousand.

use mdl_store::meta::MetaRead;

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

    /// The value in the repository's configuration `meta`, or the default.
    fn configured(&self, meta: &MetaRead) -> Result<u64> {
        meta.config(self.key)?
            .map_or(Ok(self.default), |v| self.parse(&v))
    }

    /// Refuses `count` over `limit`; `of` says what holds it (made only then).
    fn check(&self, count: u64, limit: u64, of: impl FnOnce() -> String) -> Result<()> {
        if count <= limit {
            return Ok(());
        }
        Err(Error::TooLarge(format!(
            "{} holds {count} {}, over the repository's limit of {limit} (`mdl config {} N` raises it)",
            of(),
            self.what,
            self.key
        )))
    }
}

/// How many files one commit of `repo` may hold (`limits.files`): what a server refuses an
/// upload past as soon as it has counted one more.
pub fn files_allowed(repo: &Repository) -> Result<u64> {
    FILES.configured(&repo.store().meta().read()?)
}

/// How many files one commit may hold within the decode budget (`mdl serve --decode-memory`),
/// at [`COMMIT_PER_FILE`] each: what a server refuses an upload past as soon as it has counted
/// one more, before the rest is written. Unlimited outside a server.
pub fn files_within_budget() -> u64 {
    mdl_store::budget::limit() / COMMIT_PER_FILE
}

/// What a commit's own bookkeeping holds per tensor or byte run, at its peak: the input's
/// pieces, each tensor's result, the manifest made and its parent's decoded (measured: a
/// server's peak grew 1,124 MiB committing 1,000,000 empty tensors over as many others; 878
/// MiB with no parent). What parsing the input's headers takes comes first, uncharged: at most
/// about 6× the headers' bytes (377 MiB for a 60 MB header), bounded by
/// `limits.header_bytes`.
pub(crate) const COMMIT_PER_TENSOR: u64 = 1280;

/// What a commit's bookkeeping holds per file besides its pieces: the file read, its bytes
/// when small (kept in the manifest), its entry in the tree made (measured: a server's peak
/// grew 977 MiB committing 1,000,000 one-byte files uploaded through the Hub route; the
/// reservation is taken once the tree is read, the Hub route refusing an upload past what the
/// budget could take as soon as it has counted the files).
pub(crate) const COMMIT_PER_FILE: u64 = 1280;

/// The share of the decode budget (`mdl serve --decode-memory`) a commit of `input` holds
/// while it runs, reserved before it starts: a server's commits share the budget with its
/// reads. A commit that needs more than the whole budget is refused at once. Unlimited (and
/// free) outside a server.
pub(crate) fn reserve_commit(input: &Input) -> Result<mdl_store::budget::Reservation> {
    let (pieces, files) = (input.pieces.len() as u64, input.files.len() as u64);
    let needed = pieces
        .saturating_mul(COMMIT_PER_TENSOR)
        .saturating_add(files.saturating_mul(COMMIT_PER_FILE));
    reserve_or_refuse(needed, || {
        format!("committing {files} files of {pieces} tensors and byte runs")
    })
}

/// `needed` bytes of the decode budget (`mdl serve --decode-memory`), waited for; or, where
/// they are more than the whole budget, a [`Error::TooLarge`] at once saying that `doing` needs
/// them and naming the setting to raise. Unlimited (and free) outside a server.
pub fn reserve_or_refuse(
    needed: u64,
    doing: impl FnOnce() -> String,
) -> Result<mdl_store::budget::Reservation> {
    use mdl_store::budget;
    budget::reserve_within(needed).ok_or_else(|| {
        Error::TooLarge(format!(
            "{} needs about {} MiB here, more than the server's --decode-memory ({} MiB) \
             allows: ask the server's owner to raise it",
            doing(),
            needed.div_ceil(1 << 20),
            budget::limit() >> 20
        ))
    })
}

/// Refuses `input` when it holds more than the repository allows; checked before anything of
/// it is stored.
pub(crate) fn check(repo: &Repository, input: &Input) -> Result<()> {
    let meta = repo.store().meta().read()?;
    let commit = || "the commit".to_string();
    FILES.check(input.files.len() as u64, FILES.configured(&meta)?, commit)?;
    TENSORS.check(
        input.pieces.len() as u64,
        TENSORS.configured(&meta)?,
        commit,
    )?;
    let header_limit = HEADER_BYTES.configured(&meta)?;
    for f in &input.files {
        HEADER_BYTES.check(f.header_len, header_limit, || {
            format!("{}'s header", crate::error::shown(&f.source))
        })?;
    }
    Ok(())
}
