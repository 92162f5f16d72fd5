//! Names for what a refusal is about: which operation, on which kind of backend.

use std::fmt;

/// Where a repository is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// A folder on this machine.
    Local,
    /// A repository behind `mdl serve`, over HTTP.
    Served,
    /// A repository in object storage, through this machine's replica.
    Bucket,
}

impl Backend {
    /// All three, in this order.
    pub const ALL: [Backend; 3] = [Backend::Local, Backend::Served, Backend::Bucket];
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Local => "a local repository",
            Backend::Served => "a served repository",
            Backend::Bucket => "a repository in object storage",
        })
    }
}

/// One operation of [`crate::Operations`], or an option of one that a backend may refuse on
/// its own. Each variant is documented by what it displays: the command line it stands for.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    Clone,
    Commit,
    CommitEngine,
    Checkout,
    CheckoutEngine,
    CheckoutSkipExpired,
    Maintenance,
    Log,
    LogAll,
    Show,
    Diff,
    Branches,
    RemoteBranches,
    CreateBranch,
    ForceBranch,
    DeleteBranch,
    Tags,
    CreateTag,
    DeleteTag,
    Switch,
    Reset,
    Merge,
    Reflog,
    Config,
    SetConfig,
    Gc,
    GcExpireReflog,
    Compact,
    Fsck,
    FsckRepair,
    Stats,
    Remotes,
    AddRemote,
    RemoveRemote,
    SetRemoteUrl,
    SetRemoteToken,
    Fetch,
    Pull,
    Push,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Operation as O;
        f.write_str(match self {
            O::Clone => "clone",
            O::Commit => "commit",
            O::CommitEngine => "commit --engine",
            O::Checkout => "checkout",
            O::CheckoutEngine => "checkout --engine",
            O::CheckoutSkipExpired => "checkout --skip-expired",
            O::Maintenance => "maintenance",
            O::Log => "log",
            O::LogAll => "log --all",
            O::Show => "show",
            O::Diff => "diff",
            O::Branches => "branch",
            O::RemoteBranches => "branch -r/-a",
            O::CreateBranch => "branch NAME",
            O::ForceBranch => "branch --force",
            O::DeleteBranch => "branch -d/-D",
            O::Tags => "tag",
            O::CreateTag => "tag NAME",
            O::DeleteTag => "tag -d",
            O::Switch => "switch",
            O::Reset => "reset",
            O::Merge => "merge",
            O::Reflog => "reflog",
            O::Config => "config",
            O::SetConfig => "config KEY VALUE",
            O::Gc => "gc",
            O::GcExpireReflog => "gc --expire-reflog",
            O::Compact => "compact",
            O::Fsck => "fsck",
            O::FsckRepair => "fsck --repair",
            O::Stats => "stats",
            O::Remotes => "remote",
            O::AddRemote => "remote add",
            O::RemoveRemote => "remote remove",
            O::SetRemoteUrl => "remote set-url",
            O::SetRemoteToken => "remote set-token",
            O::Fetch => "fetch",
            O::Pull => "pull",
            O::Push => "push",
        })
    }
}
