//! [`Operations`] on a repository in object storage: each runs on this machine's replica
//! (`mdl_bucket::Replica`), brought up to date from the bucket first, as [`Local`] runs it on
//! a folder; what it changed is published before it returns, so what it reports names only
//! what the bucket holds.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mdl::checkout::{CheckoutOptions, CheckoutOutcome};
use mdl::commit::{CommitOptions, CommitOutcome, DeferredReport, Staged};
use mdl::compact::{CompactOptions, CompactOutcome};
use mdl::engine::EngineChoice;
use mdl::fsck::{FsckReport, Rebuilt};
use mdl::log::LogEntry;
use mdl::merge::{MergeOptions, MergeOutcome};
use mdl::refs::{BranchMove, RefInfo, ReflogLine};
use mdl::{ObjectId, Progress};
use mdl_bucket::{Location, Publish, Published, Replica};
use mdl_protocol::body::{GcAnswer, GcRequest};

use crate::error::unsupported;
use crate::{
    Access, Backend, Branches, History, Local, Operation, Operations, Result, Transferred,
};

/// A repository in object storage.
#[derive(Clone, Debug)]
pub struct InBucket {
    loc: Location,
    access: Access,
}

impl InBucket {
    /// The repository at `loc`.
    pub fn new(loc: Location, access: Access) -> InBucket {
        InBucket { loc, access }
    }

    fn replica(&self) -> Result<Replica> {
        Ok(Replica::open(
            &self.loc,
            &mdl_bucket::cache_root(),
            self.access.wait,
        )?)
    }

    /// Runs `f` on the replica, brought up to date first; then publishes what it changed and
    /// trims the replica's cache. Even a read publishes: what an interrupted command left
    /// unpublished goes out with the next one.
    fn on_replica<T>(
        &self,
        publish: Publish,
        f: impl FnOnce(&Local) -> Result<T>,
    ) -> Result<(T, Published)> {
        let mut replica = self.replica()?;
        let local = Local::new(replica.root(), self.access.clone());
        let out = f(&local)?;
        let repo = replica.repository(self.access.wait)?;
        let published = replica.finish(&repo, publish)?;
        self.report(&replica);
        Ok((out, published))
    }

    fn run<T>(&self, f: impl FnOnce(&Local) -> Result<T>) -> Result<T> {
        Ok(self.on_replica(Publish::Replaying, f)?.0)
    }

    fn run_exactly<T>(&self, f: impl FnOnce(&Local) -> Result<T>) -> Result<T> {
        Ok(self.on_replica(Publish::Exactly, f)?.0)
    }

    /// With `-v`, the requests the command made.
    fn report(&self, replica: &Replica) {
        if self.access.verbose {
            use std::sync::atomic::Ordering::Relaxed;
            let c = &replica.bucket().counts;
            eprintln!(
                "{}: {} PUTs, {} GETs, {} LISTs, {} bytes up, {} bytes down",
                replica.bucket().url(),
                c.puts.load(Relaxed),
                c.gets.load(Relaxed),
                c.lists.load(Relaxed),
                c.bytes_up.load(Relaxed),
                c.bytes_down.load(Relaxed)
            );
        }
    }
}

impl Operations for InBucket {
    fn backend(&self) -> Backend {
        Backend::Bucket
    }

    fn location(&self) -> String {
        self.loc.url()
    }

    fn commit_staged(
        &self,
        staged: Staged,
        opts: &CommitOptions,
        engine: Option<EngineChoice>,
        progress: &dyn Progress,
    ) -> Result<CommitOutcome> {
        let (mut outcome, published) = self.on_replica(Publish::Replaying, |l| {
            l.commit_staged(staged, opts, engine, progress)
        })?;
        // Replayed onto another writer's newer tip: the commit the bucket holds.
        if let Some((_, new)) = published.replayed.last() {
            outcome.id = *new;
        }
        Ok(outcome)
    }

    fn checkout(
        &self,
        rev: &str,
        out: &Path,
        opts: &CheckoutOptions,
        engine: Option<EngineChoice>,
        progress: &dyn Progress,
    ) -> Result<CheckoutOutcome> {
        self.run(|l| l.checkout(rev, out, opts, engine, progress))
    }

    fn maintenance_due(&self) -> Result<Option<PathBuf>> {
        Ok(None)
    }

    fn maintenance(&self, background: bool) -> Result<DeferredReport> {
        self.run(|l| l.maintenance(background))
    }

    fn log(&self, rev: Option<&str>, limit: Option<usize>) -> Result<Vec<LogEntry>> {
        self.run(|l| l.log(rev, limit))
    }

    fn log_all(&self, limit: Option<usize>) -> Result<Vec<LogEntry>> {
        self.run(|l| l.log_all(limit))
    }

    fn show(&self, rev: &str) -> Result<mdl::show::Shown> {
        self.run(|l| l.show(rev))
    }

    fn diff(&self, a: &str, b: &str) -> Result<mdl::diff::Diff> {
        self.run(|l| l.diff(a, b))
    }

    fn branches(&self, which: Branches) -> Result<Vec<RefInfo>> {
        self.run(|l| l.branches(which))
    }

    fn create_branch(&self, name: &str, rev: Option<&str>) -> Result<ObjectId> {
        self.run(|l| l.create_branch(name, rev))
    }

    fn force_branch(&self, name: &str, rev: Option<&str>) -> Result<BranchMove> {
        self.run(|l| l.force_branch(name, rev))
    }

    fn delete_branch(&self, name: &str, force: bool) -> Result<ObjectId> {
        self.run(|l| l.delete_branch(name, force))
    }

    fn tags(&self) -> Result<Vec<RefInfo>> {
        self.run(|l| l.tags())
    }

    fn create_tag(&self, name: &str, rev: Option<&str>, message: Option<&str>) -> Result<ObjectId> {
        self.run(|l| l.create_tag(name, rev, message))
    }

    fn delete_tag(&self, name: &str) -> Result<ObjectId> {
        self.run(|l| l.delete_tag(name))
    }

    fn switch(&self, name: &str) -> Result<()> {
        self.run(|l| l.switch(name))
    }

    fn reset(&self, rev: &str) -> Result<BranchMove> {
        self.run(|l| l.reset(rev))
    }

    fn merge(
        &self,
        revs: &[String],
        opts: &MergeOptions,
        commit: &CommitOptions,
        progress: &dyn Progress,
    ) -> Result<MergeOutcome> {
        self.run(|l| l.merge(revs, opts, commit, progress))
    }

    fn reflog(&self, name: Option<&str>) -> Result<(String, Vec<ReflogLine>)> {
        self.run(|l| l.reflog(name))
    }

    fn config(&self) -> Result<Vec<(String, String, bool)>> {
        self.run(|l| l.config())
    }

    fn set_config(&self, key: &str, value: &str) -> Result<(String, String)> {
        self.run(|l| l.set_config(key, value))
    }

    fn gc(&self, request: &GcRequest, _progress: &dyn Progress) -> Result<GcAnswer> {
        if request.expire_reflog.is_some() {
            return Err(unsupported(
                Operation::GcExpireReflog,
                Backend::Bucket,
                "a repository in object storage keeps no reflog; leave --expire-reflog out",
            ));
        }
        let opts =
            mdl::gc::GcOptions::parse(request.prune_older_than.as_deref(), None, request.dry_run)?;
        let mut replica = self.replica()?;
        let repo = replica.repository(self.access.wait)?;
        // Its changes are published as it goes (`Replica::gc`).
        let outcome = replica.gc(&repo, opts.prune_older_than, opts.dry_run)?;
        replica.finish(&repo, Publish::Nothing)?;
        self.report(&replica);
        Ok(GcAnswer::Bucket(outcome))
    }

    fn compact(&self, opts: &CompactOptions, progress: &dyn Progress) -> Result<CompactOutcome> {
        self.run(|l| l.compact(opts, progress))
    }

    fn fsck(&self, progress: &dyn Progress) -> Result<FsckReport> {
        self.run(|l| l.fsck(progress))
    }

    fn fsck_repair(&self) -> Result<(Option<Rebuilt>, FsckReport)> {
        // This machine's copy, repaired before anything else opens it (its database may be
        // what is damaged), then brought up to date. A copy not made yet is made first.
        let root = Replica::root_of(&self.loc, &mdl_bucket::cache_root());
        if !root.join(mdl::MDL_DIR).exists() {
            self.replica()?;
        }
        let repaired = Local::new(root, self.access.clone()).fsck_repair()?;
        self.replica()?;
        Ok(repaired)
    }

    fn stats(&self, lossy: bool) -> Result<mdl::stats::Stats> {
        self.run(|l| l.stats(lossy))
    }

    // Remotes are settings, so every machine shares them.
    fn remotes(&self) -> Result<Vec<(String, String)>> {
        self.run_exactly(|l| l.remotes())
    }

    fn add_remote(&self, name: &str, url: &str) -> Result<()> {
        self.run_exactly(|l| l.add_remote(name, url))
    }

    fn remove_remote(&self, name: &str) -> Result<()> {
        self.run_exactly(|l| l.remove_remote(name))
    }

    fn set_remote_url(&self, name: &str, url: &str) -> Result<()> {
        self.run_exactly(|l| l.set_remote_url(name, url))
    }

    fn set_remote_token(&self, name: &str, token: Option<&str>) -> Result<()> {
        self.run_exactly(|l| l.set_remote_token(name, token))
    }

    // Tracking refs (refs/remotes/) stay this machine's.
    fn fetch(
        &self,
        name: &str,
        branch: Option<&str>,
        pull: bool,
        history: History,
        progress: &dyn Progress,
    ) -> Result<Transferred> {
        self.run_exactly(|l| l.fetch(name, branch, pull, history, progress))
    }

    fn wait_remote_branch(
        &self,
        name: &str,
        branch: &str,
        from: Option<ObjectId>,
        timeout: Duration,
    ) -> Result<Option<ObjectId>> {
        self.run_exactly(|l| l.wait_remote_branch(name, branch, from, timeout))
    }

    fn push(
        &self,
        name: &str,
        branch: Option<&str>,
        force: bool,
        progress: &dyn Progress,
    ) -> Result<Transferred> {
        self.run_exactly(|l| l.push(name, branch, force, progress))
    }
}
