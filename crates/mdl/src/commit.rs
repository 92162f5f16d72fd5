//! `mdl commit`: store a safetensors checkpoint as a new commit on a branch.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use mdl_codec::float::{self, Transform};
use mdl_codec::{CodecTag, EncodeOptions, SMALL_TENSOR};
use mdl_format::safetensors::{self, Layout, TensorInfo};
use mdl_format::{
    Commit, CommitStats, Entry, Exactness, Manifest, ObjectId, ObjectKind, RefName, Timestamp,
};
use mdl_store::meta::{MetaRead, MetaWrite};
use mdl_store::{CommitSummary, IndexEntry, ObjectBatch, Placement, RefValue};
use serde::Serialize;

use crate::policy::{DeltaMode, DeltaPolicy};
use crate::{per_tensor, Error, Progress, Repository, Result};

/// What to commit and how.
#[derive(Clone, Debug, Default)]
pub struct CommitOptions {
    /// Commit message.
    pub message: String,
    /// Branch to commit onto (created at HEAD's commit if missing); HEAD's branch if `None`.
    pub branch: Option<RefName>,
    /// Training step.
    pub step: Option<u64>,
    /// Metrics, `name → value`; names must be unique.
    pub metrics: Vec<(String, f64)>,
    /// Author; `$MDL_AUTHOR`, then `$USER`, then "unknown" when `None`.
    pub author: Option<String>,
    /// Codec settings.
    pub encode: EncodeOptions,
    /// Delta policy; the repository's configuration when `None`.
    pub delta: Option<DeltaPolicy>,
}

/// What a commit did.
#[derive(Clone, Debug, Serialize)]
pub struct CommitOutcome {
    /// The new commit.
    pub id: ObjectId,
    /// The branch it is on (short name).
    pub branch: String,
    /// Size of the committed file.
    pub raw_bytes: u64,
    /// Bytes of records added to the store.
    pub stored_bytes: u64,
    /// `raw_bytes / stored_bytes` (infinite when nothing new was stored).
    pub ratio: f64,
    /// Wall time.
    pub seconds: f64,
    /// Tensors in the checkpoint.
    pub tensors: u32,
    /// Tensors not already stored.
    pub new_tensors: u32,
}

/// A validated safetensors file mapped into memory.
pub(crate) struct Input {
    map: memmap2::Mmap,
    pub(crate) layout: Layout,
}

impl Input {
    /// Maps and validates `path`; nothing is written anywhere.
    pub(crate) fn open(path: &Path) -> Result<Input> {
        let io = |source| Error::Input {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(io(std::io::Error::other("not a regular file")));
        }
        let invalid = |source| Error::InvalidInput {
            path: path.to_path_buf(),
            source,
        };
        if meta.len() < 8 {
            return Err(invalid(safetensors::SafetensorsError::TooShort {
                len: meta.len(),
            }));
        }
        // SAFETY: the map is read-only and private. Another process truncating the file while
        // it is mapped would fault, as for every mmap-based reader (safetensors included); one
        // rewriting it in place cannot corrupt the store, because every tensor is re-hashed as
        // it is encoded and a mismatch aborts the commit.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let header_len = safetensors::header_len(&map[..8], map.len() as u64).map_err(invalid)?;
        let header = &map[8..8 + header_len as usize];
        let layout = safetensors::parse(header, map.len() as u64).map_err(invalid)?;
        Ok(Input { map, layout })
    }

    pub(crate) fn header_json(&self) -> &[u8] {
        &self.map[8..self.layout.data_start() as usize]
    }

    pub(crate) fn tensor(&self, i: usize) -> &[u8] {
        let t = &self.layout.tensors[i];
        let start = (self.layout.data_start() + t.offset) as usize;
        &self.map[start..start + t.len as usize]
    }

    /// Drops the pages of tensor `i` from this process's memory (they stay in the page cache),
    /// so resident memory follows the tensor being worked on, not the file size.
    fn release(&self, i: usize) {
        let t = &self.layout.tensors[i];
        let start = (self.layout.data_start() + t.offset) as usize;
        let page = 4096;
        let aligned = start.div_ceil(page) * page;
        let end = (start + t.len as usize) / page * page;
        if end > aligned {
            // SAFETY: the mapping is a read-only private file mapping that this process never
            // writes, so discarding its pages only means they are read from the file again on
            // the next access; no slice into the range is used concurrently in a way that
            // depends on the pages staying resident.
            #[allow(unsafe_code)]
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    aligned,
                    end - aligned,
                )
            };
        }
    }
}

/// Commits the safetensors file at `path`.
pub fn commit(
    repo: &Repository,
    path: &Path,
    opts: &CommitOptions,
    progress: &dyn Progress,
) -> Result<CommitOutcome> {
    let started = Instant::now();
    let metrics = check_metrics(&opts.metrics)?;
    let input = Input::open(path)?;
    let store = repo.store();

    // Which ref moves, and from where.
    let head_branch = repo.head_branch()?;
    let target = match &opts.branch {
        Some(b) => format!("refs/heads/{b}"),
        None => head_branch.clone(),
    };
    let (expected, parent) = {
        let meta = store.meta().read()?;
        let current = meta.get_ref(&target)?;
        let parent = match &current {
            Some(v) => v.target(),
            // A new branch starts at HEAD's commit, if HEAD's branch has one.
            None => meta.get_ref(&head_branch)?.and_then(|v| v.target()),
        };
        (current, parent)
    };

    // Parent versions of each tensor, by name: the delta bases.
    let policy = opts
        .delta
        .map_or_else(|| DeltaPolicy::from_store(store), Ok)?;
    let parent_manifest = match parent {
        Some(p) if policy.mode != DeltaMode::Off => {
            Some(repo.load_manifest(&repo.load_commit(&p)?.manifest)?)
        }
        _ => None,
    };
    let previous: HashMap<&str, &Entry> = parent_manifest
        .iter()
        .flat_map(|m| m.entries.iter().map(|e| (e.name.as_str(), e)))
        .collect();

    // Hash and store every tensor.
    let tensors = &input.layout.tensors;
    let batch = store.batch();
    let ctx = StoreCtx {
        repo,
        batch: &batch,
        input: &input,
        previous: &previous,
        policy,
        encode: &opts.encode,
        claimed: Mutex::new(HashSet::new()),
        rewritten: Mutex::new(HashSet::new()),
        progress,
    };
    progress.start("storing", input.map.len() as u64);
    let indices: Vec<usize> = (0..tensors.len()).collect();
    let results = per_tensor(&indices, |&i| tensors[i].len, |&i| ctx.store_tensor(i))?;
    progress.finish();
    let ids: Vec<ObjectId> = results.iter().map(|r| r.id).collect();
    let mut added: Vec<(ObjectId, IndexEntry)> = Vec::new();
    let mut rewrites: Vec<Rewrite> = Vec::new();
    for r in results {
        added.extend(r.added);
        rewrites.extend(r.rewrite);
    }
    let new_tensors = added.len();

    let manifest = Manifest {
        header_json: input.header_json().to_vec(),
        metadata: {
            let mut m = input.layout.metadata.clone();
            m.sort();
            m
        },
        entries: tensors
            .iter()
            .zip(&ids)
            .map(|(t, id)| Entry {
                name: t.name.clone(),
                header: t.header.clone(),
                id: *id,
                exactness: Exactness::Lossless,
            })
            .collect(),
    };
    let manifest_bytes = manifest.encode();
    let manifest_id = ObjectId::hash(&manifest_bytes);
    if store.meta().read()?.object(&manifest_id)?.is_none() {
        let out = batch.put_blob(ObjectKind::Manifest, &manifest_bytes)?;
        added.push((out.id, out.entry));
    }
    // Bytes this commit adds to the store: new records, less what re-encoding saved.
    let stored_bytes = (added.iter().map(|(_, e)| e.stored_len).sum::<u64>()
        + rewrites.iter().map(|r| r.new.stored_len).sum::<u64>())
    .saturating_sub(rewrites.iter().map(|r| r.old.stored_len).sum::<u64>());
    let raw_bytes = input.map.len() as u64;
    let commit = Commit {
        manifest: manifest_id,
        parents: parent.into_iter().collect(),
        author: opts.author.clone().unwrap_or_else(default_author),
        time: Timestamp::now(),
        message: opts.message.clone(),
        step: opts.step,
        metrics,
        stats: CommitStats {
            raw_bytes,
            stored_bytes,
            tensors: tensors.len() as u32,
            new_tensors: new_tensors as u32,
        },
    };
    let commit_out = batch.put_blob(ObjectKind::Commit, &commit.encode())?;
    let id = commit_out.id;
    added.push((id, commit_out.entry));
    batch.finish()?;

    // Publish: index entries, commit index and the ref, in one transaction.
    let mut w = store.meta().write()?;
    for (oid, entry) in &added {
        w.put_object(oid, entry)?;
        if let Some(base) = &entry.base {
            w.add_dependent(base, oid)?;
        }
    }
    for r in &rewrites {
        publish_rewrite(&mut w, r)?;
    }
    w.put_commit(
        &id,
        &CommitSummary {
            time: commit.time,
            manifest: manifest_id,
            parents: commit.parents.clone(),
            raw_bytes,
        },
    )?;
    let summary = commit.message.lines().next().unwrap_or("");
    let reflog = if expected.is_none() {
        format!("commit (new branch): {summary}")
    } else {
        format!("commit: {summary}")
    };
    w.update_ref(
        &target,
        expected.as_ref(),
        Some(&RefValue::Direct(id)),
        &reflog,
    )?;
    w.commit_txn()?;
    for r in &rewrites {
        store.remove_record(&r.id, r.old.generation);
    }

    Ok(CommitOutcome {
        id,
        branch: target.trim_start_matches("refs/heads/").to_string(),
        raw_bytes,
        stored_bytes,
        ratio: raw_bytes as f64 / stored_bytes.max(1) as f64,
        seconds: started.elapsed().as_secs_f64(),
        tensors: tensors.len() as u32,
        new_tensors: new_tensors as u32,
    })
}

/// Float tensors whose best float encoding saves less than this fraction also try zstd.
const FLOAT_GAIN_FLOOR: f64 = 0.03;

/// Re-encoding a previous version as a delta must save at least this fraction of its record.
const REWRITE_GAIN_FLOOR: f64 = 0.02;

/// One tensor's outcome.
struct Stored {
    id: ObjectId,
    /// Its new record, unless the repository already had the object.
    added: Option<(ObjectId, IndexEntry)>,
    /// The previous version, re-encoded against this one (reverse deltas).
    rewrite: Option<Rewrite>,
}

/// An existing object given a new record (a new generation); its id does not change.
struct Rewrite {
    id: ObjectId,
    old: IndexEntry,
    new: IndexEntry,
}

/// Everything the per-tensor work shares.
struct StoreCtx<'a> {
    repo: &'a Repository,
    batch: &'a ObjectBatch<'a>,
    input: &'a Input,
    previous: &'a HashMap<&'a str, &'a Entry>,
    policy: DeltaPolicy,
    encode: &'a EncodeOptions,
    /// Objects this commit is storing (a checkpoint may hold the same tensor twice).
    claimed: Mutex<HashSet<ObjectId>>,
    /// Objects this commit is re-encoding.
    rewritten: Mutex<HashSet<ObjectId>>,
    progress: &'a dyn Progress,
}

impl StoreCtx<'_> {
    fn store_tensor(&self, i: usize) -> Result<Stored> {
        let info = &self.input.layout.tensors[i];
        // Work on a private copy: what is hashed is exactly what is encoded, even if the file
        // changes underneath the mapping.
        let data = self.input.tensor(i).to_vec();
        self.input.release(i);
        let mut hasher = info.header.hasher();
        hasher.update(&data);
        let id = hasher.finalize();
        let store = self.repo.store();
        let fresh = self.claimed.lock().unwrap().insert(id);
        let result = if !fresh || store.meta().read()?.object(&id)?.is_some() {
            Stored {
                id,
                added: None,
                rewrite: None,
            }
        } else {
            self.encode_new(id, info, &data)?
        };
        self.progress.advance(info.len);
        Ok(result)
    }

    /// The previous version of a tensor that can serve as a delta base: same name, dtype and
    /// shape, different content, stored here, and in a chain the policy lets grow (depth cap;
    /// with reverse deltas, a self-contained record). `None` means no delta is tried at all.
    fn base_for(&self, info: &TensorInfo, id: &ObjectId) -> Result<Option<(ObjectId, IndexEntry)>> {
        let Some(prev) = self.previous.get(info.name.as_str()) else {
            return Ok(None);
        };
        if prev.header != info.header || prev.id == *id || prev.exactness != Exactness::Lossless {
            return Ok(None);
        }
        let meta = self.repo.store().meta().read()?;
        let Some(entry) = meta.object(&prev.id)? else {
            return Ok(None);
        };
        // Whether the policy lets a delta join this chain, decided before the base is decoded.
        let allowed = match self.policy.mode {
            DeltaMode::Off => false,
            DeltaMode::Forward => entry.depth < self.policy.max_depth,
            // The previous version must be self-contained, and everything decoding through it
            // must stay within the cap once it is one step deeper.
            DeltaMode::Reverse => {
                entry.base.is_none() && chain_height(&meta, &prev.id)? < self.policy.max_depth
            }
        };
        Ok(allowed.then_some((prev.id, entry)))
    }

    fn encode_new(&self, id: ObjectId, info: &TensorInfo, data: &[u8]) -> Result<Stored> {
        let header = &info.header;
        let len = data.len() as u64;
        let plain = |added| Stored {
            id,
            added: Some(added),
            rewrite: None,
        };
        if !float::supports(header.dtype) || len < SMALL_TENSOR {
            let out = self.batch.put_tensor(&id, header, data, self.encode)?;
            return Ok(plain((id, out.entry)));
        }
        let store = self.repo.store();
        let base = self.base_for(info, &id)?;
        let base_data = base
            .as_ref()
            .map(|(bid, be)| store.load_tensor(bid, be))
            .transpose()?;
        let corrupt = |source| Error::Corrupt { id, source };
        let analysis = float::analyze(header.dtype, data, base_data.as_deref()).map_err(corrupt)?;
        let delta = analysis.best_delta();
        let best_float = delta.map_or(analysis.plain.size, |d| d.size);
        if best_float as f64 > len as f64 * (1.0 - FLOAT_GAIN_FLOOR) {
            // The float codecs barely help (noise-like or repetitive data): let raw and zstd
            // compete instead.
            let out = self.batch.put_tensor(&id, header, data, self.encode)?;
            return Ok(plain((id, out.entry)));
        }
        // Writes the new tensor with a float choice, as a delta when given its base and depth.
        let write = |choice: &float::Choice, base: Option<(&ObjectId, &[u8], u32)>| {
            let payload = float::encode_pieces(header.dtype, data, base.map(|b| b.1), choice)
                .map_err(corrupt)?;
            let (codec, placement) = match base {
                Some((bid, _, depth)) => (
                    delta_codec(choice),
                    Placement {
                        generation: 0,
                        base: Some(*bid),
                        depth,
                    },
                ),
                None => (CodecTag::FloatSplit, Placement::default()),
            };
            Ok::<_, Error>(
                self.batch
                    .put_payload(&id, header, codec, placement, &payload.pieces())?
                    .entry,
            )
        };
        // The best self-contained record: float-split unless it would not beat raw.
        let whole = || {
            if analysis.plain.size < len {
                write(&analysis.plain, None)
            } else {
                Ok(self.batch.put_tensor(&id, header, data, self.encode)?.entry)
            }
        };

        let (Some((bid, bentry)), Some(bdata), Some(delta)) = (base, base_data.as_deref(), delta)
        else {
            return Ok(plain((id, whole()?)));
        };
        match self.policy.mode {
            DeltaMode::Off => Ok(plain((id, whole()?))),
            DeltaMode::Forward => Ok(plain((
                id,
                write(delta, Some((&bid, bdata, bentry.depth + 1)))?,
            ))),
            DeltaMode::Reverse => {
                // The new tensor is the self-contained end of the chain.
                let entry = whole()?;
                let rewrite = self.reverse(&bid, &bentry, bdata, &id, data, info, delta)?;
                Ok(Stored {
                    id,
                    added: Some((id, entry)),
                    rewrite: rewrite.map(|(old, new)| Rewrite { id: bid, old, new }),
                })
            }
        }
    }

    /// Re-encodes the previous version `prev` (already checked by [`Self::base_for`]) as a delta
    /// against the new tensor, when that saves enough and no other tensor of this commit did.
    #[allow(clippy::too_many_arguments)]
    fn reverse(
        &self,
        prev: &ObjectId,
        prev_entry: &IndexEntry,
        prev_data: &[u8],
        id: &ObjectId,
        data: &[u8],
        info: &TensorInfo,
        estimate: &float::Choice,
    ) -> Result<Option<(IndexEntry, IndexEntry)>> {
        if estimate.size as f64 > prev_entry.stored_len as f64 * (1.0 - REWRITE_GAIN_FLOOR)
            || !self.rewritten.lock().unwrap().insert(*prev)
        {
            return Ok(None);
        }
        // XOR planes are symmetric; planes taken as they are must be coded from the previous
        // version's own bytes unless they are stored raw.
        let corrupt = |source| Error::Corrupt { id: *prev, source };
        let choice = match estimate.transform {
            Transform::Planes if estimate.reusable_for_swap() => estimate.clone(),
            Transform::Planes => {
                float::analyze_masked(info.header.dtype, prev_data, data, estimate.xor_mask)
                    .map_err(corrupt)?
            }
            // The difference changes sign with the roles, and its zigzag symbols with it.
            Transform::Sub => {
                float::analyze_sub(info.header.dtype, prev_data, data).map_err(corrupt)?
            }
        };
        if choice.size as f64 > prev_entry.stored_len as f64 * (1.0 - REWRITE_GAIN_FLOOR) {
            return Ok(None);
        }
        let payload = float::encode_pieces(info.header.dtype, prev_data, Some(data), &choice)
            .map_err(corrupt)?;
        let placement = Placement {
            generation: prev_entry.generation + 1,
            base: Some(*id),
            depth: 1,
        };
        let new = self
            .batch
            .put_payload(
                prev,
                &info.header,
                delta_codec(&choice),
                placement,
                &payload.pieces(),
            )?
            .entry;
        Ok(Some((*prev_entry, new)))
    }
}

/// The codec of a delta record made with `choice`.
fn delta_codec(choice: &float::Choice) -> CodecTag {
    match choice.transform {
        Transform::Planes => CodecTag::XorDelta,
        Transform::Sub => CodecTag::SubDelta,
    }
}

/// The longest chain of delta steps that ends at `base` (0 when nothing decodes through it).
fn chain_height(meta: &MetaRead, base: &ObjectId) -> Result<u32> {
    let mut longest = 0;
    let mut frontier = vec![(*base, 0u32)];
    while let Some((id, steps)) = frontier.pop() {
        longest = longest.max(steps);
        if steps >= mdl_store::MAX_CHAIN {
            break;
        }
        for d in meta.dependents(&id)? {
            frontier.push((d, steps + 1));
        }
    }
    Ok(longest)
}

/// Publishes a re-encoded object: its new record, its new base link, and one more step for
/// everything that decodes through it.
fn publish_rewrite(w: &mut MetaWrite, r: &Rewrite) -> Result<()> {
    w.put_object(&r.id, &r.new)?;
    if let Some(old_base) = &r.old.base {
        w.remove_dependent(old_base, &r.id)?;
    }
    if let Some(base) = &r.new.base {
        w.add_dependent(base, &r.id)?;
    }
    let shift = r.new.depth as i64 - r.old.depth as i64;
    let mut frontier = w.dependents(&r.id)?;
    let mut seen = HashSet::new();
    while let Some(d) = frontier.pop() {
        if !seen.insert(d) {
            continue;
        }
        if let Some(mut e) = w.object(&d)? {
            e.depth = (e.depth as i64 + shift).max(0) as u32;
            w.put_object(&d, &e)?;
        }
        frontier.extend(w.dependents(&d)?);
    }
    Ok(())
}

fn check_metrics(metrics: &[(String, f64)]) -> Result<Vec<(String, f64)>> {
    let mut out = metrics.to_vec();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    for w in out.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(Error::InvalidMetric(w[0].0.clone()));
        }
    }
    if let Some((k, _)) = out
        .iter()
        .find(|(k, _)| k.is_empty() || k.chars().any(|c| c.is_control() || c == '='))
    {
        return Err(Error::InvalidMetric(k.clone()));
    }
    Ok(out)
}

fn default_author() -> String {
    std::env::var("MDL_AUTHOR")
        .or_else(|_| std::env::var("USER"))
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
