//! [`Peer`]: the other repository of a clone, fetch, pull or push — a server ([`Remote`]), or a
//! repository this process opens itself ([`Local`]; a replica of a repository in object
//! storage is one, wrapped so that a moved ref is published).

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};

use mdl::transfer::{self, PlannedObject, Receipt, Received, RefUpdate, Shallow};
use mdl::{Counting, ObjectId, Progress, Repository};
use std::time::{Duration, Instant};

use mdl_protocol::body::{Against, Refs, Waited, MAX_IDS};
use mdl_protocol::ErrorCode;

use crate::{Error, Remote, Result};

/// What a transfer asks of the other repository. Each call stands alone, as each request to
/// a server does: what one answered may have changed by the next.
pub trait Peer {
    /// Where it is, for messages.
    fn url(&self) -> &str;
    /// Its branches and tags.
    fn refs(&self) -> Result<Refs>;
    /// The objects it would send for `want` to a repository holding the commits `have`, with
    /// as much history as `limit` takes ([`transfer::plan`]).
    fn plan(
        &self,
        want: &[ObjectId],
        have: &[ObjectId],
        limit: &Shallow,
    ) -> Result<Vec<PlannedObject>>;
    /// Copies the records of the `planned` objects into `repo`, verifying each (a server may
    /// send only those, each at most once and no longer than planned); the pack's bytes are
    /// reported to `progress` as they arrive. What it added, for the caller to take out again
    /// if the transfer is refused later; nothing stays of a fetch that fails.
    fn fetch_objects(
        &self,
        repo: &Repository,
        planned: &[PlannedObject],
        progress: &dyn Progress,
    ) -> Result<Receipt>;
    /// Which of `ids` it lacks.
    fn missing(&self, ids: &[ObjectId]) -> Result<Vec<ObjectId>>;
    /// Copies the records of `ids` from `repo` into it, verifying each; the pack's bytes are
    /// reported to `progress` as they leave.
    fn send_objects(
        &self,
        repo: &Repository,
        ids: &[ObjectId],
        progress: &dyn Progress,
    ) -> Result<Received>;
    /// Moves one of its refs by compare-and-swap ([`transfer::update_ref`]).
    fn update_ref(&self, update: &RefUpdate) -> Result<()>;
    /// Waits until its ref `name` (a full name) no longer points at `from`, at most
    /// `timeout`: where it points then, and whether it moved. Looks at its refs every
    /// [`WAIT_POLL`] unless it can be told (a server holds the request until the ref moves).
    fn wait_ref(&self, name: &str, from: Option<ObjectId>, timeout: Duration) -> Result<Waited> {
        let end = Instant::now() + timeout;
        loop {
            let target = self.refs()?.get(name);
            let moved = target != from;
            if moved || Instant::now() >= end {
                let name = name.to_string();
                return Ok(Waited {
                    name,
                    target,
                    moved,
                });
            }
            std::thread::sleep(WAIT_POLL.min(end.saturating_duration_since(Instant::now())));
        }
    }
}

/// How often [`Peer::wait_ref`] looks at the refs of a repository that cannot tell it.
pub const WAIT_POLL: Duration = Duration::from_millis(10);

impl Peer for Remote {
    fn url(&self) -> &str {
        Remote::url(self)
    }
    fn refs(&self) -> Result<Refs> {
        Ok(Remote::refs(self)?)
    }
    fn plan(
        &self,
        want: &[ObjectId],
        have: &[ObjectId],
        limit: &Shallow,
    ) -> Result<Vec<PlannedObject>> {
        Ok(Remote::plan(self, want, have, limit)?)
    }
    /// In requests of at most [`MAX_IDS`] ids, in order, so bases still come first; each pack
    /// may hold only what its request planned.
    fn fetch_objects(
        &self,
        repo: &Repository,
        planned: &[PlannedObject],
        progress: &dyn Progress,
    ) -> Result<Receipt> {
        let mut total = Receipt::default();
        // A tensor may come coded against the version of it this side holds: only where this
        // side holds it as its id names it (retention may have expired or coarsened it here).
        let bases: Vec<ObjectId> = planned.iter().filter_map(|p| p.against).collect();
        let usable: HashSet<ObjectId> = transfer::usable_bases(repo, &bases)?.into_iter().collect();
        // The start of a record a cut fetch kept: the server goes on from there if its record
        // still starts so. One not planned now is of no more use.
        let partial = transfer::Partial::find(repo)?;
        let partial = partial.filter(|p| {
            let planned = planned.iter().any(|o| o.id == p.id && o.size >= p.len);
            if !planned {
                p.remove(repo);
            }
            planned
        });
        for chunk in planned.chunks(MAX_IDS) {
            let ids: Vec<ObjectId> = chunk.iter().map(|p| p.id).collect();
            let against: Vec<Against> = (chunk.iter())
                .filter_map(|p| p.against.map(|base| Against { id: p.id, base }))
                .filter(|a| usable.contains(&a.base))
                .collect();
            let bytes = chunk.iter().map(|p| p.size).fold(0, u64::saturating_add);
            let resume = partial.as_ref().filter(|p| ids.contains(&p.id));
            let asked = resume.map(transfer::Partial::resume).transpose()?;
            let pack = self.fetch_pack(&ids, &against, asked, bytes)?;
            let failure = pack.failure();
            let mut reader = Counting::new(pack, progress);
            match transfer::receive_planned(repo, &mut reader, chunk, resume, progress) {
                Ok(receipt) => total.extend(receipt),
                Err(e) => {
                    total.added.undo(repo);
                    // The connection's own failure (a deadline, a cut) says more than the
                    // read error the pack's reader saw.
                    return Err(failure.take().map_or_else(|| e.into(), Error::from));
                }
            }
        }
        // Deltas over versions at the chain cap: stored whole here.
        let coded: Vec<ObjectId> = (planned.iter())
            .filter(|p| p.against.is_some_and(|b| usable.contains(&b)))
            .map(|p| p.id)
            .collect();
        transfer::reanchor(repo, &coded)?;
        Ok(total)
    }
    fn missing(&self, ids: &[ObjectId]) -> Result<Vec<ObjectId>> {
        Ok(Remote::missing(self, ids)?)
    }
    /// One pack, built in a temporary file first and named by its hash: what the server kept
    /// of an upload of the same pack cut off is not sent again.
    fn send_objects(
        &self,
        repo: &Repository,
        ids: &[ObjectId],
        progress: &dyn Progress,
    ) -> Result<Received> {
        let (mut file, len) = spool(repo, ids)?;
        let failed = |source| mdl::Error::Input {
            path: "<the pack to send>".into(),
            source,
        };
        let key = ObjectId::hash_reader(&mut file).map_err(failed)?;
        let mut send_from = |from: u64| -> Result<Received> {
            file.seek(SeekFrom::Start(from)).map_err(failed)?;
            progress.lessen(from);
            let mut counted = Counting::new((&file).take(len - from), progress);
            Ok(self.send_pack(&mut counted, len - from, Some((key, from)))?)
        };
        // From where the server holds it to; whole if it no longer does after all.
        let held = self.upload_held(&key)?;
        if held > 0 && held < len {
            match send_from(held) {
                Err(Error::Client(mdl_client::Error::Server {
                    code: Some(ErrorCode::UploadGone),
                    ..
                })) => tracing::info!("{}: the upload's start is gone", self.url()),
                sent => return sent,
            }
        }
        send_from(0)
    }
    fn update_ref(&self, update: &RefUpdate) -> Result<()> {
        Ok(Remote::update_ref(self, update)?)
    }
    /// A long poll: the server answers as soon as the ref moves.
    fn wait_ref(&self, name: &str, from: Option<ObjectId>, timeout: Duration) -> Result<Waited> {
        Ok(Remote::wait_ref(self, name, from, timeout)?)
    }
}

/// A repository opened by this process, as the other side of a transfer: records travel
/// through a pack in a temporary file and are verified on arrival, as from a server.
pub struct Local<'a> {
    repo: &'a Repository,
    url: String,
}

impl<'a> Local<'a> {
    /// `repo`, called `url` in messages.
    pub fn new(repo: &'a Repository, url: impl Into<String>) -> Local<'a> {
        Local {
            repo,
            url: url.into(),
        }
    }
}

/// The pack of the records of `ids` from `repo`, in a temporary file: the file, open at its
/// start, and its length.
fn spool(repo: &Repository, ids: &[ObjectId]) -> Result<(std::fs::File, u64)> {
    let pack = transfer::spool_pack(repo, ids)?;
    let failed = |source| mdl::Error::Output {
        path: pack.path().to_path_buf(),
        source,
    };
    let file = pack.reopen().map_err(failed)?;
    let len = file.metadata().map_err(failed)?.len();
    Ok((file, len))
}

/// Copies the records of `ids` from `from` into `to` as one pack, which may hold what
/// `expect` says.
fn copy(
    from: &Repository,
    to: &Repository,
    ids: &[ObjectId],
    expect: transfer::Expect<'_>,
    progress: &dyn Progress,
) -> Result<Receipt> {
    let (file, _) = spool(from, ids)?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, Counting::new(file, progress));
    Ok(transfer::receive_expected(to, &mut reader, expect)?)
}

impl Peer for Local<'_> {
    fn url(&self) -> &str {
        &self.url
    }
    fn refs(&self) -> Result<Refs> {
        Ok(mdl::refs::listed(self.repo)?)
    }
    fn plan(
        &self,
        want: &[ObjectId],
        have: &[ObjectId],
        limit: &Shallow,
    ) -> Result<Vec<PlannedObject>> {
        for id in want.iter().chain(&limit.since) {
            if !transfer::has_commit(self.repo, id)? {
                return Err(Error::Remote(format!("{} has no commit {id}", self.url)));
            }
        }
        let have: HashSet<ObjectId> = have.iter().copied().collect();
        Ok(transfer::plan(
            self.repo,
            want,
            &|id| have.contains(id),
            limit,
        )?)
    }
    fn fetch_objects(
        &self,
        repo: &Repository,
        planned: &[PlannedObject],
        progress: &dyn Progress,
    ) -> Result<Receipt> {
        let ids: Vec<ObjectId> = planned.iter().map(|p| p.id).collect();
        if let Some(id) = transfer::unknown(self.repo, &ids)?.first() {
            return Err(Error::Remote(format!("{} has no object {id}", self.url)));
        }
        // As from a server: only what was planned, commits marked cut taken without parents.
        copy(
            self.repo,
            repo,
            &ids,
            transfer::Expect::Planned(planned),
            progress,
        )
    }
    fn missing(&self, ids: &[ObjectId]) -> Result<Vec<ObjectId>> {
        Ok(transfer::missing(self.repo, ids)?)
    }
    fn send_objects(
        &self,
        repo: &Repository,
        ids: &[ObjectId],
        progress: &dyn Progress,
    ) -> Result<Received> {
        let _writer = self.repo.writer();
        let any = transfer::Expect::Any {
            max_record: u64::MAX,
        };
        Ok(copy(repo, self.repo, ids, any, progress)?.received)
    }
    fn update_ref(&self, update: &RefUpdate) -> Result<()> {
        let _writer = self.repo.writer();
        Ok(transfer::update_ref(self.repo, update, "push")?)
    }
}
