//! The storage page: where the repository's storage went.
//!
//! Its report reads every reachable manifest, and so does gc's marking: seconds for a long
//! history. The server keeps both per repository ([`StorageCache`]) while the repository does
//! not change, so paging through the table, or coming back, costs no second read.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use askama::Template;
use mdl::gc::GcOutcome;
use mdl::storage::{human_size, Role, StorageReport};
use mdl::{Repository, Timestamp};

use super::{commit_href, minute, short, Pager, HISTORY_PAGE};
use crate::web::chart;

/// A role's share of the storage.
pub(crate) struct RoleRow {
    pub role: &'static str,
    pub size: String,
    pub percent: String,
}

/// A commit's line in the storage table.
pub(crate) struct AddedRow {
    pub short: String,
    pub href: String,
    pub time: String,
    pub added: Vec<String>,
    pub total: String,
}

/// Where the storage went.
#[derive(Template)]
#[template(path = "storage.html")]
pub(crate) struct StoragePage {
    pub repo: String,
    pub stored: String,
    pub chart: Option<String>,
    pub roles: Vec<RoleRow>,
    pub depths: Vec<(u32, u64, String)>,
    pub unreachable: String,
    pub unreachable_objects: u64,
    pub gc_frees: String,
    pub gc_at: String,
    pub gc_objects: u64,
    pub rows: Vec<AddedRow>,
    pub pager: Pager,
}

/// How long what gc would free is shown again without being worked out anew: unlike the
/// report, it changes with time alone (commits and reflog entries age past gc's limits).
const GC_FRESH: Duration = Duration::from_secs(60);

/// A served repository's last storage report and gc dry run, and the generation of its
/// database they were read at ([`Repository::generation`]).
#[derive(Default)]
pub(crate) struct StorageCache(Mutex<Option<Cached>>);

struct Cached {
    generation: u64,
    report: Arc<StorageReport>,
    /// The dry run, when it ran, and when by the clock that ages it.
    gc: Option<(GcOutcome, Timestamp, Instant)>,
}

impl StorageCache {
    /// What is still true of the repository at `generation`.
    fn get(&self, generation: u64) -> (Option<Arc<StorageReport>>, Option<(GcOutcome, Timestamp)>) {
        let held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match held.as_ref() {
            Some(c) if c.generation == generation => (
                Some(c.report.clone()),
                c.gc.as_ref()
                    .filter(|(_, _, at)| at.elapsed() < GC_FRESH)
                    .map(|(gc, when, _)| (gc.clone(), *when)),
            ),
            _ => (None, None),
        }
    }

    fn put(&self, c: Cached) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(c);
    }
}

/// The report and gc's dry run for `repo`, from `cache` where it still holds them.
fn read(
    repo: &Repository,
    cache: &StorageCache,
) -> mdl::Result<(Arc<StorageReport>, GcOutcome, Timestamp)> {
    // Read before the repository is: a write after this moves it, and the next page reads anew.
    let generation = repo.generation();
    let (report, gc) = generation.map_or((None, None), |g| cache.get(g));
    let dry_run = || {
        // Leftover files of interrupted writes are not counted (listing every record file is
        // most of a dry run).
        let opts = mdl::gc::GcOptions {
            dry_run: true,
            count_leftovers: false,
            ..Default::default()
        };
        let when = (Timestamp::now(), Instant::now());
        mdl::gc::gc(repo, &opts, &mdl::NoProgress).map(|gc| (gc, when))
    };
    let (report, gc) = match (report, gc) {
        (Some(r), Some((gc, when))) => return Ok((r, gc, when)),
        (Some(r), None) => (r, dry_run()?),
        // Each reads every manifest: side by side.
        (None, _) => {
            let (r, gc) = rayon::join(|| mdl::storage::report(repo), dry_run);
            (Arc::new(r?), gc?)
        }
    };
    let (gc, (when, at)) = gc;
    if let Some(generation) = generation {
        cache.put(Cached {
            generation,
            report: report.clone(),
            gc: Some((gc.clone(), when, at)),
        });
    }
    Ok((report, gc, when))
}

/// Builds the storage page (`page` of its per-commit table, newest first).
pub(crate) fn storage_page(
    repo: &Repository,
    cache: &StorageCache,
    name: &str,
    page: usize,
) -> mdl::Result<StoragePage> {
    let (r, gc, gc_when) = read(repo, cache)?;
    let x: Vec<f64> = (1..=r.commits.len()).map(|i| i as f64).collect();
    let layers: Vec<(&str, Vec<f64>)> = Role::ALL
        .iter()
        .enumerate()
        .map(|(k, role)| {
            (
                role.name(),
                r.commits.iter().map(|c| c.total[k] as f64).collect(),
            )
        })
        .collect();
    let chart = chart::stacked(
        "stored size by role",
        "commits, oldest to newest",
        &x,
        &layers,
        |v| human_size(v.max(0.0) as u64),
    );
    let reachable: u64 = r.by_role.iter().sum();
    let roles = Role::ALL
        .iter()
        .zip(r.by_role)
        .map(|(role, bytes)| RoleRow {
            role: role.name(),
            size: human_size(bytes),
            percent: if reachable == 0 {
                "0%".into()
            } else {
                format!("{:.1}%", bytes as f64 * 100.0 / reachable as f64)
            },
        })
        .collect();
    let pager = Pager::new(page, r.commits.len(), HISTORY_PAGE, |n| {
        format!("/ui/{name}/storage?page={n}")
    });
    let newest_first: Vec<&mdl::storage::CommitStorage> = r.commits.iter().rev().collect();
    let rows = newest_first[pager.range(r.commits.len(), HISTORY_PAGE)]
        .iter()
        .map(|c| AddedRow {
            short: short(&c.id),
            href: commit_href(name, &c.id.to_string()),
            time: minute(&c.time.rfc3339()),
            added: c.added.iter().map(|b| human_size(*b)).collect(),
            total: human_size(c.total.iter().sum()),
        })
        .collect();
    Ok(StoragePage {
        repo: name.to_string(),
        stored: human_size(r.stored_bytes),
        chart,
        roles,
        depths: r
            .depths
            .iter()
            .map(|(d, n, b)| (*d, *n, human_size(*b)))
            .collect(),
        unreachable: human_size(r.unreachable_bytes),
        unreachable_objects: r.unreachable_objects,
        gc_frees: human_size(gc.bytes_freed),
        gc_at: gc_when.rfc3339().replace('T', " ").replace('Z', " UTC"),
        gc_objects: gc.commits + gc.manifests + gc.tensors,
        rows,
        pager,
    })
}
