//! Serving a repository in object storage without keeping state another server needs: the
//! served repository is this machine's replica, brought up to date from the bucket before each
//! request, and what a request changed is published to the bucket before it is answered. Two
//! servers over one bucket are then two machines of `mdl_bucket`: a commit that lost the race
//! for its branch is replayed onto the winner's tip, any other lost race answers
//! `ref_conflict`.
//!
//! One server's requests take turns on its replica (its mutex orders every sync and publish; a
//! read waits for a change in progress);
//! records a push sends are uploaded as they arrive, since its ref update may reach another
//! server.

use std::time::Duration;

use mdl::ObjectId;
use mdl_bucket::{BucketGc, Publish, Published};
use mdl_protocol::ErrorCode;

use crate::access::ApiResult;
use crate::error::ApiError;
use crate::Served;

impl Served {
    /// Brings a replica up to date (nothing for a repository on disk).
    pub(crate) fn refresh(&self) -> ApiResult<()> {
        let Some(replica) = &self.replica else {
            return Ok(());
        };
        let mut replica = replica.lock().unwrap_or_else(|p| p.into_inner());
        let _writer = self.repo.writer();
        replica.sync(&self.repo)?;
        // A read publishes nothing; what earlier requests fetched is trimmed.
        replica.finish(&self.repo, Publish::Nothing)?;
        Ok(())
    }

    /// Runs `change` on the repository opened for writing ([`Served::writer`]) — for a replica,
    /// brought up to date first and with
    /// what `change` did published after (`replay`: a new commit that lost the race for its
    /// branch is replayed onto the winner's tip, see [`mdl_bucket::Replica::publish`]).
    pub(crate) fn change<T>(
        &self,
        replay: bool,
        change: impl FnOnce(&mdl::Repository) -> ApiResult<T>,
    ) -> ApiResult<(T, Published)> {
        let _trim = TrimAfter;
        let Some(replica) = &self.replica else {
            return Ok((change(&*self.writer()?)?, Published::default()));
        };
        let mut replica = replica.lock().unwrap_or_else(|p| p.into_inner());
        {
            let _writer = self.repo.writer();
            replica.sync(&self.repo)?;
        }
        let done = change(&self.repo)?;
        // Without the writer: a replay takes it.
        let how = match replay {
            true => Publish::Replaying,
            false => Publish::Exactly,
        };
        Ok((done, replica.finish(&self.repo, how)?))
    }

    /// Uploads those of `ids` (records just received) that the bucket lacks.
    pub(crate) fn publish_records(&self, ids: &[ObjectId]) -> ApiResult<()> {
        if let Some(replica) = &self.replica {
            let mut replica = replica.lock().unwrap_or_else(|p| p.into_inner());
            replica.publish_records(&self.repo, ids)?;
        }
        Ok(())
    }

    /// One step of the gc of the bucket behind the replica ([`mdl_bucket::Replica::gc`]).
    pub(crate) fn bucket_gc(&self, grace: Duration, dry_run: bool) -> ApiResult<BucketGc> {
        let Some(replica) = &self.replica else {
            return Err(ApiError::new(
                ErrorCode::Internal,
                "not a repository in object storage",
            ));
        };
        let mut replica = replica.lock().unwrap_or_else(|p| p.into_inner());
        // Its sync changes the replica: no compaction step in between.
        let _writer = self.repo.writer();
        Ok(replica.gc(&self.repo, grace, dry_run)?)
    }
}

/// Hands the memory a change freed back to the system when dropped ([`crate::give_back_memory`]).
struct TrimAfter;

impl Drop for TrimAfter {
    fn drop(&mut self) {
        crate::give_back_memory();
    }
}
