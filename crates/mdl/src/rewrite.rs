//! Re-encoding stored objects without changing their ids: a new record generation is written,
//! then one index transaction switches to it and fixes the chain depths of everything that
//! decodes through it. Used by reverse-delta commits, `mdl compact` and `mdl gc`.

use std::collections::HashSet;

use mdl_codec::{float, CodecTag};
use mdl_format::{record, ObjectId, TensorHeader};
use mdl_store::meta::MetaWrite;
use mdl_store::{IndexEntry, ObjectBatch, Placement, Store};

use crate::{Error, Result};

/// An existing object given a new record (a new generation); its id does not change.
pub(crate) struct Rewrite {
    pub(crate) id: ObjectId,
    pub(crate) old: IndexEntry,
    pub(crate) new: IndexEntry,
}

/// Publishes a re-encoded object: its new record, its new base link, and the depth change for
/// everything that decodes through it. The depth change is taken from the entry the index
/// holds now, so several rewrites of one chain may share a transaction in any order.
pub(crate) fn publish_rewrite(w: &mut MetaWrite, r: &Rewrite) -> Result<()> {
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
    let header = record_header(store, id, entry)?;
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
        let whole = if chain_root_codec(store, entry)? == Some(CodecTag::MantissaTrim) {
            CodecTag::MantissaTrim
        } else {
            CodecTag::FloatSplit
        };
        let plain = if float::supports(header.dtype) {
            Some(
                float::analyze(header.dtype, &data, None)
                    .map_err(corrupt)?
                    .plain,
            )
        } else {
            None
        };
        match plain.filter(|p| p.size < data.len() as u64) {
            Some(choice) => {
                let payload =
                    float::encode_pieces(header.dtype, &data, None, &choice).map_err(corrupt)?;
                batch
                    .put_payload(id, &header, whole, placement, &payload.pieces())?
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

/// The tensor header a record carries (its canonical prefix).
fn record_header(store: &Store, id: &ObjectId, entry: &IndexEntry) -> Result<TensorHeader> {
    let corrupt = |source| Error::Corrupt { id: *id, source };
    let bytes = store.read_record(id, entry)?;
    let (header, _, _) = record::decode(&bytes).map_err(corrupt)?;
    TensorHeader::from_canonical(&header.prefix).map_err(corrupt)
}

/// The codec of the self-contained record at the end of `entry`'s chain.
fn chain_root_codec(store: &Store, entry: &IndexEntry) -> Result<Option<CodecTag>> {
    let meta = store.meta().read()?;
    let mut e = *entry;
    for _ in 0..mdl_store::MAX_CHAIN {
        match e.base {
            None => return Ok(CodecTag::try_from(e.codec).ok()),
            Some(b) => match meta.object(&b)? {
                Some(next) => e = next,
                None => return Ok(None),
            },
        }
    }
    Ok(None)
}
