//! Tensors sent as deltas against versions the receiver holds (issue 72): a client that has
//! one commit of a series and fetches the next should move what changed, not the next version
//! whole. The plan names, for each tensor stored whole, the version of it that the receiver
//! holds ([`derive_against`]: the same file and tensor name in the newest commit it has); a
//! fetch that names those pairs gets each such tensor as a record coded against its pair —
//! the float codecs' best delta, XOR or difference, entropy-coded and sparse where sparse —
//! made as the pack is written, where that record is smaller than the stored one
//! ([`derived_record`]). The receiver verifies it as every record: decoded against the base it
//! holds and hashed against the id it was asked for, exact or refused.
//!
//! A record made is kept for the next fetch of the same pair ([`Cache`]): the rollout workers
//! that follow one trainer each ask for the same step's deltas, and the first one's work serves
//! those that ask after it, or at the same time (they wait for it: [`Claim`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use mdl_codec::planes::PlaneSpec;
use mdl_codec::{float, CodecTag};
use mdl_format::record::{self, RecordHeader};
use mdl_format::{ObjectId, ObjectKind, TensorHeader};
use mdl_store::IndexEntry;

use super::PlannedObject;
use crate::previous::Previous;
use crate::{history, Error, Repository, Result};

/// Largest tensor coded against a base as a pack is written: the sender holds the tensor, its
/// base and the delta at once, under the decode budget.
pub const MAX_DERIVED: u64 = 256 << 20;

/// Names in `plan` (objects a receiver holding the commits `has_commit` lacks for `want`) the
/// version of each float tensor stored whole that the receiver holds: the tensor of the same file
/// and name (or of the same name, where it is unique: [`Previous`]), of the same dtype and
/// shape, in the newest commit it has among `want`'s ancestors. Tensors without one keep
/// `against` empty.
pub fn derive_against(
    repo: &Repository,
    want: &[ObjectId],
    has_commit: &dyn Fn(&ObjectId) -> bool,
    plan: &mut [PlannedObject],
) -> Result<()> {
    let walked = history::walk(repo, want)?;
    // Children first: the first commit held is the newest the two sides share.
    let Some((_, held)) = walked.iter().find(|(id, _)| has_commit(id)) else {
        return Ok(());
    };
    let held = repo.load_manifest(&held.manifest)?;
    let previous = Previous::of(Some(&held));
    let mut pairs: HashMap<ObjectId, ObjectId> = HashMap::new();
    for (_, summary) in walked.iter().filter(|(id, _)| !has_commit(id)) {
        let manifest = repo.load_manifest(&summary.manifest)?;
        for (f, e) in manifest.tensors() {
            let Some(p) = previous.get(&manifest.files[f].path, &e.name) else {
                continue;
            };
            // Float tensors a delta may be made of (as a commit's reverse deltas are made).
            let worth = float::supports(e.header.dtype)
                && e.header.data_len().unwrap_or(0) >= mdl_codec::SMALL_DELTA;
            if worth && p.id != e.id && p.header == e.header {
                pairs.entry(e.id).or_insert(p.id);
            }
        }
    }
    let meta = repo.store().meta().read()?;
    for p in plan.iter_mut().filter(|p| !p.expired) {
        let Some(&base) = pairs.get(&p.id) else {
            continue;
        };
        let whole = meta.object(&p.id)?.is_some_and(|e| e.base.is_none());
        if whole && is_tensor(&meta, &base)? {
            p.against = Some(base);
        }
    }
    Ok(())
}

fn is_tensor(meta: &mdl_store::meta::MetaRead, id: &ObjectId) -> Result<bool> {
    Ok(meta
        .object(id)?
        .is_some_and(|e| e.kind == ObjectKind::Tensor))
}

/// The record of tensor `id` coded against `base`, which the receiver holds: the float codecs'
/// best delta of one against the other, where its
/// record is smaller than the stored one. `None` where there is none to make (not a float
/// tensor stored whole, another dtype or shape, larger than [`MAX_DERIVED`]) or it would not
/// be smaller.
pub fn derived_record(
    repo: &Repository,
    id: &ObjectId,
    base: &ObjectId,
) -> Result<Option<Vec<u8>>> {
    let entry = repo.store().meta().read()?.object(id)?;
    let Some(entry) = entry else {
        return Ok(None);
    };
    let _budget = crate::budget::reserve(held_bytes(&entry));
    Ok(derived(repo, id, &entry, base)?.map(|d| d.record))
}

/// Bytes making a record coded against a base holds at once, for a tensor indexed as
/// `entry`: the tensor, its base and the delta (nothing past [`MAX_DERIVED`], which is not
/// made).
pub(super) fn held_bytes(entry: &IndexEntry) -> u64 {
    match entry.content_len <= MAX_DERIVED {
        true => 3 * entry.content_len,
        false => 0,
    }
}

/// A record coded against a tensor the receiver holds.
#[derive(Clone)]
pub(super) struct Derived {
    pub(super) record: Vec<u8>,
    pub(super) codec: u8,
    /// The tensor it is coded against.
    pub(super) base: ObjectId,
}

/// Most bytes of derived records kept for later fetches.
const CACHE_BYTES: u64 = 256 << 20;

/// Records made, by `(tensor, base)`, oldest first out past [`CACHE_BYTES`]. A pair's record
/// is content-addressed (it codes one id against another, and every receiver checks it), so
/// the repositories a server serves share it.
#[derive(Default)]
struct Cache {
    records: HashMap<(ObjectId, ObjectId), Derived>,
    order: VecDeque<((ObjectId, ObjectId), u64)>,
    bytes: u64,
    /// Pairs a pack writer has claimed ([`Claim`]) and is making.
    making: HashSet<(ObjectId, ObjectId)>,
}

struct Shared {
    cache: Mutex<Cache>,
    /// Signalled when a claim ends.
    done: Condvar,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| Shared {
        cache: Mutex::new(Cache::default()),
        done: Condvar::new(),
    })
}

fn cache() -> MutexGuard<'static, Cache> {
    shared().cache.lock().unwrap_or_else(|p| p.into_inner())
}

/// Pairs a pack writer makes, so that another writer that needs them waits for their records
/// instead of making them too (rollout workers ask for a step's deltas at the same moment).
/// Taken on the writer's own thread, before the codec's parallel work: a lock waited for
/// inside that work could be held by the very thread that waits. Released when dropped.
pub(super) struct Claim(Vec<(ObjectId, ObjectId)>);

impl Claim {
    /// Waits until no other writer is making any of `pairs`, then claims those not kept yet.
    pub(super) fn take(pairs: &[(ObjectId, ObjectId)]) -> Claim {
        let s = shared();
        let mut c = cache();
        while pairs.iter().any(|p| c.making.contains(p)) {
            c = s.done.wait(c).unwrap_or_else(|p| p.into_inner());
        }
        let mine: Vec<_> = (pairs.iter())
            .filter(|p| !c.records.contains_key(p))
            .copied()
            .collect();
        c.making.extend(mine.iter().copied());
        Claim(mine)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let mut c = cache();
        for p in &self.0 {
            c.making.remove(p);
        }
        drop(c);
        shared().done.notify_all();
    }
}

/// Records this process has made (not taken from the cache).
static MADE: AtomicU64 = AtomicU64::new(0);

/// How many derived records this process has made, rather than taken from those kept.
pub fn records_made() -> u64 {
    MADE.load(Ordering::Relaxed)
}

/// Whether the record of `id` against `base` is kept for the next fetch that asks for it.
pub fn is_kept(id: &ObjectId, base: &ObjectId) -> bool {
    cache().records.contains_key(&(*id, *base))
}

/// [`derived_record`] of `id` indexed as `entry`; the caller holds [`held_bytes`] of the
/// decode budget. A record made before for the same pair is taken as it is.
pub(super) fn derived(
    repo: &Repository,
    id: &ObjectId,
    entry: &IndexEntry,
    base: &ObjectId,
) -> Result<Option<Derived>> {
    let key = (*id, *base);
    if let Some(d) = cache().records.get(&key) {
        return Ok(Some(d.clone()));
    }
    // Nothing worth sending depends on this repository's stored record: that is not kept.
    let Some(d) = make(repo, id, entry, base)? else {
        return Ok(None);
    };
    MADE.fetch_add(1, Ordering::Relaxed);
    let mut c = cache();
    let size = d.record.len() as u64;
    if c.records.insert(key, d.clone()).is_none() {
        c.order.push_back((key, size));
        c.bytes += size;
    }
    while c.bytes > CACHE_BYTES {
        let Some((old, n)) = c.order.pop_front() else {
            break;
        };
        c.bytes -= n;
        c.records.remove(&old);
    }
    Ok(Some(d))
}

/// Makes the record [`derived`] describes.
fn make(
    repo: &Repository,
    id: &ObjectId,
    entry: &IndexEntry,
    base: &ObjectId,
) -> Result<Option<Derived>> {
    let store = repo.store();
    let Some(bentry) = store.meta().read()?.object(base)? else {
        return Ok(None);
    };
    let fits = entry.kind == ObjectKind::Tensor
        && bentry.kind == ObjectKind::Tensor
        && entry.content_len == bentry.content_len
        && entry.content_len > 0
        && entry.content_len <= MAX_DERIVED;
    if !fits {
        return Ok(None);
    }
    // A coarsened record decodes to other content than its id names (retention re-encoded it):
    // a delta from or to it would not rebuild what the receiver asked for, or holds.
    let (head, bhead) = (
        store.record_header(id, entry)?,
        store.record_header(base, &bentry)?,
    );
    if head.prefix != bhead.prefix || head.coarsened.is_some() || bhead.coarsened.is_some() {
        return Ok(None);
    }
    let prefix = head.prefix;
    let header = TensorHeader::from_canonical(&prefix)
        .map_err(|source| Error::Corrupt { id: *id, source })?;
    if !float::supports(header.dtype) {
        return Ok(None);
    }
    if bentry.base == Some(*id) {
        if let Some(d) = turned(repo, id, entry, base, &bentry, &header, &prefix)? {
            return Ok(Some(d));
        }
    }
    let data = store.load_tensor(id, entry)?;
    let b = store.load_tensor(base, &bentry)?;
    let engine = store.engine();
    let encoder = |source| Error::Encode { id: *id, source };
    let Some(delta) = float::encode_delta(engine, header.dtype, &data, &b).map_err(encoder)? else {
        return Ok(None);
    };
    // The record is at least its payload; one no smaller than the stored record is not made.
    if delta.payload.len() as u64 >= entry.stored_len {
        return Ok(None);
    }
    let codec = CodecTag::delta(delta.transform) as u8;
    let head = RecordHeader::new(ObjectKind::Tensor, codec, Some(*base), prefix);
    let record = record::encode(&head, &delta.payload, entry.content_len);
    Ok(
        ((record.len() as u64) < entry.stored_len).then_some(Derived {
            record,
            codec,
            base: *base,
        }),
    )
}

/// Where `base` (what the receiver holds) is stored as a masked delta over `id` (the newest
/// version whole, the one before a reverse delta over it: the default store), that delta
/// turned round ([`float::invert_masked`]): the same mask, only the changed elements' words
/// coded again — no tensor decoded. `None` for any other record.
fn turned(
    repo: &Repository,
    id: &ObjectId,
    entry: &IndexEntry,
    base: &ObjectId,
    bentry: &IndexEntry,
    header: &TensorHeader,
    prefix: &[u8],
) -> Result<Option<Derived>> {
    let (bytes, current) = repo.store().read_current_record(base, bentry)?;
    let corrupt = |source| Error::Corrupt { id: *base, source };
    let (head, payload, _) = record::decode(&bytes).map_err(corrupt)?;
    let spec = match CodecTag::try_from(head.codec) {
        Ok(CodecTag::XorDelta) => PlaneSpec::planes(header.dtype, 0),
        Ok(CodecTag::SubDelta) => PlaneSpec::sub(header.dtype),
        _ => return Ok(None),
    };
    if current.base != Some(*id) || head.base != Some(*id) || !float::is_masked(payload) {
        return Ok(None);
    }
    let payload = float::invert_masked(spec, entry.content_len, payload).map_err(corrupt)?;
    let head = RecordHeader::new(ObjectKind::Tensor, head.codec, Some(*base), prefix.to_vec());
    let record = record::encode(&head, &payload, entry.content_len);
    Ok(
        ((record.len() as u64) < entry.stored_len).then_some(Derived {
            record,
            codec: head.codec,
            base: *base,
        }),
    )
}

/// Those of `ids` that this repository holds as tensors decoding to what their ids name: the
/// versions a fetch may take deltas against (one retention coarsened here, or expired, is not).
/// One at the chain cap (`delta.max_depth`) is usable too: the delta still travels, and
/// [`reanchor`] stores what it rebuilds whole here, as a commit starts a chain again.
pub fn usable_bases(repo: &Repository, ids: &[ObjectId]) -> Result<Vec<ObjectId>> {
    let store = repo.store();
    let meta = store.meta().read()?;
    let mut out = Vec::new();
    for id in ids {
        let Some(entry) = meta.object(id)? else {
            continue;
        };
        if entry.kind == ObjectKind::Tensor
            && crate::coarsen::coarsening(store, id, &entry)?.is_none()
        {
            out.push(*id);
        }
    }
    Ok(out)
}

/// Stores whole those of `ids` (tensors a fetch just received as deltas) whose chains now pass
/// this repository's `delta.max_depth`: the wire carried the small delta, and the chain starts
/// again here. Returns how many were re-encoded.
pub fn reanchor(repo: &Repository, ids: &[ObjectId]) -> Result<u64> {
    let store = repo.store();
    let cap = crate::policy::DeltaPolicy::from_store(store)?.max_depth;
    let deep: Vec<ObjectId> = {
        let meta = store.meta().read()?;
        let mut deep = Vec::new();
        for id in ids {
            if meta.object(id)?.is_some_and(|e| e.depth > cap) {
                deep.push(*id);
            }
        }
        deep
    };
    if deep.is_empty() {
        return Ok(0);
    }
    Ok(crate::rewrite::reencode_group(repo, &deep)?.0)
}
