//! The repository page: refs, the history of every branch with its graph, metrics charted.

use std::collections::HashMap;

use askama::Template;
use mdl::log::LogEntry;
use mdl::storage::human_size;
use mdl::{ObjectId, Repository};

use super::curve::{training_curves, Steps};
use super::{commit_href, compare_href, minute, short, Pager, HISTORY_PAGE};
use crate::web::chart::{self, Point, Series};

/// Metrics charted at most (the first recorded).
const MAX_CHARTS: usize = 12;

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
    /// The training curve the newest checkpoint of HEAD's branch carries (its
    /// `trainer_state.json`'s `log_history`), a chart a logged value, and where it came from.
    pub curves: Vec<String>,
    pub curve_source: String,
    /// The step range the charts are zoomed to (empty: from the first, to the last).
    pub from: String,
    pub to: String,
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

/// Builds page `page` of repository `name`'s history, its charts showing `steps`.
pub(crate) fn repo_page(
    repo: &Repository,
    name: &str,
    page: usize,
    steps: Steps,
) -> mdl::Result<RepoPage> {
    let branches = mdl::refs::branches(repo)?;
    let entries = mdl::log::log_all(repo, None)?;
    let charts = metric_charts(name, &entries, &branches, steps);
    let (curves, curve_source) = match branches.iter().find(|b| b.current) {
        Some(head) => training_curves(repo, name, head, steps)?,
        None => (Vec::new(), String::new()),
    };
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
        curves,
        curve_source,
        from: steps.from.map(|s| s.to_string()).unwrap_or_default(),
        to: steps.to.map(|s| s.to_string()).unwrap_or_default(),
    })
}

/// One chart per recorded metric (in order of first appearance): value against step, a line
/// a branch along its first parents, lossy commits ringed.
fn metric_charts(
    repo: &str,
    entries: &[LogEntry],
    branches: &[mdl::refs::RefInfo],
    steps: Steps,
) -> Vec<String> {
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
                            let step = e.step.filter(|s| steps.holds(*s as f64))?;
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
