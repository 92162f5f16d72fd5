//! `mdl status`: what HEAD is, its newest commit, and whether `mdl serve` owns the repository
//! (then asked of that server, which holds the repository's lock).

use std::io::Write;
use std::process::ExitCode;

use mdl::LockMode;

use crate::Cli;

/// `mdl status`: from the repository, or, when `mdl serve` owns it (and holds its lock), from
/// that server, saying so.
pub(crate) fn run(cli: &Cli, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    let mdl_ops::Location::Folder(dir) = cli.location()? else {
        anyhow::bail!("status runs on a repository folder, not a URL");
    };
    let dir = dir.as_path();
    let root = mdl::discover(dir)
        .ok_or_else(|| mdl::Error::Store(mdl::StoreError::NotARepository(dir.to_path_buf())))?;
    let status = match mdl::advertised(&root) {
        Some(ad) => {
            let remote = mdl_remote::Remote::new(&ad.url, Some(ad.token))?;
            let refs = remote.refs()?;
            let branch = refs.head.unwrap_or_else(|| "main".into());
            let full = mdl::Ref::branch(&mdl::RefName::new(&branch)?).full();
            let tip = refs.refs.iter().find(|r| r.name == full).map(|r| r.target);
            let count = |prefix: &str| {
                refs.refs
                    .iter()
                    .filter(|r| r.name.starts_with(prefix))
                    .count()
            };
            crate::output::Status {
                root,
                branch,
                commit: match tip {
                    Some(id) => remote.log(Some(&id.to_hex()), Some(1))?.pop(),
                    None => None,
                },
                branches: count(mdl::Ref::BRANCHES),
                tags: count(mdl::Ref::TAGS),
                served_by: Some(crate::output::ServedBy {
                    url: ad.url,
                    pid: ad.pid,
                }),
            }
        }
        None => {
            let repo = mdl_ops::Local::new(dir, cli.access()).open(LockMode::Read)?;
            let branch = repo.head_branch()?;
            let tip = mdl::refs::get(&repo, &branch)?.and_then(|v| v.target());
            crate::output::Status {
                root: repo.root().to_path_buf(),
                branch: branch.trim_start_matches(mdl::Ref::BRANCHES).to_string(),
                commit: match tip {
                    Some(id) => mdl::log::log(&repo, Some(&id.to_hex()), Some(1))?.pop(),
                    None => None,
                },
                branches: mdl::refs::branches(&repo)?.len(),
                tags: mdl::refs::tags(&repo)?.len(),
                served_by: None,
            }
        }
    };
    crate::output::status(out, cli.json, &status)?;
    Ok(ExitCode::SUCCESS)
}
