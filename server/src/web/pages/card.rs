//! What a commit page shows of the files themselves, as a model hub's page does: a download
//! link for each, the model's `config.json` pretty-printed, its model card (`README.md`)
//! rendered from Markdown, and how to load this revision from elsewhere.

use mdl::checkout::Listing;
use mdl::Repository;
use pulldown_cmark::{CowStr, Event, Options, Parser, Tag, TagEnd};

use super::query_value;

/// Files read to be shown (a config, a model card, a trainer state) are at most this large.
pub(crate) const SHOWN_MAX: u64 = 4 << 20;

/// The text of the file at `path` of `listed`, when it has it, it is small and it is UTF-8
/// (only that file laid out).
pub(crate) fn small_text(repo: &Repository, listed: &Listing, path: &str) -> Option<String> {
    listed
        .files
        .iter()
        .find(|f| f.path == path)
        .filter(|f| f.len <= SHOWN_MAX)?;
    let layout = mdl::checkout::layout_paths(repo, &listed.commit.to_hex(), &[path]).ok()?;
    String::from_utf8(layout.file(path)?.load(repo).ok()?).ok()
}

/// `config.json` pretty-printed (as it is, when it is not JSON).
pub(crate) fn config(repo: &Repository, listed: &Listing) -> Option<String> {
    let text = small_text(repo, listed, "config.json")?;
    Some(
        serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or(text),
    )
}

/// The model card (`README.md`) as HTML.
pub(crate) fn model_card(repo: &Repository, listed: &Listing) -> Option<String> {
    Some(markdown(&small_text(repo, listed, "README.md")?))
}

/// Markdown as HTML, safe to put in a page: raw HTML in the text is shown as text, links go
/// only to web, mail or relative addresses, and the card's YAML metadata is shown as a block
/// of code (images load only from this server: the page's policy fetches nothing from
/// elsewhere).
pub(crate) fn markdown(text: &str) -> String {
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_YAML_STYLE_METADATA_BLOCKS;
    let events = Parser::new_ext(text, options).map(|event| match event {
        Event::Html(s) | Event::InlineHtml(s) => Event::Text(s),
        Event::Start(Tag::MetadataBlock(_)) => Event::Start(Tag::CodeBlock(
            pulldown_cmark::CodeBlockKind::Fenced("yaml".into()),
        )),
        Event::End(TagEnd::MetadataBlock(_)) => Event::End(TagEnd::CodeBlock),
        Event::Start(Tag::Link {
            link_type,
            dest_url,
            title,
            id,
        }) => Event::Start(Tag::Link {
            link_type,
            dest_url: safe_url(dest_url),
            title,
            id,
        }),
        Event::Start(Tag::Image {
            link_type,
            dest_url,
            title,
            id,
        }) => Event::Start(Tag::Image {
            link_type,
            dest_url: safe_url(dest_url),
            title,
            id,
        }),
        other => other,
    });
    let mut html = String::new();
    pulldown_cmark::html::push_html(&mut html, events);
    html
}

/// `url` when it is a web, mail or relative address; `#` otherwise (`javascript:`, `data:`).
fn safe_url(url: CowStr<'_>) -> CowStr<'_> {
    let scheme = url
        .split_once(':')
        .map(|(s, _)| s)
        .filter(|s| !s.contains(['/', '?', '#']));
    match scheme.map(str::to_ascii_lowercase).as_deref() {
        None | Some("http" | "https" | "mailto") => url,
        Some(_) => "#".into(),
    }
}

/// How to load revision `id` of repository `repo` from the server at `origin`
/// (`http://HOST:PORT`): with `transformers`, with `huggingface_hub`, with mdl. Each a title
/// and the code.
pub(crate) fn snippets(
    origin: &str,
    repo: &str,
    id: &str,
    listed: &Listing,
) -> Vec<(String, String)> {
    let weights = listed
        .files
        .iter()
        .map(|f| f.path.as_str())
        .find(|p| p.ends_with(".safetensors"))
        .or_else(|| listed.files.first().map(|f| f.path.as_str()))
        .unwrap_or("model.safetensors");
    let mut out = Vec::new();
    if listed.files.iter().any(|f| f.path == "config.json") {
        out.push((
            "transformers".to_string(),
            format!(
                "import os\nos.environ[\"HF_ENDPOINT\"] = \"{origin}/hf\"  # before importing transformers\n\
                 from transformers import AutoModel\n\
                 model = AutoModel.from_pretrained(\"{repo}\", revision=\"{id}\")"
            ),
        ));
    }
    out.push((
        "huggingface_hub".to_string(),
        format!(
            "from huggingface_hub import hf_hub_download\n\
             path = hf_hub_download(\"{repo}\", \"{weights}\", revision=\"{id}\",\n\
             \x20                      endpoint=\"{origin}/hf\")  # token=… where the server asks for one"
        ),
    ));
    out.push((
        "mdl".to_string(),
        format!(
            "mdl -C {origin}/{repo} checkout {id} -o {repo}-{}  # --token … where the server asks for one",
            &id[..12.min(id.len())]
        ),
    ));
    out
}

/// The web view's link that downloads `path` of commit `id`.
pub(crate) fn download_href(repo: &str, id: &str, path: &str) -> String {
    let path: Vec<String> = path.split('/').map(query_value).collect();
    format!("/ui/{repo}/file/{id}/{}", path.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_is_rendered_and_its_html_shown_as_text() {
        let html = markdown(
            "---\nlicense: mit\n---\n# Title\n\nSome *text* <script>alert(1)</script>\n\n\
             [ok](https://example.org) [bad](javascript:alert(1)) ![img](data:image/png;base64,AA)\n",
        );
        assert!(html.contains("<h1>Title</h1>"), "{html}");
        assert!(html.contains("<em>text</em>"), "{html}");
        assert!(
            !html.contains("<script>") && html.contains("&lt;script&gt;"),
            "{html}"
        );
        assert!(html.contains(r#"href="https://example.org""#), "{html}");
        assert!(
            !html.contains("javascript:") && !html.contains("data:image"),
            "{html}"
        );
        assert!(html.contains("license: mit"), "{html}");
    }
}
