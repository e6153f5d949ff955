//! A store over a temporary directory with one base file, `disk`, for the tests of every part of
//! the store.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{BootImageStore, InstallError, Installed, StoreConfig};
use crate::build::{build_boot_image, TraceRead};
use crate::format::SourceIdentity;

pub const IMAGE: &str = "c0ffee00-0000-4000-8000-000000000001";
pub const SIZE: usize = 1 << 20;

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub store: Arc<BootImageStore>,
}

pub fn content(seed: u32) -> Vec<u8> {
    (0..SIZE as u32)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8)
        .collect()
}

impl Fixture {
    pub fn new(max_boot_image_bytes: u64) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["base", "store", "nova"] {
            fs::create_dir(dir.path().join(sub)).unwrap();
        }
        fs::write(dir.path().join("base/disk"), content(0)).unwrap();
        let store = Arc::new(BootImageStore::new(StoreConfig {
            dir: dir.path().join("store"),
            memory_budget: 64 << 20,
            lock_in_memory: false,
            share_blocks: true,
            max_boot_image_bytes,
        }));
        Fixture { dir, store }
    }

    pub fn base_dir(&self) -> PathBuf {
        self.dir.path().join("base")
    }

    pub fn base(&self) -> File {
        File::open(self.base_dir().join("disk")).unwrap()
    }

    /// A candidate boot image in "nova's" directory, built from `data` with `image_id` in its header.
    pub fn candidate(&self, data: &[u8], image_id: &str) -> PathBuf {
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

    pub fn install(&self, candidate: &Path, image_id: &str) -> Result<Installed, InstallError> {
        self.store.install("disk", &self.base(), candidate, image_id, None)
    }

    pub fn store_files(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.dir.path().join("store"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    pub fn incoming_is_empty(&self) -> bool {
        fs::read_dir(self.store.incoming_dir()).map_or(true, |mut d| d.next().is_none())
    }
}
