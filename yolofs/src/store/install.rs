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
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;
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
}
