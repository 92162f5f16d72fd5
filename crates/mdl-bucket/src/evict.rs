//! Keeping a replica's record files within the cache's size: [`Replica::trim`] removes the
//! least recently used records the bucket holds (each read stamps its file, see
//! [`mdl::source`]) until the rest fit; the replica's [`crate::records::Records`] fetches one
//! again when it is next read. A record the bucket does not hold — made here and not
//! published yet, or re-encoded here by compaction — is never removed.

use mdl::evict::Evicted;
use mdl::Repository;

use crate::replica::Replica;
use crate::{Error, Result};

/// The cache's size when `MDL_CACHE_SIZE` does not say.
pub const DEFAULT_CACHE_SIZE: u64 = 50 << 30;

/// The most bytes of record files each replica keeps between commands: `MDL_CACHE_SIZE`
/// (bytes, or with a suffix K, M, G or T: powers of 1024), else [`DEFAULT_CACHE_SIZE`].
pub fn cache_size() -> Result<u64> {
    match std::env::var("MDL_CACHE_SIZE") {
        Ok(v) => parse_size(&v).ok_or_else(|| {
            Error::Location(format!(
                "MDL_CACHE_SIZE={v} is not a size (bytes, or a number with K, M, G or T)"
            ))
        }),
        Err(_) => Ok(DEFAULT_CACHE_SIZE),
    }
}

fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s
        .strip_suffix("iB")
        .or_else(|| s.strip_suffix('B'))
        .unwrap_or(s);
    let (digits, shift) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 10),
        'm' | 'M' => (&s[..s.len() - 1], 20),
        'g' | 'G' => (&s[..s.len() - 1], 30),
        't' | 'T' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(1u64 << shift)
}

impl Replica {
    /// Removes record files, least recently used first ([`mdl::evict::evict`]), until those
    /// left take at most [`cache_size`] bytes or only records the bucket lacks are left.
    /// Nothing is listed when no record was fetched, applied or sent since the last trim in
    /// this process. Commands call it once they have published.
    pub fn trim(&self, repo: &Repository) -> Result<Evicted> {
        let limit = cache_size()?;
        if !self.records.take_grown() {
            return Ok(Evicted::default());
        }
        // Only a record exactly as the bucket holds it: in a pack no gc marked, the size
        // that pack's table of contents says (generation 0: not re-encoded here).
        let in_bucket = |id: &mdl::ObjectId, entry: &mdl::IndexEntry| -> mdl::Result<bool> {
            Ok(entry.generation == 0
                && self.seen.holds(id)
                && self
                    .records
                    .len_of(id)
                    .map_err(|e| mdl::Error::BadTransfer(e.to_string()))?
                    == Some(entry.stored_len))
        };
        Ok(mdl::evict::evict(repo, limit, &in_bucket)?)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("1000"), Some(1000));
        assert_eq!(parse_size("20G"), Some(20 << 30));
        assert_eq!(parse_size("512 MiB"), Some(512 << 20));
        assert_eq!(parse_size("3k"), Some(3 << 10));
        assert_eq!(parse_size("1T"), Some(1 << 40));
        for bad in ["", "G", "-1", "1.5G", "lots", "99999999999T"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
