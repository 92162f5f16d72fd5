use std::fmt;
use std::str::FromStr;

/// The identity of an object: the blake3 hash of its canonical content.
///
/// How the object is stored (which codec, which delta base) never changes its id, which is what
/// lets compaction re-encode history without touching a single commit.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId([u8; 32]);

impl ObjectId {
    /// Length of an id in bytes.
    pub const LEN: usize = 32;

    /// Wraps raw hash bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        ObjectId(bytes)
    }

    /// The raw hash bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Hashes a complete canonical content in one call.
    pub fn hash(content: &[u8]) -> Self {
        ObjectId(*blake3::hash(content).as_bytes())
    }

    /// The same hash of all that `r` yields, read 16 MiB at a time and hashed on every core:
    /// what names a stream of bytes that is not an object (a pack sent, the start of a record
    /// held).
    pub fn hash_reader(r: &mut dyn std::io::Read) -> std::io::Result<Self> {
        let mut hasher = blake3::Hasher::new();
        let mut piece = vec![0u8; 16 << 20];
        loop {
            let mut n = 0;
            while n < piece.len() {
                match r.read(&mut piece[n..]) {
                    Ok(0) => break,
                    Ok(got) => n += got,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if n == 0 {
                return Ok(ObjectId(*hasher.finalize().as_bytes()));
            }
            hasher.update_rayon(&piece[..n]);
        }
    }

    /// Lowercase hexadecimal, 64 characters.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(HEX[(b >> 4) as usize] as char);
            s.push(HEX[(b & 15) as usize] as char);
        }
        s
    }

    /// The first `n` hexadecimal characters, for display.
    pub fn short(&self, n: usize) -> String {
        let mut hex = self.to_hex();
        hex.truncate(n.min(64));
        hex
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({})", self.short(16))
    }
}

impl FromStr for ObjectId {
    type Err = ParseIdError;
    fn from_str(s: &str) -> Result<Self, ParseIdError> {
        let prefix: IdPrefix = s.parse()?;
        if prefix.len != 64 {
            return Err(ParseIdError {
                what: "object id",
                detail: format!("{s:?} is not 64 hex digits"),
            });
        }
        Ok(ObjectId(prefix.bytes))
    }
}

impl serde::Serialize for ObjectId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for ObjectId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Text that is not an object id (or an id prefix). Converts into
/// [`FormatError::Invalid`](crate::FormatError::Invalid) with the same message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what}: {detail}")]
pub struct ParseIdError {
    /// What was being parsed: "object id" or "object id prefix".
    pub what: &'static str,
    /// What is wrong with the text.
    pub detail: String,
}

/// A hexadecimal prefix of an [`ObjectId`], as typed on a command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdPrefix {
    bytes: [u8; 32],
    len: usize,
}

impl IdPrefix {
    /// Shortest prefix accepted.
    pub const MIN_LEN: usize = 4;

    /// Number of hex digits in the prefix.
    pub fn hex_len(&self) -> usize {
        self.len
    }

    /// The smallest id starting with this prefix (the start of a range scan).
    pub fn lower_bound(&self) -> ObjectId {
        ObjectId(self.bytes)
    }

    /// Whether `id` starts with this prefix.
    pub fn matches(&self, id: &ObjectId) -> bool {
        let full = self.len / 2;
        if id.0[..full] != self.bytes[..full] {
            return false;
        }
        if self.len % 2 == 1 {
            return id.0[full] >> 4 == self.bytes[full] >> 4;
        }
        true
    }
}

impl FromStr for IdPrefix {
    type Err = ParseIdError;
    fn from_str(s: &str) -> Result<Self, ParseIdError> {
        let raw = s.as_bytes();
        if raw.len() < Self::MIN_LEN || raw.len() > 64 {
            return Err(ParseIdError {
                what: "object id prefix",
                detail: format!("{s:?} must be 4 to 64 hex digits"),
            });
        }
        let mut bytes = [0u8; 32];
        for (i, &c) in raw.iter().enumerate() {
            let v = hex_val(c).ok_or_else(|| ParseIdError {
                what: "object id prefix",
                detail: format!("{s:?} is not hexadecimal"),
            })?;
            if i % 2 == 0 {
                bytes[i / 2] = v << 4;
            } else {
                bytes[i / 2] |= v;
            }
        }
        Ok(IdPrefix {
            bytes,
            len: raw.len(),
        })
    }
}

/// Streaming computation of an object id: feed the canonical prefix, then the data.
#[derive(Clone, Debug, Default)]
pub struct TensorHasher(blake3::Hasher);

impl TensorHasher {
    /// Starts a hash with the given canonical prefix (see [`crate::TensorHeader::canonical`]).
    pub fn new(prefix: &[u8]) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(prefix);
        TensorHasher(h)
    }

    /// Feeds more content bytes.
    pub fn update(&mut self, data: &[u8]) {
        // Large buffers hash faster with blake3's multi-threaded tree mode; below a few MiB the
        // thread hand-off costs more than it saves.
        if data.len() >= 1 << 22 {
            self.0.update_rayon(data);
        } else {
            self.0.update(data);
        }
    }

    /// The id of everything fed so far.
    pub fn finalize(&self) -> ObjectId {
        ObjectId(*self.0.finalize().as_bytes())
    }
}

impl std::io::Write for TensorHasher {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_hashes_as_its_bytes_do_whatever_its_reads_return() {
        // Over one 16 MiB piece, read 4,097 bytes at a time.
        struct Dribble<'a>(&'a [u8]);
        impl std::io::Read for Dribble<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(4097).min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let bytes: Vec<u8> = (0..(17u32 << 20)).map(|i| (i * 31 % 251) as u8).collect();
        let streamed = ObjectId::hash_reader(&mut Dribble(&bytes)).unwrap();
        assert_eq!(streamed, ObjectId::hash(&bytes));
        assert_eq!(
            ObjectId::hash_reader(&mut Dribble(&[])).unwrap(),
            ObjectId::hash(&[])
        );
    }

    #[test]
    fn hex_round_trip() {
        let id = ObjectId::hash(b"abc");
        assert_eq!(id.to_hex().len(), 64);
        assert_eq!(id.to_hex().parse::<ObjectId>().unwrap(), id);
        assert_eq!(id.to_hex().to_uppercase().parse::<ObjectId>().unwrap(), id);
    }

    #[test]
    fn streaming_equals_one_shot() {
        let mut h = TensorHasher::new(b"pre");
        h.update(b"fix and data");
        assert_eq!(h.finalize(), ObjectId::hash(b"prefix and data"));
    }

    #[test]
    fn prefixes() {
        let id = ObjectId::hash(b"x");
        let hex = id.to_hex();
        for n in 4..=64 {
            let p: IdPrefix = hex[..n].parse().unwrap();
            assert!(p.matches(&id), "len {n}");
            assert!(p.lower_bound() <= id);
        }
        let other = ObjectId::hash(b"y");
        let p: IdPrefix = hex[..12].parse().unwrap();
        assert!(!p.matches(&other) || other.to_hex()[..12] == hex[..12]);
        assert!("abc".parse::<IdPrefix>().is_err());
        assert!("zzzz".parse::<IdPrefix>().is_err());
        assert!(hex[..63].parse::<ObjectId>().is_err());
    }
}
