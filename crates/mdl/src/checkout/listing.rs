//! What a listing of a commit's files says of each (path, size, tensors, content id), read
//! from its manifest in place: a commit of a million tensors is listed holding its manifest's
//! bytes and a record a file, not laid out.

use mdl_format::{ObjectId, RegionView};
use mdl_store::StoreError;

use super::layout::ContentId;
use crate::{revision, Error, Repository, Result};

/// The files of a commit, as a listing gives them.
#[derive(Clone, Debug)]
pub struct Listing {
    /// The commit.
    pub commit: ObjectId,
    /// Its files, sorted by path.
    pub files: Vec<ListedFile>,
}

/// One file of a [`Listing`]: what [`super::FileLayout`] would say of it.
#[derive(Clone, Debug)]
pub struct ListedFile {
    /// Its path in the tree.
    pub path: String,
    /// Its length.
    pub len: u64,
    /// Whether checkout marks it executable.
    pub executable: bool,
    /// How many tensors it holds.
    pub tensors: u32,
    /// How many of them are lossy reconstructions.
    pub lossy_tensors: u32,
    /// [`super::FileLayout::content_id`].
    pub content_id: ObjectId,
}

/// The files of the commit `rev` names. Like [`super::layout`], a commit some of whose objects
/// retention expired is [`Error::Expired`], one missing an object is an error.
pub fn listing(repo: &Repository, rev: &str) -> Result<Listing> {
    let commit = revision::resolve(repo, rev)?;
    let manifest_id = repo.load_commit(&commit)?.manifest;
    let bytes = repo.load_manifest_bytes(&manifest_id)?;
    let manifest = crate::view_manifest(&manifest_id, &bytes)?;
    let meta = repo.store().meta().read()?;
    let mut expired = Vec::new();
    let mut files = Vec::with_capacity(manifest.files().len());
    for f in manifest.files() {
        let (mut id, mut lossy_tensors) = (ContentId::new(), 0);
        for r in f.regions() {
            let object = match &r {
                RegionView::Inline(bytes) => {
                    id.inline(bytes);
                    continue;
                }
                RegionView::Bytes { id, .. } => *id,
                RegionView::Tensor(e) => {
                    lossy_tensors += u32::from(e.is_lossy());
                    e.id()
                }
            };
            id.object(&object);
            if meta.object(&object)?.is_none() {
                if meta.expired(&object)?.is_none() {
                    return Err(StoreError::Missing(object).into());
                }
                expired.push(match &r {
                    RegionView::Tensor(e) => e.name.to_string(),
                    _ => format!("{} (bytes)", f.path),
                });
            }
        }
        files.push(ListedFile {
            path: f.path.to_string(),
            len: f.len(),
            executable: f.executable,
            tensors: f.tensor_count(),
            lossy_tensors,
            content_id: id.finish(),
        });
    }
    if !expired.is_empty() {
        return Err(Error::Expired {
            commit: commit.short(12),
            tensors: expired,
        });
    }
    Ok(Listing { commit, files })
}
