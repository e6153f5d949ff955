//! Installing a boot image from elsewhere: read once within bounds, checked, verified in full
//! in the staging directory (`.incoming/`) with its stamp, then renamed into place.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use log::{info, warn};
use serde::Serialize;
use thiserror::Error;

use super::files::{check_image_id, open_regular_file, BOOT_IMAGE_SUFFIX};
use super::stamp::{stamp_path, verify_and_stamp, StampError};
use super::BootImageStore;
use crate::format::{BootImage, FormatError, VerifyError};
use crate::packed;

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

impl BootImageStore {
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
        // Verified first: a boot image of other bytes writes nothing to the block file.
        let block_file = self.block_file().filter(|_| packed::packable(&image));
        let mut pending = None;
        let result = (|| {
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
            // Its blocks into the block file, those it does not hold yet (`packed.rs`).
            let packed = match &block_file {
                Some(block_file) => {
                    let (packed, packing) = block_file.pack(&bytes, &image).map_err(|e| match e {
                        FormatError::Io(e) => store_error(e),
                        e => store_error(std::io::Error::other(e)),
                    })?;
                    pending = Some(packing);
                    Some(packed)
                }
                None => None,
            };
            let mut file = File::create(&staged).map_err(store_error)?;
            file.write_all(packed.as_deref().unwrap_or(&bytes))
                .and_then(|()| file.sync_all())
                .map_err(store_error)?;
            drop(file);
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
        match (block_file, pending) {
            // The blocks of the boot image replaced are freed once the rename is durable.
            (Some(block_file), Some(pending)) if result.is_ok() => {
                let durable = self.sync_dir().inspect_err(|e| {
                    warn!("{name}: the blocks of the boot image replaced stay until the next start ({e})")
                });
                block_file.commit(name, pending, image.data_len(), durable.is_ok());
            }
            (Some(block_file), Some(pending)) => block_file.abandon(pending),
            _ if result.is_ok() => self.unpacked(&[name]),
            _ => {}
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
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use crate::build::{build_boot_image, TraceRead};
    use crate::format::{BootImage, SourceIdentity};
    use crate::store::fixture;
    use crate::store::fixture::{content, Fixture, IMAGE};
    use crate::store::BootImageInfo;

    #[test]
    fn a_matching_boot_image_is_installed_stamped_and_attributed() {
        let f = Fixture::new(1 << 30);
        let candidate = f.candidate(&content(0), IMAGE);
        let installed = f.install(&candidate, IMAGE).unwrap();
        assert_eq!((installed.file.as_str(), installed.image_id.as_str()), ("disk", IMAGE));
        assert_eq!(installed.extents, 2);
        assert_eq!(
            f.store_files(),
            [
                ".blocks.lock",
                ".incoming",
                "blocks.pack",
                "disk.image-id",
                "disk.yolo",
                "disk.yolo.verified"
            ]
        );
        assert!(f.incoming_is_empty());
        // Kept packed, its blocks in the block file: read back, the boot image installed.
        let stored = fs::read(f.store.path_for("disk")).unwrap();
        assert!(packed::is_packed(&stored));
        assert_eq!(
            fs::read(&candidate).unwrap(),
            packed::read(&f.store.path_for("disk")).unwrap()
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
    fn related_boot_images_share_their_blocks_on_disk() {
        let f = Fixture::new(1 << 30);
        // A second base file: the first with one 4 KiB block of its boot's bytes changed.
        let mut related = content(0);
        related[4096..8192].fill(7);
        fs::write(f.base_dir().join("disk2"), &related).unwrap();
        let base2 = || File::open(f.base_dir().join("disk2")).unwrap();
        // Each candidate is built once: a boot image's header records when it was built.
        let candidate = f.candidate(&content(0), IMAGE);
        let first = fs::read(&candidate).unwrap();
        f.install(&candidate, IMAGE).unwrap();
        let candidate = f.candidate(&related, IMAGE);
        let second = fs::read(&candidate).unwrap();
        f.store.install("disk2", &base2(), &candidate, IMAGE, None).unwrap();
        // Five 4 KiB blocks each (0-8 KiB; 500,000-510,000 rounded out to 4 KiB), four alike.
        let stats = f.store.block_file_stats().unwrap();
        assert_eq!((stats.boot_images, stats.image_bytes), (2, 2 * 5 * 4096));
        assert_eq!((stats.blocks, stats.slots), (6, 6));
        let block_file = f.dir.path().join("store/blocks.pack");
        assert_eq!(fs::metadata(&block_file).unwrap().len(), 6 * 4096);
        // Each reads back as installed, and loads (its stamp holds) with its own bytes.
        assert_eq!(packed::read(&f.store.path_for("disk")).unwrap(), first);
        assert_eq!(packed::read(&f.store.path_for("disk2")).unwrap(), second);
        let image = f.store.load("disk2", &base2()).unwrap().image;
        assert_eq!(&*image.extent_data(0), &related[..8192]);
        // Installed again, it holds what it held: nothing more is written.
        f.store
            .install("disk2", &base2(), &f.candidate(&related, IMAGE), IMAGE, None)
            .unwrap();
        assert_eq!(f.store.block_file_stats().unwrap().blocks, 6);
        // Its base file gone, its block goes with it; the other's stay and read as before.
        fs::remove_file(f.base_dir().join("disk2")).unwrap();
        f.store.prune(&f.base_dir(), |_| false).unwrap();
        assert_eq!(f.store.block_file_stats().unwrap().blocks, 5);
        assert_eq!(fs::metadata(&block_file).unwrap().len(), 5 * 4096);
        assert_eq!(packed::read(&f.store.path_for("disk")).unwrap(), first);
        // One writer of a block file at a time.
        let second = BootImageStore::new(f.store.config().clone());
        second.open_block_file();
        assert_eq!(second.block_file_stats(), None);
        // A store opened afresh (yolofs restarted) finds what its packed boot images hold.
        let base = f.base();
        let Fixture { dir, store } = f;
        drop(store);
        let restarted = BootImageStore::new(second.config().clone());
        restarted.open_block_file();
        let stats = restarted.block_file_stats().unwrap();
        assert_eq!((stats.boot_images, stats.blocks, stats.slots), (1, 5, 5));
        assert!(restarted.load("disk", &base).is_ok());
        drop(dir);
    }

    #[test]
    fn a_start_that_cannot_read_every_packed_boot_image_frees_no_slot() {
        let f = Fixture::new(1 << 30);
        let mut related = content(0);
        related[4096..8192].fill(7);
        fs::write(f.base_dir().join(".disk2"), &related).unwrap();
        f.install(&f.candidate(&content(0), IMAGE), IMAGE).unwrap();
        let candidate = f.candidate(&related, IMAGE);
        let base2 = File::open(f.base_dir().join(".disk2")).unwrap();
        f.store.install(".disk2", &base2, &candidate, IMAGE, None).unwrap();
        let block_file = f.dir.path().join("store/blocks.pack");
        let Fixture { dir, store } = f;
        let config = store.config().clone();
        drop(store);
        // Started again, a boot image named with a dot counts like any.
        let restarted = BootImageStore::new(config.clone());
        restarted.open_block_file();
        assert_eq!(restarted.block_file_stats().unwrap().blocks, 6);
        drop(restarted);
        // One it cannot read (its table cut short) may hold any slot: none is freed, even once
        // the other is gone.
        let disk2 = dir.path().join("store/.disk2.yolo");
        let len = fs::metadata(&disk2).unwrap().len();
        fs::OpenOptions::new()
            .write(true)
            .open(&disk2)
            .unwrap()
            .set_len(len - 24)
            .unwrap();
        let restarted = BootImageStore::new(config);
        restarted.open_block_file();
        assert_eq!(restarted.block_file_stats().unwrap().blocks, 5);
        fs::remove_file(dir.path().join("base/disk")).unwrap();
        restarted.prune(&dir.path().join("base"), |_| false).unwrap();
        assert_eq!(restarted.block_file_stats().unwrap().blocks, 0);
        assert_eq!(fs::metadata(&block_file).unwrap().len(), 6 * 4096);
        let mut blocks = fs::File::open(&block_file).unwrap();
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut blocks, &mut bytes).unwrap();
        assert_eq!(&bytes[4096 * 5..4096 * 6], &related[4096..8192]);
    }

    #[test]
    fn a_block_file_slot_that_changed_is_not_shared() {
        let f = Fixture::new(1 << 30);
        f.install(&f.candidate(&content(0), IMAGE), IMAGE).unwrap();
        // A slot whose bytes are no longer its block's (the disk changed them): a boot image
        // with that block gets a slot of its own, and reads its own bytes.
        let block_file = f.dir.path().join("store/blocks.pack");
        let mut blocks = fs::read(&block_file).unwrap();
        blocks[..4096].fill(0xee);
        fs::write(&block_file, blocks).unwrap();
        fs::write(f.base_dir().join("disk2"), content(0)).unwrap();
        let candidate = f.candidate(&content(0), IMAGE);
        f.store
            .install(
                "disk2",
                &File::open(f.base_dir().join("disk2")).unwrap(),
                &candidate,
                IMAGE,
                None,
            )
            .unwrap();
        assert_eq!(
            packed::read(&f.store.path_for("disk2")).unwrap(),
            fs::read(&candidate).unwrap()
        );
        assert_eq!(f.store.block_file_stats().unwrap().blocks, 6);
        assert!(BootImage::open(&f.store.path_for("disk")).is_err());
    }

    #[test]
    fn a_boot_image_of_many_small_extents_is_kept_whole() {
        // Extents of 512 bytes in a boot image of 4 KiB blocks' header: packed, each would
        // take a 4 KiB slot. It is kept whole.
        let f = Fixture::new(1 << 30);
        let source = f.dir.path().join("nova/source");
        fs::write(&source, content(0)).unwrap();
        let reads: Vec<TraceRead> = (0..64)
            .map(|i| TraceRead {
                offset: i * 8192,
                length: 512,
            })
            .collect();
        let identity = SourceIdentity {
            source_size: fixture::SIZE as u64,
            rendition: "raw".into(),
            ..Default::default()
        };
        let candidate = f.dir.path().join("nova/small.yolo");
        build_boot_image(&reads, &File::open(&source).unwrap(), &identity, 512, &candidate).unwrap();
        let mut bytes = fs::read(&candidate).unwrap();
        let mut image = BootImage::parse(&bytes).unwrap();
        image.block_size = 4096;
        assert!(!packed::packable(&image));
        bytes.clear();
        f.install(&candidate, IMAGE).unwrap();
        assert!(!packed::file_is_packed(&f.store.path_for("disk")));
    }

    #[test]
    fn a_packed_boot_image_whose_blocks_or_table_changed_is_refused() {
        let f = Fixture::new(1 << 30);
        f.install(&f.candidate(&content(0), IMAGE), IMAGE).unwrap();
        let path = f.store.path_for("disk");
        let block_file = f.dir.path().join("store/blocks.pack");
        let flip = |file: &Path, at: u64| {
            let mut bytes = fs::read(file).unwrap();
            bytes[at as usize] ^= 1;
            fs::write(file, bytes).unwrap();
        };
        // A byte of a block: the extent's CRC says so.
        flip(&block_file, 4096 + 17);
        let err = BootImage::open(&path).err().unwrap();
        assert!(err.to_string().contains("checksum mismatch"), "{err}");
        flip(&block_file, 4096 + 17);
        assert!(BootImage::open(&path).is_ok());
        // A byte of the block table: its CRC says so.
        let len = fs::metadata(&path).unwrap().len();
        flip(&path, len - 3);
        let err = BootImage::open(&path).err().unwrap();
        assert!(err.to_string().contains("packed header and block table"), "{err}");
        flip(&path, len - 3);
        // Blocks the file no longer has.
        fs::OpenOptions::new()
            .write(true)
            .open(&block_file)
            .unwrap()
            .set_len(4096)
            .unwrap();
        let err = BootImage::open(&path).err().unwrap();
        assert!(err.to_string().contains("past the block file"), "{err}");
    }

    #[test]
    fn a_boot_image_of_other_bytes_is_not_installed() {
        let f = Fixture::new(1 << 30);
        let err = f.install(&f.candidate(&content(1), IMAGE), IMAGE).unwrap_err();
        assert!(matches!(err, InstallError::Mismatch { .. }), "{err}");
        assert!(err.to_string().contains("does not match base file disk"), "{err}");
        assert_eq!(f.store_files(), [".blocks.lock", ".incoming", "blocks.pack"]);
        assert!(f.incoming_is_empty());
        // Its blocks, written before it was found wrong, are freed and their space given back.
        assert_eq!(f.store.block_file_stats().unwrap().blocks, 0);
        assert_eq!(fs::metadata(f.dir.path().join("store/blocks.pack")).unwrap().len(), 0);
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
}
