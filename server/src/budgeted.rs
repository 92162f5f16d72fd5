//! Reads of a whole manifest under the decode budget (`--decode-memory`): a request that reads
//! a commit's manifest (its files listed or laid out, its tensors listed, a page of them
//! shown) reserves, before reading it, what it and its answer will hold — a measured multiple
//! of the manifest's decoded length — and keeps the reservation while it holds them (an answer
//! written as the manifest is walked keeps it until its last piece is sent).
//! With the commit limits (`limits.*`), a manifest's size is bounded; with the reservation,
//! so is what all such requests hold together.

use std::ops::Deref;

use mdl::budget::Reservation;
use mdl::{ObjectId, Repository};

// Measured on a commit of 1,000,000 tensors in one file (a 54 MiB manifest; a server's peak
// growth for one request, `docs/BENCHMARKS.md`): 61 MiB for the file listing, the `/hf` tree
// and the web commit page (the manifest read in place), 212 for its manifest's JSON, 457 for
// a download of the file (its 1,000,000 pieces laid out), 748 for the shown commit (every
// tensor described, and the answer). The factors below are those, rounded up.

/// Bytes a listing of a commit's files (its manifest read in place) holds per byte of its
/// manifest.
pub(crate) const LISTED: u64 = 2;

/// Bytes a page of a commit's tensors (the web commit page: its manifest read in place, one
/// page described) holds per byte of its manifest.
pub(crate) const PAGE: u64 = 2;

/// Bytes a laid-out commit (its files' pieces) holds per byte of its manifest.
pub(crate) const LAYOUT: u64 = 10;

/// Bytes a shown commit (`/commits/{rev}`: its manifest read in place, its tensors described
/// and sent one at a time; its moment pairs' labels, about 110 bytes a pair, held whole)
/// holds per byte of its manifest.
pub(crate) const SHOWN: u64 = 3;

/// Bytes `GET /manifests/{id}` holds per byte of the manifest: its bytes, read in place while
/// its JSON is written out a piece at a time.
pub(crate) const MANIFEST_JSON: u64 = 2;

/// A value decoded from a manifest, with its share of the decode budget.
pub(crate) struct Held<T> {
    value: T,
    _budget: Reservation,
}

impl<T> Deref for Held<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

/// `make(commit)` for the commit `rev` names, under a reservation of `per_byte` times its
/// manifest's decoded length (taken first: this waits while the budget is taken), kept with
/// what it made. On a blocking thread, never in an async worker or a rayon one.
pub(crate) fn hold<T>(
    repo: &Repository,
    rev: &str,
    per_byte: u64,
    make: impl FnOnce(&ObjectId) -> mdl::Result<T>,
) -> mdl::Result<Held<T>> {
    let commit = mdl::revision::resolve(repo, rev)?;
    let len = repo.manifest_len(&commit)?;
    let budget = reserve_manifest(len, per_byte)?;
    Ok(Held {
        value: make(&commit)?,
        _budget: budget,
    })
}

/// The share of the budget a read of a manifest of `len` bytes (decoded; of two manifests
/// together, for a comparison) holds: `per_byte` times it. A read that would need more than
/// the whole budget is refused at once (413), naming the setting to raise: it would otherwise
/// be let past the budget.
pub(crate) fn reserve_manifest(len: u64, per_byte: u64) -> mdl::Result<Reservation> {
    mdl::reserve_or_refuse(len.saturating_mul(per_byte), || {
        format!(
            "reading this commit's manifest ({} MiB)",
            len.div_ceil(1 << 20)
        )
    })
}
