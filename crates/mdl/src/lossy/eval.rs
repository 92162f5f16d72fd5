//! `--eval-cmd`: a user's command that scores a candidate checkpoint.

use crate::{Error, Result};

/// Runs `--eval-cmd` on `file` (`{}` in the command is replaced by the quoted path, which is
/// appended when there is no `{}`) and reads the number on the last line of its output.
pub(crate) fn run_eval(cmd: &str, file: &std::path::Path) -> Result<f64> {
    let quoted = format!("'{}'", file.display().to_string().replace('\'', "'\\''"));
    let line = if cmd.contains("{}") {
        cmd.replace("{}", &quoted)
    } else {
        format!("{cmd} {quoted}")
    };
    let fail = |why: String| Error::EvalCommand {
        cmd: cmd.to_string(),
        why,
    };
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&line)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        return Err(fail(format!("it exited with {}", out.status)));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| fail("it printed nothing".into()))?;
    last.split_whitespace()
        .rev()
        .find_map(|w| w.parse::<f64>().ok().filter(|x| x.is_finite()))
        .ok_or_else(|| fail(format!("no number on its last line {last:?}")))
}
