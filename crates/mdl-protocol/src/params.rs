//! The query parameters of `POST /commits`: [`encode`] turns commit options into them on the
//! client, [`decode`] turns them back on the server.

use mdl::commit::CommitOptions;
use mdl::lossy::CodecMode;
use mdl::RefName;

use crate::ErrorCode;

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

/// The parameters for `opts`. The author defaults to this machine's
/// ([`mdl::commit::default_author`]), not the server's. An evaluation command runs on the
/// committing machine, so it cannot travel: that is refused with the reason.
pub fn encode(opts: &CommitOptions) -> Result<Vec<(&'static str, String)>, &'static str> {
    let lossy = &opts.lossy;
    if lossy.eval_cmd.is_some() {
        return Err("--eval-cmd runs a local command and cannot be used with a server");
    }
    let mut params = vec![
        ("message", opts.message.clone()),
        (
            "author",
            opts.author
                .clone()
                .unwrap_or_else(mdl::commit::default_author),
        ),
    ];
    if let Some(b) = &opts.branch {
        params.push(("branch", b.as_str().to_string()));
    }
    if let Some(s) = opts.step {
        params.push(("step", s.to_string()));
    }
    for (k, v) in &opts.metrics {
        params.push(("metric", format!("{k}={v}")));
    }
    match lossy.mode {
        Some(CodecMode::Lossy) => params.push(("lossy", "true".into())),
        Some(CodecMode::Lossless) => params.push(("lossless", "true".into())),
        // Trim is implied by trim_bits, below.
        Some(CodecMode::Trim) | None => {}
    }
    if let Some(e) = lossy.epsilon {
        params.push(("epsilon", e.to_string()));
    }
    if let Some(t) = lossy.trim_bits {
        params.push(("trim_bits", t.to_string()));
    }
    if let Some(m) = &lossy.moments {
        params.push(("moments", m.clone()));
    }
    Ok(params)
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

/// The commit options a query string's parameters ask for.
pub fn decode(params: &[(String, String)]) -> Result<CommitOptions, BadParameter> {
    let mut opts = CommitOptions::default();
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
                opts.lossy.epsilon =
                    Some(value.parse().map_err(|_| bad(key, value, "not a number"))?)
            }
            "trim_bits" => {
                opts.lossy.trim_bits = Some(
                    value
                        .parse()
                        .map_err(|_| bad(key, value, "not a bit count"))?,
                )
            }
            "moments" => opts.lossy.moments = Some(value.clone()),
            _ => {
                return Err(BadParameter {
                    code: ErrorCode::BadParameter,
                    message: format!("unknown parameter {key:?}"),
                })
            }
        }
    }
    opts.lossy.mode = match (lossy, lossless, opts.lossy.trim_bits.is_some()) {
        (true, true, _) | (true, _, true) | (_, true, true) => {
            return Err(BadParameter {
                code: ErrorCode::BadParameter,
                message: "lossy, lossless and trim_bits exclude each other".into(),
            })
        }
        (true, _, _) => Some(CodecMode::Lossy),
        (_, true, _) => Some(CodecMode::Lossless),
        (_, _, true) => Some(CodecMode::Trim),
        _ => None,
    };
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mdl::lossy::LossyRequest;

    fn owned(params: Vec<(&'static str, String)>) -> Vec<(String, String)> {
        params
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    #[test]
    fn what_the_client_encodes_the_server_decodes() {
        let opts = CommitOptions {
            message: "m & n = ?".into(),
            branch: Some(RefName::new("exp/1").unwrap()),
            step: Some(7),
            metrics: vec![("loss".into(), 1.5), ("acc".into(), 0.25)],
            author: Some("ada".into()),
            lossy: LossyRequest {
                mode: Some(CodecMode::Lossy),
                epsilon: Some(0.001),
                moments: Some("p.{}:m.{}:v.{}".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let back = decode(&owned(encode(&opts).unwrap())).unwrap();
        assert_eq!(back.message, opts.message);
        assert_eq!(back.branch, opts.branch);
        assert_eq!(back.step, opts.step);
        assert_eq!(back.metrics, opts.metrics);
        assert_eq!(back.author, opts.author);
        assert_eq!(back.lossy.mode, Some(CodecMode::Lossy));
        assert_eq!(back.lossy.epsilon, Some(0.001));
        assert_eq!(back.lossy.moments, opts.lossy.moments);

        let trim = CommitOptions {
            lossy: LossyRequest {
                trim_bits: Some(7),
                ..Default::default()
            },
            ..Default::default()
        };
        let back = decode(&owned(encode(&trim).unwrap())).unwrap();
        assert_eq!(back.lossy.mode, Some(CodecMode::Trim));
        assert_eq!(back.lossy.trim_bits, Some(7));
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
        let eval = CommitOptions {
            lossy: LossyRequest {
                eval_cmd: Some("true".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(encode(&eval).is_err());
    }
}
