//! Read leases on base files: the kernel's word that nobody has opened a file for writing.
//!
//! A verified boot image stays valid for as long as its base file's bytes do not change. Its
//! ctime says so only where every write moves it, which a coarse clock tick does not guarantee
//! after a touch (Linux before 6.13 has no multigrain timestamps). A read lease
//! (`fcntl(F_SETLEASE, F_RDLCK)`, every Linux since 2.4) does not depend on timestamps: the kernel
//! refuses it while the file is open for writing, and any later open for writing or truncate
//! first breaks it (the opener waits until the holder lets go, at most
//! `/proc/sys/fs/lease-break-time`). So while [`Lease::intact`] holds, the file's bytes are the
//! ones it had when the lease was taken, whatever its times say.
//!
//! The kernel signals a break with SIGIO to the lease's owner, set to this process (not the
//! thread that took it, which may be gone by then); one thread answers by letting go of every
//! lease being broken, so writers wait only that long. `intact` asks the kernel itself
//! (`F_GETLEASE`), so a lease the kernel removed for any reason (a holder too slow, a break
//! answered) is never taken for an intact one.
//!
//! Leases are local: a write from another host (NFS, where a read delegation can back a lease,
//! and a revoked one breaks nothing; a FUSE or cluster filesystem) never breaks one. So leases are
//! taken only on local filesystems ([`LOCAL_FILESYSTEMS`]); elsewhere yolofs says why
//! (`LeaseError`) and falls back to the ctime. Writes a lease does not see on a local filesystem
//! either: an overlay's layers written directly, a block device written under the filesystem.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use log::{info, warn};
use signal_hook::consts::SIGIO;
use signal_hook::iterator::Signals;
use thiserror::Error;

/// A read lease held on one base file through a descriptor of its own.
#[derive(Debug)]
pub struct Lease {
    file: File,
}

/// Why a lease could not be taken.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum LeaseError {
    #[error("the file is open for writing")]
    OpenForWriting,
    #[error("the filesystem does not offer leases (or /proc/sys/fs/leases-enable is 0)")]
    Unsupported,
    #[error("no permission to take a lease (neither the file's owner nor CAP_LEASE)")]
    NotPermitted,
    #[error("not a local filesystem (statfs type {0:#x}): writes from other hosts break no lease")]
    NotLocal(i64),
    #[error("leases cannot be taken: {0}")]
    Other(String),
}

/// Filesystems whose every write goes through this kernel, so that a lease sees it: ext4, XFS,
/// Btrfs, tmpfs (`statfs` magic numbers).
pub const LOCAL_FILESYSTEMS: [i64; 4] = [0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994];

/// The `statfs` type of the filesystem `file` is on.
pub fn filesystem_type(file: &File) -> std::io::Result<i64> {
    let mut fs = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `file` is an open descriptor and `fs` a writable statfs, read only on success.
    if unsafe { libc::fstatfs(file.as_raw_fd(), fs.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstatfs returned 0, so `fs` is initialised.
    let fs = unsafe { fs.assume_init() };
    #[allow(clippy::unnecessary_cast)] // f_type's width depends on the architecture
    Ok(fs.f_type as i64)
}

impl Lease {
    /// Takes a read lease on the file `source` is open on, through a new read-only descriptor
    /// of its own (a lease belongs to one open file, and `source` may be closed first).
    pub fn take(source: &File) -> Result<Arc<Lease>, LeaseError> {
        let fs_type = filesystem_type(source).map_err(|e| LeaseError::Other(e.to_string()))?;
        if !LOCAL_FILESYSTEMS.contains(&fs_type) {
            return Err(LeaseError::NotLocal(fs_type));
        }
        let file = File::open(format!("/proc/self/fd/{}", source.as_raw_fd()))
            .map_err(|e| LeaseError::Other(format!("reopening the file: {e}")))?;
        let leases = watcher()?;
        // The break's SIGIO goes to this process, whichever thread takes the lease (a control
        // client's or the verifying one, gone by the time of a break).
        // SAFETY: `file` is an open descriptor; F_SETOWN takes a pid.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETOWN, libc::getpid()) } != 0 {
            return Err(LeaseError::Other(std::io::Error::last_os_error().to_string()));
        }
        // SAFETY: `file` is an open descriptor; F_SETLEASE takes an int argument.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) } != 0 {
            let err = std::io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EBUSY) => LeaseError::OpenForWriting,
                Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOLCK) => LeaseError::Unsupported,
                Some(libc::EACCES) | Some(libc::EPERM) => LeaseError::NotPermitted,
                _ => LeaseError::Other(err.to_string()),
            });
        }
        let lease = Arc::new(Lease { file });
        {
            let mut leases = leases.lock().unwrap();
            leases.retain(|lease| lease.strong_count() > 0);
            leases.push(Arc::downgrade(&lease));
        }
        // A break that came before the lease was listed was not seen by the watcher.
        if !lease.intact() {
            lease.release();
            return Err(LeaseError::OpenForWriting);
        }
        Ok(lease)
    }

    /// Whether the kernel still holds the lease: nobody opened the file for writing or truncated
    /// it since it was taken (a break in progress counts as broken).
    pub fn intact(&self) -> bool {
        // SAFETY: `file` is an open descriptor; F_GETLEASE takes no argument.
        unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_GETLEASE) == libc::F_RDLCK }
    }

    fn release(&self) {
        // SAFETY: `file` is an open descriptor; F_SETLEASE takes an int argument.
        unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    }
}

type Leases = Mutex<Vec<Weak<Lease>>>;

/// The leases held, and the thread that lets go of those being broken (started once).
fn watcher() -> Result<&'static Leases, LeaseError> {
    static LEASES: OnceLock<Result<Leases, String>> = OnceLock::new();
    LEASES
        .get_or_init(|| {
            let mut signals = Signals::new([SIGIO]).map_err(|e| format!("handling SIGIO: {e}"))?;
            std::thread::Builder::new()
                .name("yolofs-leases".into())
                .spawn(move || {
                    for _ in signals.forever() {
                        if let Ok(leases) = watcher() {
                            release_broken(leases);
                        }
                    }
                })
                .map_err(|e| format!("starting the lease thread: {e}"))?;
            Ok(Mutex::new(Vec::new()))
        })
        .as_ref()
        .map_err(|e| LeaseError::Other(e.clone()))
}

/// Lets go of every lease the kernel is breaking, and forgets those dropped.
fn release_broken(leases: &Leases) {
    let mut leases = leases.lock().unwrap();
    leases.retain(|lease| match lease.upgrade() {
        Some(lease) if !lease.intact() => {
            lease.release();
            info!("a base file's lease was broken (opened for writing or truncated): its boot image is verified again");
            false
        }
        Some(_) => true,
        None => false,
    });
}

/// Logs, once per reason, that leases are not available.
pub fn warn_unavailable(err: &LeaseError) {
    static SEEN: Mutex<Vec<LeaseError>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap();
    if !seen.contains(err) {
        warn!("base files cannot be leased ({err}): a touch of a base file costs a verification again");
        seen.push(err.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    /// A file of a few bytes in a new directory.
    fn base_file() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base");
        std::fs::write(&path, b"bytes").unwrap();
        (dir, path)
    }

    /// Opens `path` for writing, which breaks `lease`: let go of by the lease thread at once, not
    /// after the kernel's 45 s.
    fn open_for_writing(path: &PathBuf, lease: &Lease) -> File {
        let started = Instant::now();
        let writer = OpenOptions::new().write(true).open(path).unwrap();
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
        assert!(!lease.intact());
        writer
    }

    #[test]
    fn a_lease_holds_until_the_file_is_opened_for_writing_and_the_writer_waits_little() {
        let (_dir, path) = base_file();
        let reader = File::open(&path).unwrap();
        let lease = Lease::take(&reader).unwrap();
        assert!(lease.intact());
        // A touch (times only) does not break it.
        let now = libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        };
        // SAFETY: `reader` is open; `times` points to two valid timespecs.
        assert_eq!(unsafe { libc::futimens(reader.as_raw_fd(), [now, now].as_ptr()) }, 0);
        assert!(lease.intact());
        open_for_writing(&path, &lease);
    }

    #[test]
    fn a_writer_waits_little_once_the_thread_that_took_the_lease_is_gone() {
        let (_dir, path) = base_file();
        let reader = File::open(&path).unwrap();
        let lease = std::thread::scope(|s| s.spawn(|| Lease::take(&reader).unwrap()).join().unwrap());
        open_for_writing(&path, &lease);
    }

    #[test]
    fn a_file_open_for_writing_cannot_be_leased() {
        let (_dir, path) = base_file();
        let _writer = OpenOptions::new().write(true).open(&path).unwrap();
        let reader = File::open(&path).unwrap();
        assert_eq!(Lease::take(&reader).unwrap_err(), LeaseError::OpenForWriting);
    }

    #[test]
    fn a_truncate_breaks_a_lease() {
        let (_dir, path) = base_file();
        let lease = Lease::take(&File::open(&path).unwrap()).unwrap();
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c_path` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::truncate(c_path.as_ptr(), 5) }, 0);
        assert!(!lease.intact());
    }
}
