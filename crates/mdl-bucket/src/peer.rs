//! [`BucketPeer`]: a repository in object storage as the other side of a clone, fetch, pull or
//! push. It reads and receives through this machine's replica, brought up to date when
//! opened; a ref the transfer moves is published at once, without replaying — a commit that
//! another repository already holds keeps its id — so a push that lost the race for its
//! branch is refused like a push to a server whose branch moved.

use std::cell::RefCell;
use std::path::Path;
use std::time::Duration;

use mdl::transfer::{PlannedObject, Receipt, Received, RefUpdate, Shallow};
use mdl::{ObjectId, Repository};
use mdl_protocol::body::Refs;
use mdl_protocol::ErrorCode;
use mdl_remote::{Local, Peer};

use crate::{Error, Location, Replica};

/// A repository in object storage, through this machine's replica of it.
pub struct BucketPeer {
    replica: RefCell<Replica>,
    repo: Repository,
    url: String,
}

impl BucketPeer {
    /// Opens this machine's replica of `loc` under `cache` ([`Replica::open`]).
    pub fn open(loc: &Location, cache: &Path, wait: Duration) -> crate::Result<BucketPeer> {
        let replica = Replica::open(loc, cache, wait)?;
        let repo = replica.repository(wait)?;
        Ok(BucketPeer {
            replica: RefCell::new(replica),
            repo,
            url: loc.url(),
        })
    }

    /// The replica, with the bucket's request counts.
    pub fn replica(&self) -> std::cell::Ref<'_, Replica> {
        self.replica.borrow()
    }

    fn local(&self) -> Local<'_> {
        Local::new(&self.repo, self.url.clone())
    }
}

/// A failure of the bucket or the replica as a transfer reports it.
fn transfer_error(e: Error) -> mdl_remote::Error {
    match e {
        Error::Local(e) => mdl_remote::Error::Local(e),
        Error::Conflict(message) => mdl_remote::Error::Peer {
            code: Some(ErrorCode::RefConflict),
            message,
        },
        other => mdl_remote::Error::Peer {
            code: None,
            message: other.to_string(),
        },
    }
}

impl Peer for BucketPeer {
    fn url(&self) -> &str {
        &self.url
    }
    fn refs(&self) -> mdl_remote::Result<Refs> {
        self.local().refs()
    }
    fn plan(
        &self,
        want: &[ObjectId],
        have: &[ObjectId],
        limit: &Shallow,
    ) -> mdl_remote::Result<Vec<PlannedObject>> {
        self.local().plan(want, have, limit)
    }
    fn fetch_objects(
        &self,
        repo: &Repository,
        planned: &[PlannedObject],
        progress: &dyn mdl::Progress,
    ) -> mdl_remote::Result<Receipt> {
        self.local().fetch_objects(repo, planned, progress)
    }
    fn missing(&self, ids: &[ObjectId]) -> mdl_remote::Result<Vec<ObjectId>> {
        self.local().missing(ids)
    }
    fn send_objects(
        &self,
        repo: &Repository,
        ids: &[ObjectId],
        progress: &dyn mdl::Progress,
    ) -> mdl_remote::Result<Received> {
        self.local().send_objects(repo, ids, progress)
    }
    /// Its refs are this machine's replica's, brought up to date when it was opened: waiting
    /// on them would not see the bucket move.
    fn wait_ref(
        &self,
        _name: &str,
        _from: Option<ObjectId>,
        _timeout: std::time::Duration,
    ) -> mdl_remote::Result<mdl_protocol::body::Waited> {
        Err(mdl_remote::Error::Remote(format!(
            "{}: waiting for a branch to move needs a served repository (mdl serve); a repository in object storage is fetched from when asked",
            self.url
        )))
    }
    fn update_ref(&self, update: &RefUpdate) -> mdl_remote::Result<()> {
        self.local().update_ref(update)?;
        self.replica
            .borrow_mut()
            .publish_exact(&self.repo)
            .map_err(transfer_error)?;
        Ok(())
    }
}
