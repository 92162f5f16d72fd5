//! The query parameters of `POST /commits`: what a commit asks for ([`CommitParams`], which the
//! library makes from its commit options and back), [`encode`]d by the client and [`decode`]d
//! by the server.

use mdl_format::RefName;

use crate::ErrorCode;

/// What a commit over HTTP asks for: the part of the library's commit options that travels.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommitParams {
    /// Commit message.
    pub message: String,
    /// Author (the committing machine's, which the library fills in).
    pub author: Option<String>,
    /// Branch to commit onto; HEAD's branch when `None`.
    pub branch: Option<RefName>,
    /// Training step.
    pub step: Option<u64>,
    /// Metrics, `name → value`.
    pub metrics: Vec<(String, f64)>,
    /// `--lossy`, `--lossless` or `--trim-bits`; the repository's setting when `None`.
    pub mode: Option<Mode>,
    /// `--epsilon`.
    pub epsilon: Option<f64>,
    /// `--trim-bits`.
    pub trim_bits: Option<u32>,
    /// `--moments`.
    pub moments: Option<String>,
    /// `--as-bytes`: a file that looks like a checkpoint but does not parse is stored as bytes
    /// instead of refused.
    pub as_bytes: bool,
}

/// How a commit stores float tensors, when it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Exactly.
    Lossless,
    /// Quantized under ε.
    Lossy,
    /// Mantissa-trimmed (implied by `trim_bits`).
    Trim,
}

/// A parameter the server refuses: its code (`bad_parameter` or `invalid_name`) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadParameter {
    /// The error code to answer with.
    pub code: ErrorCode,
    /// One line for people.
    pub message: String,
}

fn bad(key: &str, value: &str, why: &str) -> BadParameter {
    BadParameter {
        code: ErrorCode::BadParameter,
        message: format!("parameter {key}={value:?}: {why}"),
    }
}

/// The query parameters of `commit`.
pub fn encode(commit: &CommitParams) -> Vec<(&'static str, String)> {
    let mut params = vec![("message", commit.message.clone())];
    if let Some(a) = &commit.author {
        params.push(("author", a.clone()));
    }
    if let Some(b) = &commit.branch {
        params.push(("branch", b.as_str().to_string()));
    }
    if let Some(s) = commit.step {
        params.push(("step", s.to_string()));
    }
    for (k, v) in &commit.metrics {
        params.push(("metric", format!("{k}={v}")));
    }
    match commit.mode {
        Some(Mode::Lossy) => params.push(("lossy", "true".into())),
        Some(Mode::Lossless) => params.push(("lossless", "true".into())),
        // Trim is implied by trim_bits, below.
        Some(Mode::Trim) | None => {}
    }
    if let Some(e) = commit.epsilon {
        params.push(("epsilon", e.to_string()));
    }
    if let Some(t) = commit.trim_bits {
        params.push(("trim_bits", t.to_string()));
    }
    if let Some(m) = &commit.moments {
        params.push(("moments", m.clone()));
    }
    if commit.as_bytes {
        params.push(("as_bytes", "true".into()));
    }
    params
}

/// The parameter naming the uploaded file in the commit's tree (its file name on the
/// committing machine); `model.safetensors` without it.
pub const PATH: &str = "path";

/// The number of files a tree upload holds: the server checks that the tar it received holds
/// as many, so that an upload cut short between two files is not taken for a smaller tree.
pub const FILES: &str = "files";

/// The `path` parameter (the last one given), and the other parameters for [`decode`].
pub fn split_path(params: &[(String, String)]) -> (Option<String>, Vec<(String, String)>) {
    take(params, PATH)
}

/// Parameter `key` (the last one given), and the other parameters.
pub fn take(params: &[(String, String)], key: &str) -> (Option<String>, Vec<(String, String)>) {
    let (taken, rest): (Vec<_>, Vec<_>) = params.iter().cloned().partition(|(k, _)| k == key);
    (taken.into_iter().last().map(|(_, v)| v), rest)
}

/// The commit a query string's parameters ask for.
pub fn decode(params: &[(String, String)]) -> Result<CommitParams, BadParameter> {
    let mut opts = CommitParams::default();
    let (mut lossy, mut lossless) = (false, false);
    let flag = |key: &str, value: &str| match value {
        "" | "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(bad(key, value, "expected true or false")),
    };
    for (key, value) in params {
        match key.as_str() {
            "branch" => {
                opts.branch = Some(RefName::new(value).map_err(|e| BadParameter {
                    code: ErrorCode::InvalidName,
                    message: e.to_string(),
                })?)
            }
            "message" => opts.message = value.clone(),
            "author" => opts.author = Some(value.clone()),
            "step" => {
                opts.step = Some(
                    value
                        .parse()
                        .map_err(|_| bad(key, value, "not a step number"))?,
                )
            }
            "metric" => {
                let (k, v) = value
                    .split_once('=')
                    .ok_or_else(|| bad(key, value, "expected NAME=NUMBER"))?;
                let v: f64 = v
                    .trim()
                    .parse()
                    .map_err(|_| bad(key, value, "not a number"))?;
                opts.metrics.push((k.trim().to_string(), v));
            }
            "lossy" => lossy = flag(key, value)?,
            "lossless" => lossless = flag(key, value)?,
            "epsilon" => {
                opts.epsilon = Some(value.parse().map_err(|_| bad(key, value, "not a number"))?)
            }
            "trim_bits" => {
                opts.trim_bits = Some(
                    value
                        .parse()
                        .map_err(|_| bad(key, value, "not a bit count"))?,
                )
            }
            "moments" => opts.moments = Some(value.clone()),
            "as_bytes" => opts.as_bytes = flag(key, value)?,
            _ => {
                return Err(BadParameter {
                    code: ErrorCode::BadParameter,
                    message: format!("unknown parameter {key:?}"),
                })
            }
        }
    }
    opts.mode = match (lossy, lossless, opts.trim_bits.is_some()) {
        (true, true, _) | (true, _, true) | (_, true, true) => {
            return Err(BadParameter {
                code: ErrorCode::BadParameter,
                message: "lossy, lossless and trim_bits exclude each other".into(),
            })
        }
        (true, _, _) => Some(Mode::Lossy),
        (_, true, _) => Some(Mode::Lossless),
        (_, _, true) => Some(Mode::Trim),
        _ => None,
    };
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(params: Vec<(&'static str, String)>) -> Vec<(String, String)> {
        params
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    #[test]
    fn what_the_client_encodes_the_server_decodes() {
        let commit = CommitParams {
            message: "m & n = ?".into(),
            branch: Some(RefName::new("exp/1").unwrap()),
            step: Some(7),
            metrics: vec![("loss".into(), 1.5), ("acc".into(), 0.25)],
            author: Some("ada".into()),
            mode: Some(Mode::Lossy),
            epsilon: Some(0.001),
            moments: Some("p.{}:m.{}:v.{}".into()),
            ..Default::default()
        };
        assert_eq!(decode(&owned(encode(&commit))).unwrap(), commit);

        let trim = CommitParams {
            mode: Some(Mode::Trim),
            trim_bits: Some(7),
            ..Default::default()
        };
        assert_eq!(decode(&owned(encode(&trim))).unwrap(), trim);
    }

    #[test]
    fn bad_parameters_are_refused_with_their_code() {
        let one = |k: &str, v: &str| decode(&[(k.to_string(), v.to_string())]).unwrap_err();
        assert_eq!(one("step", "x").code, ErrorCode::BadParameter);
        assert_eq!(one("metric", "loss").code, ErrorCode::BadParameter);
        assert_eq!(one("colour", "red").code, ErrorCode::BadParameter);
        assert_eq!(one("branch", "a..b").code, ErrorCode::InvalidName);
        let both = decode(&[
            ("lossy".into(), "true".into()),
            ("trim_bits".into(), "7".into()),
        ]);
        assert_eq!(both.unwrap_err().code, ErrorCode::BadParameter);
    }
}
