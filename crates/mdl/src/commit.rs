//! `mdl commit`: store a safetensors checkpoint as a new commit on a branch.

use std::collections::HashSet;
use std::fs::File;
use std::path::Path;
use std::time::Instant;

use mdl_codec::EncodeOptions;
use mdl_format::safetensors::{self, Layout};
use mdl_format::{
    Commit, CommitStats, Entry, Exactness, Manifest, ObjectId, ObjectKind, RefName, Timestamp,
};
use mdl_store::{CommitSummary, IndexEntry, RefValue};
use rayon::prelude::*;
use serde::Serialize;

use crate::{Error, Progress, Repository, Result};

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

    // Identify every tensor (in parallel), releasing pages as we go.
    let tensors = &input.layout.tensors;
    progress.start("hashing", input.map.len() as u64);
    let ids: Vec<ObjectId> = (0..tensors.len())
        .into_par_iter()
        .map(|i| {
            let id = tensors[i].header.object_id(input.tensor(i));
            input.release(i);
            progress.advance(tensors[i].len);
            id
        })
        .collect();
    progress.finish();

    // Store the tensors the repository does not have yet.
    let todo: Vec<usize> = {
        let meta = store.meta().read()?;
        let mut seen = HashSet::new();
        let mut todo = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            if seen.insert(*id) && meta.object(id)?.is_none() {
                todo.push(i);
            }
        }
        todo
    };
    let batch = store.batch();
    progress.start("storing", todo.iter().map(|&i| tensors[i].len).sum());
    let mut added: Vec<(ObjectId, IndexEntry)> = todo
        .par_iter()
        .map(|&i| {
            let out =
                batch.put_tensor(&ids[i], &tensors[i].header, input.tensor(i), &opts.encode)?;
            input.release(i);
            progress.advance(tensors[i].len);
            Ok((out.id, out.entry))
        })
        .collect::<Result<_>>()?;
    progress.finish();

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
    let stored_bytes: u64 = added.iter().map(|(_, e)| e.stored_len).sum();
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
            new_tensors: todo.len() as u32,
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

    Ok(CommitOutcome {
        id,
        branch: target.trim_start_matches("refs/heads/").to_string(),
        raw_bytes,
        stored_bytes,
        ratio: raw_bytes as f64 / stored_bytes.max(1) as f64,
        seconds: started.elapsed().as_secs_f64(),
        tensors: tensors.len() as u32,
        new_tensors: todo.len() as u32,
    })
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
