//! `mdl init`, wherever the repository is to be: a folder (`mdl init DIR`, `mdl -C DIR init`),
//! object storage (`mdl init s3://BUCKET/PREFIX`, `mdl -C s3://… init`), or a server of a
//! folder of repositories (`mdl init http://HOST:PORT/NAME` with an admin token); any other
//! `scheme://` is refused, never taken for a folder name.

use std::io::Write;
use std::path::PathBuf;

use anyhow::bail;
use mdl_ops::Location;

use crate::{output, Cli};

/// Creates the repository that `cli`'s `-C` and `init`'s `path` name.
pub(crate) fn run(cli: &Cli, path: Option<&PathBuf>, out: &mut dyn Write) -> anyhow::Result<()> {
    let base = cli.location()?;
    let arg = match path {
        Some(p) => Some(Location::parse(p)?),
        None => None,
    };
    let location = match (base, arg) {
        (Location::Folder(base), Some(Location::Folder(dir))) => Location::Folder(base.join(dir)),
        (Location::Folder(_), Some(url)) => url,
        (base, None) => base,
        (url, Some(_)) => bail!(
            "mdl -C {} init takes no folder: the repository is that URL itself",
            url.shown()
        ),
    };
    output::init(out, cli.json, &mdl_ops::init(&location, &cli.access())?)?;
    Ok(())
}
