//! The semantics of the yolofs mount, independent of FUSE.
//!
//! yolofs is a read-only mirror of a source directory (Nova's `instances/_base`): same names, same
//! attributes, same bytes. Inode numbers are our own, a function of the source file (device,
//! inode, birth time), so a `.part` file renamed into place keeps its inode, a replaced file gets
//! a new one, and a yolofs that takes the mount over from a crashed one knows what the kernel
//! holds (see `InodeTable`).
//!
//! A read of a file that has a verified boot image is assembled extent by extent: ranges the boot
//! image covers are copied from memory, the gaps between them are read from the source file with
//! `pread`, so one request may mix both. Every open holds its own descriptor of the source file:
//! a source file unlinked while open keeps returning its own bytes, and a short read in the middle
//! of a mixed request is an EIO, never bytes that were not in the file.
//!
//! Every operation returns `Result<_, FsError>`; the FUSE adapter turns errors into errnos.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, Metadata};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use thiserror::Error;

use crate::fill::{Fill, FillError, Outcome, FILL_SUFFIX};
use crate::format::BootImage;
use crate::recorder::{Recorder, Recording};
use crate::stats::{FileStats, ReadSource, StatsRegistry};
use crate::store::{BootImageStore, SourceKey, Verified};

pub const ROOT_INO: u64 = 1;

#[derive(Debug, Error)]
pub enum FsError {
    #[error("no such inode {0}")]
    UnknownInode(u64),
    #[error("no such file handle {0}")]
    UnknownHandle(u64),
    #[error("not found")]
    NotFound,
    #[error("read-only file system")]
    ReadOnly,
    #[error("not a directory")]
    NotADirectory,
    #[error("source file ended early at offset {0}")]
    ShortRead(u64),
    #[error("base file being filled: {0}")]
    Fill(#[from] FillError),
    #[error("{0} is a fill file yolofs has no fill for (was yolofs restarted?)")]
    UnknownFill(String),
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}

impl FsError {
    pub fn errno(&self) -> i32 {
        match self {
            FsError::UnknownInode(_) | FsError::NotFound => libc::ENOENT,
            FsError::UnknownHandle(_) => libc::EBADF,
            FsError::ReadOnly => libc::EROFS,
            FsError::NotADirectory => libc::ENOTDIR,
            FsError::ShortRead(_) | FsError::Fill(_) | FsError::UnknownFill(_) => libc::EIO,
            FsError::Io(e) if e.kind() == io::ErrorKind::NotFound => libc::ENOENT,
            FsError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// Expected misses, logged at debug rather than as errors.
    pub fn is_expected(&self) -> bool {
        self.errno() == libc::ENOENT
    }
}

pub type Result<T> = std::result::Result<T, FsError>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Directory,
    Symlink,
    Other,
}

/// Attributes of a mirrored entry: the source's, under our inode number.
#[derive(Clone, Debug)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub blocks: u64,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub blksize: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH
    }
}

fn kind_of(meta: &Metadata) -> Kind {
    let ft = meta.file_type();
    if ft.is_file() {
        Kind::File
    } else if ft.is_dir() {
        Kind::Directory
    } else if ft.is_symlink() {
        Kind::Symlink
    } else {
        Kind::Other
    }
}

fn attr_of(ino: u64, meta: &Metadata) -> Attr {
    // Nothing written through the mount: drop every write bit.
    let perm = (meta.mode() & 0o7777 & !0o222) as u16;
    Attr {
        ino,
        kind: kind_of(meta),
        size: meta.len(),
        blocks: meta.blocks(),
        perm,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        blksize: meta.blksize() as u32,
        atime: time(meta.atime(), meta.atime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        ctime: time(meta.ctime(), meta.ctime_nsec()),
    }
}

/// Which of a source file's two inodes an entry is. Where the kernel offers FUSE passthrough, a
/// file with no boot image (and none being learned) is given a `Kernel` inode, whose opens the
/// kernel serves from the source file by itself; every other file a `Yolofs` inode. The kernel
/// requires every open of an inode to be passthrough once one is, so the two never share an inode:
/// when a boot image arrives, the next lookup hands out the `Yolofs` inode, while files already
/// open on the `Kernel` inode keep reading through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Serving {
    Yolofs,
    Kernel,
}

struct InodeEntry {
    path: PathBuf,
    source: (u64, u64),
    serving: Serving,
}

/// Inode numbers are a function of the source file, not a counter, so that a yolofs taking over
/// the mount of one that crashed or was upgraded understands the numbers the kernel holds:
/// - `Yolofs` inodes are even: `key << 1`, the key a hash of the source's device, inode number
///   and birth time (a file recreated under a reused inode number is another inode);
/// - `Kernel` inodes are odd and carry the generation of the yolofs that handed them out in their
///   top bits: the kernel ties the passthrough opens of an inode to the backing file of the
///   process that opened it first, which a later process cannot name, so each process hands out
///   its own. One inherited from an earlier process is opened without passthrough, which the
///   kernel refuses while passthrough opens of it remain (the opener gets an error); after a
///   takeover the kernel forgets its cached names, so opens by name get this process's inodes.
const GENERATION_SHIFT: u32 = 41;
const KERNEL_KEY_MASK: u64 = (1 << (GENERATION_SHIFT - 1)) - 1;

/// splitmix64's finaliser: a fixed, well-spread mix (std's hashers may change between releases,
/// and inode numbers must not change with the yolofs binary).
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn source_key(meta: &Metadata) -> u64 {
    let born = meta
        .created()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    mix(meta.dev() ^ mix(meta.ino() ^ mix(born)))
}

fn yolofs_ino(key: u64) -> u64 {
    // Never 0 (invalid) nor 1 (the root).
    (key << 1).max(2)
}

fn kernel_ino(key: u64, generation: u64) -> u64 {
    generation << GENERATION_SHIFT | (key & KERNEL_KEY_MASK) << 1 | 1
}

/// A generation for this process's `Kernel` inodes: never 0, and different from an earlier
/// process's but for a one in four million chance.
fn new_generation() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    (mix(now ^ u64::from(std::process::id()) << 32) >> GENERATION_SHIFT).max(1)
}

/// Our inodes: their source path, source (device, inode) and serving.
struct InodeTable {
    entries: HashMap<u64, InodeEntry>,
    generation: u64,
}

impl InodeTable {
    fn ino_for(&mut self, meta: &Metadata, path: PathBuf, serving: Serving) -> u64 {
        let key = source_key(meta);
        let ino = match serving {
            Serving::Yolofs => yolofs_ino(key),
            Serving::Kernel => kernel_ino(key, self.generation),
        };
        let source = (meta.dev(), meta.ino());
        self.entries.insert(ino, InodeEntry { path, source, serving });
        ino
    }

    /// A `Kernel` inode handed out by an earlier yolofs on this mount: opened without passthrough.
    fn inherited(&self, ino: u64) -> bool {
        ino != ROOT_INO && ino & 1 == 1 && ino >> GENERATION_SHIFT != self.generation
    }

    /// Whether `ino` is the number an earlier or this process gave the file `meta` describes.
    fn names(ino: u64, meta: &Metadata) -> bool {
        let key = source_key(meta);
        if ino & 1 == 0 {
            ino == yolofs_ino(key)
        } else {
            (ino >> 1) & KERNEL_KEY_MASK == key & KERNEL_KEY_MASK
        }
    }
}

/// One open file: its source descriptor and where its reads are served from.
pub struct OpenFile {
    name: String,
    source: File,
    /// The boot image, valid while its verification holds for the source as it is.
    boot_image: RwLock<Option<Verified>>,
    recording: Option<Arc<Recording>>,
    /// Its fill, if it is a fill file (which has no boot image in the store).
    filling: Option<Arc<Filling>>,
    stats: Arc<FileStats>,
}

/// A base file being filled (docs/first-boot.md): its fill, and the boot image its reads are
/// served from meanwhile, trusted by its publisher and verified once the file is complete.
pub struct Filling {
    pub fill: Fill,
    pub boot_image: Arc<BootImage>,
}

/// How a file was opened, for the FUSE adapter's open flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    pub ino: u64,
    pub fh: u64,
    pub from_boot_image: bool,
    /// Every read must reach yolofs, not the page cache: the boot is being learned, or watched
    /// to extend its boot image (with --learn), and kernel readahead would add what it never read.
    pub direct_io: bool,
    /// Not a download in progress: its bytes never change, so its pages may be cached.
    pub immutable: bool,
    /// Served by the kernel from the source file (FUSE passthrough), not by yolofs.
    pub kernel_passthrough: bool,
}

pub struct MirrorFs {
    source_root: PathBuf,
    root_key: (u64, u64),
    inodes: RwLock<InodeTable>,
    handles: RwLock<HashMap<u64, Arc<OpenFile>>>,
    next_fh: AtomicU64,
    store: Arc<BootImageStore>,
    stats: Arc<StatsRegistry>,
    recorder: Option<Arc<Recorder>>,
    /// Whether the kernel agreed to FUSE passthrough (set once mounted).
    kernel_passthrough: AtomicBool,
    /// Fill files being filled, by name.
    fills: RwLock<HashMap<String, Arc<Filling>>>,
    /// Notified when a fill begins; the number of opens waiting for one (`await_filling`).
    fill_begun: (Mutex<usize>, Condvar),
    /// How long a read of a fill file waits for bytes not filled yet (milliseconds).
    fill_read_timeout_ms: AtomicU64,
}

/// A fill read waits this long by default: a read waiting for a whole download and conversion
/// (formats that cannot be fetched by range) has minutes to wait, not for ever.
pub const DEFAULT_FILL_READ_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a read of a fill file this yolofs has no fill of waits for the driver to register it
/// (it does every few seconds while it fills, and at once after a restart of yolofs).
pub const FILL_REGISTRATION_WAIT: Duration = Duration::from_secs(30);
/// Opens waiting for a fill's registration at a time (of the FUSE session's worker threads).
const FILL_REGISTRATION_WAITERS: usize = 8;

/// Names that are never learned: Nova's downloads in progress, and fill files.
fn is_transient(name: &str) -> bool {
    name.ends_with(".part") || name.ends_with(".tmp") || is_fill_file(name)
}

pub fn is_fill_file(name: &str) -> bool {
    name.ends_with(FILL_SUFFIX)
}

/// The base file a fill file becomes once filled (`NAME.yolo-fill` -> `NAME`).
fn base_of_fill_file(relative: &Path) -> Option<PathBuf> {
    let name = relative.to_str()?.strip_suffix(FILL_SUFFIX)?;
    (!name.is_empty()).then(|| PathBuf::from(name))
}

impl MirrorFs {
    pub fn new(
        source_root: &Path,
        store: Arc<BootImageStore>,
        stats: Arc<StatsRegistry>,
        recorder: Option<Arc<Recorder>>,
    ) -> io::Result<MirrorFs> {
        let meta = fs::metadata(source_root)?;
        if !meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a directory", source_root.display()),
            ));
        }
        let mut inodes = InodeTable {
            entries: HashMap::new(),
            generation: new_generation(),
        };
        let root = InodeEntry {
            path: PathBuf::new(),
            source: (meta.dev(), meta.ino()),
            serving: Serving::Yolofs,
        };
        inodes.entries.insert(ROOT_INO, root);
        // Handles of this process never repeat an earlier one's, which the kernel may still hold.
        let first_fh = inodes.generation << 40 | 1;
        Ok(MirrorFs {
            source_root: source_root.to_path_buf(),
            root_key: (meta.dev(), meta.ino()),
            inodes: RwLock::new(inodes),
            handles: RwLock::default(),
            next_fh: AtomicU64::new(first_fh),
            store,
            stats,
            recorder,
            kernel_passthrough: AtomicBool::new(false),
            fills: RwLock::default(),
            fill_begun: (Mutex::new(0), Condvar::new()),
            fill_read_timeout_ms: AtomicU64::new(DEFAULT_FILL_READ_TIMEOUT.as_millis() as u64),
        })
    }

    pub fn set_fill_read_timeout(&self, timeout: Duration) {
        self.fill_read_timeout_ms
            .store(timeout.as_millis() as u64, Ordering::Relaxed);
    }

    /// Starts serving fill file `name` (in the source directory, at its final size) from
    /// `boot_image` and its filled ranges; the fill under way if there is one (concurrent first
    /// boots share it): (the fill, whether it is new).
    pub fn begin_fill(&self, name: &str, boot_image: BootImage) -> Result<(Arc<Filling>, bool)> {
        let meta = fs::symlink_metadata(self.source_root.join(name))?;
        if !meta.is_file() || !is_fill_file(name) {
            return Err(FsError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name} is not a fill file"),
            )));
        }
        if meta.len() != boot_image.identity.source_size {
            return Err(FsError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{name} has {} bytes, its boot image's source {}",
                    meta.len(),
                    boot_image.identity.source_size
                ),
            )));
        }
        let mut fills = self.fills.write().unwrap();
        if let Some(filling) = fills.get(name) {
            return Ok((filling.clone(), false));
        }
        let filling = Arc::new(Filling {
            fill: Fill::new(meta.len()),
            boot_image: Arc::new(boot_image),
        });
        fills.insert(name.to_string(), filling.clone());
        drop(fills);
        let (lock, begun) = &self.fill_begun;
        let _waiters = lock.lock().unwrap();
        begun.notify_all();
        Ok((filling, true))
    }

    /// The fills under way: (fill file name, its size, bytes filled so far).
    pub fn fills(&self) -> Vec<(String, u64, u64)> {
        let fills = self.fills.read().unwrap();
        let mut progress: Vec<_> = fills
            .iter()
            .map(|(name, filling)| (name.clone(), filling.fill.size(), filling.fill.progress().0))
            .collect();
        progress.sort();
        progress
    }

    pub fn filling(&self, name: &str) -> Option<Arc<Filling>> {
        self.fills.read().unwrap().get(name).cloned()
    }

    /// The fill of fill file `name`, waited for if this yolofs does not know it yet: restarted
    /// since the fill began, it learns it again from the driver within seconds, and a read
    /// meanwhile must neither fail the guest nor read the file's holes as zeros.
    /// At most FILL_REGISTRATION_WAITERS wait at a time: the others fail at once, so that waits
    /// never hold every FUSE worker (reads of other files go on meanwhile).
    fn await_filling(&self, name: &str) -> Result<Arc<Filling>> {
        if let Some(filling) = self.filling(name) {
            return Ok(filling);
        }
        let unknown = || FsError::UnknownFill(name.to_string());
        let (lock, begun) = &self.fill_begun;
        let mut waiting = lock.lock().unwrap();
        if *waiting >= FILL_REGISTRATION_WAITERS {
            return Err(unknown());
        }
        *waiting += 1;
        let deadline = Instant::now() + FILL_REGISTRATION_WAIT;
        let found = loop {
            // Checked under the lock begin_fill notifies under: no notification is missed.
            if let Some(filling) = self.filling(name) {
                break Some(filling);
            }
            let now = Instant::now();
            if now >= deadline {
                break None;
            }
            waiting = begun.wait_timeout(waiting, deadline - now).unwrap().0;
        };
        *waiting -= 1;
        found.ok_or_else(unknown)
    }

    /// Ends the fill of `name` (its open files keep it: complete, they read the file; failed,
    /// they fail) and forgets it.
    pub fn end_fill(&self, name: &str, outcome: Outcome) -> Option<Arc<Filling>> {
        let filling = self.fills.write().unwrap().remove(name)?;
        filling.fill.finish(outcome);
        Some(filling)
    }

    /// Lets files without a boot image be served by the kernel (FUSE passthrough), or stops it.
    pub fn set_kernel_passthrough(&self, enabled: bool) {
        self.kernel_passthrough.store(enabled, Ordering::Relaxed);
    }

    /// Whether this mount learns boot images (`--learn`).
    pub fn learns(&self) -> bool {
        self.recorder.as_ref().is_some_and(|r| r.learns())
    }

    pub fn source_root(&self) -> &Path {
        &self.source_root
    }

    /// Base file `name` changed: its boot image is to be verified again (if it has one and is
    /// not a download in progress). Returns the inodes whose page cache the kernel must drop.
    pub fn source_changed(&self, name: &str) -> Vec<u64> {
        if is_transient(name) {
            return Vec::new();
        }
        let path = self.source_root.join(name);
        let Ok(meta) = fs::symlink_metadata(&path) else {
            return Vec::new();
        };
        if meta.is_file() {
            self.store
                .source_changed(&self.source_root, name, SourceKey::from_metadata(&meta));
        }
        let source = (meta.dev(), meta.ino());
        // All of the file's inodes: a kernel-served one is served by yolofs, through the page
        // cache, once the kernel refuses passthrough.
        let inodes = self.inodes.read().unwrap();
        inodes
            .entries
            .iter()
            .filter(|(_, entry)| entry.source == source)
            .map(|(ino, _)| *ino)
            .collect()
    }

    pub fn stats(&self) -> &StatsRegistry {
        &self.stats
    }

    pub fn kernel_passthrough(&self) -> bool {
        self.kernel_passthrough.load(Ordering::Relaxed)
    }

    fn relative_path(&self, ino: u64) -> Result<PathBuf> {
        Ok(self.entry(ino)?.0)
    }

    fn entry(&self, ino: u64) -> Result<(PathBuf, (u64, u64), Serving)> {
        if let Some(entry) = self.inodes.read().unwrap().entries.get(&ino) {
            return Ok((entry.path.clone(), entry.source, entry.serving));
        }
        self.inherit(ino)
    }

    /// An inode the kernel holds from an earlier yolofs on this mount (we took it over): found by
    /// its number among the source's files (two levels deep: `_base` is flat).
    fn inherit(&self, ino: u64) -> Result<(PathBuf, (u64, u64), Serving)> {
        let mut dirs = vec![(PathBuf::new(), 0)];
        while let Some((dir, depth)) = dirs.pop() {
            for entry in fs::read_dir(self.source_root.join(&dir))?.flatten() {
                let Ok(meta) = entry.metadata() else { continue };
                let relative = dir.join(entry.file_name());
                if InodeTable::names(ino, &meta) {
                    let serving = if ino & 1 == 0 { Serving::Yolofs } else { Serving::Kernel };
                    let source = (meta.dev(), meta.ino());
                    let entry = InodeEntry {
                        path: relative.clone(),
                        source,
                        serving,
                    };
                    log::info!("{}: inode {ino} taken over from an earlier yolofs", relative.display());
                    self.inodes.write().unwrap().entries.insert(ino, entry);
                    return Ok((relative, source, serving));
                }
                if meta.is_dir() && depth < 2 {
                    dirs.push((relative, depth + 1));
                }
            }
        }
        Err(FsError::UnknownInode(ino))
    }

    /// How a file is to be served now (see [`Serving`]).
    fn serving_for(&self, relative: &Path, meta: &Metadata) -> Serving {
        let name = relative.to_string_lossy();
        let kernel = self.kernel_passthrough()
            && meta.is_file()
            && !is_transient(&name)
            && !self.learns()
            && !self.store.has_usable(&name);
        if kernel {
            Serving::Kernel
        } else {
            Serving::Yolofs
        }
    }

    fn register(&self, meta: &Metadata, relative: PathBuf) -> u64 {
        if (meta.dev(), meta.ino()) == self.root_key {
            return ROOT_INO;
        }
        let serving = self.serving_for(&relative, meta);
        self.inodes.write().unwrap().ino_for(meta, relative, serving)
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr> {
        let mut relative = self.relative_path(parent)?.join(name);
        let meta = match fs::symlink_metadata(self.source_root.join(&relative)) {
            Ok(meta) => meta,
            // A base file being filled is its fill file until the fill renames it: instance disks
            // name the base file, as Nova knows it, from the start (docs/first-boot.md).
            Err(e) if e.kind() == io::ErrorKind::NotFound && parent == ROOT_INO => {
                let fill_name = format!("{}{FILL_SUFFIX}", name.to_string_lossy());
                if self.filling(&fill_name).is_none() {
                    return Err(e.into());
                }
                relative = PathBuf::from(fill_name);
                fs::symlink_metadata(self.source_root.join(&relative))?
            }
            Err(e) => return Err(e.into()),
        };
        let ino = self.register(&meta, relative);
        Ok(attr_of(ino, &meta))
    }

    pub fn getattr(&self, ino: u64, fh: Option<u64>) -> Result<Attr> {
        if let Some(handle) = fh.and_then(|fh| self.handles.read().unwrap().get(&fh).cloned()) {
            return Ok(attr_of(ino, &handle.source.metadata()?));
        }
        let (relative, source, _) = self.entry(ino)?;
        let meta = fs::symlink_metadata(self.source_root.join(&relative))?;
        // The path may now name another file (renamed over, replaced): this inode is gone.
        if (meta.dev(), meta.ino()) != source {
            return Err(FsError::NotFound);
        }
        Ok(attr_of(ino, &meta))
    }

    pub fn readlink(&self, ino: u64) -> Result<OsString> {
        let relative = self.relative_path(ino)?;
        Ok(fs::read_link(self.source_root.join(relative))?.into_os_string())
    }

    /// Every entry of a directory with its inode number and kind (`.` and `..` not included).
    pub fn readdir(&self, ino: u64) -> Result<Vec<(u64, Kind, OsString)>> {
        let relative = self.relative_path(ino)?;
        let dir = self.source_root.join(&relative);
        if !fs::symlink_metadata(&dir)?.is_dir() {
            return Err(FsError::NotADirectory);
        }
        let mut entries = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            // An entry removed between readdir and stat is simply not listed.
            let Ok(meta) = entry.metadata() else { continue };
            let child_ino = self.register(&meta, relative.join(entry.file_name()));
            entries.push((child_ino, kind_of(&meta), entry.file_name()));
        }
        Ok(entries)
    }

    /// Opens a file for reading. `flags` are the open(2) flags; any write access is EROFS.
    pub fn open(&self, ino: u64, flags: i32) -> Result<Opened> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(FsError::ReadOnly);
        }
        let (handle, serving) = self.open_source(ino, true)?;
        handle.stats.opened();
        // If passthrough was turned off since this inode was handed out, yolofs serves it (without
        // a boot image: that goes with a fresh lookup); and an inherited inode is never passthrough.
        let inherited = self.inodes.read().unwrap().inherited(ino);
        let opened = Opened {
            ino,
            fh: self.next_fh.fetch_add(1, Ordering::Relaxed),
            from_boot_image: handle.boot_image.read().unwrap().is_some(),
            // Learning windows exist only on learning mounts, where watched boots extend theirs.
            direct_io: inherited || (handle.recording.is_some() && self.learns()),
            immutable: !is_transient(&handle.name),
            kernel_passthrough: serving == Serving::Kernel && self.kernel_passthrough() && !inherited,
        };
        self.handles.write().unwrap().insert(opened.fh, Arc::new(handle));
        Ok(opened)
    }

    /// A new descriptor of an inode's source file, with its boot image and (if `observe`) the
    /// boot window its reads belong to.
    fn open_source(&self, ino: u64, observe: bool) -> Result<(OpenFile, Serving)> {
        let (mut relative, key, serving) = self.entry(ino)?;
        let source = match File::open(self.source_root.join(&relative)) {
            // Looked up while its fill ran, a base file may be opened after the fill renamed it:
            // the same file under its own name (the key check below makes sure).
            Err(e) if e.kind() == io::ErrorKind::NotFound => match base_of_fill_file(&relative) {
                Some(base) => {
                    relative = base;
                    File::open(self.source_root.join(&relative))?
                }
                None => return Err(e.into()),
            },
            other => other?,
        };
        let name = relative.to_string_lossy().into_owned();
        let meta = source.metadata()?;
        // The path may now name another file (renamed over): never its bytes under this inode.
        if (meta.dev(), meta.ino()) != key {
            return Err(FsError::Io(io::Error::from_raw_os_error(libc::ESTALE)));
        }
        let boot_image = if serving == Serving::Yolofs && meta.is_file() {
            self.store.get(&name, &source)
        } else {
            None
        };
        let recording = match (&self.recorder, &boot_image) {
            _ if !observe || serving == Serving::Kernel || is_transient(&name) || meta.len() == 0 => None,
            (Some(recorder), Some(verified)) => recorder.observe(&name, &source, verified.image.clone()),
            (Some(recorder), None) => recorder.begin(&name, &source),
            (None, _) => None,
        };
        let filling = if is_fill_file(&name) {
            Some(self.await_filling(&name)?)
        } else {
            None
        };
        let stats = self.stats.for_file(&name);
        let handle = OpenFile {
            name,
            source,
            boot_image: RwLock::new(boot_image),
            recording,
            filling,
            stats,
        };
        Ok((handle, serving))
    }

    /// Runs `f` with the source file of an open handle (the kernel passthrough backing file).
    pub fn with_source<T>(&self, fh: u64, f: impl FnOnce(&File) -> T) -> Result<T> {
        Ok(f(&self.handle(fh)?.source))
    }

    /// Counts an open whose reads the kernel serves from the source file without yolofs.
    pub fn note_kernel_passthrough(&self, fh: u64) {
        if let Ok(handle) = self.handle(fh) {
            handle.stats.kernel_passthrough_opened();
        }
    }

    pub fn release(&self, fh: u64) {
        let released = self.handles.write().unwrap().remove(&fh);
        // Dropped past the lock: the last holder of a boot image gives its blocks back to the
        // pool, which reads need not wait for.
        drop(released);
    }

    fn handle(&self, fh: u64) -> Result<Arc<OpenFile>> {
        self.handles
            .read()
            .unwrap()
            .get(&fh)
            .cloned()
            .ok_or(FsError::UnknownHandle(fh))
    }

    /// A handle the kernel holds from an earlier yolofs on this mount (we took it over) is opened
    /// again on its first read; its boot window, if it was in one, is not observed.
    fn handle_or_reopen(&self, ino: u64, fh: u64) -> Result<Arc<OpenFile>> {
        if let Ok(handle) = self.handle(fh) {
            return Ok(handle);
        }
        let handle = Arc::new(self.open_source(ino, false)?.0);
        log::info!("{}: file handle {fh} taken over from an earlier yolofs", handle.name);
        let mut handles = self.handles.write().unwrap();
        Ok(handles.entry(fh).or_insert(handle).clone())
    }

    /// Reads up to `size` bytes at `offset` of inode `ino` open as `fh`: fewer only at the end of
    /// the file.
    pub fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let _in_flight = self.stats.in_flight.begin();
        let started = Instant::now();
        let handle = self.handle_or_reopen(ino, fh).inspect_err(|_| {
            self.stats.read_took(ReadSource::Error, started.elapsed());
        })?;
        let result = match &handle.filling {
            Some(filling) => self.read_filling(&handle, filling, offset, size as u64),
            None => match self.fresh_boot_image(&handle)? {
                Some(image) => read_mixed(&image, &handle.source, offset, size as u64),
                None => read_through(&handle.source, offset, size as u64),
            },
        };
        if let Some(recording) = &handle.recording {
            let (memory, passthrough) = result.as_ref().map_or((0, 0), |(_, m, p)| (*m, *p));
            recording.record(offset, size as u64, memory, passthrough, started);
        }
        let source = match &result {
            Err(_) => ReadSource::Error,
            Ok(_) if handle.filling.is_some() => ReadSource::Fill,
            Ok((_, memory, passthrough)) => ReadSource::of(*memory, *passthrough),
        };
        self.stats.read_took(source, started.elapsed());
        match result {
            Ok((data, from_memory, passed_through)) => {
                handle.stats.read(from_memory, passed_through);
                Ok(data)
            }
            Err(e) => {
                handle.stats.error();
                log::warn!("{}: read of {size} bytes at {offset} failed: {e}", handle.name);
                Err(e)
            }
        }
    }

    /// A read of a fill file: what the boot image does not cover waits until it is filled.
    fn read_filling(&self, handle: &OpenFile, filling: &Filling, offset: u64, len: u64) -> Result<(Vec<u8>, u64, u64)> {
        let end = offset.saturating_add(len).min(filling.fill.size());
        if offset >= end {
            return Ok((Vec::new(), 0, 0));
        }
        let missing: Vec<std::ops::Range<u64>> = filling
            .boot_image
            .uncovered(offset, end - offset)
            .into_iter()
            .map(|(start, length)| start..start + length)
            .collect();
        let timeout = Duration::from_millis(self.fill_read_timeout_ms.load(Ordering::Relaxed));
        filling.fill.wait_filled(&missing, timeout)?;
        // Past the wait every byte read is filled, final: never a hole's zeros. Once the file is
        // complete it is read alone (its boot image may have turned out not to match it).
        if filling.fill.is_complete() {
            return read_through(&handle.source, offset, end - offset);
        }
        read_mixed(&filling.boot_image, &handle.source, offset, end - offset)
    }

    /// The boot image of an open file if its verification holds for the base file as it is: checked
    /// at every read (one fstat, and the lease's state once the file's times moved), so that no
    /// read that starts after a write to the base file is served from the boot image. A change
    /// sends the store to verify it again; meanwhile reads pass through, and once it is verified
    /// for the file as it now is, they are served from it again.
    fn fresh_boot_image(&self, handle: &OpenFile) -> Result<Option<Arc<BootImage>>> {
        let now = {
            let current = handle.boot_image.read().unwrap();
            let Some(verified) = current.as_ref() else {
                return Ok(None);
            };
            let now = SourceKey::of(&handle.source)?;
            if verified.holds_for(&now) {
                return Ok(Some(verified.image.clone()));
            }
            now
        };
        if let Some(verified) = self.store.cached(&handle.name, &now) {
            let image = verified.image.clone();
            *handle.boot_image.write().unwrap() = Some(verified);
            return Ok(Some(image));
        }
        self.store.source_changed(&self.source_root, &handle.name, now);
        Ok(None)
    }

    pub fn statfs(&self) -> Result<libc::statvfs> {
        let path = std::ffi::CString::new(self.source_root.as_os_str().as_encoded_bytes())
            .map_err(|e| FsError::Io(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let mut out = std::mem::MaybeUninit::<libc::statvfs>::uninit();
        // SAFETY: `path` is a valid NUL-terminated string and `out` points to writable memory
        // large enough for a statvfs; statvfs initialises it fully when it returns 0.
        let rc = unsafe { libc::statvfs(path.as_ptr(), out.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: statvfs returned 0, so `out` is initialised.
        Ok(unsafe { out.assume_init() })
    }

    pub fn open_handles(&self) -> usize {
        self.handles.read().unwrap().len()
    }
}

/// Reads `len` bytes at `offset`, stopping early only at the end of the file.
fn pread_full(file: &File, offset: u64, len: u64) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    let mut done = 0usize;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
    buf.truncate(done);
    Ok(buf)
}

/// Serves a read from `source` alone, counted as [`read_mixed`] counts.
fn read_through(source: &File, offset: u64, len: u64) -> Result<(Vec<u8>, u64, u64)> {
    let data = pread_full(source, offset, len)?;
    let n = data.len() as u64;
    Ok((data, 0, n))
}

/// Serves a read from the boot image where it covers the range and from `source` elsewhere.
/// Returns the data and how many bytes came from memory and from the source file.
pub fn read_mixed(image: &BootImage, source: &File, offset: u64, len: u64) -> Result<(Vec<u8>, u64, u64)> {
    let end = offset.saturating_add(len).min(image.identity.source_size);
    if offset >= end {
        return Ok((Vec::new(), 0, 0));
    }
    let mut out = Vec::with_capacity((end - offset) as usize);
    let (mut from_memory, mut passed_through) = (0u64, 0u64);
    let mut cursor = offset;
    let mut index = image.first_extent_ending_after(offset);
    while cursor < end {
        match image.extents.get(index) {
            Some(extent) if extent.source_offset <= cursor => {
                let stop = extent.source_end().min(end);
                image.copy_extent_data(
                    index,
                    cursor - extent.source_offset,
                    stop - extent.source_offset,
                    &mut out,
                );
                from_memory += stop - cursor;
                cursor = stop;
                index += 1;
            }
            next => {
                let stop = next.map_or(end, |e| e.source_offset.min(end));
                let data = pread_full(source, cursor, stop - cursor)?;
                if (data.len() as u64) < stop - cursor {
                    // The file is shorter than the boot image says: never invent bytes.
                    return Err(FsError::ShortRead(cursor + data.len() as u64));
                }
                out.extend_from_slice(&data);
                passed_through += stop - cursor;
                cursor = stop;
            }
        }
    }
    Ok((out, from_memory, passed_through))
}
