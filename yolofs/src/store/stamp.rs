//! Verification stamps: the record, next to a boot image, that it matched its base file, naming
//! both sides: the boot image by its header and index CRCs ([`BootImageKey`]), the base file by
//! device, inode, size, birth time and status change time ([`SourceKey`]). Every write moves a
//! file's ctime, so a stamp whose key still matches still vouches for the bytes; on a filesystem
//! with coarse timestamps only once the ctime is [`SETTLE`] old, which [`SourceKey::settled`]
//! waits for.

use std::fs::{self, File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::format::{self, BootImage, VerifyError};

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
    pub(super) fn same_file(&self, other: &SourceKey) -> bool {
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
    pub(super) fn is_settled(&self) -> bool {
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

pub(super) fn save_stamp(boot_image_path: &Path, stamp: &Stamp) -> std::io::Result<()> {
    let path = stamp_path(boot_image_path);
    let tmp = path.with_extension("verified.tmp");
    fs::write(&tmp, serde_json::to_vec(stamp)?)?;
    fs::rename(tmp, path)
}

pub(super) fn read_stamp(boot_image_path: &Path) -> Option<Stamp> {
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

impl Stamp {
    /// Whether it vouches for boot image `image` over the base file as `source` is.
    pub(super) fn vouches_for(&self, image: BootImageKey, source: &SourceKey) -> bool {
        self.boot_image == image && self.source == *source
    }
}

pub(super) fn stamp_matches(boot_image_path: &Path, image: BootImageKey, source: &SourceKey) -> bool {
    read_stamp(boot_image_path).is_some_and(|stamp| stamp.vouches_for(image, source))
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
}
