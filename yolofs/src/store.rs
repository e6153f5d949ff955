//! The local boot image store and its in-memory cache.
//!
//! Boot images live in a directory as `<base file name>.yolo`. A boot image is served only after
//! it has been verified against the base file it claims to describe: every extent compared with
//! the file. Verifying reads the boot's ranges from the base file, which is exactly the I/O YOLO
//! exists to avoid at boot, so the result is remembered in a stamp file (`<name>.yolo.verified`)
//! naming both sides: the boot image by its header and index CRCs, the base file by device, inode,
//! size and birth time. Nova's base files are immutable once renamed into place, so a stamp that
//! still matches both sides means the comparison still holds; anything else is verified again.
//! `yolofs verify --mark` writes the stamp right after Nova downloads a base (while it is still in
//! page cache); the daemon verifies by itself when no valid stamp exists.
//!
//! Loaded boot images stay in memory under a byte budget, least recently used evicted first, and
//! are optionally locked with `mlock` so memory pressure cannot page them out (the thesis' point
//! against relying on the page cache). A boot image that fails validation or verification is
//! remembered as rejected (with why) until its file changes, and its base file is passed through.

use std::collections::HashMap;
use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::UNIX_EPOCH;

use log::{debug, info, warn};
use lru::LruCache;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::format::{BootImage, FormatError, VerifyError};

/// Identity of a base file: what a verification stamp is valid for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceKey {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Birth time in nanoseconds, where the filesystem records one (mtime changes: Nova touches
    /// base files in use, so it cannot be part of the key).
    pub btime_ns: Option<u128>,
}

impl SourceKey {
    pub fn of(file: &File) -> std::io::Result<SourceKey> {
        let meta = file.metadata()?;
        Ok(SourceKey {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            btime_ns: meta
                .created()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_nanos()),
        })
    }
}

/// Identity of a boot image's content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootImageKey {
    pub header_crc32c: u32,
    pub index_crc32c: u32,
}

impl BootImageKey {
    pub fn of(image: &BootImage) -> BootImageKey {
        BootImageKey {
            header_crc32c: image.header_crc32c,
            index_crc32c: image.index_crc32c,
        }
    }
}

/// The record that a boot image matched a base file.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    pub boot_image: BootImageKey,
    pub source: SourceKey,
}

/// Path of the stamp file that goes with a boot image file.
pub fn stamp_path(boot_image_path: &Path) -> PathBuf {
    let mut name = boot_image_path.as_os_str().to_owned();
    name.push(".verified");
    PathBuf::from(name)
}

/// Writes the verification stamp for `image` (read from `boot_image_path`) and `source`.
pub fn write_stamp(boot_image_path: &Path, image: &BootImage, source: &File) -> std::io::Result<()> {
    let stamp = Stamp {
        boot_image: BootImageKey::of(image),
        source: SourceKey::of(source)?,
    };
    let path = stamp_path(boot_image_path);
    let tmp = path.with_extension("verified.tmp");
    fs::write(&tmp, serde_json::to_vec(&stamp)?)?;
    fs::rename(tmp, path)
}

fn stamp_matches(boot_image_path: &Path, image: &BootImage, source: &SourceKey) -> bool {
    let Ok(bytes) = fs::read(stamp_path(boot_image_path)) else {
        return false;
    };
    let Ok(stamp) = serde_json::from_slice::<Stamp>(&bytes) else {
        return false;
    };
    stamp.boot_image == BootImageKey::of(image) && stamp.source == *source
}

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("no boot image for {0}")]
    Missing(String),
    #[error("boot image for {name} is invalid: {source}")]
    Invalid { name: String, source: FormatError },
    #[error("boot image for {name} does not match its base file: {source}")]
    Mismatch { name: String, source: VerifyError },
    #[error("boot image for {name} is for a {expected}-byte file, the base file has {actual} bytes")]
    WrongSize { name: String, expected: u64, actual: u64 },
    #[error("I/O error on {name}: {source}")]
    Io { name: String, source: std::io::Error },
    #[error("boot image for {name} was refused earlier: {reason}")]
    Refused { name: String, reason: String },
}

/// Settings of the store.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub dir: PathBuf,
    /// Most bytes of boot image data kept in memory.
    pub memory_budget: u64,
    /// Lock loaded boot images in RAM.
    pub lock_in_memory: bool,
}

struct Loaded {
    image: Arc<BootImage>,
    source: SourceKey,
}

/// What is known of a boot image file that was refused, so it is not retried at every open.
struct Rejection {
    file_key: (u64, i64, u64),
    source: SourceKey,
    reason: String,
}

/// A summary of one loaded boot image, for `status`.
#[derive(Debug, Clone, Serialize)]
pub struct LoadedInfo {
    pub name: String,
    pub extents: usize,
    pub bytes: u64,
    pub locked: bool,
    pub image_id: String,
}

pub struct BootImageStore {
    config: StoreConfig,
    state: Mutex<StoreState>,
}

struct StoreState {
    loaded: LruCache<String, Loaded>,
    used_bytes: u64,
    rejected: HashMap<String, Rejection>,
}

fn boot_image_file_key(path: &Path) -> std::io::Result<(u64, i64, u64)> {
    let meta = fs::metadata(path)?;
    Ok((meta.ino(), meta.mtime_nsec() + meta.mtime() * 1_000_000_000, meta.len()))
}

impl BootImageStore {
    pub fn new(config: StoreConfig) -> BootImageStore {
        BootImageStore {
            config,
            state: Mutex::new(StoreState {
                loaded: LruCache::unbounded(),
                used_bytes: 0,
                rejected: HashMap::new(),
            }),
        }
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Path of the boot image for base file `name`.
    pub fn path_for(&self, name: &str) -> PathBuf {
        self.config.dir.join(format!("{name}.yolo"))
    }

    /// The verified boot image for base file `name`, opened as `source`, loading it if needed.
    ///
    /// Never fails: a missing, corrupt or mismatching boot image means `None` (serve the file by
    /// passthrough), logged once.
    pub fn get(&self, name: &str, source: &File) -> Option<Arc<BootImage>> {
        match self.load(name, source) {
            Ok(image) => Some(image),
            Err(StoreError::Missing(_)) => None,
            Err(err) => {
                debug!("{name}: serving by passthrough: {err}");
                None
            }
        }
    }

    /// Like [`get`](Self::get), but says why there is no boot image.
    pub fn load(&self, name: &str, source: &File) -> Result<Arc<BootImage>, StoreError> {
        let io = |source| StoreError::Io {
            name: name.to_string(),
            source,
        };
        let source_key = SourceKey::of(source).map_err(io)?;
        let path = self.path_for(name);
        {
            let mut state = self.state.lock().unwrap();
            if let Some(loaded) = state.loaded.get(name) {
                if loaded.source == source_key {
                    return Ok(loaded.image.clone());
                }
            }
            if let Some(rejection) = state.rejected.get(name) {
                let same_file = boot_image_file_key(&path).ok() == Some(rejection.file_key);
                if same_file && rejection.source == source_key {
                    return Err(StoreError::Refused {
                        name: name.into(),
                        reason: rejection.reason.clone(),
                    });
                }
            }
        }
        let file_key = match boot_image_file_key(&path) {
            Ok(key) => key,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(StoreError::Missing(name.into())),
            Err(e) => return Err(io(e)),
        };
        // Load and verify without holding the lock: other files keep opening meanwhile.
        match self.load_verified(name, &path, source, &source_key) {
            Ok(image) => {
                let image = Arc::new(image);
                self.insert(name, image.clone(), source_key);
                Ok(image)
            }
            Err(err) => {
                warn!("{name}: boot image refused, the base file is served by passthrough: {err}");
                let rejection = Rejection {
                    file_key,
                    source: source_key,
                    reason: err.to_string(),
                };
                self.state.lock().unwrap().rejected.insert(name.to_string(), rejection);
                Err(err)
            }
        }
    }

    fn load_verified(&self, name: &str, path: &Path, source: &File, key: &SourceKey) -> Result<BootImage, StoreError> {
        let mut image = BootImage::open(path).map_err(|source| match source {
            FormatError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => StoreError::Missing(name.into()),
            source => StoreError::Invalid {
                name: name.into(),
                source,
            },
        })?;
        if image.identity.source_size != key.size {
            return Err(StoreError::WrongSize {
                name: name.into(),
                expected: image.identity.source_size,
                actual: key.size,
            });
        }
        if !stamp_matches(path, &image, key) {
            info!(
                "{name}: verifying boot image against the base file ({} bytes in {} extents)",
                image.covered_bytes(),
                image.extents.len()
            );
            image.verify_against(source).map_err(|source| StoreError::Mismatch {
                name: name.into(),
                source,
            })?;
            if let Err(e) = write_stamp(path, &image, source) {
                warn!("{name}: could not write the verification stamp: {e}");
            }
        }
        if self.config.lock_in_memory {
            if let Err(e) = image.lock_in_memory() {
                warn!("{name}: could not lock the boot image in RAM ({e}); it stays in ordinary memory");
            }
        }
        info!(
            "{name}: boot image loaded: {} bytes in {} extents{}",
            image.data_len(),
            image.extents.len(),
            if image.is_locked() { ", locked in RAM" } else { "" }
        );
        Ok(image)
    }

    fn insert(&self, name: &str, image: Arc<BootImage>, source: SourceKey) {
        let mut state = self.state.lock().unwrap();
        state.rejected.remove(name);
        let bytes = image.data_len();
        if bytes > self.config.memory_budget {
            warn!("{name}: boot image ({bytes} bytes) exceeds the memory budget; used for open files only, not cached");
            return;
        }
        if let Some(old) = state.loaded.put(name.to_string(), Loaded { image, source }) {
            state.used_bytes -= old.image.data_len();
        }
        state.used_bytes += bytes;
        while state.used_bytes > self.config.memory_budget {
            let Some((evicted, loaded)) = state.loaded.pop_lru() else {
                break;
            };
            state.used_bytes -= loaded.image.data_len();
            info!(
                "{evicted}: boot image evicted from memory (budget {} bytes)",
                self.config.memory_budget
            );
        }
    }

    /// Whether `name` has a boot image file that has not been refused (cheap: no loading).
    pub fn has_usable(&self, name: &str) -> bool {
        let Ok(file_key) = boot_image_file_key(&self.path_for(name)) else {
            return false;
        };
        let state = self.state.lock().unwrap();
        state.rejected.get(name).is_none_or(|r| r.file_key != file_key)
    }

    /// Drops the boot image of `name` from memory. Open files keep theirs until closed.
    pub fn evict(&self, name: &str) -> bool {
        let mut state = self.state.lock().unwrap();
        state.rejected.remove(name);
        match state.loaded.pop(name) {
            Some(loaded) => {
                state.used_bytes -= loaded.image.data_len();
                true
            }
            None => false,
        }
    }

    /// Forgets a remembered rejection, e.g. after a new boot image was installed.
    pub fn forget_rejection(&self, name: &str) {
        self.state.lock().unwrap().rejected.remove(name);
    }

    /// Bytes of boot image data held in memory.
    pub fn used_bytes(&self) -> u64 {
        self.state.lock().unwrap().used_bytes
    }

    pub fn loaded(&self) -> Vec<LoadedInfo> {
        let state = self.state.lock().unwrap();
        state
            .loaded
            .iter()
            .map(|(name, l)| LoadedInfo {
                name: name.clone(),
                extents: l.image.extents.len(),
                bytes: l.image.data_len(),
                locked: l.image.is_locked(),
                image_id: l.image.identity.image_id.clone(),
            })
            .collect()
    }

    /// Names with a remembered rejection and why.
    pub fn rejected(&self) -> Vec<(String, String)> {
        let state = self.state.lock().unwrap();
        state
            .rejected
            .iter()
            .map(|(n, r)| (n.clone(), r.reason.clone()))
            .collect()
    }
}
