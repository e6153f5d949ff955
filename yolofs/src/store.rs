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

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, Metadata};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use log::{debug, info, warn};
use lru::LruCache;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::format::{self, BootImage, FormatError, VerifyError};
use crate::lease::{self, Lease, LeaseError};

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

/// Identity of a base file and of its content: what a verification stamp is valid for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceKey {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Birth time in nanoseconds, where the filesystem records one.
    pub btime_ns: Option<u128>,
    /// Status change time in nanoseconds: every write moves it, and nothing can set it back, so
    /// an unchanged ctime means unchanged bytes. Nova's touches of base files in use move it too
    /// (they set mtime): those cost a verification again, never a stale byte.
    pub ctime_ns: i128,
}

/// How long after its last change a base file's ctime is trusted to move at the next write: a
/// filesystem with coarse timestamps (one tick, before Linux 6.13's multigrain ones) leaves the
/// ctime where it is for a write in the same tick as the one that set it (git's "racily clean").
pub const SETTLE: Duration = Duration::from_secs(1);

impl SourceKey {
    pub fn of(file: &File) -> std::io::Result<SourceKey> {
        Ok(SourceKey::from_metadata(&file.metadata()?))
    }

    /// Whether `self` and `other` are the same file with the same size, whatever their times.
    fn same_file(&self, other: &SourceKey) -> bool {
        (self.dev, self.ino, self.size, self.btime_ns) == (other.dev, other.ino, other.size, other.btime_ns)
    }

    /// How long ago the ctime was, if it is in the past.
    fn ctime_age_ns(&self) -> i128 {
        let now_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        now_ns.saturating_sub(self.ctime_ns)
    }

    /// Whether any later write moves the ctime, even on a filesystem with coarse timestamps.
    fn is_settled(&self) -> bool {
        self.ctime_age_ns() >= SETTLE.as_nanos() as i128
    }

    /// The key of `file` once its ctime is at least [`SETTLE`] old, so that any later write moves
    /// it; waits for that up to `wait`, and is None if the file keeps changing.
    pub fn settled(file: &File, wait: Duration) -> std::io::Result<Option<SourceKey>> {
        let deadline = Instant::now() + wait;
        loop {
            let key = SourceKey::of(file)?;
            if key.is_settled() {
                return Ok(Some(key));
            }
            let age = key.ctime_age_ns();
            let pause = Duration::from_nanos((SETTLE.as_nanos() as i128 - age).max(1_000_000) as u64);
            if Instant::now() + pause > deadline {
                return Ok(None);
            }
            std::thread::sleep(pause);
        }
    }

    pub fn from_metadata(meta: &Metadata) -> SourceKey {
        SourceKey {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            btime_ns: meta
                .created()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_nanos()),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
        }
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

    /// The key of a boot image file read from its header alone.
    pub fn of_header(header: &format::HeaderSummary) -> BootImageKey {
        BootImageKey {
            header_crc32c: header.header_crc32c,
            index_crc32c: header.index_crc32c,
        }
    }
}

/// The record that a boot image matched a base file.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    pub boot_image: BootImageKey,
    pub source: SourceKey,
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

/// What keeps boot images verified across a change of their base file's times (a touch), for
/// `status` and the metrics.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TouchSafety {
    /// `leases`, `multigrain_timestamps` (touches through yolofs only) or `none`, or `unknown`
    /// before the first base file was leased.
    pub mechanism: &'static str,
    /// Why leases are not used, if they are not.
    pub lease_error: Option<String>,
}

/// Set (to anything) by tests and benchmarks to make yolofs behave as on a kernel without
/// multigrain timestamps (before Linux 6.13), on any kernel.
pub const COARSE_TIMESTAMPS_ENV: &str = "YOLOFS_ASSUME_COARSE_TIMESTAMPS";

/// Whether every change to `file` after its ctime was read moves its ctime, even within the same
/// clock tick: Linux 6.13's multigrain timestamps, on ext4, XFS, Btrfs and tmpfs.
pub fn ctime_moves_at_every_change(file: &File) -> bool {
    if std::env::var_os(COARSE_TIMESTAMPS_ENV).is_some() {
        return false;
    }
    // The local filesystems of leases are those with multigrain timestamps.
    let Ok(fs_type) = lease::filesystem_type(file) else {
        return false;
    };
    let mut uts = std::mem::MaybeUninit::<libc::utsname>::uninit();
    // SAFETY: the buffer is writable and large enough, and read only after the call succeeded.
    let uts = unsafe {
        if libc::uname(uts.as_mut_ptr()) != 0 {
            return false;
        }
        uts.assume_init()
    };
    let release: String = uts
        .release
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8 as char)
        .collect();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    version >= (6, 13) && lease::LOCAL_FILESYSTEMS.contains(&fs_type)
}

/// Path of the stamp file that goes with a boot image file.
pub fn stamp_path(boot_image_path: &Path) -> PathBuf {
    let mut name = boot_image_path.as_os_str().to_owned();
    name.push(".verified");
    PathBuf::from(name)
}

/// Writes the verification stamp for `image` (read from `boot_image_path`) and the base file
/// `source`, as it was (its key taken) before the comparison began: a write during the
/// comparison moves its ctime, so the stamp does not vouch for it.
pub fn write_stamp(boot_image_path: &Path, image: &BootImage, source: SourceKey) -> std::io::Result<()> {
    save_stamp(
        boot_image_path,
        &Stamp {
            boot_image: BootImageKey::of(image),
            source,
        },
    )
}

fn save_stamp(boot_image_path: &Path, stamp: &Stamp) -> std::io::Result<()> {
    let path = stamp_path(boot_image_path);
    let tmp = path.with_extension("verified.tmp");
    fs::write(&tmp, serde_json::to_vec(stamp)?)?;
    fs::rename(tmp, path)
}

fn read_stamp(boot_image_path: &Path) -> Option<Stamp> {
    serde_json::from_slice(&fs::read(stamp_path(boot_image_path)).ok()?).ok()
}

/// Compares every extent of `image` (read from `boot_image_path`) with `source` and, if each byte
/// matches, writes the verification stamp next to the boot image: what `yolofs verify --mark`
/// does, and what an install does in the staging directory.
pub fn verify_and_stamp(boot_image_path: &Path, image: &BootImage, source: &File) -> Result<(), StampError> {
    let key = SourceKey::settled(source, Duration::from_secs(10))
        .map_err(StampError::Write)?
        .ok_or(StampError::Changing)?;
    image.verify_against(source)?;
    write_stamp(boot_image_path, image, key).map_err(StampError::Write)
}

/// Why [`verify_and_stamp`] did not stamp.
#[derive(Debug, Error)]
pub enum StampError {
    #[error(transparent)]
    Mismatch(#[from] VerifyError),
    #[error("writing the verification stamp: {0}")]
    Write(std::io::Error),
    #[error("the base file kept changing: it cannot be vouched for")]
    Changing,
}

fn stamp_matches(boot_image_path: &Path, image: BootImageKey, source: &SourceKey) -> bool {
    read_stamp(boot_image_path).is_some_and(|stamp| stamp.boot_image == image && stamp.source == *source)
}

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

/// Why a boot image was not installed.
#[derive(Debug, Error)]
pub enum InstallError {
    #[error("{0}")]
    BadRequest(String),
    #[error("base file {name}: {source}")]
    Base { name: String, source: std::io::Error },
    #[error("boot image {path}: {reason}")]
    Candidate { path: PathBuf, reason: String },
    #[error("boot image {path} is {size} bytes, more than the {limit}-byte limit (--max-boot-image-bytes)")]
    TooLarge { path: PathBuf, size: u64, limit: u64 },
    #[error("boot image {path} is not a valid boot image: {source}")]
    Invalid { path: PathBuf, source: FormatError },
    #[error("boot image {path} does not match base file {name}: {source}")]
    Mismatch {
        path: PathBuf,
        name: String,
        source: VerifyError,
    },
    #[error("boot image {path} is for image {found}, not {expected}")]
    ForeignImage {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("installing into the store {dir}: {source}")]
    Store { dir: PathBuf, source: std::io::Error },
}

impl InstallError {
    /// Whether the boot image handed in is what is wrong (offering it again cannot help),
    /// rather than the request, the base file or the store.
    pub fn is_refusal(&self) -> bool {
        self.refusal_reason().is_some()
    }

    /// What is wrong with the boot image handed in, in a word, if that is what failed.
    pub fn refusal_reason(&self) -> Option<&'static str> {
        match self {
            InstallError::Candidate { .. } => Some("unreadable"),
            InstallError::TooLarge { .. } => Some("too_large"),
            InstallError::Invalid { .. } => Some("invalid"),
            InstallError::Mismatch { .. } => Some("mismatch"),
            InstallError::ForeignImage { .. } => Some("foreign_image"),
            InstallError::BadRequest(_) | InstallError::Base { .. } | InstallError::Store { .. } => None,
        }
    }
}

/// An installed boot image, for the `install` answer.
#[derive(Debug, Clone, Serialize)]
pub struct Installed {
    pub file: String,
    pub image_id: String,
    pub extents: usize,
    pub bytes: u64,
    pub seconds: f64,
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
    /// Largest boot image file [`BootImageStore::install`] reads.
    pub max_boot_image_bytes: u64,
}

/// What is known of a boot image file that was refused, so it is not retried at every open.
struct Rejection {
    file_key: (u64, i64, u64),
    source: SourceKey,
    reason: String,
}

#[derive(Default)]
struct ReverifyQueue {
    /// Base file names, and when to verify each.
    due: HashMap<String, Instant>,
    /// Whether a thread works through it.
    running: bool,
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
}

struct StoreState {
    loaded: LruCache<String, Verified>,
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
            install_lock: Mutex::new(()),
            staged: AtomicU64::new(0),
            counters: StoreCounters::default(),
            reverified: Mutex::default(),
            reverify_queue: Mutex::default(),
            lease_outcome: Mutex::default(),
        }
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    pub fn counters(&self) -> &StoreCounters {
        &self.counters
    }

    /// The store to oneself: what writes boot images holds it (installs, prunes, the recorder's
    /// builds).
    pub fn exclusive(&self) -> std::sync::MutexGuard<'_, ()> {
        self.install_lock.lock().unwrap()
    }

    /// Path of the boot image for base file `name`.
    pub fn path_for(&self, name: &str) -> PathBuf {
        self.config.dir.join(format!("{name}{BOOT_IMAGE_SUFFIX}"))
    }

    /// The trace a learned boot image of `name` was built from.
    pub fn trace_path(&self, name: &str) -> PathBuf {
        self.config.dir.join(format!("{name}{TRACE_SUFFIX}"))
    }

    fn image_id_path(&self, name: &str) -> PathBuf {
        self.config.dir.join(format!("{name}{IMAGE_ID_SUFFIX}"))
    }

    fn incoming_dir(&self) -> PathBuf {
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

    /// Empties the staging directory (at start, when no install can be under way).
    pub fn clear_incoming(&self) -> std::io::Result<()> {
        let _installing = self.install_lock.lock().unwrap();
        match fs::remove_dir_all(self.incoming_dir()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Installs `candidate` as the boot image of base file `name` (`base`, opened from the source
    /// directory), for Glance image `image_id`: the only way a boot image from elsewhere enters
    /// the store.
    ///
    /// The candidate is opened without following a symbolic link and must be a regular file, owned
    /// by `owner` when given (the uid of an unprivileged client: yolofs runs as root and must not
    /// read for it what it could not read itself), of at most `max_boot_image_bytes`, and is read
    /// once, never beyond that bound. It must be a valid boot image whose every extent equals the
    /// base file's bytes and whose header names `image_id` or no image. It is then written to the
    /// staging directory with its stamp and image id record, and those are renamed into place
    /// before the boot image itself, so the boot image is never visible unverified. Whatever was
    /// known of an earlier boot image of `name` (loaded, refused) is dropped: the next open uses
    /// the new one.
    pub fn install(
        &self,
        name: &str,
        base: &File,
        candidate: &Path,
        image_id: &str,
        owner: Option<u32>,
    ) -> Result<Installed, InstallError> {
        let installed = self.install_verified(name, base, candidate, image_id, owner);
        if let Some(reason) = installed.as_ref().err().and_then(InstallError::refusal_reason) {
            self.counters.rejected(reason);
        }
        installed
    }

    fn install_verified(
        &self,
        name: &str,
        base: &File,
        candidate: &Path,
        image_id: &str,
        owner: Option<u32>,
    ) -> Result<Installed, InstallError> {
        let started = Instant::now();
        // One install at a time, from before the candidate is read: each holds a whole boot image
        // in memory (up to --max-boot-image-bytes).
        let _installing = self.install_lock.lock().unwrap();
        let (bytes, image) = self.read_offered(candidate, image_id, owner)?;
        let store_error = |source| InstallError::Store {
            dir: self.config.dir.clone(),
            source,
        };
        let incoming = self.incoming_dir();
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&incoming)
            .map_err(store_error)?;
        let staged = incoming.join(format!(
            "{name}.{}.{}{BOOT_IMAGE_SUFFIX}",
            std::process::id(),
            self.staged.fetch_add(1, Ordering::Relaxed)
        ));
        let staged_stamp = stamp_path(&staged);
        let staged_id = staged.with_extension("image-id");
        let result = (|| {
            let mut file = File::create(&staged).map_err(store_error)?;
            file.write_all(&bytes)
                .and_then(|()| file.sync_all())
                .map_err(store_error)?;
            drop(file);
            verify_and_stamp(&staged, &image, base).map_err(|e| match e {
                StampError::Mismatch(source) => InstallError::Mismatch {
                    path: candidate.into(),
                    name: name.into(),
                    source,
                },
                StampError::Write(e) => store_error(e),
                StampError::Changing => InstallError::Base {
                    name: name.into(),
                    source: std::io::Error::other("it keeps changing"),
                },
            })?;
            fs::write(&staged_id, image_id).map_err(store_error)?;
            fs::rename(&staged_stamp, stamp_path(&self.path_for(name))).map_err(store_error)?;
            fs::rename(&staged_id, self.image_id_path(name)).map_err(store_error)?;
            fs::rename(&staged, self.path_for(name)).map_err(store_error)?;
            Ok(())
        })();
        if result.is_err() {
            for leftover in [&staged, &staged_stamp, &staged_id] {
                let _ = fs::remove_file(leftover);
            }
        }
        result?;
        // A learned boot image's trace describes it, not the one installed over it.
        if let Err(e) = fs::remove_file(self.trace_path(name)) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!("{name}: could not remove the trace of the boot image replaced: {e}");
            }
        }
        self.evict(name);
        info!(
            "{name}: installed a verified boot image for image {image_id}: {} bytes in {} extents",
            image.data_len(),
            image.extents.len()
        );
        Ok(Installed {
            file: name.into(),
            image_id: image_id.into(),
            extents: image.extents.len(),
            bytes: image.data_len(),
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// The whole candidate file, read once through one descriptor and never past the size bound.
    /// A boot image a client offers for Glance image `image_id`: a file it owns (`owner`, None
    /// for root), within the size limit, well formed (checksums included) and built for that image.
    /// Not compared with any base file: [`BootImageStore::install`] does that.
    pub fn read_offered(
        &self,
        candidate: &Path,
        image_id: &str,
        owner: Option<u32>,
    ) -> Result<(Vec<u8>, BootImage), InstallError> {
        check_image_id(image_id).map_err(InstallError::BadRequest)?;
        if !candidate.is_absolute() {
            return Err(InstallError::BadRequest(format!(
                "boot image path {} is not absolute",
                candidate.display()
            )));
        }
        let bytes = self.read_candidate(candidate, owner)?;
        let image = BootImage::parse(&bytes).map_err(|source| InstallError::Invalid {
            path: candidate.into(),
            source,
        })?;
        let found = &image.identity.image_id;
        if !found.is_empty() && found != image_id {
            return Err(InstallError::ForeignImage {
                path: candidate.into(),
                found: found.clone(),
                expected: image_id.into(),
            });
        }
        Ok((bytes, image))
    }

    fn read_candidate(&self, path: &Path, owner: Option<u32>) -> Result<Vec<u8>, InstallError> {
        let refused = |reason: String| InstallError::Candidate {
            path: path.into(),
            reason,
        };
        let file = open_regular_file(path).map_err(|e| refused(e.to_string()))?;
        let meta = file.metadata().map_err(|e| refused(e.to_string()))?;
        if let Some(uid) = owner {
            if meta.uid() != uid {
                return Err(refused(format!(
                    "is owned by uid {}, not by the requesting user (uid {uid})",
                    meta.uid()
                )));
            }
        }
        let limit = self.config.max_boot_image_bytes;
        let too_large = |size| InstallError::TooLarge {
            path: path.into(),
            size,
            limit,
        };
        if meta.len() > limit {
            return Err(too_large(meta.len()));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| refused(e.to_string()))?;
        if bytes.len() as u64 > limit {
            return Err(too_large(bytes.len() as u64));
        }
        Ok(bytes)
    }

    /// Every boot image in the store, with the image it serves and whether it is usable.
    pub fn boot_images(&self, source_dir: &Path) -> Vec<BootImageInfo> {
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
            .into_iter()
            .map(|name| self.boot_image_info(source_dir, name))
            .collect()
    }

    fn boot_image_info(&self, source_dir: &Path, name: String) -> BootImageInfo {
        let path = self.path_for(&name);
        let header = format::read_header(&path).ok();
        let base = fs::metadata(source_dir.join(&name)).ok();
        let (loaded, rejected) = {
            let state = self.state.lock().unwrap();
            let loaded = match (state.loaded.peek(&name), &base) {
                (Some(loaded), Some(meta)) => loaded.holds_for(&SourceKey::from_metadata(meta)),
                _ => false,
            };
            let rejected = state
                .rejected
                .get(&name)
                .and_then(|r| (boot_image_file_key(&path).ok() == Some(r.file_key)).then(|| r.reason.clone()));
            (loaded, rejected)
        };
        let stamped = match (&header, &base) {
            (Some(header), Some(meta)) => {
                stamp_matches(&path, BootImageKey::of_header(header), &SourceKey::from_metadata(meta))
            }
            _ => false,
        };
        let image_id = self
            .image_id(&name)
            .or_else(|| header.map(|h| h.image_id).filter(|id| !id.is_empty()));
        let learned = self.trace_path(&name).exists();
        BootImageInfo {
            file: name,
            image_id,
            verified: rejected.is_none() && (loaded || stamped),
            rejected,
            learned,
        }
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
        if !removed.is_empty() {
            info!(
                "removed the boot image files of deleted base files: {}",
                removed.join(", ")
            );
        }
        Ok(removed)
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
        match self.load_verified(name, &path, source, &source_key) {
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

    /// A read lease on `source`, or None where the kernel or the filesystem gives none (the
    /// outcome remembered for [`touch_safety`](Self::touch_safety)); an error if the file is
    /// open for writing, which says nothing of the filesystem.
    fn take_lease(&self, source: &File) -> Result<Option<Arc<Lease>>, LeaseError> {
        let taken = Lease::take(source);
        match &taken {
            Err(LeaseError::OpenForWriting) => return Err(LeaseError::OpenForWriting),
            Err(e) => lease::warn_unavailable(e),
            Ok(_) => {}
        }
        let outcome = (
            taken.as_ref().map(|_| ()).map_err(Clone::clone),
            ctime_moves_at_every_change(source),
        );
        *self.lease_outcome.lock().unwrap() = Some(outcome);
        Ok(taken.ok())
    }

    /// What keeps boot images verified across a touch of their base file here, as the last
    /// attempt to lease one found.
    pub fn touch_safety(&self) -> TouchSafety {
        match self.lease_outcome.lock().unwrap().clone() {
            None => TouchSafety {
                mechanism: "unknown",
                lease_error: None,
            },
            Some((Ok(()), _)) => TouchSafety {
                mechanism: "leases",
                lease_error: None,
            },
            Some((Err(e), multigrain)) => TouchSafety {
                mechanism: if multigrain { "multigrain_timestamps" } else { "none" },
                lease_error: Some(e.to_string()),
            },
        }
    }

    /// Tries a lease on `file` (a base file) to learn what [`touch_safety`](Self::touch_safety)
    /// reports before any boot image is loaded; at start, on one base file.
    pub fn probe_touch_safety(&self, file: &File) {
        let _ = self.take_lease(file);
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

    fn insert(&self, name: &str, verified: Verified) {
        let mut state = self.state.lock().unwrap();
        state.rejected.remove(name);
        let bytes = verified.image.data_len();
        if bytes > self.config.memory_budget {
            warn!("{name}: boot image ({bytes} bytes) exceeds the memory budget; used for open files only, not cached");
            return;
        }
        if let Some(old) = state.loaded.put(name.to_string(), verified) {
            state.used_bytes -= old.image.data_len();
        }
        state.used_bytes += bytes;
        while state.used_bytes > self.config.memory_budget {
            let Some((evicted, loaded)) = state.loaded.pop_lru() else {
                break;
            };
            state.used_bytes -= loaded.image.data_len();
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

    /// Base file `name` in `source_dir` changed (a write, or its times set) since its boot image
    /// was verified, and is now as `now` says. A boot image whose verification still holds (a
    /// touch under a lease) is kept, and its stamp moved once the change has settled. Otherwise,
    /// once per state of the file: the boot image is dropped from memory and, if it was there
    /// (in use), queued to be verified again by one background thread a second after the
    /// change, so that the next boots find it ready (or refused) without verifying at open.
    /// Boot images not in memory are verified when next loaded.
    pub fn source_changed(self: &Arc<Self>, source_dir: &Path, name: &str, now: SourceKey) {
        let state = self.state.lock().unwrap();
        if let Some(loaded) = state.loaded.peek(name).filter(|loaded| loaded.holds_for(&now)) {
            if loaded.key != now {
                drop(state);
                self.queue_reverify(source_dir, name);
            }
            return;
        }
        drop(state);
        {
            let mut seen = self.reverified.lock().unwrap();
            if seen.get(name) == Some(&now) || !self.path_for(name).exists() {
                return;
            }
            seen.insert(name.to_string(), now);
        }
        if self.evict(name) {
            self.queue_reverify(source_dir, name);
        }
    }

    /// Has `name` loaded (verified again if it must be) by one background thread a second from
    /// now, once its base file's ctime has settled.
    fn queue_reverify(self: &Arc<Self>, source_dir: &Path, name: &str) {
        let mut queue = self.reverify_queue.lock().unwrap();
        // A second after the last change: its ctime has settled by then.
        let due = Instant::now() + SETTLE;
        let entry = queue.due.entry(name.to_string()).or_insert(due);
        *entry = (*entry).max(due);
        if queue.running {
            return;
        }
        let (store, source_dir) = (self.clone(), source_dir.to_path_buf());
        match std::thread::Builder::new()
            .name("yolofs-reverify".into())
            .spawn(move || store.reverify_queued(&source_dir))
        {
            Ok(_) => queue.running = true,
            Err(e) => {
                warn!("cannot verify changed boot images again now: {e}");
                queue.due.clear();
            }
        }
    }

    /// The queue of [`source_changed`](Self::source_changed), until it is empty.
    fn reverify_queued(&self, source_dir: &Path) {
        loop {
            let (name, due) = {
                let mut queue = self.reverify_queue.lock().unwrap();
                let next = queue
                    .due
                    .iter()
                    .min_by_key(|(_, due)| **due)
                    .map(|(n, d)| (n.clone(), *d));
                match next {
                    Some(next) => next,
                    None => {
                        queue.running = false;
                        return;
                    }
                }
            };
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            self.reverify_queue.lock().unwrap().due.remove(&name);
            match open_regular_file(&source_dir.join(&name)) {
                Ok(source) => match self.load(&name, &source) {
                    Ok(_) => info!("{name}: boot image verified again after its base file changed"),
                    Err(e) => debug!("{name}: not verified again: {e}"),
                },
                Err(e) => debug!("{name}: not verified again: {e}"),
            }
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

    /// Sets base file `name`'s access and modification times to now, as Nova's image cache marks
    /// the base files in use (it ages them by their mtime), and keeps its boot image's
    /// verification: a time set moves the file's ctime, which would otherwise cost a verification
    /// again, reading the boot's bytes from the disk at the start of every boot. Whether a
    /// verification (in memory or stamped) was kept.
    ///
    /// A boot image held under a lease keeps its verification whatever the times (see
    /// [`Verified::holds_for`]); its stamp follows once the ctime has settled. Without a lease,
    /// only where the ctime read after the touch moves at any later write, even in the same clock
    /// tick (the racily-clean rule above cannot wait here): filesystems with multigrain
    /// timestamps, where yolofs, which changes nothing but the times under the store's lock,
    /// moves the key of the boot image and of its stamp to the file as it is. Elsewhere the times
    /// are set and the boot image is verified again.
    pub fn touch(self: &Arc<Self>, source_dir: &Path, name: &str, source: &File) -> std::io::Result<bool> {
        let multigrain = ctime_moves_at_every_change(source);
        let path = self.path_for(name);
        let mut state = self.state.lock().unwrap();
        let before = SourceKey::of(source)?;
        let now = libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        };
        // SAFETY: `source` is an open descriptor and `times` two valid timespecs.
        if unsafe { libc::futimens(source.as_raw_fd(), [now, now].as_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let after = SourceKey::of(source)?;
        if let Some(loaded) = state.loaded.peek_mut(name) {
            if loaded.lease.as_ref().is_some_and(|l| l.intact()) && loaded.holds_for(&after) {
                drop(state);
                self.queue_reverify(source_dir, name);
                return Ok(true);
            }
        }
        if !multigrain {
            return Ok(false);
        }
        let mut kept = false;
        if let Some(loaded) = state.loaded.peek_mut(name).filter(|l| l.key == before) {
            loaded.key = after;
            kept = true;
        }
        if let Some(stamp) = read_stamp(&path).filter(|stamp| stamp.source == before) {
            save_stamp(&path, &Stamp { source: after, ..stamp })?;
            kept = true;
        }
        Ok(kept)
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

    /// Bytes of loaded boot image data locked in RAM.
    pub fn locked_bytes(&self) -> u64 {
        let state = self.state.lock().unwrap();
        state
            .loaded
            .iter()
            .filter(|(_, l)| l.image.is_locked())
            .map(|(_, l)| l.image.data_len())
            .sum()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_taken_once_the_file_has_settled() {
        let file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut &file, b"just written").unwrap();
        let key = SourceKey::settled(&file, Duration::from_secs(5)).unwrap().unwrap();
        let now_ns = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as i128;
        assert!(now_ns - key.ctime_ns >= SETTLE.as_nanos() as i128);
        // Settled already: no wait needed (none is allowed). Still changing past the wait: none.
        assert_eq!(SourceKey::settled(&file, Duration::ZERO).unwrap(), Some(key));
        std::io::Write::write_all(&mut &file, b" again").unwrap();
        assert_eq!(SourceKey::settled(&file, Duration::from_millis(100)).unwrap(), None);
    }
    use crate::build::{build_boot_image, TraceRead};
    use crate::format::SourceIdentity;

    const IMAGE: &str = "c0ffee00-0000-4000-8000-000000000001";
    const SIZE: usize = 1 << 20;

    struct Fixture {
        dir: tempfile::TempDir,
        store: Arc<BootImageStore>,
    }

    fn content(seed: u32) -> Vec<u8> {
        (0..SIZE as u32)
            .map(|i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8)
            .collect()
    }

    impl Fixture {
        fn new(max_boot_image_bytes: u64) -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            for sub in ["base", "store", "nova"] {
                fs::create_dir(dir.path().join(sub)).unwrap();
            }
            fs::write(dir.path().join("base/disk"), content(0)).unwrap();
            let store = Arc::new(BootImageStore::new(StoreConfig {
                dir: dir.path().join("store"),
                memory_budget: 64 << 20,
                lock_in_memory: false,
                max_boot_image_bytes,
            }));
            Fixture { dir, store }
        }

        fn base_dir(&self) -> PathBuf {
            self.dir.path().join("base")
        }

        fn base(&self) -> File {
            File::open(self.base_dir().join("disk")).unwrap()
        }

        /// A candidate boot image in "nova's" directory, built from `data` with `image_id` in its header.
        fn candidate(&self, data: &[u8], image_id: &str) -> PathBuf {
            let source = self.dir.path().join("nova/source");
            fs::write(&source, data).unwrap();
            let reads = [
                TraceRead {
                    offset: 0,
                    length: 8192,
                },
                TraceRead {
                    offset: 500_000,
                    length: 10_000,
                },
            ];
            let identity = SourceIdentity {
                image_id: image_id.into(),
                source_size: SIZE as u64,
                rendition: "raw".into(),
                ..Default::default()
            };
            let path = self.dir.path().join("nova/candidate.yolo");
            build_boot_image(&reads, &File::open(&source).unwrap(), &identity, 4096, &path).unwrap();
            path
        }

        fn install(&self, candidate: &Path, image_id: &str) -> Result<Installed, InstallError> {
            self.store.install("disk", &self.base(), candidate, image_id, None)
        }

        fn store_files(&self) -> Vec<String> {
            let mut names: Vec<String> = fs::read_dir(self.dir.path().join("store"))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            names
        }

        fn incoming_is_empty(&self) -> bool {
            fs::read_dir(self.store.incoming_dir()).map_or(true, |mut d| d.next().is_none())
        }
    }

    #[test]
    fn a_matching_boot_image_is_installed_stamped_and_attributed() {
        let f = Fixture::new(1 << 30);
        let candidate = f.candidate(&content(0), IMAGE);
        let installed = f.install(&candidate, IMAGE).unwrap();
        assert_eq!((installed.file.as_str(), installed.image_id.as_str()), ("disk", IMAGE));
        assert_eq!(installed.extents, 2);
        assert_eq!(
            f.store_files(),
            [".incoming", "disk.image-id", "disk.yolo", "disk.yolo.verified"]
        );
        assert!(f.incoming_is_empty());
        assert_eq!(
            fs::read(&candidate).unwrap(),
            fs::read(f.store.path_for("disk")).unwrap()
        );
        assert_eq!(
            f.store.boot_images(&f.base_dir()),
            [BootImageInfo {
                file: "disk".into(),
                image_id: Some(IMAGE.into()),
                verified: true,
                rejected: None,
                learned: false,
            }]
        );
        // The stamp is valid: loading does not verify again, and the image is served.
        let image = f.store.load("disk", &f.base()).unwrap().image;
        assert_eq!(image.identity.image_id, IMAGE);
        // A boot image without an image id in its header is taken for the image named.
        let anonymous = f.candidate(&content(0), "");
        f.install(&anonymous, IMAGE).unwrap();
        assert_eq!(f.store.image_id("disk").as_deref(), Some(IMAGE));
    }

    #[test]
    fn an_install_replaces_a_learned_boot_image_and_its_trace() {
        let f = Fixture::new(1 << 30);
        // What learning leaves: a boot image built from the base file, and its trace.
        fs::copy(f.candidate(&content(0), IMAGE), f.store.path_for("disk")).unwrap();
        fs::write(f.store.trace_path("disk"), "yolofs trace v1\n").unwrap();
        assert!(f.store.boot_images(&f.base_dir())[0].learned);
        f.install(&f.candidate(&content(0), IMAGE), IMAGE).unwrap();
        assert!(!f.store.trace_path("disk").exists());
        assert!(!f.store.boot_images(&f.base_dir())[0].learned);
    }

    #[test]
    fn a_touch_keeps_a_leased_verification_whatever_the_timestamps() {
        let f = Fixture::new(1 << 30);
        f.install(&f.candidate(&content(0), IMAGE), IMAGE).unwrap();
        let loaded = f.store.load("disk", &f.base()).unwrap();
        assert!(loaded.leased());
        let verified = SourceKey::of(&f.base()).unwrap();
        // Times set behind the store's back (Nova's image cache manager) and through it.
        let old_times = std::fs::FileTimes::new().set_modified(UNIX_EPOCH + Duration::from_secs(1000));
        f.base().set_times(old_times).unwrap();
        assert!(f.store.cached("disk", &SourceKey::of(&f.base()).unwrap()).is_some());
        assert!(f.store.touch(&f.base_dir(), "disk", &f.base()).unwrap());
        let now = SourceKey::of(&f.base()).unwrap();
        assert!(now != verified);
        let modified = f.base().metadata().unwrap().modified().unwrap();
        assert!(SystemTime::now().duration_since(modified).unwrap() < Duration::from_secs(60));
        assert!(loaded.holds_for(&now));
        assert!(f.store.cached("disk", &now).is_some());
        // The stamp follows once the change has settled, so that a restart finds it verified.
        assert!(!stamp_matches(
            &f.store.path_for("disk"),
            BootImageKey::of(&loaded.image),
            &now
        ));
        std::thread::sleep(SETTLE);
        assert!(f.store.cached("disk", &now).is_some());
        // Moved by that call or by the re-check the touch queued, whichever came first.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !stamp_matches(&f.store.path_for("disk"), BootImageKey::of(&loaded.image), &now) {
            assert!(Instant::now() < deadline, "the stamp did not follow the touch");
            std::thread::sleep(Duration::from_millis(10));
        }
        // An open for writing ends it, even with no byte written and the times as they were.
        let writer = fs::OpenOptions::new()
            .write(true)
            .open(f.base_dir().join("disk"))
            .unwrap();
        writer.set_times(old_times).unwrap();
        f.base()
            .set_times(std::fs::FileTimes::new().set_modified(modified))
            .unwrap();
        let changed = SourceKey::of(&f.base()).unwrap();
        assert!(!loaded.holds_for(&changed));
        assert!(f.store.cached("disk", &changed).is_none());
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

    #[test]
    fn installing_replaces_a_refused_or_loaded_boot_image() {
        let f = Fixture::new(1 << 30);
        fs::write(f.store.path_for("disk"), b"not a boot image").unwrap();
        assert!(f.store.load("disk", &f.base()).is_err());
        let listed = f.store.boot_images(&f.base_dir());
        assert!(listed[0].rejected.as_deref().unwrap().contains("invalid"), "{listed:?}");
        assert!(!listed[0].verified);
        f.install(&f.candidate(&content(0), IMAGE), IMAGE).unwrap();
        assert!(f.store.load("disk", &f.base()).is_ok());
        assert_eq!(f.store.boot_images(&f.base_dir())[0].rejected, None);
        assert!(f.store.boot_images(&f.base_dir())[0].verified);
    }

    #[test]
    fn a_boot_image_of_other_bytes_is_not_installed() {
        let f = Fixture::new(1 << 30);
        let err = f.install(&f.candidate(&content(1), IMAGE), IMAGE).unwrap_err();
        assert!(matches!(err, InstallError::Mismatch { .. }), "{err}");
        assert!(err.to_string().contains("does not match base file disk"), "{err}");
        assert_eq!(f.store_files(), [".incoming"]);
        assert!(f.incoming_is_empty());
    }

    #[test]
    fn a_boot_image_for_another_image_is_not_installed() {
        let f = Fixture::new(1 << 30);
        let err = f
            .install(&f.candidate(&content(0), "another-image"), IMAGE)
            .unwrap_err();
        assert!(matches!(err, InstallError::ForeignImage { .. }), "{err}");
        assert!(err.to_string().contains("for image another-image, not"), "{err}");
        assert!(f.store_files().is_empty());
    }

    #[test]
    fn symbolic_links_and_special_files_are_not_read() {
        let f = Fixture::new(1 << 30);
        let candidate = f.candidate(&content(0), IMAGE);
        let link = f.dir.path().join("nova/link.yolo");
        std::os::unix::fs::symlink(&candidate, &link).unwrap();
        let err = f.install(&link, IMAGE).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        let err = f.install(&f.dir.path().join("nova"), IMAGE).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let fifo = f.dir.path().join("nova/fifo");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c_path` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let err = f.install(&fifo, IMAGE).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        assert!(f.store_files().is_empty());
    }

    #[test]
    fn a_file_of_another_owner_is_not_read_for_an_unprivileged_client() {
        let f = Fixture::new(1 << 30);
        let candidate = f.candidate(&content(0), IMAGE);
        let owner = fs::metadata(&candidate).unwrap().uid();
        let err = f
            .store
            .install("disk", &f.base(), &candidate, IMAGE, Some(owner.wrapping_add(1)))
            .unwrap_err();
        assert!(err.to_string().contains("not by the requesting user"), "{err}");
        f.store
            .install("disk", &f.base(), &candidate, IMAGE, Some(owner))
            .unwrap();
    }

    #[test]
    fn a_boot_image_over_the_size_bound_is_not_read() {
        let f = Fixture::new(16 << 10);
        let candidate = f.candidate(&content(0), IMAGE);
        let err = f.install(&candidate, IMAGE).unwrap_err();
        assert!(matches!(err, InstallError::TooLarge { limit: 16384, .. }), "{err}");
        assert!(f.store_files().is_empty());
    }

    #[test]
    fn bad_requests_are_refused() {
        let f = Fixture::new(1 << 30);
        let candidate = f.candidate(&content(0), IMAGE);
        for image_id in ["", "has space", &"x".repeat(64)] {
            let err = f.install(&candidate, image_id).unwrap_err();
            assert!(matches!(err, InstallError::BadRequest(_)), "{err}");
        }
        let err = f.install(Path::new("nova/candidate.yolo"), IMAGE).unwrap_err();
        assert!(err.to_string().contains("not absolute"), "{err}");
        let err = f.install(&f.dir.path().join("nova/missing.yolo"), IMAGE).unwrap_err();
        assert!(matches!(err, InstallError::Candidate { .. }), "{err}");
    }

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
}
