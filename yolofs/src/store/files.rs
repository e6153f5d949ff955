//! The store's files: what each is called, the image id record, the listing for `status`, and
//! the pruning of the files of base files Nova deleted.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use log::info;
use serde::Serialize;

use super::stamp::{read_stamp, stamp_path, BootImageKey, SourceKey};
use super::BootImageStore;
use crate::format;

/// Suffix of a boot image file in the store.
pub const BOOT_IMAGE_SUFFIX: &str = ".yolo";
/// Suffix of a boot image's verification stamp.
pub const STAMP_SUFFIX: &str = ".yolo.verified";
/// Suffix of the record of the Glance image id a base file belongs to.
pub const IMAGE_ID_SUFFIX: &str = ".image-id";
/// Suffix of the trace a learned boot image was built from.
pub const TRACE_SUFFIX: &str = ".trace";
/// The staging directory of installs, inside the store.
pub const INCOMING_DIR: &str = ".incoming";
/// Every file the store may hold for one base file, temporary ones included (longest first, so
/// the base file name is what is left after the first suffix that matches).
const STORE_SUFFIXES: [&str; 7] = [
    ".yolo.verified.tmp",
    STAMP_SUFFIX,
    ".yolo.tmp",
    BOOT_IMAGE_SUFFIX,
    ".image-id.tmp",
    IMAGE_ID_SUFFIX,
    TRACE_SUFFIX,
];
/// Longest image id kept (a boot image header holds 63 bytes; Glance ids are 36).
pub const MAX_IMAGE_ID_LEN: usize = 63;

/// Opens `path` for reading without following a symbolic link in its last component and without
/// blocking (a FIFO), and requires a regular file.
pub fn open_regular_file(path: &Path) -> std::io::Result<File> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => std::io::Error::new(std::io::ErrorKind::InvalidInput, "is a symbolic link"),
            _ => e,
        })?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "is not a regular file",
        ));
    }
    Ok(file)
}

/// A Glance image id as the store keeps it: 1 to [`MAX_IMAGE_ID_LEN`] printable ASCII characters.
pub fn check_image_id(image_id: &str) -> Result<&str, String> {
    if image_id.is_empty() || image_id.len() > MAX_IMAGE_ID_LEN || !image_id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "invalid image id {image_id:?}: 1 to {MAX_IMAGE_ID_LEN} printable ASCII characters"
        ));
    }
    Ok(image_id)
}

pub(super) fn boot_image_file_key(path: &Path) -> std::io::Result<(u64, i64, u64)> {
    let meta = fs::metadata(path)?;
    Ok((meta.ino(), meta.mtime_nsec() + meta.mtime() * 1_000_000_000, meta.len()))
}

/// A store file's key (see [`SourceKey`]; None: not there): what was read of it holds while
/// the key stays. The store's files are replaced by rename, never written in place; one changed
/// within the last [`SETTLE`](super::SETTLE) could change again without its ctime moving, so
/// what is read of it is not kept.
fn file_key(path: &Path) -> Option<SourceKey> {
    fs::metadata(path).ok().map(|meta| SourceKey::from_metadata(&meta))
}

/// What `status` read of one boot image's files (its header, stamp and image id record): read
/// again only when one of them, or its base file, changed. A listing then costs a few `stat`s per
/// boot image, not three reads: on a host of hundreds of images whose disk is busy (what YOLO is
/// for), reading them all for every `status` took longer than its clients wait.
#[derive(Clone)]
pub(super) struct Listed {
    files: [Option<SourceKey>; 3],
    base: Option<SourceKey>,
    image_id: Option<String>,
    stamped: bool,
}

/// One boot image of the store, for `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BootImageInfo {
    /// The base file it is for.
    pub file: String,
    /// The Glance image the base file belongs to: the id recorded for it, else the boot image's own.
    pub image_id: Option<String>,
    /// Loaded in memory (so verified), or with a stamp that matches the boot image and the base file.
    pub verified: bool,
    /// Why it was refused, if it was (and has not changed since).
    pub rejected: Option<String>,
    /// Learned on this host from its own boots (its trace is in the store), not installed: a
    /// boot image Glance publishes for the image replaces it.
    pub learned: bool,
}

impl BootImageStore {
    /// Path of the boot image for base file `name`.
    pub fn path_for(&self, name: &str) -> PathBuf {
        self.config.dir.join(format!("{name}{BOOT_IMAGE_SUFFIX}"))
    }

    /// The trace a learned boot image of `name` was built from.
    pub fn trace_path(&self, name: &str) -> PathBuf {
        self.config.dir.join(format!("{name}{TRACE_SUFFIX}"))
    }

    pub(super) fn image_id_path(&self, name: &str) -> PathBuf {
        self.config.dir.join(format!("{name}{IMAGE_ID_SUFFIX}"))
    }

    pub(super) fn incoming_dir(&self) -> PathBuf {
        self.config.dir.join(INCOMING_DIR)
    }

    /// The Glance image id recorded for base file `name`, if any.
    pub fn image_id(&self, name: &str) -> Option<String> {
        let mut text = String::new();
        File::open(self.image_id_path(name))
            .ok()?
            .take(MAX_IMAGE_ID_LEN as u64 + 1)
            .read_to_string(&mut text)
            .ok()?;
        check_image_id(text.trim()).ok().map(str::to_string)
    }

    /// Records the Glance image id base file `name` belongs to (base file names are a hash of it
    /// in Nova, which cannot be reversed, and the scheduler asks by image id). Returns whether the
    /// record changed.
    pub fn remember_image_id(&self, name: &str, image_id: &str) -> std::io::Result<bool> {
        if self.image_id(name).as_deref() == Some(image_id) {
            return Ok(false);
        }
        fs::create_dir_all(&self.config.dir)?;
        let path = self.image_id_path(name);
        // A name of its own: two requests for one base file may be under way at once.
        let tmp = self.config.dir.join(format!(
            ".{name}{IMAGE_ID_SUFFIX}.{}.tmp",
            self.staged.fetch_add(1, Ordering::Relaxed)
        ));
        fs::write(&tmp, image_id)?;
        fs::rename(tmp, path)?;
        Ok(true)
    }

    /// Every boot image in the store, with the image it serves and whether it is usable.
    pub fn boot_images(&self, source_dir: &Path) -> Vec<BootImageInfo> {
        let names = self.names();
        let infos = names
            .iter()
            .map(|name| self.boot_image_info(source_dir, name.clone()))
            .collect();
        self.listing
            .lock()
            .unwrap()
            .retain(|name, _| names.binary_search(name).is_ok());
        infos
    }

    /// The base files the store has a boot image for, sorted.
    pub(super) fn names(&self) -> Vec<String> {
        let Ok(entries) = fs::read_dir(&self.config.dir) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .filter_map(|n| n.strip_suffix(BOOT_IMAGE_SUFFIX).map(str::to_string))
            .filter(|n| !n.is_empty())
            .collect();
        names.sort();
        names
    }

    fn boot_image_info(&self, source_dir: &Path, name: String) -> BootImageInfo {
        let path = self.path_for(&name);
        let base = fs::metadata(source_dir.join(&name))
            .ok()
            .map(|meta| SourceKey::from_metadata(&meta));
        let listed = self.listed(&name, &path, base);
        let (loaded, rejected) = {
            let state = self.state.lock().unwrap();
            let loaded = match (state.loaded.peek(&name), &base) {
                (Some(loaded), Some(base)) => loaded.holds_for(base),
                _ => false,
            };
            let rejected = state
                .rejected
                .get(&name)
                .and_then(|r| (boot_image_file_key(&path).ok() == Some(r.file_key)).then(|| r.reason.clone()));
            (loaded, rejected)
        };
        let learned = self.trace_path(&name).exists();
        BootImageInfo {
            file: name,
            image_id: listed.image_id,
            verified: rejected.is_none() && (loaded || listed.stamped),
            rejected,
            learned,
        }
    }

    /// What boot image `name`'s files say (at `path`, for the base file as `base` is), read
    /// only if they or the base file changed since they were last read.
    fn listed(&self, name: &str, path: &Path, base: Option<SourceKey>) -> Listed {
        // Taken before the reads: a change meanwhile leaves a state that differs next time.
        let files = [
            file_key(path),
            file_key(&stamp_path(path)),
            file_key(&self.image_id_path(name)),
        ];
        if let Some(listed) = self.listing.lock().unwrap().get(name) {
            if listed.files == files && listed.base == base {
                return listed.clone();
            }
        }
        #[cfg(test)]
        self.listing_reads.fetch_add(1, Ordering::Relaxed);
        let header = format::read_header(path).ok();
        let stamp = read_stamp(path);
        let recorded_id = self.image_id(name);
        let stamped = match (&header, &stamp, &base) {
            (Some(header), Some(stamp), Some(base)) => stamp.vouches_for(BootImageKey::of_header(header), base),
            _ => false,
        };
        // Kept only if every file there was read (a failed read is not the answer) and none
        // of them, nor the base file, changed too recently to be told from a later change.
        let read = [header.is_some(), stamp.is_some(), recorded_id.is_some()];
        let keep = files.iter().zip(read).all(|(key, read)| key.is_none() || read)
            && files.iter().chain([&base]).flatten().all(SourceKey::is_settled);
        let listed = Listed {
            files,
            base,
            image_id: recorded_id.or_else(|| header.map(|h| h.image_id).filter(|id| !id.is_empty())),
            stamped,
        };
        if keep {
            self.listing.lock().unwrap().insert(name.to_string(), listed.clone());
        }
        listed
    }

    /// Deletes the store's files of base files that are no longer in `source_dir` (Nova's image
    /// cache manager removed them), except those `keep` names (recordings under way), and empties
    /// the staging directory. Returns the files deleted.
    pub fn prune(&self, source_dir: &Path, keep: impl Fn(&str) -> bool) -> std::io::Result<Vec<String>> {
        let _installing = self.install_lock.lock().unwrap();
        let mut removed = Vec::new();
        let entries = match fs::read_dir(&self.config.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(removed),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let Ok(file_name) = entry?.file_name().into_string() else {
                continue;
            };
            if file_name.starts_with('.') {
                continue;
            }
            let Some(name) = STORE_SUFFIXES.iter().find_map(|s| file_name.strip_suffix(s)) else {
                continue;
            };
            if name.is_empty() || keep(name) {
                continue;
            }
            match fs::symlink_metadata(source_dir.join(name)) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                _ => continue,
            }
            fs::remove_file(self.config.dir.join(&file_name))?;
            self.evict(name);
            removed.push(file_name);
        }
        match fs::remove_dir_all(self.incoming_dir()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        removed.sort();
        // Their blocks, once the removals are durable, at once.
        let boot_images: Vec<&str> = removed
            .iter()
            .filter_map(|f| f.strip_suffix(BOOT_IMAGE_SUFFIX))
            .collect();
        self.unpacked(&boot_images);
        if !removed.is_empty() {
            info!(
                "removed the boot image files of deleted base files: {}",
                removed.join(", ")
            );
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fixture::{content, Fixture, IMAGE};
    use crate::store::SETTLE;

    #[test]
    fn prune_removes_the_files_of_deleted_base_files_only() {
        let f = Fixture::new(1 << 30);
        f.install(&f.candidate(&content(0), IMAGE), IMAGE).unwrap();
        fs::write(f.base_dir().join("other"), b"x").unwrap();
        for suffix in [".yolo", ".yolo.verified", ".image-id", ".trace", ".yolo.tmp"] {
            fs::write(f.dir.path().join(format!("store/gone{suffix}")), b"x").unwrap();
            fs::write(f.dir.path().join(format!("store/other{suffix}")), b"x").unwrap();
            fs::write(f.dir.path().join(format!("store/recording{suffix}")), b"x").unwrap();
        }
        fs::create_dir_all(f.store.incoming_dir()).unwrap();
        fs::write(f.store.incoming_dir().join("left.yolo"), b"x").unwrap();
        let removed = f.store.prune(&f.base_dir(), |name| name == "recording").unwrap();
        assert_eq!(
            removed,
            [
                "gone.image-id",
                "gone.trace",
                "gone.yolo",
                "gone.yolo.tmp",
                "gone.yolo.verified"
            ]
        );
        assert!(!f.store.incoming_dir().exists());
        assert!(f.store.path_for("disk").exists() && f.store.path_for("other").exists());
        assert!(f.store.path_for("recording").exists());
        fs::remove_file(f.base_dir().join("disk")).unwrap();
        f.store.prune(&f.base_dir(), |_| false).unwrap();
        assert!(!f.store.path_for("disk").exists());
    }

    #[test]
    fn image_ids_are_remembered_once() {
        let f = Fixture::new(1 << 30);
        assert_eq!(f.store.image_id("disk"), None);
        assert!(f.store.remember_image_id("disk", IMAGE).unwrap());
        assert!(!f.store.remember_image_id("disk", IMAGE).unwrap());
        assert_eq!(f.store.image_id("disk").as_deref(), Some(IMAGE));
        assert!(f.store.remember_image_id("disk", "other").unwrap());
        assert_eq!(f.store.image_id("disk").as_deref(), Some("other"));
        // A boot image without its record is attributed by its header.
        f.install(&f.candidate(&content(0), IMAGE), IMAGE).unwrap();
        fs::remove_file(f.store.image_id_path("disk")).unwrap();
        assert_eq!(f.store.boot_images(&f.base_dir())[0].image_id.as_deref(), Some(IMAGE));
    }

    #[test]
    fn a_listing_reads_a_boot_images_files_again_only_when_they_changed() {
        let f = Fixture::new(1 << 30);
        f.install(&f.candidate(&content(0), IMAGE), IMAGE).unwrap();
        let reads = || f.store.listing_reads.load(Ordering::Relaxed);
        // Listed twice once settled: the second listing reads nothing. Each change below is
        // made to files whose listing has been kept since they settled.
        let listed_settled = || {
            std::thread::sleep(SETTLE);
            let first = f.store.boot_images(&f.base_dir());
            let after_first = reads();
            assert_eq!(f.store.boot_images(&f.base_dir()), first);
            assert_eq!(reads(), after_first);
            first[0].clone()
        };
        let listed = || f.store.boot_images(&f.base_dir())[0].clone();
        assert!(listed_settled().verified);
        // The image id record.
        assert!(f.store.remember_image_id("disk", "other").unwrap());
        assert_eq!(listed().image_id.as_deref(), Some("other"));
        listed_settled();
        fs::remove_file(f.store.image_id_path("disk")).unwrap();
        assert_eq!(listed().image_id.as_deref(), Some(IMAGE));
        // The stamp, gone and back.
        listed_settled();
        let stamp = stamp_path(&f.store.path_for("disk"));
        let kept = fs::read(&stamp).unwrap();
        fs::remove_file(&stamp).unwrap();
        assert!(!listed().verified);
        listed_settled();
        fs::write(&stamp, kept).unwrap();
        assert!(listed().verified);
        // The base file: the stamp no longer holds for it.
        listed_settled();
        fs::write(f.base_dir().join("disk"), content(1)).unwrap();
        assert!(!listed().verified);
        // The boot image file, replaced by one of another image.
        listed_settled();
        fs::rename(f.candidate(&content(1), "another-image"), f.store.path_for("disk")).unwrap();
        assert_eq!(listed().image_id.as_deref(), Some("another-image"));
        // A removed boot image is forgotten.
        fs::remove_file(f.store.path_for("disk")).unwrap();
        assert!(f.store.boot_images(&f.base_dir()).is_empty());
        assert!(f.store.listing.lock().unwrap().is_empty());
    }
}
