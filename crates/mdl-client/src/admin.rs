//! A server's upkeep and refs through its API: compaction, gc, settings, branches and tags,
//! the reflog, fsck — what `mdl -C URL …` asks of a served repository.

use mdl_format::ObjectId;
use mdl_protocol::body;
use mdl_protocol::history::{BranchMove, Diff};
use mdl_protocol::limits;
use mdl_protocol::outcome::{CompactOptions, CompactOutcome, FsckReport, Stats};
use mdl_protocol::route;

use crate::{Remote, Result};

impl Remote {
    /// `DELETE path` of a ref (a branch or a tag); the commit it named.
    pub(crate) fn delete(&self, path: &str, query: &[(&str, String)]) -> Result<ObjectId> {
        let mut req = self.auth(self.agent.delete(format!("{}{path}", self.api)));
        for (k, v) in query {
            req = req.query(*k, v);
        }
        let what = "deleting a ref";
        let resp = self.check(what, req.call())?;
        let deleted: body::Deleted = self.json(what, resp, limits::MAX_DOCUMENT)?;
        Ok(deleted.was)
    }

    /// Runs `mdl compact` on the server (`POST /maintenance/compact`).
    pub fn compact(&self, max_depth: Option<u32>, dry_run: bool) -> Result<CompactOutcome> {
        let opts = CompactOptions { max_depth, dry_run };
        self.post_json(route::COMPACT, &opts, limits::MAX_DOCUMENT)
    }

    /// Creates this repository on its server (`POST /v1/repos`): for an `admin` token, on a
    /// server that serves a folder of repositories.
    pub fn create(&self) -> Result<()> {
        let req = self.auth(self.agent.post(format!("{}{}", self.server, route::REPOS)));
        let new = body::NewRepo {
            name: self.name().to_string(),
        };
        let what = "creating the repository";
        let resp = self.check(what, req.send_json(&new))?;
        let _: body::NewRepo = self.json(what, resp, limits::MAX_DOCUMENT)?;
        Ok(())
    }

    /// Runs `mdl gc` on the server (`POST /maintenance/gc`); durations as `mdl gc` takes them.
    pub fn gc(
        &self,
        prune_older_than: Option<&str>,
        expire_reflog: Option<&str>,
        dry_run: bool,
    ) -> Result<body::GcAnswer> {
        let request = body::GcRequest {
            prune_older_than: prune_older_than.map(str::to_string),
            expire_reflog: expire_reflog.map(str::to_string),
            dry_run,
        };
        self.post_json(route::GC, &request, limits::MAX_DOCUMENT)
    }

    /// The repository's totals (`GET /stats`); with `lossy`, HEAD's series under the lossy
    /// papers' accountings too (`?lossy=true`).
    pub fn stats(&self, lossy: bool) -> Result<Stats> {
        let query = if lossy {
            vec![("lossy", "true".to_string())]
        } else {
            Vec::new()
        };
        self.get_json(route::STATS, &query, limits::MAX_DOCUMENT)
    }

    /// Revisions `a` and `b` compared (`GET /diff`).
    pub fn diff(&self, a: &str, b: &str) -> Result<Diff> {
        self.get_json(
            route::DIFF,
            &[("a", a.to_string()), ("b", b.to_string())],
            limits::MAX_DOCUMENT,
        )
    }

    /// Every setting: key, value, whether it is the default (`GET /config`).
    pub fn config(&self) -> Result<Vec<(String, String, bool)>> {
        self.get_json(route::CONFIG, &[], limits::MAX_DOCUMENT)
    }

    /// Changes one setting (`POST /config`).
    pub fn set_config(&self, key: &str, value: &str) -> Result<body::ConfigSet> {
        let req = body::ConfigSet {
            key: key.to_string(),
            value: value.to_string(),
        };
        self.post_json(route::CONFIG, &req, limits::MAX_DOCUMENT)
    }

    /// Creates branch `name` at `rev` (HEAD's commit when `None`); with `force`, creates or
    /// moves it (`POST /branches`).
    pub fn branch(&self, name: &str, rev: Option<&str>, force: bool) -> Result<BranchMove> {
        let req = body::BranchRequest {
            name: name.to_string(),
            rev: rev.map(str::to_string),
            force,
        };
        self.post_json(route::BRANCHES, &req, limits::MAX_DOCUMENT)
    }

    /// Deletes branch `name`; without `force`, only if its commits stay reachable
    /// (`DELETE /branches/{name}`). Returns the commit it pointed at.
    pub fn delete_branch(&self, name: &str, force: bool) -> Result<ObjectId> {
        let path = route::fill(route::BRANCH, &[("name", name)]);
        self.delete(&path, &[("force", force.to_string())])
    }

    /// Creates tag `name` at `rev` (HEAD's commit when `None`), annotated by `tagger` when
    /// `message` is given (`POST /tags`); the commit it names.
    pub fn tag(
        &self,
        name: &str,
        rev: Option<&str>,
        message: Option<&str>,
        tagger: &str,
    ) -> Result<ObjectId> {
        let req = body::TagRequest {
            name: name.to_string(),
            rev: rev.map(str::to_string),
            message: message.map(str::to_string),
            tagger: tagger.to_string(),
        };
        let tagged: body::Tagged = self.post_json(route::TAGS, &req, limits::MAX_DOCUMENT)?;
        Ok(tagged.target)
    }

    /// Deletes tag `name` (`DELETE /tags/{name}`); the commit it named.
    pub fn delete_tag(&self, name: &str) -> Result<ObjectId> {
        let path = route::fill(route::TAG, &[("name", name)]);
        self.delete(&path, &[])
    }

    /// Moves the current branch to `rev` (`POST /reset`).
    pub fn reset(&self, rev: &str) -> Result<BranchMove> {
        let req = body::ResetRequest {
            rev: rev.to_string(),
        };
        self.post_json(route::RESET, &req, limits::MAX_DOCUMENT)
    }

    /// Where ref `name` (HEAD's branch when `None`) pointed, newest first (`GET /reflog`).
    pub fn reflog(&self, name: Option<&str>) -> Result<body::Reflog> {
        let query: Vec<(&str, String)> =
            name.map(|n| ("name", n.to_string())).into_iter().collect();
        self.get_json(route::REFLOG, &query, limits::MAX_DOCUMENT)
    }

    /// Points HEAD at branch `name` (`POST /head`).
    pub fn switch(&self, name: &str) -> Result<()> {
        let req = body::Head {
            branch: name.to_string(),
        };
        self.post_json::<body::Head>(route::HEAD, &req, limits::MAX_DOCUMENT)
            .map(|_| ())
    }

    /// Checks the whole repository on the server, without repairing
    /// (`POST /maintenance/fsck`).
    pub fn fsck(&self) -> Result<FsckReport> {
        self.post_json(route::FSCK, &serde_json::json!({}), limits::MAX_DOCUMENT)
    }
}
