//! [`Operations`] on a folder on this machine: each call opens the repository for itself, with
//! the lock it needs (shared to read, exclusive to write), and closes it when done.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use mdl::checkout::{CheckoutOptions, CheckoutOutcome};
use mdl::commit::{CommitOptions, CommitOutcome, DeferredReport, Staged};
use mdl::compact::{CompactOptions, CompactOutcome};
use mdl::engine::{EngineChoice, Selected, Side};
use mdl::fsck::{FsckReport, Rebuilt};
use mdl::log::LogEntry;
use mdl::merge::{MergeOptions, MergeOutcome};
use mdl::refs::{BranchMove, RefInfo, ReflogLine};
use mdl::transfer::Shallow;
use mdl::{LockMode, ObjectId, OpenOptions, Progress, Repository, StoreError};
use mdl_protocol::body::{GcAnswer, GcRequest};

use crate::{Access, Backend, Branches, History, Operations, Result, Transferred};

/// A repository in a folder on this machine.
#[derive(Debug)]
pub struct Local {
    dir: PathBuf,
    access: Access,
    /// Set by a commit that left re-encodes queued: the repository's work directory.
    due: Mutex<Option<PathBuf>>,
}

impl Local {
    /// The repository at `dir` or its nearest ancestor holding `.mdl` (found when a call opens
    /// it).
    pub fn new(dir: impl Into<PathBuf>, access: Access) -> Local {
        Local {
            dir: dir.into(),
            access,
            due: Mutex::new(None),
        }
    }

    fn options(&self, mode: LockMode) -> OpenOptions {
        OpenOptions {
            mode,
            wait: self.access.wait,
            purpose: self.access.purpose.clone(),
            lent: self.access.lent.clone(),
            ..OpenOptions::default()
        }
    }

    /// Opens the repository with `mode`.
    pub fn open(&self, mode: LockMode) -> mdl::Result<Repository> {
        Repository::open(&self.dir, &self.options(mode))
    }

    /// Opens it for writing with its codec engine chosen (the `engine` setting): what work
    /// on the repository outside these operations needs (a live state's deferred re-encodes).
    pub fn writer(&self) -> mdl::Result<Repository> {
        self.with_engine(LockMode::Write, None)
    }

    /// Opens it with `mode` and chooses its codec engine (`engine`, else the `engine`
    /// setting); with `-v`, says which and why.
    fn with_engine(&self, mode: LockMode, engine: Option<EngineChoice>) -> mdl::Result<Repository> {
        Ok(self.engine_for(self.open(mode)?, engine)?.0)
    }

    /// `repo` with its codec engine chosen ([`Local::with_engine`]), and the choice (to record
    /// what the operation measured of it).
    fn engine_for(
        &self,
        mut repo: Repository,
        engine: Option<EngineChoice>,
    ) -> mdl::Result<(Repository, Selected)> {
        let selected = mdl::engine::select(&repo, engine)?;
        if self.access.verbose {
            eprintln!("engine: {}", selected.why);
        }
        repo.set_engine(selected.engine.clone());
        Ok((repo, selected))
    }
}

/// The lock a change needs, or a dry run's.
fn lock_for(dry_run: bool) -> LockMode {
    if dry_run {
        LockMode::Read
    } else {
        LockMode::Write
    }
}

impl Operations for Local {
    fn backend(&self) -> Backend {
        Backend::Local
    }

    fn location(&self) -> String {
        self.dir.display().to_string()
    }

    fn commit_staged(
        &self,
        staged: Staged,
        opts: &CommitOptions,
        engine: Option<EngineChoice>,
        progress: &dyn Progress,
    ) -> Result<CommitOutcome> {
        let (repo, selected) = self.engine_for(self.open(LockMode::Write)?, engine)?;
        let outcome = mdl::commit::commit_staged(&repo, staged, opts, progress)?;
        // A lossless commit of new tensors is what `auto` compares the engines on (a lossy
        // one's search, or a commit of stored tensors, says little of them).
        if outcome.lossy_tensors == 0 && outcome.new_tensors == outcome.tensors {
            selected.observe(Side::Encode, outcome.raw_bytes, outcome.seconds);
        }
        if mdl::commit::pending_deferred(&repo)? > 0 {
            *self.due.lock().unwrap_or_else(|p| p.into_inner()) = Some(repo.root().to_path_buf());
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
        let (repo, selected) = self.engine_for(self.open(LockMode::Read)?, engine)?;
        let started = std::time::Instant::now();
        let outcome = mdl::checkout::checkout(&repo, rev, out, opts, progress)?;
        selected.observe(Side::Decode, outcome.bytes, started.elapsed().as_secs_f64());
        Ok(outcome)
    }

    fn maintenance_due(&self) -> Result<Option<PathBuf>> {
        Ok(self.due.lock().unwrap_or_else(|p| p.into_inner()).take())
    }

    fn maintenance(&self, background: bool) -> Result<DeferredReport> {
        let repo = if background {
            // The commit that started this one is closing; another writer at work starts its
            // own maintenance when it is done.
            let opts = OpenOptions {
                wait: std::time::Duration::from_secs(5),
                ..self.options(LockMode::Write)
            };
            match Repository::open(&self.dir, &opts) {
                Err(mdl::Error::Store(StoreError::Busy { .. })) => {
                    return Ok(DeferredReport::default())
                }
                r => r?,
            }
        } else {
            self.open(LockMode::Write)?
        };
        let (repo, _) = self.engine_for(repo, None)?;
        let stop = || background && mdl::commit::writer_waiting(&repo);
        Ok(mdl::commit::run_deferred(&repo, None, &stop)?)
    }

    fn log(&self, rev: Option<&str>, limit: Option<usize>) -> Result<Vec<LogEntry>> {
        Ok(mdl::log::log(&self.open(LockMode::Read)?, rev, limit)?)
    }

    fn log_all(&self, limit: Option<usize>) -> Result<Vec<LogEntry>> {
        Ok(mdl::log::log_all(&self.open(LockMode::Read)?, limit)?)
    }

    fn show(&self, rev: &str) -> Result<mdl::show::Shown> {
        Ok(mdl::show::show(&self.open(LockMode::Read)?, rev)?)
    }

    fn diff(&self, a: &str, b: &str) -> Result<mdl::diff::Diff> {
        Ok(mdl::diff::diff(&self.open(LockMode::Read)?, a, b)?)
    }

    fn branches(&self, which: Branches) -> Result<Vec<RefInfo>> {
        let repo = self.open(LockMode::Read)?;
        let mut listed = match which {
            Branches::Remote => Vec::new(),
            Branches::Local | Branches::All => mdl::refs::branches(&repo)?,
        };
        if which != Branches::Local {
            listed.extend(mdl::refs::remote_branches(&repo)?);
        }
        Ok(listed)
    }

    fn create_branch(&self, name: &str, rev: Option<&str>) -> Result<ObjectId> {
        Ok(mdl::refs::create_branch(
            &self.open(LockMode::Write)?,
            name,
            rev,
        )?)
    }

    fn force_branch(&self, name: &str, rev: Option<&str>) -> Result<BranchMove> {
        Ok(mdl::refs::force_branch(
            &self.open(LockMode::Write)?,
            name,
            rev,
        )?)
    }

    fn delete_branch(&self, name: &str, force: bool) -> Result<ObjectId> {
        Ok(mdl::refs::delete_branch(
            &self.open(LockMode::Write)?,
            name,
            force,
        )?)
    }

    fn tags(&self) -> Result<Vec<RefInfo>> {
        Ok(mdl::refs::tags(&self.open(LockMode::Read)?)?)
    }

    fn create_tag(&self, name: &str, rev: Option<&str>, message: Option<&str>) -> Result<ObjectId> {
        let repo = self.open(LockMode::Write)?;
        let tagger = mdl::commit::default_author();
        Ok(mdl::refs::create_tag(&repo, name, rev, message, &tagger)?)
    }

    fn delete_tag(&self, name: &str) -> Result<ObjectId> {
        Ok(mdl::refs::delete_tag(&self.open(LockMode::Write)?, name)?)
    }

    fn switch(&self, name: &str) -> Result<()> {
        Ok(mdl::refs::switch(&self.open(LockMode::Write)?, name)?)
    }

    fn reset(&self, rev: &str) -> Result<BranchMove> {
        Ok(mdl::refs::reset(&self.open(LockMode::Write)?, rev)?)
    }

    fn merge(
        &self,
        revs: &[String],
        opts: &MergeOptions,
        commit: &CommitOptions,
        progress: &dyn Progress,
    ) -> Result<MergeOutcome> {
        let repo = self.open(LockMode::Write)?;
        Ok(mdl::merge::merge(&repo, revs, opts, commit, progress)?)
    }

    fn reflog(&self, name: Option<&str>) -> Result<(String, Vec<ReflogLine>)> {
        Ok(mdl::refs::reflog(&self.open(LockMode::Read)?, name)?)
    }

    fn config(&self) -> Result<Vec<(String, String, bool)>> {
        Ok(mdl::config::config(&self.open(LockMode::Read)?)?)
    }

    fn set_config(&self, key: &str, value: &str) -> Result<(String, String)> {
        mdl::config::set_config(&self.open(LockMode::Write)?, key, value)?;
        Ok((key.to_string(), value.to_string()))
    }

    fn gc(&self, request: &GcRequest, progress: &dyn Progress) -> Result<GcAnswer> {
        let opts = mdl::gc::GcOptions::parse(
            request.prune_older_than.as_deref(),
            request.expire_reflog.as_deref(),
            request.dry_run,
        )?;
        let repo = self.open(lock_for(request.dry_run))?;
        Ok(GcAnswer::Disk(mdl::gc::gc(&repo, &opts, progress)?))
    }

    fn compact(&self, opts: &CompactOptions, progress: &dyn Progress) -> Result<CompactOutcome> {
        let repo = self.open(lock_for(opts.dry_run))?;
        Ok(mdl::compact::compact(&repo, opts, progress)?)
    }

    fn fsck(&self, progress: &dyn Progress) -> Result<FsckReport> {
        Ok(mdl::fsck::fsck_with(
            &self.open(LockMode::Check)?,
            false,
            progress,
        )?)
    }

    fn fsck_repair(&self) -> Result<(Option<Rebuilt>, FsckReport)> {
        Ok(mdl::fsck::repair(
            &self.dir,
            &self.options(LockMode::Write),
        )?)
    }

    fn stats(&self, lossy: bool) -> Result<mdl::stats::Stats> {
        Ok(mdl::stats::stats(&self.open(LockMode::Read)?, lossy)?)
    }

    fn remotes(&self) -> Result<Vec<(String, String)>> {
        Ok(mdl_remote::remotes(&self.open(LockMode::Read)?)?)
    }

    fn add_remote(&self, name: &str, url: &str) -> Result<()> {
        crate::Location::url(url)?;
        Ok(mdl_remote::add_remote(
            &self.open(LockMode::Write)?,
            name,
            url,
        )?)
    }

    fn remove_remote(&self, name: &str) -> Result<()> {
        Ok(mdl_remote::remove_remote(
            &self.open(LockMode::Write)?,
            name,
        )?)
    }

    fn set_remote_url(&self, name: &str, url: &str) -> Result<()> {
        crate::Location::url(url)?;
        Ok(mdl_remote::set_url(
            &self.open(LockMode::Write)?,
            name,
            url,
        )?)
    }

    fn set_remote_token(&self, name: &str, token: Option<&str>) -> Result<()> {
        Ok(mdl_remote::set_token(
            &self.open(LockMode::Write)?,
            name,
            token,
        )?)
    }

    fn fetch(
        &self,
        name: &str,
        branch: Option<&str>,
        pull: bool,
        history: History,
        progress: &dyn Progress,
    ) -> Result<Transferred> {
        let repo = self.open(LockMode::Write)?;
        let peer = crate::peer::named(&repo, name, &self.access)?;
        let transfer = if pull {
            mdl_remote::pull
        } else {
            mdl_remote::fetch
        };
        let (deepened, limit) = match history {
            History::All => (Default::default(), Shallow::WHOLE),
            History::Deepen(by) => (
                mdl_remote::deepen(&repo, peer.as_ref(), by, progress)?,
                Shallow::WHOLE,
            ),
            History::Newest(n) => (
                Default::default(),
                Shallow {
                    depth: Some(n),
                    since: None,
                },
            ),
        };
        let mut outcome = transfer(&repo, name, peer.as_ref(), branch, &limit, progress)?;
        outcome.objects += deepened.objects;
        outcome.bytes += deepened.bytes;
        Ok(Transferred {
            url: peer.url().to_string(),
            outcome,
        })
    }

    fn wait_remote_branch(
        &self,
        name: &str,
        branch: &str,
        from: Option<ObjectId>,
        timeout: Duration,
    ) -> Result<Option<ObjectId>> {
        let short = mdl::RefName::new(branch).map_err(mdl::Error::from)?;
        let full = mdl::Ref::branch(&short).full();
        let peer = {
            let repo = self.open(LockMode::Read)?;
            crate::peer::named(&repo, name, &self.access)?
        };
        let waited = peer.wait_ref(&full, from, timeout)?;
        match (waited.moved, waited.target) {
            (false, _) => Ok(None),
            (true, Some(target)) => Ok(Some(target)),
            (true, None) => Err(mdl_remote::Error::Remote(format!(
                "{} has no branch {branch} (any more)",
                peer.url()
            ))
            .into()),
        }
    }

    fn push(
        &self,
        name: &str,
        branch: Option<&str>,
        force: bool,
        progress: &dyn Progress,
    ) -> Result<Transferred> {
        let repo = self.open(LockMode::Write)?;
        let peer = crate::peer::named(&repo, name, &self.access)?;
        let outcome = mdl_remote::push(&repo, name, peer.as_ref(), branch, force, progress)?;
        Ok(Transferred {
            url: peer.url().to_string(),
            outcome,
        })
    }
}
