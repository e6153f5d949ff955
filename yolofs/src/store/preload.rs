//! Preloading at start (`yolofs mount --preload`). A host back from a reboot starts its guests all
//! at once (Nova's `resume_guests_state_on_host_boot`), and each first open of a base file then
//! waits for its boot image to be read and checked. Preloading loads the store's boot images
//! before those opens ask: the base files Nova used last first (its image cache manager touches
//! the base files its instances use, so their mtimes say which), as many as the memory budget
//! holds. It never evicts: what the guests loaded meanwhile stays.

use std::path::Path;
use std::time::{Instant, SystemTime};

use log::{info, warn};
use serde::Serialize;

use super::{open_regular_file, BootImageStore};
use crate::format;

/// What preloading has done so far, for `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PreloadProgress {
    /// Every boot image with a base file has been considered.
    pub done: bool,
    /// Boot images this preload loaded (not those the guests loaded first).
    pub loaded: usize,
    pub bytes: u64,
    /// Boot images left out: no room left in the budget, or refused.
    pub skipped: usize,
    pub seconds: f64,
}

impl BootImageStore {
    /// Loads the store's boot images, most recently used base files first, until the memory
    /// budget is full. Runs in its own thread; `status` shows its progress.
    pub fn preload(&self, source_dir: &Path) -> PreloadProgress {
        let started = Instant::now();
        let mut progress = PreloadProgress::default();
        self.set_preload_progress(&progress);
        for (name, data_length) in self.preload_order(source_dir) {
            let in_memory = self.state.lock().unwrap().loaded.contains(&name);
            if in_memory {
                continue;
            }
            if self.used_bytes() + data_length > self.config.memory_budget {
                progress.skipped += 1;
                continue;
            }
            let loaded = open_regular_file(&source_dir.join(&name))
                .map_err(|e| e.to_string())
                .and_then(|source| self.load(&name, &source).map_err(|e| e.to_string()));
            match loaded {
                Ok(verified) => {
                    progress.loaded += 1;
                    progress.bytes += verified.image.data_len();
                }
                Err(e) => {
                    warn!("{name}: not preloaded: {e}");
                    progress.skipped += 1;
                }
            }
            progress.seconds = started.elapsed().as_secs_f64();
            self.set_preload_progress(&progress);
        }
        progress.done = true;
        progress.seconds = started.elapsed().as_secs_f64();
        self.set_preload_progress(&progress);
        info!(
            "preloaded {} boot images ({} bytes) in {:.1} s, {} left out",
            progress.loaded, progress.bytes, progress.seconds, progress.skipped
        );
        progress
    }

    /// What preloading has done, if it ran.
    pub fn preload_progress(&self) -> Option<PreloadProgress> {
        self.preload.lock().unwrap().clone()
    }

    fn set_preload_progress(&self, progress: &PreloadProgress) {
        *self.preload.lock().unwrap() = Some(progress.clone());
    }

    /// The boot images whose base file is there, with their data's size: newest base file
    /// first (ties by name, so the order is stable).
    fn preload_order(&self, source_dir: &Path) -> Vec<(String, u64)> {
        let mut found: Vec<(SystemTime, String, u64)> = self
            .names()
            .into_iter()
            .filter_map(|name| {
                let modified = std::fs::metadata(source_dir.join(&name)).ok()?.modified().ok()?;
                let header = format::read_header(&self.path_for(&name)).ok()?;
                Some((modified, name, header.data_length))
            })
            .collect();
        found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        found.into_iter().map(|(_, name, bytes)| (name, bytes)).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::fs::{self, File};
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::build::{build_boot_image, TraceRead};
    use crate::format::SourceIdentity;
    use crate::store::fixture::content;
    use crate::store::{StoreConfig, SETTLE};

    const SIZE: u64 = 1 << 20;
    const BOOT_SET: u64 = 64 << 10;

    /// A store holding a boot image of BOOT_SET bytes for each of `names`, whose base files were
    /// last modified one minute apart, the first name the newest.
    fn store_of(names: &[&str], budget: u64) -> (tempfile::TempDir, Arc<BootImageStore>) {
        let dir = tempfile::tempdir().unwrap();
        let (base, store_dir) = (dir.path().join("base"), dir.path().join("store"));
        fs::create_dir(&base).unwrap();
        fs::create_dir(&store_dir).unwrap();
        let now = SystemTime::now();
        for (i, name) in names.iter().enumerate() {
            let path = base.join(name);
            fs::write(&path, content(i as u32)).unwrap();
            let reads = [TraceRead {
                offset: 0,
                length: BOOT_SET,
            }];
            let identity = SourceIdentity {
                image_id: format!("c0ffee00-0000-4000-8000-00000000000{i}"),
                source_size: SIZE,
                rendition: "raw".into(),
                ..Default::default()
            };
            let output = store_dir.join(format!("{name}{}", super::super::BOOT_IMAGE_SUFFIX));
            build_boot_image(&reads, &File::open(&path).unwrap(), &identity, 4096, &output).unwrap();
            let file = File::options().write(true).open(&path).unwrap();
            file.set_modified(now - Duration::from_secs(60 * i as u64)).unwrap();
        }
        // The base files' ctimes settle, as a host's have long done after a reboot.
        std::thread::sleep(SETTLE);
        let store = Arc::new(BootImageStore::new(StoreConfig {
            dir: store_dir,
            memory_budget: budget,
            lock_in_memory: false,
            share_blocks: true,
            max_boot_image_bytes: 1 << 30,
        }));
        (dir, store)
    }

    fn loaded_names(store: &BootImageStore) -> Vec<String> {
        let mut names: Vec<String> = store.loaded().into_iter().map(|l| l.name).collect();
        names.sort();
        names
    }

    #[test]
    fn newest_base_files_first_until_the_budget_is_full() {
        // Room for two of three: the two newest are loaded, the oldest is left out, none evicted.
        let (dir, store) = store_of(&["new", "middle", "old"], 2 * BOOT_SET + BOOT_SET / 2);
        assert_eq!(store.preload_progress(), None);
        let progress = store.preload(&dir.path().join("base"));
        assert!(progress.done);
        assert_eq!(
            (progress.loaded, progress.bytes, progress.skipped),
            (2, 2 * BOOT_SET, 1)
        );
        assert_eq!(loaded_names(&store), ["middle", "new"]);
        assert_eq!(store.counters().evictions.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(store.preload_progress(), Some(progress));
    }

    #[test]
    fn what_is_loaded_already_stays_and_is_not_counted() {
        let (dir, store) = store_of(&["new", "old"], 2 * BOOT_SET);
        let base = dir.path().join("base");
        store.load("old", &File::open(base.join("old")).unwrap()).unwrap();
        let progress = store.preload(&base);
        assert_eq!((progress.loaded, progress.skipped), (1, 0));
        assert_eq!(loaded_names(&store), ["new", "old"]);
    }

    #[test]
    fn boot_images_without_a_base_file_or_refused_are_left_out() {
        let (dir, store) = store_of(&["gone", "wrong", "good"], 8 * BOOT_SET);
        let base = dir.path().join("base");
        fs::remove_file(base.join("gone")).unwrap();
        // Same size, other bytes: its boot image no longer matches and is refused.
        fs::write(base.join("wrong"), content(99)).unwrap();
        std::thread::sleep(SETTLE);
        let progress = store.preload(&base);
        assert_eq!((progress.loaded, progress.skipped), (1, 1));
        assert_eq!(loaded_names(&store), ["good"]);
    }

    #[test]
    fn loads_take_turns_beyond_their_limit() {
        let slots = crate::store::LoadSlots::new(2);
        let (first, second) = (slots.take(), slots.take());
        let third_taken = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let _third = slots.take();
                third_taken.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(200));
            assert!(!third_taken.load(std::sync::atomic::Ordering::SeqCst));
            drop(first);
        });
        assert!(third_taken.load(std::sync::atomic::Ordering::SeqCst));
        drop(second);
        // A limit raised lets a waiting load go at once.
        slots.set_limit(3);
        let _held = [slots.take(), slots.take(), slots.take()];
    }

    #[test]
    fn concurrent_opens_of_one_image_load_it_once() {
        let (dir, store) = store_of(&["disk"], 8 * BOOT_SET);
        let base = dir.path().join("base");
        let together = std::sync::Barrier::new(8);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    let source = File::open(base.join("disk")).unwrap();
                    together.wait();
                    store.load("disk", &source).unwrap()
                });
            }
        });
        assert_eq!(store.counters().loads.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
