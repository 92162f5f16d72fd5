//! The web view's pages: what each shows, gathered from the repository into the values its
//! template (`server/templates/`) renders. Long lists are paged. One file a page; what they
//! share (paging, links, dates) is here.

mod card;
mod commit;
mod compare;
mod curve;
mod history;
mod storage;

use askama::Template;
use mdl::ObjectId;

pub(crate) use commit::commit_page;
pub(crate) use compare::compare_page;
pub(crate) use curve::Steps;
pub(crate) use history::repo_page;
pub(crate) use storage::{storage_page, StorageCache};

/// Commits on a page of history.
pub(crate) const HISTORY_PAGE: usize = 50;
/// Tensors on a page of a commit or a comparison.
pub(crate) const TENSOR_PAGE: usize = 100;

/// Links to the pages before and after this one.
pub(crate) struct Pager {
    pub page: usize,
    pub pages: usize,
    pub prev: Option<String>,
    pub next: Option<String>,
}

impl Pager {
    /// Page `page` (1-based, clamped) of `items` items, `per` a page; `link(n)` is page n's URL.
    pub(super) fn new(
        page: usize,
        items: usize,
        per: usize,
        link: impl Fn(usize) -> String,
    ) -> Pager {
        let pages = items.div_ceil(per).max(1);
        let page = page.clamp(1, pages);
        Pager {
            page,
            pages,
            prev: (page > 1).then(|| link(page - 1)),
            next: (page < pages).then(|| link(page + 1)),
        }
    }

    pub(super) fn range(&self, items: usize, per: usize) -> std::ops::Range<usize> {
        let start = ((self.page - 1) * per).min(items);
        start..(start + per).min(items)
    }
}

pub(super) fn short(id: &ObjectId) -> String {
    id.short(12)
}

/// `2026-11-24T07:40:12Z` as `2026-11-24 07:40`.
pub(super) fn minute(rfc3339: &str) -> String {
    rfc3339.replacen('T', " ", 1).chars().take(16).collect()
}

pub(super) fn commit_href(repo: &str, id: &str) -> String {
    format!("/ui/{repo}/commit/{id}")
}

/// Encodes a query value (revision names may hold `^`, `~`, `/`).
pub(super) fn query_value(s: &str) -> String {
    mdl_protocol::route::segment(s)
}

pub(super) fn compare_href(repo: &str, a: &str, b: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
