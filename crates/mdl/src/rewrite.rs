//! Re-encoding stored objects without changing their ids: a new record generation is written,
//! then one index transaction switches to it and fixes the chain depths of everything that
//! decodes through it. Used by reverse-delta commits, `mdl compact` and `mdl gc`.

use std::collections::HashSet;

use mdl_codec::{float, CodecTag};
use mdl_format::{ObjectId, TensorHeader};
use mdl_store::meta::{MetaRead, MetaWrite};
use mdl_store::{IndexEntry, ObjectBatch, Placement, Store};

use crate::{Error, Repository, Result};

/// An existing object given a new record (a new generation); its id does not change.
pub(crate) struct Rewrite {
    pub(crate) id: ObjectId,
    pub(crate) old: IndexEntry,
    pub(crate) new: IndexEntry,
}

/// Publishes a re-encoded object: its new record, its new base link, and the depth change for
/// everything that decodes through it. The depth change is taken from the entry the index
/// holds now, so several rewrites of one chain may share a transaction in any order.
pub(crate) fn publish_rewrite(w: &mut MetaWrite<'_>, r: &Rewrite) -> Result<()> {
    let current = w.object(&r.id)?.unwrap_or(r.old);
    w.put_object(&r.id, &r.new)?;
    if let Some(old_base) = &current.base {
        w.remove_dependent(old_base, &r.id)?;
    }
    if let Some(base) = &r.new.base {
        w.add_dependent(base, &r.id)?;
    }
    let shift = r.new.depth as i64 - current.depth as i64;
    if shift == 0 {
        return Ok(());
    }
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

/// Publishes `rewrites` in one index transaction, then removes their old records (a crash
/// in between leaves unindexed records, which gc sweeps).
pub(crate) fn publish_all(store: &Store, rewrites: &[Rewrite]) -> Result<()> {
    let mut w = store.meta().write()?;
    for r in rewrites {
        publish_rewrite(&mut w, r)?;
    }
    w.commit_txn()?;
    for r in rewrites {
        store.remove_record(&r.id, r.old.generation);
    }
    Ok(())
}

/// Re-encodes `ids` (tensors of one chain) as self-contained records and publishes them in one
/// transaction, holding the repository's writer meanwhile. Returns how many were re-encoded,
/// how many were skipped (gone or already self-contained), and the change in stored bytes.
pub(crate) fn reencode_group(repo: &Repository, ids: &[ObjectId]) -> Result<(u64, u64, i64)> {
    let store = repo.store();
    let _writer = repo.writer();
    let batch = store.batch();
    let mut rewrites: Vec<Rewrite> = Vec::new();
    let mut skipped = 0;
    for id in ids {
        // The entry as it is now: another step (or a commit) may have changed it since the plan.
        match store.meta().read()?.object(id)? {
            Some(entry) if entry.base.is_some() => {
                rewrites.push(encode_whole(store, &batch, id, &entry)?)
            }
            _ => skipped += 1,
        }
    }
    batch.finish()?;
    publish_all(store, &rewrites)?;
    let bytes = rewrites
        .iter()
        .map(|r| r.new.stored_len as i64 - r.old.stored_len as i64)
        .sum();
    Ok((rewrites.len() as u64, skipped, bytes))
}

/// Writes a self-contained record for tensor `id` (currently stored as `entry`, typically a
/// delta) at the next generation, in `batch`; the index is not touched. Lossless tensors are
/// decoded and stored with the best whole float encoding (or raw/zstd when that is smaller);
/// quantized ones are rebuilt from their codes, so the reconstruction stays bit-identical.
pub(crate) fn encode_whole(
    store: &Store,
    batch: &ObjectBatch<'_>,
    id: &ObjectId,
    entry: &IndexEntry,
) -> Result<Rewrite> {
    let corrupt = |source| Error::Corrupt { id: *id, source };
    let codec = CodecTag::try_from(entry.codec).map_err(corrupt)?;
    let record = store.record_header(id, entry)?;
    let header = TensorHeader::from_canonical(&record.prefix).map_err(corrupt)?;
    let placement = Placement {
        generation: entry.generation + 1,
        base: None,
        depth: 0,
    };
    let new = if codec.is_quant() {
        let q = store.load_quant(id, entry)?;
        batch
            .put_payload(
                id,
                &header,
                CodecTag::QuantBase,
                placement,
                &[&q.encode_base()],
            )?
            .entry
    } else {
        let data = store.load_tensor(id, entry)?;
        // Trimmed content keeps the codec its chain started with.
        let root = chain(&store.meta().read()?, entry)?.pop().unwrap_or(*entry);
        let whole = if root.codec == CodecTag::MantissaTrim as u8 {
            CodecTag::MantissaTrim
        } else {
            CodecTag::FloatSplit
        };
        let plain = if float::supports(header.dtype) {
            Some(
                float::analyze(store.engine(), header.dtype, &data, None)
                    .map_err(corrupt)?
                    .plain,
            )
        } else {
            None
        };
        // A coarsened record's content is not what its id names: it keeps its coarsening
        // (the raw path below would check the content against the id).
        let keep = record.coarsened.is_some();
        match plain.filter(|p| keep || p.size < data.len() as u64) {
            Some(choice) => {
                let payload =
                    float::encode_pieces(store.engine(), header.dtype, &data, None, &choice)
                        .map_err(corrupt)?;
                batch
                    .put_coarsened(
                        id,
                        &header,
                        whole,
                        placement,
                        record.coarsened,
                        &payload.pieces(),
                    )?
                    .entry
            }
            None => {
                let out =
                    batch.put_tensor_at(id, &header, &data, &Default::default(), placement)?;
                out.entry
            }
        }
    };
    Ok(Rewrite {
        id: *id,
        old: *entry,
        new,
    })
}

/// The entries of the records read to reconstruct the object stored as `entry`: itself, its
/// base, its base's base… up to the self-contained end (or the first base the index lacks).
pub(crate) fn chain(meta: &MetaRead, entry: &IndexEntry) -> Result<Vec<IndexEntry>> {
    let mut out = vec![*entry];
    while let Some(base) = out.last().and_then(|e| e.base) {
        if out.len() > mdl_store::MAX_CHAIN as usize {
            break;
        }
        match meta.object(&base)? {
            Some(b) => out.push(b),
            None => break,
        }
    }
    Ok(out)
}
