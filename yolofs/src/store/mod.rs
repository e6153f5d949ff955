//! The local boot image store and its in-memory cache.
//!
//! The store is yolofs' private directory; nothing else writes to it. For a base file `name` it
//! holds the boot image `<name>.yolo`, its verification stamp `<name>.yolo.verified`, the Glance
//! image id the base file belongs to (`<name>.image-id`, see [`BootImageStore::remember_image_id`])
//! and, for learned boot images, the trace they were built from (`<name>.trace`). Boot images
//! come in two ways: learned from a boot ([`crate::recorder`]) or installed through the control
//! socket ([`BootImageStore::install`]), which verifies the candidate in full in a staging
//! directory (`.incoming/`) before renaming it into place.
//!
//! A boot image is served only after it has been verified against the base file it claims to
//! describe: every extent compared with the file. Verifying reads the boot's ranges from the base
//! file, which is exactly the I/O YOLO exists to avoid at boot, so the result is remembered in the
//! stamp, naming both sides: the boot image by its header and index CRCs, the base file by
//! device, inode, size and birth time. Nova's base files are immutable once renamed into place, so
//! a stamp that still matches both sides means the comparison still holds; anything else is
//! verified again when the boot image is loaded.
//!
//! Loaded boot images stay in memory under a byte budget, least recently used evicted first, and
//! are optionally locked with `mlock` so memory pressure cannot page them out (the thesis' point
//! against relying on the page cache). A boot image that fails validation or verification is
//! remembered as rejected (with why) until its file changes, and its base file is passed through.
//!
//! This module holds the cache and the loading of boot images; its parts hold the rest:
//! `stamp.rs` (what a verification vouches for), `files.rs` (the store's files, their listing and
//! pruning), `install.rs` (boot images from elsewhere) and `changes.rs` (base files that change:
//! leases, touches, verifying again).

mod changes;
mod files;
#[cfg(test)]
mod fixture;
mod install;
mod preload;
mod stamp;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use log::{debug, info, warn};
use lru::LruCache;
use serde::Serialize;
use thiserror::Error;

pub use changes::{ctime_moves_at_every_change, TouchSafety, COARSE_TIMESTAMPS_ENV};
pub use files::{
    check_image_id, open_regular_file, BootImageInfo, BOOT_IMAGE_SUFFIX, IMAGE_ID_SUFFIX, INCOMING_DIR,
    MAX_IMAGE_ID_LEN, STAMP_SUFFIX, TRACE_SUFFIX,
};
pub use install::{InstallError, Installed};
pub use preload::PreloadProgress;
pub use stamp::{stamp_path, verify_and_stamp, write_stamp, BootImageKey, SourceKey, Stamp, StampError, SETTLE};

use crate::format::{BootImage, FormatError, VerifyError};
use crate::lease::{Lease, LeaseError};
use crate::packed::{BlockFile, BlockFileStats};
use crate::pool::{BlockPool, PoolStats};
use changes::ReverifyQueue;
use files::boot_image_file_key;
use stamp::{read_stamp, save_stamp, stamp_matches};

/// The boot images being loaded, one load each at a time ([`BootImageStore::load`]).
#[derive(Default)]
struct Loading {
    names: Mutex<HashSet<String>>,
    done: Condvar,
}

/// How many boot images load from the store at a time ([`BootImageStore::set_loads_at_once`]).
/// Loads share the store's disk: a storm's loads all at once end together, with the last, where
/// one or two at a time make the first ready in a fraction of that.
pub const DEFAULT_LOADS_AT_ONCE: usize = 2;

/// The loads under way and how many may be.
struct LoadSlots {
    count: Mutex<SlotCount>,
    freed: Condvar,
}

struct SlotCount {
    in_use: usize,
    limit: usize,
}

/// One load's slot, given back when dropped.
struct LoadSlot<'a>(&'a LoadSlots);

impl LoadSlots {
    fn new(limit: usize) -> LoadSlots {
        LoadSlots {
            count: Mutex::new(SlotCount {
                in_use: 0,
                limit: limit.max(1),
            }),
            freed: Condvar::new(),
        }
    }

    fn take(&self) -> LoadSlot<'_> {
        let mut count = self.count.lock().unwrap();
        while count.in_use >= count.limit {
            count = self.freed.wait(count).unwrap();
        }
        count.in_use += 1;
        LoadSlot(self)
    }

    fn set_limit(&self, limit: usize) {
        self.count.lock().unwrap().limit = limit.max(1);
        self.freed.notify_all();
    }
}

impl Drop for LoadSlot<'_> {
    fn drop(&mut self) {
        self.0.count.lock().unwrap().in_use -= 1;
        self.0.freed.notify_one();
    }
}

/// Marks one boot image as being loaded until dropped.
struct LoadingGuard<'a> {
    loading: &'a Loading,
    name: &'a str,
}

impl Loading {
    /// Waits for a load of `name` under way to end, then marks `name` as loading.
    fn begin<'a>(&'a self, name: &'a str) -> LoadingGuard<'a> {
        let mut names = self.names.lock().unwrap();
        while names.contains(name) {
            names = self.done.wait(names).unwrap();
        }
        names.insert(name.to_string());
        LoadingGuard { loading: self, name }
    }
}

impl Drop for LoadingGuard<'_> {
    fn drop(&mut self) {
        self.loading.names.lock().unwrap().remove(self.name);
        self.loading.done.notify_all();
    }
}

/// A boot image verified for a base file, and what keeps that verification true.
#[derive(Clone)]
pub struct Verified {
    pub image: Arc<BootImage>,
    /// The base file's key when it was verified: settled (see [`SETTLE`]), or taken after a
    /// touch where every later write moves the ctime.
    key: SourceKey,
    /// A read lease taken before the key: while intact, the file's bytes have not changed,
    /// whatever its times say.
    lease: Option<Arc<Lease>>,
}

impl Verified {
    /// Whether the verification holds for the base file as `now` says it is: the same key, or
    /// the same file of the same size with an intact lease (its times set, Nova's touches).
    pub fn holds_for(&self, now: &SourceKey) -> bool {
        *now == self.key || (now.same_file(&self.key) && self.lease.as_ref().is_some_and(|l| l.intact()))
    }

    pub fn leased(&self) -> bool {
        self.lease.is_some()
    }
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
    #[error("{0} keeps changing: its boot image is not used")]
    Changing(String),
}

impl StoreError {
    /// Why a boot image was refused, in a word (`None`: there was none, or it was refused before).
    pub fn rejection_reason(&self) -> Option<&'static str> {
        match self {
            StoreError::Invalid { .. } => Some("invalid"),
            StoreError::Mismatch { .. } => Some("mismatch"),
            StoreError::WrongSize { .. } => Some("wrong_size"),
            StoreError::Io { .. } => Some("io"),
            StoreError::Missing(_) | StoreError::Refused { .. } | StoreError::Changing(_) => None,
        }
    }
}

/// What the store did since the mount started, for metrics.
#[derive(Default)]
pub struct StoreCounters {
    /// Boot images loaded into memory (verified first when their stamp did not match).
    pub loads: AtomicU64,
    /// Boot images dropped from memory to stay within the budget.
    pub evictions: AtomicU64,
    /// Boot images refused, at load or install, by reason.
    rejections: Mutex<BTreeMap<&'static str, u64>>,
}

impl StoreCounters {
    pub fn rejected(&self, reason: &'static str) {
        *self.rejections.lock().unwrap().entry(reason).or_default() += 1;
    }

    pub fn rejections(&self) -> BTreeMap<&'static str, u64> {
        self.rejections.lock().unwrap().clone()
    }
}

/// Settings of the store.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub dir: PathBuf,
    /// Most bytes of boot image data kept in memory.
    pub memory_budget: u64,
    /// Lock loaded boot images in RAM.
    pub lock_in_memory: bool,
    /// Hold each distinct block of the loaded boot images once ([`crate::pool`]), and of the
    /// boot images installed, once on disk ([`crate::packed`]).
    pub share_blocks: bool,
    /// Largest boot image file [`BootImageStore::install`] reads.
    pub max_boot_image_bytes: u64,
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
    /// Whether a lease on its base file keeps it verified across touches.
    pub leased: bool,
}

pub struct BootImageStore {
    config: StoreConfig,
    /// Where loaded boot images keep their data if they share blocks.
    pool: Option<Arc<BlockPool>>,
    /// Where installed boot images keep their blocks on disk if they share them: opened at start
    /// if the store has one (it reads the store's packed boot images), else at the first
    /// install; None until then, or while it cannot be.
    block_file: Mutex<Option<Arc<BlockFile>>>,
    state: Mutex<StoreState>,
    /// Held by installs, prunes and builds ([`BootImageStore::exclusive`]): one at a time, so
    /// the staging directory holds only theirs and no two write a boot image at once.
    install_lock: Mutex<()>,
    staged: AtomicU64,
    counters: StoreCounters,
    /// The state of each changed base file whose boot image was sent to be verified again
    /// ([`BootImageStore::source_changed`]), and the queue of those to verify.
    reverified: Mutex<HashMap<String, SourceKey>>,
    reverify_queue: Mutex<ReverifyQueue>,
    /// The outcome of the last attempt to lease a base file, and whether the filesystem has
    /// multigrain timestamps: what [`BootImageStore::touch_safety`] reports.
    lease_outcome: Mutex<Option<(Result<(), LeaseError>, bool)>>,
    loading: Loading,
    load_slots: LoadSlots,
    /// What preloading at start has done ([`BootImageStore::preload`]).
    preload: Mutex<Option<PreloadProgress>>,
    /// What `status` read of each boot image's files, for as long as they stay as they were.
    listing: Mutex<HashMap<String, files::Listed>>,
    /// How many times a listing read a boot image's files (its memo missed).
    #[cfg(test)]
    listing_reads: AtomicU64,
}

struct StoreState {
    loaded: LruCache<String, Verified>,
    /// Bytes of data of the cached boot images that keep their own memory (not in the pool).
    own_bytes: u64,
    rejected: HashMap<String, Rejection>,
}

impl BootImageStore {
    pub fn new(config: StoreConfig) -> BootImageStore {
        BootImageStore {
            pool: config.share_blocks.then(|| BlockPool::new(config.lock_in_memory)),
            block_file: Mutex::new(None),
            config,
            state: Mutex::new(StoreState {
                loaded: LruCache::unbounded(),
                own_bytes: 0,
                rejected: HashMap::new(),
            }),
            install_lock: Mutex::new(()),
            staged: AtomicU64::new(0),
            counters: StoreCounters::default(),
            reverified: Mutex::default(),
            reverify_queue: Mutex::default(),
            lease_outcome: Mutex::default(),
            loading: Loading::default(),
            load_slots: LoadSlots::new(DEFAULT_LOADS_AT_ONCE),
            preload: Mutex::default(),
            listing: Mutex::default(),
            #[cfg(test)]
            listing_reads: AtomicU64::new(0),
        }
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    pub fn counters(&self) -> &StoreCounters {
        &self.counters
    }

    /// How many boot images may load from the store at a time (at least one).
    pub fn set_loads_at_once(&self, limit: usize) {
        self.load_slots.set_limit(limit);
    }

    /// The store to oneself: what writes boot images holds it (installs, prunes, the recorder's
    /// builds).
    pub fn exclusive(&self) -> std::sync::MutexGuard<'_, ()> {
        self.install_lock.lock().unwrap()
    }

    /// The verified boot image for base file `name`, opened as `source`, loading it if needed.
    ///
    /// Never fails: a missing, corrupt or mismatching boot image means `None` (serve the file by
    /// passthrough), logged once.
    pub fn get(&self, name: &str, source: &File) -> Option<Verified> {
        match self.load(name, source) {
            Ok(verified) => Some(verified),
            Err(StoreError::Missing(_)) => None,
            Err(err @ StoreError::Changing(_)) => {
                info!("{err}");
                None
            }
            Err(err) => {
                debug!("{name}: serving by passthrough: {err}");
                None
            }
        }
    }

    /// Like [`get`](Self::get), but says why there is no boot image.
    pub fn load(&self, name: &str, source: &File) -> Result<Verified, StoreError> {
        let io = |source| StoreError::Io {
            name: name.to_string(),
            source,
        };
        // In memory and still verified for the file as it is: no wait for it to settle.
        let now = SourceKey::of(source).map_err(io)?;
        if let Some(verified) = self.cached(name, &now) {
            return Ok(verified);
        }
        // One load per boot image at a time: the guests of a boot storm open one image at once,
        // and all but the first wait for its load instead of reading and verifying it again.
        let _loading = self.loading.begin(name);
        if let Some(verified) = self.cached(name, &now) {
            return Ok(verified);
        }
        let path = self.path_for(name);
        {
            // Refused for the file as it is: a rejection's key is settled, so any write since
            // moved the ctime past it.
            let state = self.state.lock().unwrap();
            if let Some(rejection) = state.rejected.get(name) {
                let same_file = boot_image_file_key(&path).ok() == Some(rejection.file_key);
                if same_file && rejection.source == now {
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
        // The lease before the key: a write after the key was taken then breaks it. A file
        // changed within the last second could change again without its ctime moving: the key
        // waits for it to settle (a fresh download, at most a second), else it is served by
        // passthrough.
        let lease = match self.take_lease(source) {
            Ok(lease) => lease,
            // A writer has it open: its bytes may change without its ctime moving (a shared
            // mapping, one long write), so it is not vouched for. Nova's base files are never
            // open for writing once in place.
            Err(_) => return Err(StoreError::Changing(name.into())),
        };
        let source_key = SourceKey::settled(source, 2 * SETTLE)
            .map_err(io)?
            .ok_or_else(|| StoreError::Changing(name.into()))?;
        // Load and verify without holding the lock: other files keep opening meanwhile.
        let slot = self.load_slots.take();
        let loaded = self.load_verified(name, &path, source, &source_key);
        drop(slot);
        match loaded {
            Ok(image) => {
                self.counters.loads.fetch_add(1, Ordering::Relaxed);
                let verified = Verified {
                    image: Arc::new(image),
                    key: source_key,
                    lease,
                };
                self.insert(name, verified.clone());
                Ok(verified)
            }
            Err(err) => {
                warn!("{name}: boot image refused, the base file is served by passthrough: {err}");
                if let Some(reason) = err.rejection_reason() {
                    self.counters.rejected(reason);
                }
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
        if !stamp_matches(path, BootImageKey::of(&image), key) {
            info!(
                "{name}: verifying boot image against the base file ({} bytes in {} extents)",
                image.covered_bytes(),
                image.extents.len()
            );
            image.verify_against(source).map_err(|source| StoreError::Mismatch {
                name: name.into(),
                source,
            })?;
            if let Err(e) = write_stamp(path, &image, *key) {
                warn!("{name}: could not write the verification stamp: {e}");
            }
        }
        if let Some(pool) = &self.pool {
            if let Err(e) = image.share_blocks(pool) {
                warn!("{name}: could not put the boot image in the block pool ({e}); it keeps its own memory");
            }
        }
        if self.config.lock_in_memory && image.pooled().is_none() {
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

    fn insert(&self, name: &str, verified: Verified) {
        // What leaves the cache is dropped past the store's lock (giving blocks back to the
        // pool takes a while): declared before the guard, so dropped after it.
        let mut dropped = Vec::new();
        let mut state = self.state.lock().unwrap();
        state.rejected.remove(name);
        let bytes = verified.image.data_len();
        if bytes > self.config.memory_budget {
            warn!("{name}: boot image ({bytes} bytes) exceeds the memory budget; used for open files only, not cached");
            return;
        }
        charge(&verified, true);
        let own = own_memory(&verified);
        if let Some(old) = state.loaded.put(name.to_string(), verified) {
            charge(&old, false);
            state.own_bytes -= own_memory(&old);
            dropped.push(old);
        }
        state.own_bytes += own;
        while self.held_bytes(&state) > self.config.memory_budget {
            let Some((evicted, loaded)) = state.loaded.pop_lru() else {
                break;
            };
            charge(&loaded, false);
            state.own_bytes -= own_memory(&loaded);
            dropped.push(loaded);
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            info!(
                "{evicted}: boot image evicted from memory (budget {} bytes)",
                self.config.memory_budget
            );
        }
    }

    /// The boot image of `name` if it is in memory and its verification holds for the base file
    /// as `source` says it is now (no loading, no verification: for the read path). A lease
    /// that kept it across a touch moves its key to a settled `source`, and its stamp with it,
    /// so that a restart finds it verified too.
    pub fn cached(&self, name: &str, source: &SourceKey) -> Option<Verified> {
        // Settled first: a write after the lease check below moves the ctime past `source`.
        let settled = source.is_settled();
        let (verified, moved_from) = {
            let mut state = self.state.lock().unwrap();
            let loaded = state.loaded.get_mut(name).filter(|loaded| loaded.holds_for(source))?;
            let moved_from = (settled && source.ctime_ns > loaded.key.ctime_ns).then_some(loaded.key);
            if moved_from.is_some() {
                loaded.key = *source;
            }
            (loaded.clone(), moved_from)
        };
        // The stamp's file written outside the store's lock.
        if let Some(before) = moved_from {
            let path = self.path_for(name);
            let image = BootImageKey::of(&verified.image);
            if let Some(stamp) = read_stamp(&path).filter(|s| s.source == before && s.boot_image == image) {
                if let Err(e) = save_stamp(
                    &path,
                    &Stamp {
                        source: *source,
                        ..stamp
                    },
                ) {
                    warn!("{name}: could not write the verification stamp: {e}");
                }
            }
        }
        Some(verified)
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
        let evicted = {
            let mut state = self.state.lock().unwrap();
            state.rejected.remove(name);
            let evicted = state.loaded.pop(name);
            if let Some(loaded) = &evicted {
                charge(loaded, false);
                state.own_bytes -= own_memory(loaded);
            }
            evicted
        };
        // Dropped past the store's lock.
        evicted.is_some()
    }

    /// Bytes locked in RAM for boot images: the pool's slabs, whole, and the cached boot
    /// images locked in memory of their own.
    pub fn locked_bytes(&self) -> u64 {
        let pooled = self.pool.as_ref().map_or(0, |pool| pool.stats().locked_bytes);
        let state = self.state.lock().unwrap();
        let own: u64 = state
            .loaded
            .iter()
            .filter(|(_, l)| l.image.pooled().is_none() && l.image.is_locked())
            .map(|(_, l)| l.image.data_len())
            .sum();
        pooled + own
    }

    /// Bytes of boot image data held in memory: what the memory budget bounds.
    pub fn used_bytes(&self) -> u64 {
        self.held_bytes(&self.state.lock().unwrap())
    }

    /// What the cache holds: the pool's blocks of its boot images, each distinct block once,
    /// and the data of those that keep their own memory.
    fn held_bytes(&self, state: &StoreState) -> u64 {
        self.pool.as_ref().map_or(0, |pool| pool.stats().charged_bytes) + state.own_bytes
    }

    /// What the block pool holds, if boot images share blocks.
    pub fn pool_stats(&self) -> Option<PoolStats> {
        self.pool.as_ref().map(|pool| pool.stats())
    }

    /// The store's block file, if installed boot images share blocks on disk: opened (and made
    /// if missing) at the first call, tried again at the next if it could not be.
    pub(super) fn block_file(&self) -> Option<Arc<BlockFile>> {
        if !self.config.share_blocks {
            return None;
        }
        let mut block_file = self.block_file.lock().unwrap();
        if block_file.is_none() {
            match BlockFile::open(&self.config.dir) {
                Ok(opened) => *block_file = Some(Arc::new(opened)),
                Err(e) => warn!(
                    "the block file of {} cannot be used ({e}): boot images installed are kept whole",
                    self.config.dir.display()
                ),
            }
        }
        block_file.clone()
    }

    /// Opens the store's block file if it has one (at start: what it holds is read then, not at
    /// the first `status` or install).
    pub fn open_block_file(&self) {
        if self.config.dir.join(crate::packed::BLOCK_FILE).exists() {
            self.block_file();
        }
    }

    /// What the store's block file holds, once open.
    pub fn block_file_stats(&self) -> Option<BlockFileStats> {
        // Not while it is being opened: `status` does not wait for the store to be read.
        let block_file = self.block_file.try_lock().ok()?.clone()?;
        Some(block_file.stats())
    }

    /// The store's boot images `names` were removed, or replaced by ones kept whole: their
    /// blocks are let go, once that is durable.
    pub fn unpacked(&self, names: &[&str]) {
        if names.is_empty() || !self.config.dir.join(crate::packed::BLOCK_FILE).exists() {
            return; // nothing was ever packed
        }
        if let Some(block_file) = self.block_file() {
            match self.sync_dir() {
                Ok(()) => block_file.forget(names),
                Err(e) => warn!("{}: their blocks stay until the next start ({e})", names.join(", ")),
            }
        }
    }

    /// Makes the renames and removals in the store durable (before the blocks of the boot
    /// images they replaced or removed are freed, and maybe reused).
    pub(super) fn sync_dir(&self) -> std::io::Result<()> {
        File::open(&self.config.dir)?.sync_all()
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
                leased: l.lease.as_ref().is_some_and(|l| l.intact()),
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

/// Bytes of data a boot image keeps in memory of its own (0 if it is in the pool).
fn own_memory(verified: &Verified) -> u64 {
    match verified.image.pooled() {
        Some(_) => 0,
        None => verified.image.data_len(),
    }
}

/// Counts a boot image's blocks in the pool as held by the cache, or no longer.
fn charge(verified: &Verified, held: bool) {
    if let Some(pooled) = verified.image.pooled() {
        pooled.charge(held);
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::store::fixture::{content, Fixture, IMAGE};

    #[test]
    fn boot_images_of_related_files_hold_their_common_blocks_once_and_read_their_own_bytes() {
        let f = Fixture::new(1 << 30);
        // A second base file, the first with its first block changed.
        let mut other = content(0);
        other[..4096].fill(9);
        fs::write(f.base_dir().join("disk2"), &other).unwrap();
        f.install(&f.candidate(&content(0), IMAGE), IMAGE).unwrap();
        let base2 = File::open(f.base_dir().join("disk2")).unwrap();
        f.store
            .install("disk2", &base2, &f.candidate(&other, IMAGE), IMAGE, None)
            .unwrap();
        let one = f.store.load("disk", &f.base()).unwrap();
        let two = f.store.load("disk2", &base2).unwrap();
        // Each holds 5 blocks (20 KiB); 4 of them are the same bytes.
        assert_eq!(one.image.data_len(), 5 * 4096);
        assert_eq!(f.store.used_bytes(), 6 * 4096);
        let pool = f.store.pool_stats().unwrap();
        assert_eq!((pool.blocks, pool.charged_image_bytes), (6, 10 * 4096));
        // Byte for byte each file's own, across the blocks they share and the one they do not.
        for (verified, source, bytes) in [(&one, f.base(), content(0)), (&two, base2, other)] {
            let (data, from_memory, _) = crate::fs::read_mixed(&verified.image, &source, 0, 512_000).unwrap();
            assert_eq!(data, bytes[..512_000]);
            assert_eq!(from_memory, 5 * 4096);
        }
        // Evicted, the first's blocks no longer count; those the second refers to stay.
        assert!(f.store.evict("disk"));
        assert_eq!(f.store.used_bytes(), 5 * 4096);
        drop(one);
        assert_eq!(f.store.pool_stats().unwrap().blocks, 5);
        assert!(f.store.evict("disk2"));
        assert_eq!(f.store.used_bytes(), 0);
        drop(two);
        assert_eq!(f.store.pool_stats().unwrap().blocks, 0);
    }

    #[test]
    fn a_boot_image_of_its_own_memory_counts_beside_the_pool() {
        let f = Fixture::new(1 << 30);
        // Built with 512-byte blocks: kept out of the pool, counted all the same.
        let reads = [crate::build::TraceRead {
            offset: 512,
            length: 1024,
        }];
        let identity = crate::format::SourceIdentity {
            image_id: IMAGE.into(),
            source_size: crate::store::fixture::SIZE as u64,
            rendition: "raw".into(),
            ..Default::default()
        };
        let candidate = f.dir.path().join("nova/small.yolo");
        crate::build::build_boot_image(&reads, &f.base(), &identity, 512, &candidate).unwrap();
        f.install(&candidate, IMAGE).unwrap();
        let loaded = f.store.load("disk", &f.base()).unwrap();
        assert!(loaded.image.pooled().is_none());
        assert_eq!(f.store.used_bytes(), 1024);
        assert!(f.store.evict("disk"));
        assert_eq!(f.store.used_bytes(), 0);
    }

    #[test]
    fn the_budget_counts_shared_blocks_once() {
        let f = Fixture::new(1 << 30);
        let store = BootImageStore::new(StoreConfig {
            memory_budget: 6 * 4096,
            ..f.store.config().clone()
        });
        let mut other = content(0);
        other[..4096].fill(9);
        fs::write(f.base_dir().join("disk2"), &other).unwrap();
        let base2 = File::open(f.base_dir().join("disk2")).unwrap();
        store
            .install("disk", &f.base(), &f.candidate(&content(0), IMAGE), IMAGE, None)
            .unwrap();
        store
            .install("disk2", &base2, &f.candidate(&other, IMAGE), IMAGE, None)
            .unwrap();
        store.load("disk", &f.base()).unwrap();
        store.load("disk2", &base2).unwrap();
        // 10 blocks of data, 6 distinct: both fit a budget of 6.
        assert_eq!(store.loaded().len(), 2);
        assert_eq!(store.counters().evictions.load(Ordering::Relaxed), 0);
        // Without sharing they would not.
        let apart = BootImageStore::new(StoreConfig {
            share_blocks: false,
            ..store.config().clone()
        });
        apart.load("disk", &f.base()).unwrap();
        apart.load("disk2", &base2).unwrap();
        assert_eq!(apart.loaded().len(), 1);
        assert!(apart.pool_stats().is_none());
    }

    #[test]
    fn a_base_file_open_for_writing_is_not_served_from_its_boot_image() {
        let f = Fixture::new(1 << 30);
        f.install(&f.candidate(&content(0), IMAGE), IMAGE).unwrap();
        // Its bytes can change without its ctime moving (a shared mapping, one long write).
        let writer = fs::OpenOptions::new()
            .write(true)
            .open(f.base_dir().join("disk"))
            .unwrap();
        assert!(matches!(f.store.load("disk", &f.base()), Err(StoreError::Changing(_))));
        drop(writer);
        assert!(f.store.load("disk", &f.base()).unwrap().leased());
        assert_eq!(f.store.touch_safety().mechanism, "leases");
    }
}
