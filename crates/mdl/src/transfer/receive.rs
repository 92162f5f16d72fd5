//! Receiving a pack stream (`docs/FORMAT.md`): every frame checked against what was asked for
//! (a fetch's plan: only planned objects, each once, none larger than planned), every record
//! checked against what its bytes can hold before memory is taken for it, then written to its
//! file (a tensor's record over 4 MiB as it arrives, never held whole; smaller ones read whole
//! and written a group at a time into one pack), decoded a window at a time and re-hashed against
//! its id, and published in index transactions that check what it depends on (bases, the
//! tensors a manifest names, a commit's manifest and parents). A pack refused half-way leaves
//! the repository as it was: what it wrote and indexed is removed again. A fetched pack cut off
//! (it ends, or its connection fails, before its end) keeps the tensors that arrived whole,
//! and the start of the tensor record it was cut off inside ([`Partial`]), which the next
//! fetch asks the sender to go on from.

use std::collections::{HashMap, HashSet};
use std::io::Read;

use mdl_codec::CodecTag;
use mdl_format::record::{RecordHeader, Trailer, MAX_HEADER_LEN, MAX_META_CONTENT, TRAILER_LEN};
use mdl_format::{ObjectId, ObjectKind, TensorHeader, Timestamp};
use mdl_store::meta::MetaRead;
use mdl_store::{Expired, IndexEntry, ObjectBatch, StoreError};

use super::frame::{read_exact, read_expired, read_frame, skip, Copied, Sent, Watched};
use super::pack::{EXPIRED_FRAME, RESUMED_FRAME};
use super::partial::{self, Partial};
use super::publish::{index_tensor, publish_tail, publish_tensors, Verified};
use super::toc::{Frame, FrameRecord};
use super::{bad_pack, Added, PlannedObject, Received, PACK_MAGIC};
use crate::{Error, NoProgress, Progress, Repository, Result};

/// A received pack may decode to at most this many times the bytes received…
const MAX_EXPANSION: u64 = 4096;
/// …or this much, whichever is more: enough for any real checkpoint (whose tensors compress a
/// few times at most) and for tensors of constants, not for a few bytes that claim gigabytes.
const MIN_DECODE_ALLOWANCE: u64 = 256 << 20;
/// Expired frames a pack that was not planned may hold: each is kept until the end (a few
/// hundred bytes), so their number is bounded like any other memory a sender can make us take.
const MAX_EXPIRED_FRAMES: usize = 1 << 20;
/// Longest manifest or commit record: the longest content one may claim, stored raw.
const MAX_META_RECORD: u64 = MAX_META_CONTENT + MAX_HEADER_LEN as u64 + TRAILER_LEN as u64;
/// Tensor records up to this long are read whole and written into a pack, a group at a
/// time…
const SMALL_RECORD: u64 = 4 << 20;
/// …of at most this many bytes (a larger record is written as it arrives, by the reading thread).
const GROUP_BYTES: u64 = 64 << 20;

/// What receiving a pack did: what it added ([`Received`], what the sender is told), and every
/// frame of the pack, its objects stored now or already present (not sent over HTTP): what a
/// repository in object storage knows its bucket holds once the pack is applied, and where.
#[derive(Clone, Debug, Default)]
pub struct Receipt {
    /// What the pack added.
    pub received: Received,
    /// Its frames.
    pub frames: Vec<Frame>,
    /// What it added, to be taken out again if the transfer is refused later.
    pub added: Added,
}

impl Receipt {
    /// Adds another pack's receipt.
    pub fn extend(&mut self, other: Receipt) {
        self.received.add(other.received);
        self.frames.extend(other.frames);
        self.added.extend(other.added);
    }
}

/// What a pack may hold.
#[derive(Clone, Copy, Debug)]
pub enum Expect<'a> {
    /// Any objects, each record at most this many bytes: a push a server receives, a copy
    /// between repositories this process opened.
    Any {
        /// Longest record accepted.
        max_record: u64,
    },
    /// Only these objects, each at most once, none longer than planned (an expired frame
    /// stands for any of them): what a fetch asked a server for. A record longer than its plan
    /// is [`Error::PlanChanged`] (the sender re-encoded it after planning: plan again).
    Planned(&'a [PlannedObject]),
}

/// Reads a pack stream from `r` and stores its objects, verifying every one (checksum, and
/// the content re-hashed against its id), and that every commit's manifest, tensors and
/// parents are present. Records longer than `max_record` are refused.
pub fn receive_pack(repo: &Repository, r: &mut dyn Read, max_record: u64) -> Result<Receipt> {
    receive_expected(repo, r, Expect::Any { max_record })
}

/// [`receive_pack`] of a pack that may hold only what `expect` says. A pack refused for any
/// reason leaves the repository as it was: the records it wrote are removed, those it indexed
/// taken out of the index again (the caller holds the writer, so nothing else can have come
/// to use them).
#[tracing::instrument(name = "transfer.receive_pack", skip_all)]
pub fn receive_expected(
    repo: &Repository,
    r: &mut dyn Read,
    expect: Expect<'_>,
) -> Result<Receipt> {
    receive_with(repo, r, expect, None, &NoProgress)
}

/// [`receive_expected`] of the pack a fetch asked for by `plan`, in which the sender may go on
/// with the record `resume` holds the start of (a resumed frame, `docs/HTTP_API.md`; the
/// start is removed once the record is in). A record arriving shorter than planned, or from
/// an offset, lessens `progress`'s total by the bytes that do not move.
pub fn receive_planned(
    repo: &Repository,
    r: &mut dyn Read,
    plan: &[PlannedObject],
    resume: Option<&Partial>,
    progress: &dyn Progress,
) -> Result<Receipt> {
    receive_with(repo, r, Expect::Planned(plan), resume, progress)
}

fn receive_with(
    repo: &Repository,
    r: &mut dyn Read,
    expect: Expect<'_>,
    resume: Option<&Partial>,
    progress: &dyn Progress,
) -> Result<Receipt> {
    // A record or object that fails verification is the sender's fault, not damage here.
    receive(repo, r, expect, resume, progress).map_err(|e| match e {
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
            pack: None,
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
    let rest = receive_pack(repo, &mut stream.as_slice(), u64::MAX)?;
    received.add(rest.received);
    Ok(Receipt {
        received,
        frames: frames.to_vec(),
        added: rest.added,
    })
}

/// What receiving a pack holds between frames.
struct Receiving<'r> {
    repo: &'r Repository,
    batch: ObjectBatch<'r>,
    /// What may still arrive: the planned objects not yet received (`None`: anything, records
    /// up to `max_record` bytes).
    planned: Option<HashMap<ObjectId, PlannedObject>>,
    /// The commits the plan sends without their parents (where a shallow history is cut).
    cut: HashSet<ObjectId>,
    max_record: u64,
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
    /// What the layer published last holds decoded, for the next layer's deltas over it.
    verified: Verified,
    /// Tensors the sender's retention deleted, recorded when a received manifest names them.
    expired: HashMap<ObjectId, Expired>,
    /// Small tensor records read and checked, waiting to be written together, and their bytes.
    group: Vec<Small>,
    /// The group's payloads, one after another (kept from group to group).
    payloads: Vec<u8>,
    group_bytes: u64,
    receipt: Receipt,
    /// The record start the sender may go on from, until it does.
    resume: Option<&'r Partial>,
    /// Where the start of a record cut off in this pack was kept.
    kept: Option<std::path::PathBuf>,
    progress: &'r dyn Progress,
    /// The index as it was when the current layer began ([`Self::index`]).
    index: Option<MetaRead>,
}

/// A small tensor record read whole, its frame checked, not yet written.
struct Small {
    id: ObjectId,
    header: RecordHeader,
    content_len: u64,
    depth: u32,
    /// The bytes of its frame that moved (all but what was held).
    moved: u64,
    /// Where its payload is in [`Receiving::payloads`].
    payload: std::ops::Range<usize>,
}

/// One frame's head: the end of the pack, or an object's id with its length.
enum Head {
    End,
    Frame(ObjectId, u64),
}

fn receive<'r>(
    repo: &'r Repository,
    r: &mut dyn Read,
    expect: Expect<'r>,
    resume: Option<&'r Partial>,
    progress: &'r dyn Progress,
) -> Result<Receipt> {
    let mut magic = [0u8; 8];
    read_exact(r, &mut magic)?;
    if &magic != PACK_MAGIC {
        return Err(bad_pack("not an mdl pack stream"));
    }
    // Only a fetch keeps what arrived before a cut: its plan names what may come, each object
    // verified against the id asked for. A pack pushed here, or copied between repositories
    // this process opened, is whole or refused (a server's upload is spooled whole first, so a
    // short pack in it is malformed, not cut).
    let keeps_on_cut = matches!(expect, Expect::Planned(_));
    let (planned, max_record) = match expect {
        Expect::Any { max_record } => (None, max_record),
        Expect::Planned(plan) => (Some(plan.iter().map(|p| (p.id, *p)).collect()), u64::MAX),
    };
    // Only a plan may send a commit without its parents: one it marks cut.
    let cut = match expect {
        Expect::Any { .. } => HashSet::new(),
        Expect::Planned(plan) => plan.iter().filter(|p| p.cut).map(|p| p.id).collect(),
    };
    let mut rx = Receiving {
        repo,
        batch: repo.store().bulk_batch(),
        planned,
        cut,
        max_record,
        read_bytes: PACK_MAGIC.len() as u64,
        decoded: 0,
        layer: Vec::new(),
        tail: Vec::new(),
        pending: HashSet::new(),
        in_layer: HashSet::new(),
        verified: Verified::default(),
        expired: HashMap::new(),
        group: Vec::new(),
        payloads: Vec::new(),
        group_bytes: 0,
        receipt: Receipt::default(),
        resume,
        kept: None,
        progress,
        index: None,
    };
    let mut watched = Watched {
        inner: r,
        cut: false,
    };
    match rx.frames(&mut watched).and_then(|()| rx.publish()) {
        Ok(()) => Ok(rx.receipt),
        Err(e) if watched.cut && keeps_on_cut => {
            let why = match e {
                Error::BadTransfer(why) => why,
                e => e.to_string(),
            };
            match rx.keep_whole() {
                Ok(kept) => {
                    let started = (rx.kept.as_ref())
                        .and_then(|p| std::fs::metadata(p).ok())
                        .map_or(0, |m| m.len());
                    Err(Error::TransferCut { why, kept, started })
                }
                Err(e) => {
                    rx.roll_back();
                    Err(e)
                }
            }
        }
        Err(e) => {
            // Bytes refused, not cut off: the record start kept, or the one gone on from, is not
            // worth going on from (one not reached yet is: the fetch may plan again).
            if let Some(kept) = &rx.kept {
                partial::remove(repo, kept);
            }
            if let (Some(p), None) = (resume, rx.resume) {
                p.remove(repo);
            }
            rx.roll_back();
            Err(e)
        }
    }
}

impl Receiving<'_> {
    /// Reads every frame up to the pack's end.
    fn frames(&mut self, r: &mut dyn Read) -> Result<()> {
        while let Head::Frame(id, len) = self.head(r)? {
            if len == RESUMED_FRAME {
                self.resumed(r, id)?;
                continue;
            }
            self.admit(&id, len)?;
            if len == EXPIRED_FRAME {
                self.expired_frame(r, id)?;
            } else {
                self.record(r, id, len, 0)?;
            }
        }
        Ok(())
    }

    /// A record sent from an offset: only the one whose start this side holds, from where it
    /// holds it to; read as that start followed by the rest.
    fn resumed(&mut self, r: &mut dyn Read, id: ObjectId) -> Result<()> {
        let mut at = [0u8; 16];
        read_exact(r, &mut at)?;
        self.read_bytes += at.len() as u64;
        let held = u64::from_le_bytes(at[..8].try_into().expect("8 bytes"));
        let len = u64::from_le_bytes(at[8..].try_into().expect("8 bytes"));
        let Some(p) = self
            .resume
            .take()
            .filter(|p| p.id == id && p.held == held && p.len == len)
        else {
            return Err(bad_pack(format!(
                "the pack goes on with {id} from byte {held}, which was not asked for"
            )));
        };
        self.admit(&id, len)?;
        self.progress.lessen(held);
        let mut joined = p.open()?.chain(&mut *r);
        self.record(&mut joined, id, len, held)?;
        p.remove(self.repo);
        Ok(())
    }

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

    /// Checks a frame's head against what may arrive, before anything of its body is read.
    fn admit(&mut self, id: &ObjectId, len: u64) -> Result<()> {
        let expired = len == EXPIRED_FRAME;
        let Some(planned) = &mut self.planned else {
            if expired && self.expired.len() >= MAX_EXPIRED_FRAMES {
                return Err(bad_pack(format!(
                    "more than {MAX_EXPIRED_FRAMES} expired frames"
                )));
            }
            if !expired && len > self.max_record {
                return Err(bad_pack(format!(
                    "record of {id} is {len} bytes, over the limit of {}",
                    self.max_record
                )));
            }
            return Ok(());
        };
        let Some(plan) = planned.remove(id) else {
            return Err(bad_pack(format!(
                "the pack sends {id}, which was not asked for or was sent before"
            )));
        };
        if !expired && len > plan.size {
            return Err(Error::PlanChanged {
                id: *id,
                planned: plan.size,
                sent: len,
            });
        }
        if !expired {
            // Coded against what this side holds: fewer bytes move than planned.
            self.progress.lessen(plan.size - len);
        }
        Ok(())
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

    /// A record's frame of `len` bytes (the first `held` of them held here, the rest moving):
    /// its header read and checked, then, unless the repository has it, written into the batch
    /// (verified when its layer or the tail is published) — a tensor's as it arrives (its
    /// start kept if the pack is cut off inside it), a manifest's or commit's (bounded) whole.
    fn record(&mut self, r: &mut dyn Read, id: ObjectId, len: u64, held: u64) -> Result<()> {
        if len < TRAILER_LEN as u64 + 4 {
            return Err(bad_pack(format!("record of {id} is too short")));
        }
        let first = (len - TRAILER_LEN as u64).min(MAX_HEADER_LEN as u64) as usize;
        let mut head = vec![0u8; first];
        read_exact(r, &mut head)?;
        let (header, header_len) = RecordHeader::decode(&head).map_err(corrupt(&id))?;
        if header.kind != ObjectKind::Tensor {
            if len > MAX_META_RECORD {
                return Err(bad_pack(format!(
                    "{} record of {id} is {len} bytes, over the limit of {MAX_META_RECORD}",
                    header.kind
                )));
            }
            let rest = read_frame(r, len - first as u64)?;
            head.extend_from_slice(&rest);
            return self.whole_record(id, head, held);
        }
        let payload_len = len - (header_len + TRAILER_LEN) as u64;
        let content_len = TensorHeader::from_canonical(&header.prefix)
            .ok()
            .and_then(|t| t.data_len())
            .ok_or_else(|| bad_pack(format!("{id}: a tensor record without a tensor header")))?;
        if !self.framed(id, len, &header, content_len)? {
            return skip(r, len - first as u64);
        }
        self.claim(content_len)?;
        let depth = self.depth(&id, &header)?;
        let sent = Sent {
            id: &id,
            header: &header,
            head: &head,
            header_len,
            payload_len,
            content_len,
        };
        if len <= SMALL_RECORD {
            let at = self.payloads.len();
            sent.read_into(r, &mut self.payloads)?;
            let payload = at..self.payloads.len();
            self.pending.insert(id);
            self.in_layer.insert(id);
            self.group_bytes += len;
            self.group.push(Small {
                id,
                header,
                content_len,
                depth,
                moved: len - held,
                payload,
            });
            if self.group_bytes >= GROUP_BYTES {
                self.write_group()?;
            }
            return Ok(());
        }
        // A fetch's record is written where a cut, or the process's end, leaves its start for
        // the next fetch ([`Partial`]).
        let start = match self.planned {
            Some(_) => Some(partial::path_for(self.repo, &id, len)?),
            None => None,
        };
        let mut w =
            (self.batch).open_received(&id, &header, content_len, depth, start.as_deref())?;
        match sent.copy(r, &mut w) {
            Ok(()) => {
                let put = w.finish()?;
                self.stored(id, len - held, put);
                if let Some(p) = self.resume.filter(|p| p.id == id) {
                    // Sent whole after all: its start is of no more use.
                    p.remove(self.repo);
                }
                Ok(())
            }
            Err(Copied::Here(e)) => Err(w.failed("write", e).into()),
            Err(Copied::Refused(e)) => {
                if let Some(start) = start {
                    if partial::keep(self.repo, w, &start) {
                        self.kept = Some(start);
                    }
                }
                Err(e)
            }
        }
    }

    /// Writes the group of small records waiting into one pack (`mdl_store`'s packs: one file
    /// for them all, not a file each); each is noted (to be taken out again if the transfer is
    /// refused).
    fn write_group(&mut self) -> Result<()> {
        let group = std::mem::take(&mut self.group);
        self.group_bytes = 0;
        if group.is_empty() {
            return Ok(());
        }
        let payloads = std::mem::take(&mut self.payloads);
        let records: Vec<_> = group
            .iter()
            .map(|g| mdl_store::ReceivedRecord {
                id: g.id,
                header: &g.header,
                content_len: g.content_len,
                depth: g.depth,
                payload: &payloads[g.payload.clone()],
            })
            .collect();
        let puts = self.batch.put_packed(&records);
        drop(records);
        // The buffer is kept for the next group (its pages are in place).
        self.payloads = payloads;
        self.payloads.clear();
        let puts = puts?;
        if let Some(p) = puts.first().and_then(|p| p.entry.pack) {
            self.receipt.added.packs.push(p.pack);
        }
        for (g, put) in group.iter().zip(puts) {
            self.stored(g.id, g.moved, put);
        }
        Ok(())
    }

    /// Notes a record's frame (`header`, decoding to `content_len` bytes) in the receipt;
    /// whether the repository still lacks the object.
    fn framed(
        &mut self,
        id: ObjectId,
        len: u64,
        header: &RecordHeader,
        content_len: u64,
    ) -> Result<bool> {
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
        let present = self.pending.contains(&id) || self.index()?.object(&id)?.is_some();
        Ok(!present)
    }

    /// A manifest's or commit's whole record (the first `held` bytes of it held here): parsed,
    /// its claims checked, and unless the repository has it, written into the batch (verified
    /// when the tail is published).
    fn whole_record(&mut self, id: ObjectId, record: Vec<u8>, held: u64) -> Result<()> {
        let len = record.len() as u64;
        let (header, payload_len, content_len) = parse_record(&id, &record)?;
        if !self.framed(id, len, &header, content_len)? {
            return Ok(());
        }
        mdl_format::record::check_content_len(&header, payload_len, content_len)
            .map_err(|e| bad_pack(format!("{id}: {e}")))?;
        if header.base.is_some() {
            return Err(bad_pack(format!("{id}: only tensors may be deltas")));
        }
        self.claim(content_len)?;
        let put = self.batch.put_record(&id, &record, 0)?;
        self.stored(id, len - held, put);
        Ok(())
    }

    /// Notes a record written into the batch, `moved` of its bytes sent.
    fn stored(&mut self, id: ObjectId, moved: u64, put: mdl_store::PutOutcome) {
        let received = &mut self.receipt.received;
        received.objects += 1;
        received.bytes += moved;
        self.pending.insert(id);
        self.receipt.added.records.push((id, put.entry.generation));
        match put.entry.kind {
            ObjectKind::Tensor => {
                self.in_layer.insert(id);
                self.layer.push((id, put.entry));
            }
            _ => self.tail.push((id, put.entry)),
        }
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
        if self.in_layer.contains(&base) {
            self.publish_layer(true)?;
        }
        let base_entry = self
            .index()?
            .object(&base)?
            .ok_or(Error::BaseNotSent { id: *id, base })?;
        if base_entry.kind != ObjectKind::Tensor {
            return Err(bad_pack(format!("{id}: delta base {base} is not a tensor")));
        }
        Ok(base_entry.depth + 1)
    }

    /// A view of the index for the frames between two layers' publishing (one open of the
    /// database for them all, not one a frame); let go before a layer is published.
    fn index(&mut self) -> Result<&MetaRead> {
        if self.index.is_none() {
            self.index = Some(self.repo.store().meta().read()?);
        }
        Ok(self.index.as_ref().expect("just read"))
    }

    /// Publishes the current layer of tensors, starting a new batch; `more`: another layer
    /// may follow (what this one decodes is kept for its deltas).
    fn publish_layer(&mut self, more: bool) -> Result<()> {
        // This process's view of the index would keep its own write out.
        self.index = None;
        self.write_group()?;
        let full = std::mem::replace(&mut self.batch, self.repo.store().bulk_batch());
        let (layer, verified) = (&mut self.layer, &mut self.verified);
        let unexpired = publish_tensors(self.repo, full, layer, verified, more)?;
        self.receipt.added.unexpired.extend(unexpired);
        self.in_layer.clear();
        Ok(())
    }

    /// Publishes the last layer of tensors, then the manifests and commits.
    fn publish(&mut self) -> Result<()> {
        self.publish_layer(false)?;
        let tail = publish_tail(self.repo, &self.tail, &self.expired, &self.cut)?;
        let received = &mut self.receipt.received;
        received.expired = tail.expired.len() as u64;
        received.commits = tail.commits.clone();
        let added = &mut self.receipt.added;
        added.commits = tail.commits;
        added.expired = tail.expired;
        added.cut = tail.cut;
        added.joined = tail.joined;
        tracing::info!(
            objects = received.objects,
            bytes = received.bytes,
            "received"
        );
        Ok(())
    }

    /// After a cut: verifies and indexes the tensors that arrived whole (all of them refused,
    /// and the pack's additions undone, if one fails), and removes the manifests and commits
    /// written (they are published only with the whole pack). How many tensors are kept.
    fn keep_whole(&mut self) -> Result<u64> {
        self.publish_layer(false)?;
        let tail: HashSet<ObjectId> = self.tail.iter().map(|(id, _)| *id).collect();
        let added = &mut self.receipt.added;
        let (unpublished, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut added.records)
            .into_iter()
            .partition(|(id, _)| tail.contains(id));
        added.records = kept;
        for (id, generation) in unpublished {
            self.repo.store().remove_record(&id, generation);
        }
        Ok(added.records.len() as u64)
    }

    /// Undoes what a refused pack did ([`Added::undo`]).
    fn roll_back(self) {
        let Receiving {
            repo,
            batch,
            receipt,
            index,
            ..
        } = self;
        // This process's view of the index would keep the undoing write out.
        drop(index);
        // No fsync may still run on a record once it is removed.
        drop(batch);
        receipt.added.undo(repo);
    }
}

/// A corrupt received record, named.
fn corrupt(id: &ObjectId) -> impl Fn(mdl_format::FormatError) -> Error + '_ {
    move |source| {
        StoreError::Corrupt {
            id: *id,
            kind: "received",
            source,
        }
        .into()
    }
}

/// A record's header, its payload's length and the length its trailer says it decodes to.
fn parse_record(id: &ObjectId, record: &[u8]) -> Result<(RecordHeader, u64, u64)> {
    let (header, header_len) = RecordHeader::decode(record).map_err(corrupt(id))?;
    let trailer = record
        .len()
        .checked_sub(TRAILER_LEN)
        .map(|at| Trailer::decode(&record[at..]))
        .ok_or_else(|| bad_pack(format!("record of {id} is too short")))?
        .map_err(corrupt(id))?;
    let payload_len = record.len().saturating_sub(header_len + TRAILER_LEN) as u64;
    Ok((header, payload_len, trailer.content_len))
}
