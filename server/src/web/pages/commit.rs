//! The commit page: what a commit records and holds.

use askama::Template;
use mdl::storage::human_size;
use mdl::Repository;

use super::{card, commit_href, compare_href, minute, short, Pager, TENSOR_PAGE};

/// A file of a commit.
pub(crate) struct FileRow {
    pub path: String,
    pub format: String,
    pub size: String,
    pub tensors: u32,
    pub note: String,
    /// Where the file downloads from.
    pub href: String,
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
    /// How it was made: a merge's strategy, the training code's git commit.
    pub properties: Vec<(String, String)>,
    pub parents: Vec<(String, String, String)>,
    pub raw: String,
    pub stored: String,
    pub files: Vec<FileRow>,
    pub tensor_count: usize,
    pub lossy_count: usize,
    pub tensors: Vec<TensorRow>,
    pub pager: Pager,
    /// `config.json`, pretty-printed.
    pub config: Option<String>,
    /// The model card (`README.md`) as HTML (see [`card::markdown`]).
    pub card: Option<String>,
    /// How to load this revision: a title and code each.
    pub snippets: Vec<(String, String)>,
}

/// Builds page `page` of commit `rev`'s tensors; `origin` (`http://HOST:PORT`) is where the
/// page was asked from, for the snippets.
pub(crate) fn commit_page(
    repo: &Repository,
    name: &str,
    rev: &str,
    page: usize,
    origin: &str,
) -> mdl::Result<CommitPage> {
    // The files first, their listing's share of the decode budget given back before the
    // listing takes its own: a request holding one while waiting for the other would deadlock
    // with others doing the same.
    // One commit for both, even if `rev` is a branch that moves meanwhile.
    let rev = &mdl::revision::resolve(repo, rev)?.to_hex();
    let (config, model_card, snippets) = {
        let listed = crate::budgeted::hold(repo, rev, crate::budgeted::LISTED, |c| {
            mdl::checkout::listing(repo, &c.to_hex())
        })?;
        let id = listed.commit.to_hex();
        (
            card::config(repo, &listed),
            card::model_card(repo, &listed),
            card::snippets(origin, name, &id, &listed),
        )
    };
    // Only the page's tensors are described (the manifest is read in place); a page past
    // the last is the last.
    let wanted = page.max(1);
    let shown = |page: usize| {
        let first = (page - 1).saturating_mul(TENSOR_PAGE);
        crate::budgeted::hold(repo, rev, crate::budgeted::PAGE, |c| {
            mdl::show::show_page(repo, &c.to_hex(), first..first.saturating_add(TENSOR_PAGE))
        })
    };
    let mut held = shown(wanted)?;
    let last = held.1.div_ceil(TENSOR_PAGE).max(1);
    if wanted > last {
        held = shown(last)?;
    }
    let (s, count) = &*held;
    let id = s.id.to_string();
    let pager = Pager::new(page, *count, TENSOR_PAGE, |n| {
        format!("{}?page={n}", commit_href(name, &id))
    });
    let tensors = s
        .tensors
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
        properties: s.properties.clone().into_iter().collect(),
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
                href: card::download_href(name, &id, &f.path),
            })
            .collect(),
        tensor_count: s.tensors.len(),
        lossy_count: s.tensors.iter().filter(|t| t.lossy).count(),
        tensors,
        pager,
        config,
        card: model_card,
        snippets,
        id,
    })
}
