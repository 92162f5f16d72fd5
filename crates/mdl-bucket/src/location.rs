//! Where a repository in object storage is: `s3://BUCKET[/PREFIX]`, with the endpoint, region
//! and credentials from the usual `AWS_*` environment variables.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::{BackoffConfig, ObjectStore, RetryConfig};

use crate::{Error, Result};

/// The scheme of repository locations in S3-compatible storage.
pub const SCHEME: &str = "s3://";

/// A repository's place in object storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// The bucket.
    pub bucket: String,
    /// The folder inside it (no leading or trailing `/`; empty for the bucket's root).
    pub prefix: String,
}

impl Location {
    /// Parses `s3://BUCKET[/PREFIX]`.
    pub fn parse(s: &str) -> Result<Location> {
        let bad = |why: &str| {
            Error::Location(format!(
                "invalid repository location {s:?}: {why} (expected s3://BUCKET[/PREFIX])"
            ))
        };
        let rest = s.strip_prefix(SCHEME).ok_or_else(|| bad("not s3://"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let valid_bucket = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !valid_bucket {
            return Err(bad(
                "a bucket name is 3 to 63 lowercase letters, digits, '-' or '.'",
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix
            .split('/')
            .any(|part| part == "." || part == ".." || (part.is_empty() && !prefix.is_empty()))
            || prefix.chars().any(|c| c.is_control() || c == '\\')
        {
            return Err(bad("the prefix has an empty, '.' or '..' part"));
        }
        Ok(Location {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// `s3://BUCKET/PREFIX`, as users write it.
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("{SCHEME}{}", self.bucket)
        } else {
            format!("{SCHEME}{}/{}", self.bucket, self.prefix)
        }
    }

    /// The name a clone takes by default: the prefix's last part, else the bucket.
    pub fn name(&self) -> &str {
        self.prefix
            .rsplit('/')
            .next()
            .filter(|n| !n.is_empty())
            .unwrap_or(&self.bucket)
    }

    /// The endpoint the environment names (`AWS_ENDPOINT_URL` or `AWS_ENDPOINT`), if any: part
    /// of what tells two repositories of the same name apart in the local cache.
    pub fn endpoint() -> Option<String> {
        ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// The S3 client: `AWS_*` variables as the AWS tools read them, the bucket from the
    /// location, and conditional writes by ETag (`If-Match`, `If-None-Match`), which refs need.
    /// `retrying`: a failed request is tried again ([`retries`]); otherwise once.
    pub(crate) fn store(&self, retrying: bool) -> Result<Arc<dyn ObjectStore>> {
        // The client refuses plain HTTP unless told otherwise, and says only "builder error"
        // when a request is made: name the variable instead, before anything is sent.
        let allowed = std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
        if let Some(endpoint) = Self::endpoint().filter(|e| {
            e.get(..7)
                .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
                && !allowed
        }) {
            return Err(Error::Location(format!(
                "{}: the endpoint {endpoint} is plain HTTP; set AWS_ALLOW_HTTP=true to use it",
                self.url()
            )));
        }
        // TLS through rustls on ring's cryptography, installed for the process once (the
        // client is built without a provider of its own; one installed already is kept).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&self.bucket)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(if retrying {
                retries()
            } else {
                RetryConfig {
                    max_retries: 0,
                    ..retries()
                }
            });
        if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            b = b.with_region("us-east-1");
        }
        let store = b
            .build()
            .map_err(|e| Error::Location(format!("{}: {e}", self.url())))?;
        Ok(Arc::new(store))
    }
}

/// How long one request is tried, at most, before it fails: the documented bound
/// (`docs/RELIABILITY.md`), whatever the endpoint does.
pub const RETRY_FOR: Duration = Duration::from_secs(20);

/// How requests that failed (connection refused or reset, 5xx, throttling) are tried again:
/// waits drawn between 250 ms and twice the last (so growing about 1.5× a try, at most 4 s),
/// until [`RETRY_FOR`] has passed or 10 tries were made — enough to ride out a store
/// restarting. It was 15 tries within 3 minutes: one unreadable object cost 184 s a read.
fn retries() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(4),
            base: 2.0,
        },
        max_retries: 10,
        retry_timeout: RETRY_FOR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_and_print_back() {
        let l = Location::parse("s3://ml-runs/team/gpt/").unwrap();
        assert_eq!(l.bucket, "ml-runs");
        assert_eq!(l.prefix, "team/gpt");
        assert_eq!(l.url(), "s3://ml-runs/team/gpt");
        assert_eq!(l.name(), "gpt");
        assert_eq!(
            Location::parse("s3://ml-runs").unwrap().url(),
            "s3://ml-runs"
        );
        assert_eq!(Location::parse("s3://ml-runs").unwrap().name(), "ml-runs");
        for bad in [
            "s3://",
            "s3://A",
            "s3://ab",
            "s3://bucket/a//b",
            "s3://bucket/../x",
            "http://x/y",
        ] {
            let e = Location::parse(bad).unwrap_err().to_string();
            assert!(e.contains("expected s3://BUCKET[/PREFIX]"), "{bad}: {e}");
        }
    }
}
