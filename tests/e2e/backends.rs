//! The same journey on each of the three backends (a folder here, a served repository over
//! HTTP, a repository in object storage), and every (operation, backend) pair with its
//! outcome: it runs, or it is refused with the one `unsupported` error that says what to do
//! instead. The bucket's half needs SeaweedFS (ignored in a plain `cargo test`; `scripts/test.sh`
//! runs it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::server::{Server, WRITE};
use mdl_ops::Operation;
use Operation as O;

use crate::util::{column, mdl_bin, mixed, tensor, write_safetensors};

/// Builds `mdl -C LOCATION ARGS` with a backend's environment.
type Runner = Box<dyn Fn(&[&str]) -> Command>;

/// A repository on one backend, and how to run `mdl -C LOCATION …` on it.
struct Place {
    /// What `-C` names: a folder, a URL.
    location: String,
    /// Runs `mdl -C LOCATION ARGS` with the backend's environment.
    command: Runner,
    /// Scratch space: checkpoints, checkouts.
    scratch: tempfile::TempDir,
    /// What must live as long as the place: a server, a SeaweedFS.
    _keep: Vec<Box<dyn std::any::Any>>,
}

impl Place {
    fn local() -> Place {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        let location = repo.to_str().unwrap().to_string();
        plain(&["init", &location]);
        Place {
            command: plain_at(location.clone()),
            location,
            scratch: tempfile::tempdir().unwrap(),
            _keep: vec![Box::new(dir)],
        }
    }

    fn served() -> Place {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        plain(&["init", repo.to_str().unwrap()]);
        let server = Server::start(&["-C", repo.to_str().unwrap()], dir.path());
        let location = format!("{}/repo", server.base);
        let at = location.clone();
        Place {
            command: Box::new(move |args| {
                let mut c = base(&at, args);
                c.env("MDL_TOKEN", WRITE);
                c
            }),
            location,
            scratch: tempfile::tempdir().unwrap(),
            _keep: vec![Box::new(server), Box::new(dir)],
        }
    }

    fn bucket(name: &str) -> Place {
        let repo = crate::s3::Repo::new(name);
        let location = repo.url.clone();
        let repo = std::sync::Arc::new(repo);
        let r = repo.clone();
        let cache = repo.cache("m1");
        let at = location.clone();
        Place {
            command: Box::new(move |args| {
                let mut all = vec!["-C", at.as_str()];
                all.extend_from_slice(args);
                r.weed.command(&cache, &all)
            }),
            location,
            scratch: tempfile::tempdir().unwrap(),
            _keep: vec![Box::new(repo)],
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        (self.command)(args)
            .env("MDL_AUTHOR", "tester")
            .output()
            .expect("run mdl")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "mdl -C {} {args:?} failed: {}",
            self.location,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.push("--json");
        serde_json::from_str(&self.ok(&all)).unwrap()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.scratch.path().join(name)
    }
}

/// `mdl ARGS` with no `-C`.
fn plain(args: &[&str]) {
    let out = Command::new(mdl_bin()).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
}

fn base(at: &str, args: &[&str]) -> Command {
    let mut c = Command::new(mdl_bin());
    c.arg("-C").arg(at).args(args).env_remove("MDL_TOKEN");
    c
}

fn plain_at(at: String) -> Runner {
    Box::new(move |args| base(&at, args))
}

/// A folder as a `transformers` Trainer writes one: weights, optimizer state, RNG state and
/// its JSON documents; `seed` changes the weights.
fn trainer_folder(dir: &Path, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    write_safetensors(&dir.join("model.safetensors"), &mixed(seed), &[]);
    write_safetensors(
        &dir.join("optimizer.safetensors"),
        &[tensor("exp_avg", "F32", &[64, 32], seed + 100)],
        &[],
    );
    std::fs::write(dir.join("rng_state.pth"), crate::util::noise(seed, 1500)).unwrap();
    std::fs::write(
        dir.join("trainer_state.json"),
        format!("{{\"global_step\": {seed}, \"epoch\": 0.5}}\n"),
    )
    .unwrap();
    std::fs::write(dir.join("config.json"), "{\"model_type\": \"gpt2\"}\n").unwrap();
}

/// Every file of the folder `dir`, by relative path, with its bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    all.sort();
    all
}

/// Commit a Trainer folder twice, list every history, check out byte for byte, branch, tag,
/// reset, gc, fsck: the same on every backend.
fn journey(place: &Place) {
    let (one, two) = (place.path("checkpoint-1"), place.path("checkpoint-2"));
    trainer_folder(&one, 1);
    trainer_folder(&two, 2);
    let c1 = place.json(&["commit", one.to_str().unwrap(), "-m", "one", "--step", "1"]);
    let c2 = place.json(&["commit", two.to_str().unwrap(), "-m", "two", "--step", "2"]);
    let (id1, id2) = (c1["id"].as_str().unwrap(), c2["id"].as_str().unwrap());

    let branched = place.json(&["branch", "exp", id1]);
    assert!(branched["message"]
        .as_str()
        .unwrap()
        .starts_with("branch exp at "));
    place.ok(&["tag", "v1", id1, "-m", "the first"]);
    let tags = place.json(&["tag"]);
    assert_eq!(tags[0]["name"], "v1");
    assert_eq!(tags[0]["target"], id1);
    let branches = place.json(&["branch"]);
    let names = column(&branches, "name");
    assert_eq!(names, ["exp", "main"]);

    let all = place.json(&["log", "--all"]);
    let ids = column(&all, "id");
    assert_eq!(ids, [id2, id1], "log --all on {}", place.location);

    for (rev, folder) in [("main", &two), ("v1", &one), ("exp", &one)] {
        let out = place.path(&format!("out-{rev}"));
        place.ok(&["checkout", rev, "-o", out.to_str().unwrap()]);
        assert!(
            files(&out) == files(folder),
            "{rev} differs on {}",
            place.location
        );
    }

    let moved = place.json(&["reset", "v1"]);
    assert_eq!(moved["from"], id2);
    assert_eq!(moved["to"], id1);
    assert_eq!(place.json(&["log"])[0]["id"], id1);
    let reflog = place.json(&["reflog"]);
    assert_eq!(reflog["entries"][0]["new"], id1);
    place.ok(&["reset", id2]);
    place.ok(&["branch", "-D", "exp"]);
    place.ok(&["tag", "-d", "v1"]);
    place.ok(&["gc", "--prune-older-than", "0s"]);
    // What main reaches is all still there.
    let out = place.path("out-after-gc");
    place.ok(&["checkout", "main~1", "-o", out.to_str().unwrap()]);
    assert!(files(&out) == files(&one));
    assert_eq!(place.json(&["fsck"])["ok"], true);
}

#[test]
fn the_journey_on_a_local_folder() {
    journey(&Place::local());
}

#[test]
fn the_journey_on_a_served_repository() {
    journey(&Place::served());
}

#[test]
#[ignore = "needs SeaweedFS: scripts/test.sh runs it with MDL_WEED from scripts/seaweedfs-env.sh"]
fn the_journey_in_object_storage() {
    journey(&Place::bucket("journey"));
}

/// What an operation does on a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// It runs and succeeds.
    Runs,
    /// It goes to the other repository it names, which this test never starts: it fails
    /// with `unreachable`, having got past the backend.
    Reaches,
    /// Refused with `unsupported` and what to do instead.
    Refused,
}

use Outcome::{Reaches, Refused, Runs};

/// A remote that no server answers (the discard port).
const NOWHERE: &str = "http://127.0.0.1:9/nowhere";

/// Every operation (`mdl_ops::Operation`), as the command line runs it, with its outcome on a
/// local folder, a served repository and a repository in object storage — in an order where
/// each one's set-up is done by those before. `FILE` stands for a checkpoint file, `OUT` for a
/// fresh output path. `clone` makes a repository rather than running on one: `remotes.rs`,
/// `s3.rs`.
const TABLE: &[(Operation, &[&str], [Outcome; 3])] = &[
    (
        O::Commit,
        &["commit", "FILE", "-m", "first"],
        [Runs, Runs, Runs],
    ),
    (
        O::CommitEngine,
        &["commit", "FILE", "--engine", "cpu"],
        [Runs, Refused, Runs],
    ),
    (
        O::Checkout,
        &["checkout", "HEAD", "-o", "OUT"],
        [Runs, Runs, Runs],
    ),
    (
        O::CheckoutEngine,
        &["checkout", "HEAD", "-o", "OUT", "--engine", "cpu"],
        [Runs, Refused, Runs],
    ),
    (
        O::CheckoutSkipExpired,
        &["checkout", "HEAD", "-o", "OUT", "--skip-expired"],
        [Runs, Refused, Runs],
    ),
    (O::Maintenance, &["maintenance"], [Runs, Refused, Runs]),
    (O::Log, &["log"], [Runs, Runs, Runs]),
    (O::LogAll, &["log", "--all"], [Runs, Runs, Runs]),
    (O::Show, &["show", "HEAD"], [Runs, Runs, Runs]),
    (O::Diff, &["diff", "HEAD", "HEAD"], [Runs, Runs, Runs]),
    (
        O::Merge,
        &["merge", "HEAD", "HEAD~1", "-m", "merged"],
        [Runs, Refused, Runs],
    ),
    (O::Branches, &["branch"], [Runs, Runs, Runs]),
    (O::RemoteBranches, &["branch", "-r"], [Runs, Refused, Runs]),
    (O::RemoteBranches, &["branch", "-a"], [Runs, Refused, Runs]),
    (
        O::CreateBranch,
        &["branch", "b1", "HEAD"],
        [Runs, Runs, Runs],
    ),
    (
        O::ForceBranch,
        &["branch", "-f", "b1", "HEAD"],
        [Runs, Runs, Runs],
    ),
    (O::DeleteBranch, &["branch", "-d", "b1"], [Runs, Runs, Runs]),
    (
        O::CreateTag,
        &["tag", "t1", "-m", "tagged"],
        [Runs, Runs, Runs],
    ),
    (O::Tags, &["tag"], [Runs, Runs, Runs]),
    (O::DeleteTag, &["tag", "-d", "t1"], [Runs, Runs, Runs]),
    (O::Switch, &["switch", "main"], [Runs, Runs, Runs]),
    (O::Reset, &["reset", "HEAD"], [Runs, Runs, Runs]),
    (O::Reflog, &["reflog"], [Runs, Runs, Runs]),
    (O::Config, &["config"], [Runs, Runs, Runs]),
    (
        O::SetConfig,
        &["config", "delta.max_depth", "12"],
        [Runs, Runs, Runs],
    ),
    (O::Gc, &["gc"], [Runs, Runs, Runs]),
    (
        O::GcExpireReflog,
        &["gc", "--expire-reflog", "30d"],
        [Runs, Runs, Refused],
    ),
    (O::Compact, &["compact", "--dry-run"], [Runs, Runs, Runs]),
    (O::Fsck, &["fsck"], [Runs, Runs, Runs]),
    (O::FsckRepair, &["fsck", "--repair"], [Runs, Refused, Runs]),
    (O::Stats, &["stats"], [Runs, Runs, Runs]),
    (
        O::AddRemote,
        &["remote", "add", "origin", NOWHERE],
        [Runs, Refused, Runs],
    ),
    (O::Remotes, &["remote"], [Runs, Refused, Runs]),
    (
        O::SetRemoteUrl,
        &["remote", "set-url", "origin", NOWHERE],
        [Runs, Refused, Runs],
    ),
    (
        O::SetRemoteToken,
        &["remote", "set-token", "origin", "--token", "t0k3n"],
        [Runs, Refused, Runs],
    ),
    (O::Fetch, &["fetch", "origin"], [Reaches, Refused, Reaches]),
    (O::Pull, &["pull", "origin"], [Reaches, Refused, Reaches]),
    (O::Push, &["push", "origin"], [Reaches, Refused, Reaches]),
    (
        O::RemoveRemote,
        &["remote", "remove", "origin"],
        [Runs, Refused, Runs],
    ),
];

/// Every operation is in [`TABLE`], so that a new one cannot ship without its outcome on each
/// backend being tested — but `clone` (tested apart) and a live state's commit (Python only:
/// `tests/python/test_backends.py` runs it on each backend).
#[test]
fn the_table_holds_every_operation() {
    let missing: Vec<String> = Operation::ALL
        .iter()
        .filter(|o| ![O::Clone, O::CommitState].contains(o))
        .filter(|o| !TABLE.iter().any(|(t, _, _)| t == *o))
        .map(|o| o.to_string())
        .collect();
    assert!(missing.is_empty(), "not in the backend table: {missing:?}");
}

/// Runs [`TABLE`] on `place`, the backend's column `column`.
fn every_operation(place: &Place, column: usize) {
    let file = place.path("ckpt.safetensors");
    for (n, (_, args, outcomes)) in TABLE.iter().enumerate() {
        write_safetensors(&file, &mixed(n as u64), &[]);
        let out = place.path(&format!("out-{n}"));
        let mut args: Vec<&str> = args
            .iter()
            .map(|a| match *a {
                "FILE" => file.to_str().unwrap(),
                "OUT" => out.to_str().unwrap(),
                a => a,
            })
            .collect();
        args.push("--json");
        let run = place.run(&args);
        let stdout = String::from_utf8_lossy(&run.stdout);
        let stderr = String::from_utf8_lossy(&run.stderr);
        let said = || format!("mdl -C {} {args:?}: {stderr}{stdout}", place.location);
        let code = || {
            let doc: serde_json::Value =
                serde_json::from_str(&stdout).unwrap_or_else(|_| panic!("{}", said()));
            doc["error"]["code"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        match outcomes[column] {
            Runs => assert!(run.status.success(), "should run: {}", said()),
            Reaches => {
                assert_eq!(run.status.code(), Some(1), "{}", said());
                assert_eq!(code(), "unreachable", "{}", said());
            }
            Refused => {
                assert_eq!(run.status.code(), Some(1), "{}", said());
                assert_eq!(code(), "unsupported", "{}", said());
                assert_eq!(stderr.trim_end().lines().count(), 1, "{}", said());
                assert!(stderr.contains("does not run on"), "{}", said());
            }
        }
    }
}

#[test]
fn every_operation_on_a_local_folder() {
    every_operation(&Place::local(), 0);
}

#[test]
fn every_operation_on_a_served_repository() {
    every_operation(&Place::served(), 1);
}

#[test]
#[ignore = "needs SeaweedFS: scripts/test.sh runs it with MDL_WEED from scripts/seaweedfs-env.sh"]
fn every_operation_in_object_storage() {
    every_operation(&Place::bucket("every"), 2);
}
