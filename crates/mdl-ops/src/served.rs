//! [`Operations`] on a repository behind `mdl serve`, over HTTP (`docs/HTTP_API.md`). The
//! server runs each operation with its own engine and locks; what only its machine can do
//! (the remotes it pulls from, a repair that needs the repository closed) is refused here
//! with what to do instead.

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
use mdl::{ObjectId, Progress, Ref};
use mdl_protocol::body::{GcAnswer, GcRequest};
use mdl_remote::Remote;

use crate::error::unsupported;
use crate::{Backend, Branches, Error, History, Operation, Operations, Result, Transferred};

/// A repository on a server.
pub struct Served {
    remote: Remote,
}

impl Served {
    /// The repository `remote` reaches.
    pub fn new(remote: Remote) -> Served {
        Served { remote }
    }

    /// Its HTTP client.
    pub fn remote(&self) -> &Remote {
        &self.remote
    }

    fn refuse(&self, operation: Operation, instead: impl Into<String>) -> Error {
        unsupported(operation, Backend::Served, instead)
    }

    /// The refusal of what runs where the repository is stored.
    fn on_its_machine(&self, operation: Operation) -> Error {
        self.refuse(
            operation,
            format!(
                "run it where {} is stored (stop `mdl serve` there, or run it in a clone)",
                self.remote.url()
            ),
        )
    }

    /// The refs under `prefix` (`refs/heads/`, `refs/tags/`), named without it.
    fn refs(&self, prefix: &str) -> Result<Vec<RefInfo>> {
        let refs = self.remote.refs()?;
        Ok(refs
            .refs
            .iter()
            .filter_map(|r| {
                let short = r.name.strip_prefix(prefix)?;
                Some(RefInfo {
                    name: short.to_string(),
                    target: r.target,
                    current: prefix == Ref::BRANCHES && refs.head.as_deref() == Some(short),
                    message: r.message.clone(),
                })
            })
            .collect())
    }
}

/// The refusal of `--engine` over HTTP.
fn engine_here(operation: Operation) -> Error {
    unsupported(
        operation,
        Backend::Served,
        "--engine chooses this machine's engine; a server runs its repository's `engine` setting",
    )
}

impl Operations for Served {
    fn backend(&self) -> Backend {
        Backend::Served
    }

    fn location(&self) -> String {
        self.remote.url().to_string()
    }

    fn commit(
        &self,
        paths: &[PathBuf],
        opts: &CommitOptions,
        engine: Option<EngineChoice>,
        _progress: &dyn Progress,
    ) -> Result<CommitOutcome> {
        if engine.is_some() {
            return Err(engine_here(Operation::CommitEngine));
        }
        Ok(mdl_remote::commit_paths(&self.remote, paths, opts)?)
    }

    fn commit_staged(
        &self,
        _staged: Staged,
        _opts: &CommitOptions,
        _engine: Option<EngineChoice>,
        _progress: &dyn Progress,
    ) -> Result<CommitOutcome> {
        Err(self.refuse(
            Operation::CommitState,
            "commit it into a local repository and push it, or into the served folder on the \
             server's machine",
        ))
    }

    fn checkout(
        &self,
        rev: &str,
        out: &Path,
        opts: &CheckoutOptions,
        engine: Option<EngineChoice>,
        _progress: &dyn Progress,
    ) -> Result<CheckoutOutcome> {
        if engine.is_some() {
            return Err(engine_here(Operation::CheckoutEngine));
        }
        if opts.skip_expired {
            return Err(self.refuse(
                Operation::CheckoutSkipExpired,
                "check out the thinned commit where the repository is stored",
            ));
        }
        if opts.since.is_some() {
            return Err(self.refuse(
                Operation::Checkout,
                "--since updates files from a repository on this machine: fetch into a clone and check out from it",
            ));
        }
        Ok(mdl_remote::download(
            &self.remote,
            rev,
            out,
            opts.path.as_deref(),
            opts.force,
        )?)
    }

    fn maintenance_due(&self) -> Result<Option<PathBuf>> {
        Ok(None)
    }

    fn maintenance(&self, _background: bool) -> Result<DeferredReport> {
        Err(self.refuse(
            Operation::Maintenance,
            format!(
                "{} does its maintenance after each commit itself",
                self.remote.url()
            ),
        ))
    }

    fn log(&self, rev: Option<&str>, limit: Option<usize>) -> Result<Vec<LogEntry>> {
        Ok(self.remote.log(rev, limit)?)
    }

    fn log_all(&self, limit: Option<usize>) -> Result<Vec<LogEntry>> {
        Ok(self.remote.log_all(limit)?)
    }

    fn show(&self, rev: &str) -> Result<mdl::show::Shown> {
        Ok(self.remote.show(rev)?)
    }

    fn diff(&self, a: &str, b: &str) -> Result<mdl::diff::Diff> {
        Ok(self.remote.diff(a, b)?)
    }

    fn branches(&self, which: Branches) -> Result<Vec<RefInfo>> {
        match which {
            Branches::Local => self.refs(Ref::BRANCHES),
            Branches::Remote | Branches::All => Err(self.refuse(
                Operation::RemoteBranches,
                "remote-tracking branches stay where the repository is; `mdl branch` lists a server's branches",
            )),
        }
    }

    fn create_branch(&self, name: &str, rev: Option<&str>) -> Result<ObjectId> {
        Ok(self.remote.branch(name, rev, false)?.to)
    }

    fn force_branch(&self, name: &str, rev: Option<&str>) -> Result<BranchMove> {
        Ok(self.remote.branch(name, rev, true)?)
    }

    fn delete_branch(&self, name: &str, force: bool) -> Result<ObjectId> {
        Ok(self.remote.delete_branch(name, force)?)
    }

    fn tags(&self) -> Result<Vec<RefInfo>> {
        self.refs(Ref::TAGS)
    }

    fn create_tag(&self, name: &str, rev: Option<&str>, message: Option<&str>) -> Result<ObjectId> {
        let tagger = mdl::commit::default_author();
        Ok(self.remote.tag(name, rev, message, &tagger)?)
    }

    fn delete_tag(&self, name: &str) -> Result<ObjectId> {
        Ok(self.remote.delete_tag(name)?)
    }

    fn switch(&self, name: &str) -> Result<()> {
        Ok(self.remote.switch(name)?)
    }

    fn reset(&self, rev: &str) -> Result<BranchMove> {
        Ok(self.remote.reset(rev)?)
    }

    fn merge(
        &self,
        _revs: &[String],
        _opts: &MergeOptions,
        _commit: &CommitOptions,
        _progress: &dyn Progress,
    ) -> Result<MergeOutcome> {
        // It reads every merged tensor: where the records are, not over HTTP.
        Err(self.on_its_machine(Operation::Merge))
    }

    fn reflog(&self, name: Option<&str>) -> Result<(String, Vec<ReflogLine>)> {
        let reflog = self.remote.reflog(name)?;
        Ok((reflog.name, reflog.entries))
    }

    fn config(&self) -> Result<Vec<(String, String, bool)>> {
        Ok(self.remote.config()?)
    }

    fn set_config(&self, key: &str, value: &str) -> Result<(String, String)> {
        let set = self.remote.set_config(key, value)?;
        Ok((set.key, set.value))
    }

    fn gc(&self, request: &GcRequest, _progress: &dyn Progress) -> Result<GcAnswer> {
        // Checked here too, so a typo fails before anything is sent.
        mdl::gc::GcOptions::parse(
            request.prune_older_than.as_deref(),
            request.expire_reflog.as_deref(),
            request.dry_run,
        )?;
        Ok(self.remote.gc(
            request.prune_older_than.as_deref(),
            request.expire_reflog.as_deref(),
            request.dry_run,
        )?)
    }

    fn compact(&self, opts: &CompactOptions, _progress: &dyn Progress) -> Result<CompactOutcome> {
        Ok(self.remote.compact(opts.max_depth, opts.dry_run)?)
    }

    fn fsck(&self, _progress: &dyn Progress) -> Result<FsckReport> {
        Ok(self.remote.fsck()?)
    }

    fn fsck_repair(&self) -> Result<(Option<Rebuilt>, FsckReport)> {
        Err(self.refuse(
            Operation::FsckRepair,
            format!(
                "a repair may rebuild the database, which needs the repository closed: stop the `mdl serve` at {} first",
                self.remote.url()
            ),
        ))
    }

    fn stats(&self, lossy: bool) -> Result<mdl::stats::Stats> {
        Ok(self.remote.stats(lossy)?)
    }

    fn remotes(&self) -> Result<Vec<(String, String)>> {
        Err(self.on_its_machine(Operation::Remotes))
    }

    fn add_remote(&self, _name: &str, _url: &str) -> Result<()> {
        Err(self.on_its_machine(Operation::AddRemote))
    }

    fn remove_remote(&self, _name: &str) -> Result<()> {
        Err(self.on_its_machine(Operation::RemoveRemote))
    }

    fn set_remote_url(&self, _name: &str, _url: &str) -> Result<()> {
        Err(self.on_its_machine(Operation::SetRemoteUrl))
    }

    fn set_remote_token(&self, _name: &str, _token: Option<&str>) -> Result<()> {
        Err(self.on_its_machine(Operation::SetRemoteToken))
    }

    fn fetch(
        &self,
        _name: &str,
        _branch: Option<&str>,
        pull: bool,
        _history: History,
        _progress: &dyn Progress,
    ) -> Result<Transferred> {
        let op = if pull {
            Operation::Pull
        } else {
            Operation::Fetch
        };
        Err(self.on_its_machine(op))
    }

    fn wait_remote_branch(
        &self,
        _name: &str,
        _branch: &str,
        _from: Option<ObjectId>,
        _timeout: Duration,
    ) -> Result<Option<ObjectId>> {
        Err(self.on_its_machine(Operation::Fetch))
    }

    fn push(
        &self,
        _name: &str,
        _branch: Option<&str>,
        _force: bool,
        _progress: &dyn Progress,
    ) -> Result<Transferred> {
        Err(self.on_its_machine(Operation::Push))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live state's commit is refused before anything is sent (no server answers here),
    /// with the one refusal every surface shows.
    #[test]
    fn a_staged_commit_is_refused_with_what_to_do_instead() {
        let served = Served::new(Remote::new("http://127.0.0.1:9/repo", None).unwrap());
        let staged = Staged::memory(Vec::new(), &[]).unwrap();
        let err = served
            .commit_staged(staged, &CommitOptions::default(), None, &mdl::NoProgress)
            .unwrap_err();
        assert!(matches!(
            err,
            Error::Unsupported {
                operation: Operation::CommitState,
                backend: Backend::Served,
                ..
            }
        ));
        let text = err.to_string();
        assert!(text.contains("push it"), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }
}
