use crate::wire::{Reader, Writer};
use crate::{FormatError, ObjectId, ObjectKind, Timestamp};

/// Compression figures recorded with a commit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Size of the committed safetensors file.
    pub raw_bytes: u64,
    /// Bytes of records this commit added to the store (tensors and manifest).
    pub stored_bytes: u64,
    /// Tensors in the checkpoint.
    pub tensors: u32,
    /// Tensors that were not already in the store.
    pub new_tensors: u32,
    /// Tensors stored lossily (checkout reproduces them approximately).
    pub lossy_tensors: u32,
}

/// A commit: one checkpoint in history.
#[derive(Clone, Debug, PartialEq)]
pub struct Commit {
    /// The checkpoint's manifest.
    pub manifest: ObjectId,
    /// Parent commits (none for a root commit).
    pub parents: Vec<ObjectId>,
    /// Who made it.
    pub author: String,
    /// When it was made (UTC).
    pub time: Timestamp,
    /// Free-form message.
    pub message: String,
    /// Training step, if given.
    pub step: Option<u64>,
    /// Named metrics, sorted by name, names unique.
    pub metrics: Vec<(String, f64)>,
    /// Compression figures.
    pub stats: CommitStats,
    /// Named facts about how the commit was made, sorted by name, names unique: a merge's
    /// strategy and parameters (`merge.*`), the training code's git commit (`source.*`).
    pub properties: Vec<(String, String)>,
}

/// Version 2 added `lossy_tensors` (version 1 commits read as having none); version 3,
/// `properties`. A commit without properties is written as version 2, byte for byte what
/// builds before version 3 wrote (its id unchanged, older readers still read it).
const COMMIT_VERSION: u16 = 3;

impl Commit {
    /// The canonical serialisation (what the id hashes). Layout in `docs/FORMAT.md`.
    pub fn encode(&self) -> Vec<u8> {
        let version = if self.properties.is_empty() { 2 } else { 3 };
        let mut w = Writer::default();
        w.u8(ObjectKind::Commit as u8)
            .u16(version)
            .id(&self.manifest);
        w.u32(self.parents.len() as u32);
        for p in &self.parents {
            w.id(p);
        }
        w.str(&self.author).i64(self.time.0).str(&self.message);
        match self.step {
            Some(s) => w.u8(1).u64(s),
            None => w.u8(0),
        };
        w.u32(self.metrics.len() as u32);
        for (k, v) in &self.metrics {
            w.str(k).f64(*v);
        }
        let s = &self.stats;
        w.u64(s.raw_bytes)
            .u64(s.stored_bytes)
            .u32(s.tensors)
            .u32(s.new_tensors)
            .u32(s.lossy_tensors);
        if version >= 3 {
            w.u32(self.properties.len() as u32);
            for (k, v) in &self.properties {
                w.str(k).str(v);
            }
        }
        w.buf
    }

    /// The property `name`, if recorded.
    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties
            .binary_search_by(|(k, _)| k.as_str().cmp(name))
            .ok()
            .map(|i| self.properties[i].1.as_str())
    }

    /// Parses [`Self::encode`] output.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(bytes, "commit");
        let kind = r.u8()?;
        if kind != ObjectKind::Commit as u8 {
            return Err(FormatError::invalid(
                "commit",
                format!("object kind {kind}"),
            ));
        }
        let version = r.u16()?;
        if version == 0 || version > COMMIT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: "commit",
                found: version,
                supported: COMMIT_VERSION,
            });
        }
        let manifest = r.id()?;
        let n = r.count(32)?;
        let parents = (0..n).map(|_| r.id()).collect::<Result<Vec<_>, _>>()?;
        let author = r.str()?.to_string();
        let time = Timestamp(r.i64()?);
        let message = r.str()?.to_string();
        let step = match r.u8()? {
            0 => None,
            1 => Some(r.u64()?),
            tag => {
                return Err(FormatError::UnknownTag {
                    what: "step flag",
                    tag,
                })
            }
        };
        let n = r.count(12)?;
        let mut metrics = Vec::with_capacity(n);
        for _ in 0..n {
            metrics.push((r.str()?.to_string(), r.f64()?));
        }
        let stats = CommitStats {
            raw_bytes: r.u64()?,
            stored_bytes: r.u64()?,
            tensors: r.u32()?,
            new_tensors: r.u32()?,
            lossy_tensors: if version >= 2 { r.u32()? } else { 0 },
        };
        let mut properties = Vec::new();
        if version >= 3 {
            let n = r.count(8)?;
            for _ in 0..n {
                properties.push((r.str()?.to_string(), r.str()?.to_string()));
            }
            // Sorted and unique, as written: one encoding per commit, one id.
            if n == 0 || properties.windows(2).any(|w| w[0].0 >= w[1].0) {
                return Err(FormatError::invalid(
                    "commit",
                    "properties empty, unsorted or repeated in a version 3 commit".to_string(),
                ));
            }
        }
        r.finish()?;
        Ok(Commit {
            manifest,
            parents,
            author,
            time,
            message,
            step,
            metrics,
            stats,
            properties,
        })
    }

    /// The commit's id.
    pub fn id(&self) -> ObjectId {
        ObjectId::hash(&self.encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Commit {
        Commit {
            manifest: ObjectId::hash(b"m"),
            parents: vec![ObjectId::hash(b"p1"), ObjectId::hash(b"p2")],
            author: "ada".into(),
            time: Timestamp(1_700_000_000_123),
            message: "step 1200\nsecond line".into(),
            step: Some(1200),
            metrics: vec![("acc".into(), 0.5), ("loss".into(), 2.41)],
            stats: CommitStats {
                raw_bytes: 10,
                stored_bytes: 7,
                tensors: 3,
                new_tensors: 1,
                lossy_tensors: 1,
            },
            properties: Vec::new(),
        }
    }

    #[test]
    fn round_trip() {
        let c = sample();
        let bytes = c.encode();
        assert_eq!(
            u16::from_le_bytes([bytes[1], bytes[2]]),
            2,
            "no properties: version 2"
        );
        assert_eq!(Commit::decode(&bytes).unwrap(), c);
        for cut in 0..bytes.len() {
            assert!(Commit::decode(&bytes[..cut]).is_err());
        }
        let mut other = c.clone();
        other.step = None;
        assert_ne!(other.id(), c.id());

        let mut merged = c.clone();
        merged.properties = vec![
            ("merge.strategy".into(), "linear".into()),
            ("merge.weights".into(), "0.5,0.5".into()),
        ];
        let bytes = merged.encode();
        assert_eq!(u16::from_le_bytes([bytes[1], bytes[2]]), 3);
        let back = Commit::decode(&bytes).unwrap();
        assert_eq!(back, merged);
        assert_eq!(back.property("merge.weights"), Some("0.5,0.5"));
        assert_eq!(back.property("merge.base"), None);
        for cut in 0..bytes.len() {
            assert!(Commit::decode(&bytes[..cut]).is_err());
        }
    }

    #[test]
    fn properties_must_be_sorted_unique_and_present() {
        let mut c = sample();
        for props in [
            vec![("b", "1"), ("a", "2")],
            vec![("a", "1"), ("a", "2")],
            vec![],
        ] {
            c.properties = props
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let mut bytes = c.clone().encode();
            if c.properties.is_empty() {
                // An empty list written as version 3 by hand.
                bytes[1..3].copy_from_slice(&3u16.to_le_bytes());
                bytes.extend_from_slice(&0u32.to_le_bytes());
            }
            assert!(Commit::decode(&bytes).is_err(), "{:?}", c.properties);
        }
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = Commit::decode(&bytes);
        }
    }
}
