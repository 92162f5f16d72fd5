//! The web view's pages: what each shows, gathered from the repository into the values its
//! template (`server/templates/`) renders. Long lists are paged.

use std::collections::{BTreeMap, HashMap};

use askama::Template;
use mdl::diff::{Change, FileChange};
use mdl::log::LogEntry;
use mdl::storage::{human_size, Role};
use mdl::{ObjectId, Repository};

use super::chart::{self, Point, Series};

/// Commits on a page of history.
pub(crate) const HISTORY_PAGE: usize = 50;
/// Tensors on a page of a commit or a comparison.
pub(crate) const TENSOR_PAGE: usize = 100;
/// Metrics charted at most (the first recorded).
const MAX_CHARTS: usize = 12;

/// Links to the pages before and after this one.
pub(crate) struct Pager {
    pub page: usize,
    pub pages: usize,
    pub prev: Option<String>,
    pub next: Option<String>,
}

impl Pager {
    /// Page `page` (1-based, clamped) of `items` items, `per` a page; `link(n)` is page n's URL.
    fn new(page: usize, items: usize, per: usize, link: impl Fn(usize) -> String) -> Pager {
        let pages = items.div_ceil(per).max(1);
        let page = page.clamp(1, pages);
        Pager {
            page,
            pages,
            prev: (page > 1).then(|| link(page - 1)),
            next: (page < pages).then(|| link(page + 1)),
        }
    }

    fn range(&self, items: usize, per: usize) -> std::ops::Range<usize> {
        let start = ((self.page - 1) * per).min(items);
        start..(start + per).min(items)
    }
}

fn short(id: &ObjectId) -> String {
    id.short(12)
}

/// `2026-11-24T07:40:12Z` as `2026-11-24 07:40`.
fn minute(rfc3339: &str) -> String {
    rfc3339.replacen('T', " ", 1).chars().take(16).collect()
}

fn commit_href(repo: &str, id: &str) -> String {
    format!("/ui/{repo}/commit/{id}")
}

/// Encodes a query value (revision names may hold `^`, `~`, `/`).
fn query_value(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn compare_href(repo: &str, a: &str, b: &str) -> String {
    format!(
        "/ui/{repo}/compare?a={}&b={}",
        query_value(a),
        query_value(b)
    )
}

/// The list of repositories.
#[derive(Template)]
#[template(path = "index.html")]
pub(crate) struct IndexPage {
    pub repos: Vec<String>,
}

/// Where a browser signs in with a token.
#[derive(Template)]
#[template(path = "login.html")]
pub(crate) struct LoginPage {
    pub next: String,
    pub problem: Option<String>,
}

/// A request that could not be answered.
#[derive(Template)]
#[template(path = "error.html")]
pub(crate) struct ErrorPage {
    pub status: u16,
    pub message: String,
}

/// A branch or tag in the sidebar.
pub(crate) struct RefRow {
    pub name: String,
    pub short: String,
    pub href: String,
    pub current: bool,
}

/// A commit's row in the history.
pub(crate) struct LogRow {
    pub graph: String,
    pub connectors: Vec<String>,
    pub short: String,
    pub href: String,
    pub time: String,
    pub step: String,
    pub message: String,
    pub refs: Vec<String>,
    pub metrics: String,
    pub stored: String,
    pub raw: String,
    pub lossy: u32,
    pub parent_diff: Option<String>,
}

/// A repository: its refs, its history across branches, its metrics charted.
#[derive(Template)]
#[template(path = "repo.html")]
pub(crate) struct RepoPage {
    pub repo: String,
    pub branches: Vec<RefRow>,
    pub tags: Vec<RefRow>,
    pub remotes: Vec<RefRow>,
    pub commits: usize,
    pub rows: Vec<LogRow>,
    pub pager: Pager,
    pub charts: Vec<String>,
}

fn ref_rows(repo: &str, refs: Vec<mdl::refs::RefInfo>) -> Vec<RefRow> {
    refs.into_iter()
        .map(|r| RefRow {
            short: short(&r.target),
            href: commit_href(repo, &r.target.to_string()),
            name: r.name,
            current: r.current,
        })
        .collect()
}

/// Builds page `page` of repository `name`'s history.
pub(crate) fn repo_page(repo: &Repository, name: &str, page: usize) -> mdl::Result<RepoPage> {
    let branches = mdl::refs::branches(repo)?;
    let entries = mdl::log::log_all(repo, None)?;
    let charts = metric_charts(name, &entries, &branches);
    let pager = Pager::new(page, entries.len(), HISTORY_PAGE, |n| {
        format!("/ui/{name}?page={n}")
    });
    let range = pager.range(entries.len(), HISTORY_PAGE);
    let graph = mdl::log::graph(&entries);
    let rows = entries[range.clone()]
        .iter()
        .zip(&graph[range])
        .map(|(e, (lanes, connectors))| LogRow {
            graph: lanes.clone(),
            connectors: connectors.clone(),
            short: short(&e.id),
            href: commit_href(name, &e.id.to_string()),
            time: minute(&e.time),
            step: e.step.map(|s| s.to_string()).unwrap_or_default(),
            message: e.message.lines().next().unwrap_or("").to_string(),
            refs: e.refs.clone(),
            metrics: e
                .metrics
                .0
                .iter()
                .map(|(k, v)| format!("{k}={}", chart::short_number(*v)))
                .collect::<Vec<_>>()
                .join(" "),
            stored: human_size(e.stored_bytes),
            raw: human_size(e.raw_bytes),
            lossy: e.lossy_tensors,
            parent_diff: e
                .parents
                .first()
                .map(|p| compare_href(name, &p.to_string(), &e.id.to_string())),
        })
        .collect();
    Ok(RepoPage {
        repo: name.to_string(),
        branches: ref_rows(name, branches),
        tags: ref_rows(name, mdl::refs::tags(repo)?),
        remotes: ref_rows(name, mdl::refs::remote_branches(repo)?),
        commits: entries.len(),
        rows,
        pager,
        charts,
    })
}

/// One chart per recorded metric (in order of first appearance): value against step, a line
/// a branch along its first parents, lossy commits ringed.
fn metric_charts(repo: &str, entries: &[LogEntry], branches: &[mdl::refs::RefInfo]) -> Vec<String> {
    let by_id: HashMap<ObjectId, &LogEntry> = entries.iter().map(|e| (e.id, e)).collect();
    let mut names: Vec<&str> = Vec::new();
    for e in entries.iter().rev() {
        for (k, _) in &e.metrics.0 {
            if !names.contains(&k.as_str()) {
                names.push(k);
            }
        }
    }
    let chains: Vec<(&str, Vec<&LogEntry>)> = branches
        .iter()
        .map(|b| {
            let mut chain = Vec::new();
            let mut at = by_id.get(&b.target).copied();
            while let Some(e) = at {
                chain.push(e);
                at = e.parents.first().and_then(|p| by_id.get(p).copied());
            }
            (b.name.as_str(), chain)
        })
        .collect();
    names
        .into_iter()
        .take(MAX_CHARTS)
        .filter_map(|metric| {
            let series: Vec<Series> = chains
                .iter()
                .map(|(branch, chain)| Series {
                    name: branch.to_string(),
                    points: chain
                        .iter()
                        .filter_map(|e| {
                            let step = e.step?;
                            let (_, v) = e.metrics.0.iter().find(|(k, _)| k == metric)?;
                            Some(Point {
                                x: step as f64,
                                y: *v,
                                marked: e.lossy_tensors > 0,
                                href: commit_href(repo, &e.id.to_string()),
                                label: format!(
                                    "{branch} step {step}: {metric}={v}{}",
                                    if e.lossy_tensors > 0 { " (lossy)" } else { "" }
                                ),
                            })
                        })
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect();
            chart::lines(metric, "step", &series).map(|svg| {
                let legend: Vec<String> = series
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        format!(
                            r#"<span class="key" style="color:{}">&#9632;</span> {}"#,
                            chart::PALETTE[i % chart::PALETTE.len()],
                            chart::esc(&s.name)
                        )
                    })
                    .collect();
                format!(
                    r#"<figure class="metric" data-metric="{}"><figcaption>{}</figcaption>{svg}<p class="legend">{} <span class="key lossy-key">&#9675;</span> lossy commit</p></figure>"#,
                    chart::esc(metric),
                    chart::esc(metric),
                    legend.join(" ")
                )
            })
        })
        .collect()
}

/// A file of a commit.
pub(crate) struct FileRow {
    pub path: String,
    pub format: String,
    pub size: String,
    pub tensors: u32,
    pub note: String,
}

/// A tensor of a commit.
pub(crate) struct TensorRow {
    pub file: String,
    pub name: String,
    pub dtype: String,
    pub shape: String,
    pub codec: String,
    pub stored: String,
    pub raw: String,
    pub depth: u32,
    pub exactness: String,
    pub lossy: bool,
}

/// A commit: what it records and what it holds.
#[derive(Template)]
#[template(path = "commit.html")]
pub(crate) struct CommitPage {
    pub repo: String,
    pub id: String,
    pub message: String,
    pub author: String,
    pub time: String,
    pub step: String,
    pub metrics: Vec<(String, String)>,
    pub parents: Vec<(String, String, String)>,
    pub raw: String,
    pub stored: String,
    pub files: Vec<FileRow>,
    pub tensor_count: usize,
    pub lossy_count: usize,
    pub tensors: Vec<TensorRow>,
    pub pager: Pager,
}

/// Builds page `page` of commit `rev`'s tensors.
pub(crate) fn commit_page(
    repo: &Repository,
    name: &str,
    rev: &str,
    page: usize,
) -> mdl::Result<CommitPage> {
    let s = mdl::show::show(repo, rev)?;
    let id = s.id.to_string();
    let pager = Pager::new(page, s.tensors.len(), TENSOR_PAGE, |n| {
        format!("{}?page={n}", commit_href(name, &id))
    });
    let tensors = s.tensors[pager.range(s.tensors.len(), TENSOR_PAGE)]
        .iter()
        .map(|t| TensorRow {
            file: t.file.clone(),
            name: t.name.clone(),
            dtype: t.dtype.clone(),
            shape: format!(
                "[{}]",
                t.shape
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            codec: t.codec.clone(),
            stored: human_size(t.stored_bytes),
            raw: human_size(t.raw_bytes),
            depth: t.depth,
            exactness: match (&t.expired, &t.lossy_info) {
                (Some(why), _) => format!("expired ({why})"),
                (None, Some(l)) => format!(
                    "lossy: relative error {:.2e}, max |error| {:.2e}",
                    l.rel_error, l.max_abs_error
                ),
                (None, None) if t.lossy => "lossy".to_string(),
                (None, None) => "exact".to_string(),
            },
            lossy: t.lossy,
        })
        .collect();
    Ok(CommitPage {
        repo: name.to_string(),
        message: s.message.clone(),
        author: s.author.clone(),
        time: minute(&s.time),
        step: s.step.map(|n| n.to_string()).unwrap_or_default(),
        metrics: s
            .metrics
            .0
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect(),
        parents: s
            .parents
            .iter()
            .map(|p| {
                (
                    short(p),
                    commit_href(name, &p.to_string()),
                    compare_href(name, &p.to_string(), &id),
                )
            })
            .collect(),
        raw: human_size(s.raw_bytes),
        stored: human_size(s.stored_bytes),
        files: s
            .files
            .iter()
            .map(|f| FileRow {
                path: f.path.clone(),
                format: f.format.clone(),
                size: human_size(f.raw_bytes),
                tensors: f.tensors,
                note: f.note.clone(),
            })
            .collect(),
        tensor_count: s.tensors.len(),
        lossy_count: s.tensors.iter().filter(|t| t.lossy).count(),
        tensors,
        pager,
        id,
    })
}

/// The layer a tensor belongs to: its name up to the first numbered part (`model.layers.3`),
/// else without its last part (`transformer.wte`), else itself.
pub(crate) fn layer_of(name: &str) -> &str {
    let mut end = 0;
    for part in name.split('.') {
        end += part.len();
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            return &name[..end];
        }
        end += 1;
    }
    name.rsplit_once('.').map_or(name, |(head, _)| head)
}

/// A tensor that changed, ranked.
pub(crate) struct ChangeRow {
    pub layer: String,
    pub file: String,
    pub name: String,
    pub change: String,
    pub bar: u32,
}

/// A layer's changes together.
pub(crate) struct LayerRow {
    pub layer: String,
    pub changed: usize,
    pub tensors: usize,
    pub max: String,
    pub bar: u32,
}

/// Two revisions compared.
#[derive(Template)]
#[template(path = "compare.html")]
pub(crate) struct ComparePage {
    pub repo: String,
    pub a: String,
    pub b: String,
    pub a_href: String,
    pub b_href: String,
    pub summary: String,
    pub layers: Vec<LayerRow>,
    pub ranked: Vec<ChangeRow>,
    pub changed: usize,
    pub pager: Pager,
    pub added: Vec<(String, String)>,
    pub removed: Vec<(String, String)>,
    pub files: Vec<(String, &'static str, String)>,
}

/// Builds page `page` of the comparison of `a` with `b`.
pub(crate) fn compare_page(
    repo: &Repository,
    name: &str,
    a: &str,
    b: &str,
    page: usize,
) -> mdl::Result<ComparePage> {
    let d = mdl::diff::diff(repo, a, b)?;
    let a_id = mdl::revision::resolve(repo, a)?;
    let b_id = mdl::revision::resolve(repo, b)?;
    // Largest relative change first; changes without a measure (reshaped, not floats) after.
    let mut changed: Vec<(&mdl::diff::TensorDiff, Option<f64>)> = d
        .tensors
        .iter()
        .filter_map(|t| match &t.change {
            Change::Changed { rel_l2, .. } => Some((t, *rel_l2)),
            _ => None,
        })
        .collect();
    changed.sort_by(|x, y| {
        let key = |v: Option<f64>| v.filter(|v| v.is_finite()).unwrap_or(f64::NEG_INFINITY);
        key(y.1).total_cmp(&key(x.1))
    });
    let top = changed
        .iter()
        .filter_map(|(_, r)| *r)
        .filter(|r| r.is_finite())
        .fold(0.0f64, f64::max);
    let bar = |r: Option<f64>| match r {
        Some(r) if top > 0.0 && r.is_finite() => {
            ((r / top) * 100.0).round().clamp(1.0, 100.0) as u32
        }
        _ => 0,
    };
    let text = |r: Option<f64>| match r {
        Some(r) => format!("{r:.3e}"),
        None => "changed (no measure)".to_string(),
    };

    let mut layers: BTreeMap<&str, (usize, usize, Option<f64>)> = BTreeMap::new();
    for t in &d.tensors {
        let l = layers.entry(layer_of(&t.name)).or_default();
        l.1 += 1;
        if let Change::Changed { rel_l2, .. } = &t.change {
            l.0 += 1;
            if let Some(r) = rel_l2.filter(|r| r.is_finite()) {
                l.2 = Some(l.2.map_or(r, |m: f64| m.max(r)));
            }
        }
    }
    let mut layers: Vec<LayerRow> = layers
        .into_iter()
        .filter(|(_, (c, _, _))| *c > 0)
        .map(|(layer, (changed, tensors, max))| LayerRow {
            layer: layer.to_string(),
            changed,
            tensors,
            max: max.map_or_else(|| "—".to_string(), |m| format!("{m:.3e}")),
            bar: bar(max),
        })
        .collect();
    layers.sort_by(|x, y| y.bar.cmp(&x.bar).then(x.layer.cmp(&y.layer)));

    let link = |n| format!("{}&page={n}", compare_href(name, a, b));
    let pager = Pager::new(page, changed.len(), TENSOR_PAGE, link);
    let ranked = changed[pager.range(changed.len(), TENSOR_PAGE)]
        .iter()
        .map(|(t, r)| ChangeRow {
            layer: layer_of(&t.name).to_string(),
            file: t.file.clone(),
            name: t.name.clone(),
            change: text(*r),
            bar: bar(*r),
        })
        .collect();
    let pick = |want: &Change| -> Vec<(String, String)> {
        d.tensors
            .iter()
            .filter(|t| &t.change == want)
            .map(|t| (t.file.clone(), t.name.clone()))
            .collect()
    };
    let unchanged = d
        .tensors
        .iter()
        .filter(|t| t.change == Change::Unchanged)
        .count();
    let files = d
        .files
        .iter()
        .filter(|f| f.change != FileChange::Unchanged)
        .map(|f| {
            let what = match f.change {
                FileChange::Added => "added",
                FileChange::Removed => "removed",
                _ => "changed",
            };
            let size = match (f.bytes_a, f.bytes_b) {
                (Some(x), Some(y)) if x != y => format!("{} → {}", human_size(x), human_size(y)),
                (_, Some(y)) => human_size(y),
                (Some(x), None) => human_size(x),
                (None, None) => String::new(),
            };
            (f.path.clone(), what, size)
        })
        .collect();
    let added = pick(&Change::Added);
    let removed = pick(&Change::Removed);
    Ok(ComparePage {
        repo: name.to_string(),
        a_href: commit_href(name, &a_id.to_string()),
        b_href: commit_href(name, &b_id.to_string()),
        a: a.to_string(),
        b: b.to_string(),
        summary: format!(
            "{} changed, {} added, {} removed, {} unchanged",
            changed.len(),
            added.len(),
            removed.len(),
            unchanged
        ),
        changed: changed.len(),
        layers,
        ranked,
        pager,
        added,
        removed,
        files,
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_are_named_by_their_number_or_their_module() {
        assert_eq!(
            layer_of("model.layers.3.self_attn.q_proj.weight"),
            "model.layers.3"
        );
        assert_eq!(layer_of("transformer.wte.weight"), "transformer.wte");
        assert_eq!(layer_of("state.12.exp_avg"), "state.12");
        assert_eq!(layer_of("bias"), "bias");
    }

    #[test]
    fn pages_are_clamped_and_linked() {
        let p = Pager::new(9, 120, 50, |n| format!("?page={n}"));
        assert_eq!((p.page, p.pages), (3, 3));
        assert_eq!(p.prev.as_deref(), Some("?page=2"));
        assert!(p.next.is_none());
        assert_eq!(p.range(120, 50), 100..120);
        let empty = Pager::new(0, 0, 50, |n| n.to_string());
        assert_eq!((empty.page, empty.pages, empty.range(0, 50)), (1, 1, 0..0));
    }

    #[test]
    fn revisions_are_encoded_in_links() {
        assert_eq!(
            compare_href("r", "HEAD~1", "origin/main"),
            "/ui/r/compare?a=HEAD~1&b=origin%2Fmain"
        );
    }
}
