//! mdl: version control for deep-learning checkpoints.
//!
//! A [`Repository`] stores safetensors checkpoints as content-addressed tensor objects, with
//! manifests, commits, branches and tags on top, like git. Each operation is a module with its
//! options and outcome: [`commit`], [`checkout`], [`log`], [`show`], [`diff`], [`refs`],
//! [`fsck`], [`stats`]. Revisions (`main~2`, a tag, an id prefix) are resolved by [`revision`].
//!
//! ```no_run
//! use mdl::{Repository, commit::CommitOptions};
//! let repo = Repository::init("run".as_ref())?;
//! let out = mdl::commit::commit(&repo, "ckpt.safetensors".as_ref(), &CommitOptions::default(), &mdl::NoProgress)?;
//! println!("committed {}", out.id);
//! # Ok::<(), mdl::Error>(())
//! ```
//!
//! Architecture: `docs/ARCHITECTURE.md`; byte formats: `docs/FORMAT.md`.

pub mod accounting;
mod advertised;
pub mod assemble;
pub mod background;
mod cache;
pub mod checkout;
pub mod coarsen;
mod code;
pub mod commit;
pub mod compact;
pub mod config;
pub mod credentials;
pub mod diff;
pub mod engine;
mod error;
pub mod evict;
pub mod fsck;
pub mod gc;
mod history;
mod input;
pub mod inspect;
pub mod interrupt;
mod limits;
pub mod log;
pub mod lossy;
pub mod merge;
pub mod policy;
mod previous;
mod progress;
pub mod refs;
mod repack;
mod repo;
pub mod revision;
mod rewrite;
pub mod shallow;
pub mod show;
pub mod stats;
pub mod storage;
pub mod transfer;
pub mod warm;

pub use advertised::{advertised, process_alive, ADVERTISEMENT};
pub use cache::user_cache_dir;
pub use code::store_code;
pub use error::{not_safetensors, Error};
pub use limits::{files_allowed, files_within_budget, reserve_or_refuse};
pub use mdl_format::{
    names, Commit, Dtype, Manifest, ObjectId, ObjectKind, Ref, RefName, Timestamp, TreeFile,
    V1_FILE_PATH,
};
pub use mdl_store::{budget, source};
pub use mdl_store::{
    disk_bytes, free_bytes, Held, IndexEntry, Lent, LentBytes, LockMode, RefValue, Storage,
    StoreError, MDL_DIR, PACKS_DIR,
};
pub use progress::{Counting, NoProgress, Progress};
pub use repo::{discover, view_manifest, OpenOptions, Repository};

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Tensors at least this large are processed one at a time (chunk-parallel inside).
pub(crate) const BIG_TENSOR: u64 = 64 << 20;

/// Runs `f` on every item, returning the results in item order: items of at least
/// [`BIG_TENSOR`] bytes (by `size`) one at a time, the rest tensor-parallel, so memory stays
/// near a few tensors whatever the checkpoint's size. The parallel ones start largest first, so
/// that the last to finish are small ones and no core idles behind a large one.
pub(crate) fn per_tensor<T: Sync, R: Send>(
    items: &[T],
    size: impl Fn(&T) -> u64 + Sync,
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    use rayon::prelude::*;
    let (big, mut small): (Vec<usize>, Vec<usize>) =
        (0..items.len()).partition(|&i| size(&items[i]) >= BIG_TENSOR);
    small.sort_by_key(|&i| std::cmp::Reverse(size(&items[i])));
    // The large ones first, each alone; then the rest into one buffer with them, put in item
    // order in place: the results are held once (a million tensors' were held twice).
    let large = big
        .into_iter()
        .map(|i| Ok((i, f(&items[i])?)))
        .collect::<Result<Vec<_>>>()?;
    let mut done: Vec<(usize, R)> = small
        .into_par_iter()
        .map(|i| Ok((i, f(&items[i])?)))
        .collect::<Result<_>>()?;
    done.extend(large);
    done.sort_unstable_by_key(|(i, _)| *i);
    debug_assert!(done.iter().enumerate().all(|(k, (i, _))| k == *i));
    Ok(done.into_iter().map(|(_, r)| r).collect())
}
