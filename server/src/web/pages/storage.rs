//! The storage page: where the repository's storage went.

use askama::Template;
use mdl::storage::{human_size, Role};
use mdl::Repository;

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
    pub gc_objects: u64,
    pub rows: Vec<AddedRow>,
    pub pager: Pager,
}

/// Builds the storage page (`page` of its per-commit table, newest first).
pub(crate) fn storage_page(repo: &Repository, name: &str, page: usize) -> mdl::Result<StoragePage> {
    // The report and gc's marking each read every manifest: side by side. Leftover files of
    // interrupted writes are not counted (listing every record file is most of a dry run).
    let (r, gc) = rayon::join(
        || mdl::storage::report(repo),
        || {
            let opts = mdl::gc::GcOptions {
                dry_run: true,
                count_leftovers: false,
                ..Default::default()
            };
            mdl::gc::gc(repo, &opts, &mdl::NoProgress)
        },
    );
    let (r, gc) = (r?, gc?);
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
        gc_objects: gc.commits + gc.manifests + gc.tensors,
        rows,
        pager,
    })
}
