//! A commit's options as they travel to a server ([`CommitParams`]) and back.

use mdl_protocol::params::{CommitParams, Mode};

use super::{default_author, CommitOptions, Reading};
use crate::lossy::{CodecMode, LossyRequest};

impl CommitOptions {
    /// What a server needs to make this commit. The author is this machine's when unset
    /// ([`default_author`]), not the server's. An evaluation command runs on the committing
    /// machine, so it cannot travel: that is refused with the reason.
    pub fn to_params(&self) -> Result<CommitParams, &'static str> {
        let lossy = &self.lossy;
        if lossy.eval_cmd.is_some() {
            return Err("--eval-cmd runs a local command and cannot be used with a server");
        }
        Ok(CommitParams {
            message: self.message.clone(),
            author: Some(self.author.clone().unwrap_or_else(default_author)),
            branch: self.branch.clone(),
            step: self.step,
            metrics: self.metrics.clone(),
            mode: lossy.mode.map(|m| match m {
                CodecMode::Lossless => Mode::Lossless,
                CodecMode::Lossy => Mode::Lossy,
                CodecMode::Trim => Mode::Trim,
            }),
            epsilon: lossy.epsilon,
            trim_bits: lossy.trim_bits,
            moments: lossy.moments.clone(),
            as_bytes: self.reading.as_bytes,
        })
    }

    /// The options of a commit a client asked for; everything else as by default.
    pub fn from_params(p: CommitParams) -> CommitOptions {
        CommitOptions {
            message: p.message,
            author: p.author,
            branch: p.branch,
            step: p.step,
            metrics: p.metrics,
            lossy: LossyRequest {
                mode: p.mode.map(|m| match m {
                    Mode::Lossless => CodecMode::Lossless,
                    Mode::Lossy => CodecMode::Lossy,
                    Mode::Trim => CodecMode::Trim,
                }),
                epsilon: p.epsilon,
                trim_bits: p.trim_bits,
                moments: p.moments,
                eval_cmd: None,
            },
            reading: Reading {
                as_bytes: p.as_bytes,
                // The server's own files are never the committed tree.
                follow_links: false,
            },
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use mdl_format::RefName;
    use mdl_protocol::params::{decode, encode};

    use super::*;

    #[test]
    fn options_travel_to_a_server_and_back() {
        let opts = CommitOptions {
            message: "m & n = ?".into(),
            branch: Some(RefName::new("exp/1").unwrap()),
            step: Some(7),
            metrics: vec![("loss".into(), 1.5), ("acc".into(), 0.25)],
            author: Some("ada".into()),
            lossy: LossyRequest {
                mode: Some(CodecMode::Lossy),
                epsilon: Some(0.001),
                trim_bits: None,
                moments: Some("p.{}:m.{}:v.{}".into()),
                eval_cmd: None,
            },
            ..Default::default()
        };
        let query: Vec<(String, String)> = encode(&opts.to_params().unwrap())
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let back = CommitOptions::from_params(decode(&query).unwrap());
        assert_eq!(back.message, opts.message);
        assert_eq!(back.branch, opts.branch);
        assert_eq!(back.step, opts.step);
        assert_eq!(back.metrics, opts.metrics);
        assert_eq!(back.author, opts.author);
        assert_eq!(back.lossy.mode, opts.lossy.mode);
        assert_eq!(back.lossy.epsilon, opts.lossy.epsilon);
        assert_eq!(back.lossy.moments, opts.lossy.moments);
    }

    #[test]
    fn the_author_is_this_machines_and_an_eval_command_stays_home() {
        let unset = CommitOptions::default().to_params().unwrap();
        assert_eq!(unset.author, Some(default_author()));
        let eval = CommitOptions {
            lossy: LossyRequest {
                eval_cmd: Some("true".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(eval.to_params().is_err());
    }
}
