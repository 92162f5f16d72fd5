//! A manifest read in place: its encoded bytes checked in one walk, then walked again on
//! demand, file by file and region by region, without decoding the whole tree. A reader that
//! lists a million tensors holds the manifest's own bytes and one small record a file, not a
//! decoded [`Manifest`] (several hundred bytes a tensor). [`Manifest::decode`] is this walk
//! too, so there is one reading of the layout (`docs/FORMAT.md`).
//!
//! Version 1 described one safetensors file (its header, metadata and tensors); it is read as
//! a tree of that one file, [`V1_FILE_PATH`], whose first region is the header.

use std::borrow::Cow;

use super::{
    Entry, Exactness, FileFormat, Lossy, Manifest, MomentPair, PairSource, Region, TreeFile,
    V1_FILE_PATH,
};
use crate::names::check_tree;
use crate::wire::Reader;
use crate::{Dtype, FormatError, ObjectId, ObjectKind, TensorHeader};

use super::encoding::{BYTES, CURRENT_VERSION, EXECUTABLE, INLINE, TENSOR};

/// What every re-walk of checked bytes may assume.
const CHECKED: &str = "manifest bytes were checked when the view was made";

/// A manifest's encoded bytes, checked (everything [`Manifest::decode`] checks), with one
/// record a file.
#[derive(Clone, Debug)]
pub struct ManifestView<'a> {
    version: u16,
    files: Vec<FileView<'a>>,
    pairs: &'a [u8],
    tensors: u64,
}

/// One file of a [`ManifestView`].
#[derive(Clone, Copy, Debug)]
pub struct FileView<'a> {
    /// Its path in the tree.
    pub path: &'a str,
    /// How it was split.
    pub format: FileFormat,
    /// Whether checkout marks it executable.
    pub executable: bool,
    /// Why a file that looked like a format mdl splits was stored as bytes; empty otherwise.
    pub note: &'a str,
    metadata: &'a [u8],
    regions: &'a [u8],
    region_count: u32,
    /// A version 1 manifest's header JSON: the file's first region, given its length prefix.
    v1_head: Option<&'a [u8]>,
    len: u64,
    tensor_count: u32,
    tensor_bytes: u64,
}

/// A region of a [`FileView`].
#[derive(Clone, Debug, PartialEq)]
pub enum RegionView<'a> {
    /// Bytes kept in the manifest (borrowed, but for a version 1 header).
    Inline(Cow<'a, [u8]>),
    /// Bytes stored as an object.
    Bytes {
        /// The object.
        id: ObjectId,
        /// Its length.
        len: u64,
    },
    /// A tensor.
    Tensor(EntryView<'a>),
}

/// A tensor of a [`FileView`]: its name, the rest read when asked. Two are equal when their
/// records are (what the manifest's id hashes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EntryView<'a> {
    /// Its name in the file.
    pub name: &'a str,
    /// Its record after the name: dtype, shape, id, exactness.
    rest: &'a [u8],
}

impl<'a> ManifestView<'a> {
    /// Checks `bytes` as [`Manifest::decode`] does, keeping one record a file.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(bytes, "manifest");
        let kind = r.u8()?;
        if kind != ObjectKind::Manifest as u8 {
            return Err(FormatError::invalid(
                "manifest",
                format!("object kind {kind}"),
            ));
        }
        let version = r.u16()?;
        let view = match version {
            1 => parse_v1(&mut r)?,
            2 => parse_v2(&mut r)?,
            found => {
                return Err(FormatError::UnsupportedVersion {
                    what: "manifest",
                    found,
                    supported: CURRENT_VERSION,
                })
            }
        };
        r.finish()?;
        check_tree(view.files.iter().map(|f| f.path))?;
        for p in view.pairs() {
            if [p.param, p.exp_avg, p.exp_avg_sq]
                .iter()
                .any(|&i| u64::from(i) >= view.tensors)
            {
                return Err(FormatError::invalid(
                    "manifest",
                    format!(
                        "moment pair names a tensor past the {} there are",
                        view.tensors
                    ),
                ));
            }
        }
        Ok(view)
    }

    /// The layout version the bytes are encoded with (1 or 2).
    pub fn version(&self) -> u16 {
        self.version
    }

    /// The files, sorted by path.
    pub fn files(&self) -> &[FileView<'a>] {
        &self.files
    }

    /// The file at `path`.
    pub fn file(&self, path: &str) -> Option<&FileView<'a>> {
        self.files
            .binary_search_by(|f| f.path.cmp(path))
            .ok()
            .map(|i| &self.files[i])
    }

    /// How many tensors the tree holds.
    pub fn tensor_count(&self) -> u64 {
        self.tensors
    }

    /// Every tensor of every file, in tree then file order, with its file's index.
    pub fn tensors(&self) -> impl Iterator<Item = (usize, EntryView<'a>)> + '_ {
        self.files
            .iter()
            .enumerate()
            .flat_map(|(i, f)| f.tensors().map(move |e| (i, e)))
    }

    /// The moment pairing of the tensors.
    pub fn pairs(&self) -> impl Iterator<Item = MomentPair> + 'a {
        self.pairs.chunks_exact(PAIR_LEN).map(|p| {
            let u = |at: usize| u32::from_le_bytes(p[at..at + 4].try_into().expect("4 bytes"));
            MomentPair {
                param: u(0),
                exp_avg: u(4),
                exp_avg_sq: u(8),
                source: pair_source(p[12]).expect(CHECKED),
            }
        })
    }

    /// Total size of the tree's files.
    pub fn len(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }

    /// Whether the tree holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole manifest, decoded.
    pub fn to_manifest(&self) -> Manifest {
        Manifest {
            files: self.files.iter().map(FileView::to_file).collect(),
            pairs: self.pairs().collect(),
            version: self.version,
        }
    }
}

impl<'a> FileView<'a> {
    /// The file's size.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many regions it is cut into.
    pub fn region_count(&self) -> usize {
        self.region_count as usize
    }

    /// How many tensors it holds.
    pub fn tensor_count(&self) -> u32 {
        self.tensor_count
    }

    /// The bytes of its tensors.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensor_bytes
    }

    /// A safetensors file's `__metadata__` pairs, sorted by key.
    pub fn metadata(&self) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let mut r = Reader::new(self.metadata, "manifest");
        std::iter::from_fn(move || {
            (!r.is_empty()).then(|| (r.str().expect(CHECKED), r.str().expect(CHECKED)))
        })
    }

    /// Its regions, in order.
    pub fn regions(&self) -> impl Iterator<Item = RegionView<'a>> + 'a {
        let mut head = self.v1_head;
        let v1 = head.is_some();
        let mut r = Reader::new(self.regions, "manifest");
        std::iter::from_fn(move || {
            if let Some(json) = head.take() {
                let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
                bytes.extend_from_slice(json);
                return Some(RegionView::Inline(Cow::Owned(bytes)));
            }
            if r.is_empty() {
                return None;
            }
            let tag = if v1 { TENSOR } else { r.u8().expect(CHECKED) };
            Some(region(tag, &mut r).expect(CHECKED))
        })
    }

    /// Its tensors, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = EntryView<'a>> + 'a {
        self.regions().filter_map(|r| match r {
            RegionView::Tensor(e) => Some(e),
            _ => None,
        })
    }

    /// The file, decoded.
    pub fn to_file(&self) -> TreeFile {
        let mut regions = Vec::with_capacity(self.region_count as usize);
        regions.extend(self.regions().map(|r| r.to_region()));
        TreeFile {
            path: self.path.to_string(),
            format: self.format,
            executable: self.executable,
            note: self.note.to_string(),
            metadata: self
                .metadata()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            regions,
        }
    }
}

impl RegionView<'_> {
    /// The region's length in the file.
    pub fn len(&self) -> u64 {
        match self {
            RegionView::Inline(b) => b.len() as u64,
            RegionView::Bytes { len, .. } => *len,
            RegionView::Tensor(e) => e.data_len(),
        }
    }

    /// Whether the region holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The object the region's bytes are stored in, with its header; `None` for inline bytes.
    pub fn object(&self) -> Option<(ObjectId, TensorHeader)> {
        match self {
            RegionView::Inline(_) => None,
            RegionView::Bytes { id, len } => Some((*id, super::bytes_header(*len))),
            RegionView::Tensor(e) => Some((e.id(), e.header())),
        }
    }

    /// The region, decoded.
    pub fn to_region(&self) -> Region {
        match self {
            RegionView::Inline(b) => Region::Inline(b.to_vec()),
            RegionView::Bytes { id, len } => Region::Bytes { id: *id, len: *len },
            RegionView::Tensor(e) => Region::Tensor(e.to_entry()),
        }
    }
}

impl EntryView<'_> {
    fn reader(&self) -> Reader<'_> {
        Reader::new(self.rest, "manifest")
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        Dtype::try_from(self.rest[0]).expect(CHECKED)
    }

    /// Dimensions.
    pub fn shape(&self) -> Vec<u64> {
        let mut r = self.reader();
        r.take(1).expect(CHECKED);
        let rank = r.u8().expect(CHECKED);
        (0..rank).map(|_| r.u64().expect(CHECKED)).collect()
    }

    /// Dtype and shape.
    pub fn header(&self) -> TensorHeader {
        TensorHeader::new(self.dtype(), self.shape())
    }

    /// The tensor's bytes in the file (checked not to overflow).
    pub fn data_len(&self) -> u64 {
        self.header().data_len().expect(CHECKED)
    }

    /// The tensor object.
    pub fn id(&self) -> ObjectId {
        let rank = self.rest[1] as usize;
        let at = 2 + 8 * rank;
        ObjectId::from_bytes(self.rest[at..at + 32].try_into().expect(CHECKED))
    }

    /// Whether the stored tensor is a lossy reconstruction.
    pub fn is_lossy(&self) -> bool {
        self.rest[2 + 8 * self.rest[1] as usize + 32] != 0
    }

    /// Lossless or lossy, with the lossy details.
    pub fn exactness(&self) -> Exactness {
        let mut r = self.reader();
        r.take(2 + 8 * self.rest[1] as usize + 32).expect(CHECKED);
        exactness(&mut r).expect(CHECKED)
    }

    /// The entry, decoded.
    pub fn to_entry(&self) -> Entry {
        Entry {
            name: self.name.to_string(),
            header: self.header(),
            id: self.id(),
            exactness: self.exactness(),
        }
    }
}

const PAIR_LEN: usize = 13;

fn pair_source(tag: u8) -> Result<PairSource, FormatError> {
    match tag {
        0 => Ok(PairSource::Names),
        1 => Ok(PairSource::OptimizerOrder),
        2 => Ok(PairSource::Client),
        tag => Err(FormatError::UnknownTag {
            what: "pair source",
            tag,
        }),
    }
}

/// Walks and checks `n` regions of a file, or (`v1`) `n` tensor records: their bytes, with
/// the file's size, tensor count and tensor bytes.
fn walk_regions<'a>(
    r: &mut Reader<'a>,
    n: usize,
    v1: bool,
    path: &str,
) -> Result<(&'a [u8], u64, u32, u64), FormatError> {
    let start = r.remaining();
    let (mut len, mut tensors, mut tensor_bytes) = (0u64, 0u32, 0u64);
    for _ in 0..n {
        let tag = if v1 { TENSOR } else { r.u8()? };
        let region = region(tag, r)?;
        if let RegionView::Tensor(_) = region {
            tensors += 1;
            tensor_bytes = tensor_bytes.saturating_add(region.len());
        }
        len = len
            .checked_add(region.len())
            .ok_or_else(|| FormatError::invalid("manifest", format!("{path:?} size overflows")))?;
    }
    let used = start.len() - r.remaining().len();
    Ok((&start[..used], len, tensors, tensor_bytes))
}

/// One region after its tag, checked.
fn region<'a>(tag: u8, r: &mut Reader<'a>) -> Result<RegionView<'a>, FormatError> {
    Ok(match tag {
        INLINE => RegionView::Inline(Cow::Borrowed(r.bytes()?)),
        BYTES => RegionView::Bytes {
            len: r.u64()?,
            id: r.id()?,
        },
        TENSOR => RegionView::Tensor(entry(r)?),
        tag => {
            return Err(FormatError::UnknownTag {
                what: "region",
                tag,
            })
        }
    })
}

/// One tensor record, checked: dtype known, rank bounded, size without overflow, exactness
/// tags known.
fn entry<'a>(r: &mut Reader<'a>) -> Result<EntryView<'a>, FormatError> {
    let name = r.str()?;
    let start = r.remaining();
    let dtype = Dtype::try_from(r.u8()?)?;
    let rank = r.u8()? as usize;
    if rank > TensorHeader::MAX_RANK {
        return Err(FormatError::invalid("manifest", format!("rank {rank}")));
    }
    let shape = (0..rank).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
    if TensorHeader::new(dtype, shape).data_len().is_none() {
        return Err(FormatError::invalid(
            "manifest",
            format!("{name:?} size overflows"),
        ));
    }
    r.id()?;
    exactness(r)?;
    let used = start.len() - r.remaining().len();
    Ok(EntryView {
        name,
        rest: &start[..used],
    })
}

fn exactness(r: &mut Reader<'_>) -> Result<Exactness, FormatError> {
    Ok(match r.u8()? {
        0 => Exactness::Lossless,
        // Tag 1 (settings and relative error only) was never written by a release.
        2 => Exactness::Lossy(Lossy {
            settings: r.str()?.to_string(),
            max_abs_error: r.f64()?,
            rel_error: r.f64()?,
            est_delta_loss: match r.u8()? {
                0 => None,
                1 => Some(r.f64()?),
                tag => {
                    return Err(FormatError::UnknownTag {
                        what: "loss estimate",
                        tag,
                    })
                }
            },
        }),
        tag => {
            return Err(FormatError::UnknownTag {
                what: "exactness",
                tag,
            })
        }
    })
}

/// A file's `__metadata__` pairs, checked: their bytes.
fn walk_metadata<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], FormatError> {
    let n = r.count(8)?;
    let start = r.remaining();
    for _ in 0..n {
        r.str()?;
        r.str()?;
    }
    Ok(&start[..start.len() - r.remaining().len()])
}

fn parse_v1<'a>(r: &mut Reader<'a>) -> Result<ManifestView<'a>, FormatError> {
    let head = r.bytes()?;
    let metadata = walk_metadata(r)?;
    let n = r.count(4 + 2 + 32 + 1)?;
    let (regions, len, tensors, tensor_bytes) = walk_regions(r, n, true, V1_FILE_PATH)?;
    let file = FileView {
        path: V1_FILE_PATH,
        format: FileFormat::Safetensors,
        executable: false,
        note: "",
        metadata,
        regions,
        region_count: n as u32 + 1,
        v1_head: Some(head),
        len: len
            .checked_add(8 + head.len() as u64)
            .ok_or_else(|| FormatError::invalid("manifest", "size overflows"))?,
        tensor_count: tensors,
        tensor_bytes,
    };
    Ok(ManifestView {
        version: 1,
        files: vec![file],
        pairs: &[],
        tensors: u64::from(tensors),
    })
}

fn parse_v2<'a>(r: &mut Reader<'a>) -> Result<ManifestView<'a>, FormatError> {
    let n = r.count(4 + 1 + 1 + 4 + 4 + 4)?;
    let mut files = Vec::with_capacity(n);
    let mut all_tensors = 0u64;
    for _ in 0..n {
        let path = r.str()?;
        let format = FileFormat::try_from(r.u8()?)?;
        let flags = r.u8()?;
        if flags & !EXECUTABLE != 0 {
            return Err(FormatError::invalid(
                "manifest",
                format!("{path:?}: unknown flags {flags:#x}"),
            ));
        }
        let note = r.str()?;
        let metadata = walk_metadata(r)?;
        if format != FileFormat::Safetensors && !metadata.is_empty() {
            return Err(FormatError::invalid(
                "manifest",
                format!("{path:?} has metadata but is not safetensors"),
            ));
        }
        let count = r.count(1 + 4)?;
        let (regions, len, tensors, tensor_bytes) = walk_regions(r, count, false, path)?;
        all_tensors += u64::from(tensors);
        files.push(FileView {
            path,
            format,
            executable: flags & EXECUTABLE != 0,
            note,
            metadata,
            regions,
            region_count: count as u32,
            v1_head: None,
            len,
            tensor_count: tensors,
            tensor_bytes,
        });
    }
    let n = r.count(PAIR_LEN)?;
    let pairs = r.take(n * PAIR_LEN)?;
    for p in pairs.chunks_exact(PAIR_LEN) {
        pair_source(p[12])?;
    }
    Ok(ManifestView {
        version: 2,
        files,
        pairs,
        tensors: all_tensors,
    })
}
