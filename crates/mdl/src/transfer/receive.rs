//! Receiving a pack stream (`docs/FORMAT.md`): every record checked against what its bytes
//! can hold before memory is taken for it, decoded and re-hashed against its id, and published
//! in index transactions that check what it depends on (bases, the tensors a manifest names, a
//! commit's manifest and parents).

use std::collections::{HashMap, HashSet};
use std::io::Read;

use mdl_codec::CodecTag;
use mdl_format::record::{RecordHeader, Trailer, TRAILER_LEN};
use mdl_format::{Commit, Manifest, ObjectId, ObjectKind, Timestamp};
use mdl_store::meta::MetaWrite;
use mdl_store::{CommitSummary, Expired, IndexEntry, ObjectBatch, StoreError};

use super::pack::{EXPIRED_FRAME, MAX_RULE_LEN};
use super::toc::{Frame, FrameRecord};
use super::{Received, PACK_MAGIC};
use crate::{per_tensor, Error, Repository, Result};

/// A received pack may decode to at most this many times the bytes received…
const MAX_EXPANSION: u64 = 4096;
/// …or this much, whichever is more: enough for any real checkpoint (whose tensors compress a
/// few times at most) and for tensors of constants, not for a few bytes that claim gigabytes.
const MIN_DECODE_ALLOWANCE: u64 = 256 << 20;

/// Reads the rest of an expired frame; with its length.
fn read_expired(r: &mut dyn Read, id: &ObjectId) -> Result<(Expired, u64)> {
    let mut fixed = [0u8; 19];
    read_exact(r, &mut fixed)?;
    let kind = ObjectKind::try_from(fixed[0])
        .ok()
        .filter(|k| *k == ObjectKind::Tensor)
        .ok_or_else(|| bad_pack(format!("{id}: only tensors expire")))?;
    let content_len = u64::from_le_bytes(fixed[1..9].try_into().expect("8 bytes"));
    let time = Timestamp(i64::from_le_bytes(
        fixed[9..17].try_into().expect("8 bytes"),
    ));
    let n = u16::from_le_bytes(fixed[17..19].try_into().expect("2 bytes")) as usize;
    if n > MAX_RULE_LEN {
        return Err(bad_pack(format!("{id}: expiry rule of {n} bytes")));
    }
    let mut rule = vec![0u8; n];
    read_exact(r, &mut rule)?;
    let rule = String::from_utf8(rule).map_err(|_| bad_pack(format!("{id}: rule not UTF-8")))?;
    let expired = Expired {
        kind,
        content_len,
        time,
        rule,
    };
    Ok((expired, fixed.len() as u64 + n as u64))
}

/// What receiving a pack did: what it added ([`Received`], what the sender is told), and every
/// frame of the pack, its objects stored now or already present (not sent over HTTP): what a
/// repository in object storage knows its bucket holds once the pack is applied, and where.
#[derive(Clone, Debug, Default)]
pub struct Receipt {
    /// What the pack added.
    pub received: Received,
    /// Its frames.
    pub frames: Vec<Frame>,
}

/// Why a pack was refused.
fn bad_pack(why: impl Into<String>) -> Error {
    Error::BadTransfer(why.into())
}

/// Reads a pack stream from `r` and stores its objects, verifying every one (checksum, and
/// the content re-hashed against its id), and that every commit's manifest, tensors and
/// parents are present. Records longer than `max_record` are refused.
#[tracing::instrument(name = "transfer.receive_pack", skip_all)]
pub fn receive_pack(repo: &Repository, r: &mut dyn Read, max_record: u64) -> Result<Receipt> {
    // A record or object that fails verification is the sender's fault, not damage here.
    receive(repo, r, max_record).map_err(|e| match e {
        Error::Store(StoreError::Corrupt { .. }) | Error::Corrupt { .. } => {
            Error::BadTransfer(e.to_string())
        }
        e => e,
    })
}

/// Receives a pack from its table of contents (`frames`, [`super::toc`]) without the bytes of
/// its tensors: each tensor's record is named in the index as the table describes it, for the
/// repository's [`mdl_store::source::RecordSource`] to fetch, check against that entry and
/// verify when it is first read. Everything else — manifests, commits, expired frames, whose
/// bodies `tail` holds in the table's order — is received as [`receive_pack`] receives it,
/// every check included. Only for a store with a source ([`mdl_store::Store::fetches_records`]).
#[tracing::instrument(name = "transfer.receive_indexed", skip_all, fields(frames = frames.len()))]
pub fn receive_indexed(repo: &Repository, frames: &[Frame], tail: &[Vec<u8>]) -> Result<Receipt> {
    let store = repo.store();
    if !store.fetches_records() {
        return Err(bad_pack(
            "a pack's table of contents alone is only enough where records are fetched",
        ));
    }
    let (tensors, rest): (Vec<&Frame>, Vec<&Frame>) = frames.iter().partition(|f| f.is_tensor());
    if rest.len() != tail.len() {
        return Err(bad_pack("the bodies given are not the table's"));
    }
    let mut received = Received::default();
    let mut w = store.meta().write()?;
    let now = Timestamp::now();
    for f in tensors {
        let r = f.record.expect("a tensor frame has a record");
        if w.object(&f.id)?.is_some() {
            continue;
        }
        let codec = CodecTag::try_from(r.codec).map_err(|e| bad_pack(format!("{}: {e}", f.id)))?;
        if r.base.is_some() != codec.has_base() || r.base == Some(f.id) {
            return Err(bad_pack(format!(
                "{}: base flag disagrees with the codec",
                f.id
            )));
        }
        let depth = match &r.base {
            None => 0,
            Some(base) => match w.object(base)? {
                Some(b) if b.kind == ObjectKind::Tensor && b.content_len == r.content_len => {
                    b.depth + 1
                }
                Some(_) => {
                    return Err(bad_pack(format!(
                        "{}: delta base {base} is not a tensor of its size",
                        f.id
                    )))
                }
                None => {
                    return Err(Error::Incomplete(format!(
                        "delta base {base} of tensor {}",
                        f.id
                    )))
                }
            },
        };
        let entry = IndexEntry {
            kind: ObjectKind::Tensor,
            codec: r.codec,
            generation: 0,
            base: r.base,
            depth,
            stored_len: f.len,
            content_len: r.content_len,
            created: now,
        };
        index_tensor(&mut w, &f.id, &entry)?;
        received.objects += 1;
        received.bytes += f.len;
    }
    w.commit_txn()?;
    let mut stream = PACK_MAGIC.to_vec();
    for (f, body) in rest.iter().zip(tail) {
        stream.extend_from_slice(f.id.as_bytes());
        let len = if f.record.is_some() {
            body.len() as u64
        } else {
            EXPIRED_FRAME
        };
        stream.extend_from_slice(&len.to_le_bytes());
        stream.extend_from_slice(body);
    }
    stream.extend_from_slice(&[0u8; 40]);
    received.add(receive_pack(repo, &mut stream.as_slice(), u64::MAX)?.received);
    Ok(Receipt {
        received,
        frames: frames.to_vec(),
    })
}

/// What receiving a pack holds between frames.
struct Receiving<'r> {
    repo: &'r Repository,
    batch: ObjectBatch<'r>,
    /// Bytes read so far, and what the tensors among them decode to (their claims, checked
    /// against their headers before anything is decoded).
    read_bytes: u64,
    decoded: u64,
    /// Tensors written but not yet indexed (the current layer), and manifests and commits,
    /// which are published together at the end.
    layer: Vec<(ObjectId, IndexEntry)>,
    tail: Vec<(ObjectId, IndexEntry)>,
    /// Ids written but not yet indexed, and those of them in the current layer.
    pending: HashSet<ObjectId>,
    in_layer: HashSet<ObjectId>,
    /// Tensors the sender's retention deleted, recorded when a received manifest names them.
    expired: HashMap<ObjectId, Expired>,
    receipt: Receipt,
}

/// One frame's head: the end of the pack, or an object's id with its length.
enum Head {
    End,
    Frame(ObjectId, u64),
}

fn receive(repo: &Repository, r: &mut dyn Read, max_record: u64) -> Result<Receipt> {
    let mut magic = [0u8; 8];
    read_exact(r, &mut magic)?;
    if &magic != PACK_MAGIC {
        return Err(bad_pack("not an mdl pack stream"));
    }
    let mut rx = Receiving {
        repo,
        batch: repo.store().batch(),
        read_bytes: PACK_MAGIC.len() as u64,
        decoded: 0,
        layer: Vec::new(),
        tail: Vec::new(),
        pending: HashSet::new(),
        in_layer: HashSet::new(),
        expired: HashMap::new(),
        receipt: Receipt::default(),
    };
    while let Head::Frame(id, len) = rx.head(r)? {
        if len == EXPIRED_FRAME {
            rx.expired_frame(r, id)?;
        } else if len > max_record {
            return Err(bad_pack(format!(
                "record of {id} is {len} bytes, over the limit of {max_record}"
            )));
        } else {
            rx.record(id, read_frame(r, len)?)?;
        }
    }
    rx.finish()
}

impl Receiving<'_> {
    /// Reads the next frame's head.
    fn head(&mut self, r: &mut dyn Read) -> Result<Head> {
        let mut head = [0u8; 40];
        read_exact(r, &mut head)?;
        self.read_bytes += 40;
        let id = ObjectId::from_bytes(head[..32].try_into().expect("32 bytes"));
        let len = u64::from_le_bytes(head[32..].try_into().expect("8 bytes"));
        Ok(if len == 0 && id.as_bytes() == &[0u8; 32] {
            Head::End
        } else {
            Head::Frame(id, len)
        })
    }

    /// An expired tensor's frame: kept until a received manifest names it.
    fn expired_frame(&mut self, r: &mut dyn Read, id: ObjectId) -> Result<()> {
        let (x, n) = read_expired(r, &id)?;
        self.receipt.frames.push(Frame {
            id,
            offset: self.read_bytes,
            len: n,
            record: None,
        });
        self.read_bytes += n;
        self.expired.insert(id, x);
        Ok(())
    }

    /// A record's frame: parsed, its claims checked, and unless the repository has it, written
    /// into the batch (verified when its layer or the tail is published).
    fn record(&mut self, id: ObjectId, record: Vec<u8>) -> Result<()> {
        let len = record.len() as u64;
        let (header, payload_len, content_len) = parse_record(&id, &record)?;
        self.receipt.frames.push(Frame {
            id,
            offset: self.read_bytes,
            len,
            record: Some(FrameRecord {
                kind: header.kind,
                codec: header.codec,
                base: header.base,
                content_len,
            }),
        });
        self.read_bytes += len;
        let store = self.repo.store();
        if self.pending.contains(&id) || store.meta().read()?.object(&id)?.is_some() {
            return Ok(());
        }
        mdl_format::record::check_content_len(&header, payload_len, content_len)
            .map_err(|e| bad_pack(format!("{id}: {e}")))?;
        self.claim(content_len)?;
        let depth = self.depth(&id, &header)?;
        let put = self.batch.put_record(&id, &record, depth)?;
        let received = &mut self.receipt.received;
        received.objects += 1;
        received.bytes += len;
        self.pending.insert(id);
        match put.entry.kind {
            ObjectKind::Tensor => {
                self.in_layer.insert(id);
                self.layer.push((id, put.entry));
            }
            _ => self.tail.push((id, put.entry)),
        }
        Ok(())
    }

    /// Counts `content_len` more decoded bytes; refused past what the bytes read so far may
    /// decode to.
    fn claim(&mut self, content_len: u64) -> Result<()> {
        self.decoded = self.decoded.saturating_add(content_len);
        let allowance = MIN_DECODE_ALLOWANCE.max(self.read_bytes.saturating_mul(MAX_EXPANSION));
        if self.decoded > allowance {
            return Err(bad_pack(format!(
                "the pack's {} bytes claim to decode to {} bytes (at most {MAX_EXPANSION} times what is sent, or {MIN_DECODE_ALLOWANCE} bytes)",
                self.read_bytes, self.decoded
            )));
        }
        Ok(())
    }

    /// The chain depth of record `id`: one below its base, which must be a tensor the
    /// repository has (a base in the current layer publishes that layer first).
    fn depth(&mut self, id: &ObjectId, header: &RecordHeader) -> Result<u32> {
        let Some(base) = header.base else {
            return Ok(0);
        };
        if header.kind != ObjectKind::Tensor {
            return Err(bad_pack(format!("{id}: only tensors may be deltas")));
        }
        let store = self.repo.store();
        if self.in_layer.contains(&base) {
            let full = std::mem::replace(&mut self.batch, store.batch());
            publish_tensors(self.repo, full, &mut self.layer)?;
            self.in_layer.clear();
        }
        let base_entry = store
            .meta()
            .read()?
            .object(&base)?
            .ok_or(Error::BaseNotSent { id: *id, base })?;
        if base_entry.kind != ObjectKind::Tensor {
            return Err(bad_pack(format!("{id}: delta base {base} is not a tensor")));
        }
        Ok(base_entry.depth + 1)
    }

    /// Publishes the last layer of tensors, then the manifests and commits.
    fn finish(mut self) -> Result<Receipt> {
        publish_tensors(self.repo, self.batch, &mut self.layer)?;
        let received = &mut self.receipt.received;
        (received.commits, received.expired) = publish_tail(self.repo, &self.tail, &self.expired)?;
        tracing::info!(
            objects = received.objects,
            bytes = received.bytes,
            "received"
        );
        Ok(self.receipt)
    }
}

/// A record's header, its payload's length and the length its trailer says it decodes to.
fn parse_record(id: &ObjectId, record: &[u8]) -> Result<(RecordHeader, u64, u64)> {
    let corrupt = |source| StoreError::Corrupt {
        id: *id,
        kind: "received",
        source,
    };
    let (header, header_len) = RecordHeader::decode(record).map_err(corrupt)?;
    let trailer = record
        .len()
        .checked_sub(TRAILER_LEN)
        .map(|at| Trailer::decode(&record[at..]))
        .ok_or_else(|| bad_pack(format!("record of {id} is too short")))?
        .map_err(corrupt)?;
    let payload_len = record.len().saturating_sub(header_len + TRAILER_LEN) as u64;
    Ok((header, payload_len, trailer.content_len))
}

/// Reads a frame's record of `len` bytes, holding memory only for bytes that arrive (a
/// length that lies ends in "ends early", not in a huge allocation), and failing cleanly if
/// memory runs out.
fn read_frame(r: &mut dyn Read, len: u64) -> Result<Vec<u8>> {
    let mut buf: Vec<u8> = Vec::new();
    let mut left = len;
    while left > 0 {
        let step = left.min(8 << 20) as usize;
        buf.try_reserve(step)
            .map_err(|_| bad_pack(format!("no memory for a record of {len} bytes")))?;
        let start = buf.len();
        buf.resize(start + step, 0);
        read_exact(r, &mut buf[start..])?;
        left -= step as u64;
    }
    Ok(buf)
}

fn read_exact(r: &mut dyn Read, buf: &mut [u8]) -> Result<()> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => bad_pack("pack stream ends early"),
        _ => Error::Input {
            path: "<transfer>".into(),
            source: e,
        },
    })
}

/// Verifies a layer of written tensor records by decoding them, then indexes them.
fn publish_tensors(
    repo: &Repository,
    batch: mdl_store::ObjectBatch<'_>,
    layer: &mut Vec<(ObjectId, IndexEntry)>,
) -> Result<()> {
    batch.finish()?;
    if layer.is_empty() {
        return Ok(());
    }
    let store = repo.store();
    // Verified in batches that fit the process's decode budget (a server shares it among its
    // requests; a batch is reserved whole before it decodes).
    let cap = mdl_store::budget::limit().min(1 << 30);
    let mut start = 0;
    while start < layer.len() {
        let (mut end, mut cost) = (start, 0u64);
        while end < layer.len() {
            let c = mdl_store::budget::decode_cost(&layer[end].1);
            if end > start && cost.saturating_add(c) > cap {
                break;
            }
            cost = cost.saturating_add(c);
            end += 1;
        }
        let _held = mdl_store::budget::reserve(cost);
        per_tensor(
            &layer[start..end],
            |(_, e)| e.content_len,
            |(id, e)| {
                store.load_tensor(id, e)?;
                Ok(())
            },
        )?;
        start = end;
    }
    // Checked inside the write transaction: no deletion can commit between check and publish.
    let mut w = store.meta().write()?;
    for (id, e) in layer.iter() {
        if let Some(base) = &e.base {
            if w.object(base)?.is_none() {
                return Err(Error::Incomplete(format!(
                    "delta base {base} of tensor {id}"
                )));
            }
        }
    }
    for (id, e) in layer.iter() {
        index_tensor(&mut w, id, e)?;
    }
    w.commit_txn()?;
    layer.clear();
    Ok(())
}

/// Names a tensor's record in the index, as a dependent of its base.
fn index_tensor(w: &mut MetaWrite<'_>, id: &ObjectId, e: &IndexEntry) -> Result<()> {
    w.put_object(id, e)?;
    if let Some(base) = &e.base {
        w.add_dependent(base, id)?;
    }
    // Stored again: no longer expired here.
    if w.expired(id)?.is_some() {
        w.remove_expired(id)?;
    }
    Ok(())
}

/// Verifies the received manifests and commits and what they name, then indexes them all in
/// one transaction, with the expiry of the tensors `expired` lists that a received manifest
/// names. Returns the commits and how many tensors were recorded as expired.
fn publish_tail(
    repo: &Repository,
    tail: &[(ObjectId, IndexEntry)],
    expired: &HashMap<ObjectId, Expired>,
) -> Result<(Vec<ObjectId>, u64)> {
    if tail.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let store = repo.store();
    // Everything below is checked while this write transaction is open: redb has one writer,
    // so no deletion (gc) can commit between the checks and the publishing.
    let mut w = store.meta().write()?;
    let meta = store.meta().read()?;
    let incoming: HashMap<ObjectId, ObjectKind> = tail.iter().map(|(i, e)| (*i, e.kind)).collect();
    let present = |id: &ObjectId, kind: ObjectKind| -> Result<bool> {
        Ok(incoming.get(id) == Some(&kind) || meta.object(id)?.is_some_and(|e| e.kind == kind))
    };
    let mut commits = Vec::new();
    let mut newly_expired: Vec<(ObjectId, &Expired)> = Vec::new();
    for (id, entry) in tail {
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(entry.content_len as usize)
            .map_err(|_| StoreError::OutOfMemory(entry.content_len))?;
        store.read_object(id, entry, &mut bytes)?;
        let corrupt = |source| Error::Corrupt { id: *id, source };
        match entry.kind {
            ObjectKind::Manifest => {
                let manifest = Manifest::decode(&bytes).map_err(corrupt)?;
                for (object, header) in manifest.objects() {
                    if present(&object, ObjectKind::Tensor)? || meta.expired(&object)?.is_some() {
                        continue;
                    }
                    match expired.get(&object) {
                        Some(x) if Some(x.content_len) == header.data_len() => {
                            newly_expired.push((object, x));
                        }
                        Some(_) => {
                            return Err(bad_pack(format!(
                                "expired tensor {object} has the wrong size"
                            )))
                        }
                        None => {
                            return Err(Error::Incomplete(format!(
                                "object {object} of manifest {id}"
                            )))
                        }
                    }
                }
            }
            ObjectKind::Commit => {
                let commit = Commit::decode(&bytes).map_err(corrupt)?;
                if !present(&commit.manifest, ObjectKind::Manifest)? {
                    return Err(Error::Incomplete(format!(
                        "manifest {} of commit {id}",
                        commit.manifest
                    )));
                }
                for p in &commit.parents {
                    if !present(p, ObjectKind::Commit)? {
                        return Err(Error::Incomplete(format!("parent {p} of commit {id}")));
                    }
                }
                commits.push((*id, commit));
            }
            ObjectKind::Tensor => unreachable!("tensors are published in layers"),
        }
    }
    drop(meta);
    for (id, e) in tail {
        w.put_object(id, e)?;
    }
    for (id, c) in &commits {
        w.put_commit(id, &CommitSummary::of(c))?;
    }
    newly_expired.sort_by_key(|(id, _)| *id);
    newly_expired.dedup_by_key(|(id, _)| *id);
    for (id, x) in &newly_expired {
        w.put_expired(id, x)?;
    }
    w.commit_txn()?;
    let ids = commits.into_iter().map(|(id, _)| id).collect();
    Ok((ids, newly_expired.len() as u64))
}
