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
    CommitState,
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

impl Operation {
    /// Every operation, in declaration order: what the tests hold each list of operations to
    /// (the backend matrix, the `--json` shapes, docs/CLI_JSON.md).
    pub const ALL: [Operation; 40] = {
        use Operation as O;
        [
            O::Clone,
            O::Commit,
            O::CommitEngine,
            O::CommitState,
            O::Checkout,
            O::CheckoutEngine,
            O::CheckoutSkipExpired,
            O::Maintenance,
            O::Log,
            O::LogAll,
            O::Show,
            O::Diff,
            O::Branches,
            O::RemoteBranches,
            O::CreateBranch,
            O::ForceBranch,
            O::DeleteBranch,
            O::Tags,
            O::CreateTag,
            O::DeleteTag,
            O::Switch,
            O::Reset,
            O::Merge,
            O::Reflog,
            O::Config,
            O::SetConfig,
            O::Gc,
            O::GcExpireReflog,
            O::Compact,
            O::Fsck,
            O::FsckRepair,
            O::Stats,
            O::Remotes,
            O::AddRemote,
            O::RemoveRemote,
            O::SetRemoteUrl,
            O::SetRemoteToken,
            O::Fetch,
            O::Pull,
            O::Push,
        ]
    };
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Operation as O;
        f.write_str(match self {
            O::Clone => "clone",
            O::Commit => "commit",
            O::CommitEngine => "commit --engine",
            O::CommitState => "commit of a live state (Python)",
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL` holds every variant once: a variant added to the enum and not to `ALL` fails the
    /// match below (it must be named there), one added to the match and not to `ALL` fails the
    /// count.
    #[test]
    fn all_names_every_operation_once() {
        let index = |o: Operation| -> usize {
            use Operation as O;
            match o {
                O::Clone => 0,
                O::Commit => 1,
                O::CommitEngine => 2,
                O::CommitState => 3,
                O::Checkout => 4,
                O::CheckoutEngine => 5,
                O::CheckoutSkipExpired => 6,
                O::Maintenance => 7,
                O::Log => 8,
                O::LogAll => 9,
                O::Show => 10,
                O::Diff => 11,
                O::Branches => 12,
                O::RemoteBranches => 13,
                O::CreateBranch => 14,
                O::ForceBranch => 15,
                O::DeleteBranch => 16,
                O::Tags => 17,
                O::CreateTag => 18,
                O::DeleteTag => 19,
                O::Switch => 20,
                O::Reset => 21,
                O::Merge => 22,
                O::Reflog => 23,
                O::Config => 24,
                O::SetConfig => 25,
                O::Gc => 26,
                O::GcExpireReflog => 27,
                O::Compact => 28,
                O::Fsck => 29,
                O::FsckRepair => 30,
                O::Stats => 31,
                O::Remotes => 32,
                O::AddRemote => 33,
                O::RemoveRemote => 34,
                O::SetRemoteUrl => 35,
                O::SetRemoteToken => 36,
                O::Fetch => 37,
                O::Pull => 38,
                O::Push => 39,
            }
        };
        for (i, o) in Operation::ALL.iter().enumerate() {
            assert_eq!(index(*o), i, "{o}");
        }
    }
}
