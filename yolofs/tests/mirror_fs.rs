//! Filesystem-level tests of `MirrorFs`, without a FUSE mount: every read is compared with the
//! source file's bytes, and bad boot images are checked never to be served.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use yolofs::build::{build_boot_image, TraceRead};
use yolofs::format::{BootImage, SourceIdentity};
use yolofs::fs::{MirrorFs, ROOT_INO};
use yolofs::recorder::{RecordConfig, Recorder};
use yolofs::stats::StatsRegistry;
use yolofs::store::{self, BootImageStore, StoreConfig};

const SIZE: usize = 3 << 20;
const IMAGE_ID: &str = "c0ffee00-0000-4000-8000-000000000001";
/// When a test's boot window closes without reads: long beside the gaps between its reads, even
/// in a slow guest, so that none falls outside the window.
const BOOT_IDLE: Duration = Duration::from_secs(1);

struct Fixture {
    dir: tempfile::TempDir,
    content: Vec<u8>,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("base")).unwrap();
        fs::create_dir(dir.path().join("images")).unwrap();
        let mut rng = SmallRng::seed_from_u64(7);
        let content: Vec<u8> = (0..SIZE).map(|_| rng.gen()).collect();
        fs::write(dir.path().join("base/disk"), &content).unwrap();
        Fixture { dir, content }
    }

    fn base(&self) -> std::path::PathBuf {
        self.dir.path().join("base")
    }

    fn boot_image_path(&self) -> std::path::PathBuf {
        self.dir.path().join("images/disk.yolo")
    }

    /// A boot image covering scattered ranges of the file, as a boot's reads would.
    fn build_boot_image(&self) -> BootImage {
        let reads: Vec<TraceRead> = (0..40u64)
            .map(|i| TraceRead {
                offset: i * 70_001 + 512,
                length: 9_000 + i * 97,
            })
            .collect();
        let identity = SourceIdentity {
            source_size: SIZE as u64,
            rendition: "raw".into(),
            ..Default::default()
        };
        let source = File::open(self.base().join("disk")).unwrap();
        build_boot_image(&reads, &source, &identity, 4096, &self.boot_image_path()).unwrap();
        BootImage::open(&self.boot_image_path()).unwrap()
    }

    fn store(&self) -> Arc<BootImageStore> {
        Arc::new(BootImageStore::new(StoreConfig {
            dir: self.dir.path().join("images"),
            memory_budget: 64 << 20,
            lock_in_memory: false,
            share_blocks: true,
            max_boot_image_bytes: 1 << 30,
        }))
    }

    fn mirror(&self) -> (MirrorFs, Arc<BootImageStore>, Arc<StatsRegistry>) {
        let store = self.store();
        let stats = Arc::new(StatsRegistry::default());
        let fs = MirrorFs::new(&self.base(), store.clone(), stats.clone(), None).unwrap();
        (fs, store, stats)
    }

    /// A mirror that learns boot images, its window closing after `idle` without reads.
    fn learning_mirror(&self, idle: Duration) -> (MirrorFs, Arc<Recorder>) {
        let (fs, recorder, _) = self.watching_mirror(idle, true);
        (fs, recorder)
    }

    /// A mirror whose boot windows close after `idle` without reads; `learn`: as --learn.
    fn watching_mirror(&self, idle: Duration, learn: bool) -> (MirrorFs, Arc<Recorder>, Arc<StatsRegistry>) {
        let store = self.store();
        let config = RecordConfig {
            idle,
            max_duration: Duration::from_secs(60),
            block_size: 4096,
            learn,
        };
        let stats = Arc::new(StatsRegistry::default());
        let recorder = Recorder::new(config, store.clone(), stats.clone());
        let fs = MirrorFs::new(&self.base(), store, stats.clone(), Some(recorder.clone())).unwrap();
        (fs, recorder, stats)
    }
}

fn open_disk(fs: &MirrorFs) -> (u64, yolofs::fs::Opened) {
    let attr = fs.lookup(ROOT_INO, "disk".as_ref()).unwrap();
    (attr.ino, fs.open(attr.ino, libc::O_RDONLY).unwrap())
}

fn check_random_reads(fs: &MirrorFs, opened: &yolofs::fs::Opened, content: &[u8], seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..2000 {
        let offset = rng.gen_range(0..content.len() as u64 + 10_000);
        let size = rng.gen_range(1..300_000u32);
        let data = fs.read(opened.ino, opened.fh, offset, size).unwrap();
        let start = (offset as usize).min(content.len());
        let end = (offset as usize + size as usize).min(content.len());
        assert_eq!(data, &content[start..end], "read of {size} bytes at {offset}");
    }
}

#[test]
fn mixed_reads_equal_the_source_bytes() {
    let fixture = Fixture::new();
    fixture.build_boot_image();
    let (fs, _, stats) = fixture.mirror();
    let (_, opened) = open_disk(&fs);
    assert!(opened.from_boot_image);
    check_random_reads(&fs, &opened, &fixture.content, 1);
    let counters = &stats.snapshot(Some("disk"))["disk"];
    assert!(
        counters.requests_mixed > 0 && counters.requests_memory > 0 && counters.requests_passthrough > 0,
        "{counters:?}"
    );
}

#[test]
fn reads_are_exact_at_every_extent_boundary() {
    let fixture = Fixture::new();
    let image = fixture.build_boot_image();
    let (fs, _, _) = fixture.mirror();
    let (_, opened) = open_disk(&fs);
    for extent in &image.extents {
        for &(offset, size) in &[
            (extent.source_offset.saturating_sub(1), 2),
            (extent.source_offset, 1),
            (extent.source_end() - 1, 2),
            (
                extent.source_offset.saturating_sub(5000),
                (extent.length + 10_000) as u32,
            ),
        ] {
            let data = fs.read(opened.ino, opened.fh, offset, size).unwrap();
            assert_eq!(
                data,
                &fixture.content[offset as usize..(offset as usize + size as usize).min(SIZE)]
            );
        }
    }
}

#[test]
fn a_corrupt_boot_image_is_never_served() {
    let fixture = Fixture::new();
    fixture.build_boot_image();
    let mut bytes = fs::read(fixture.boot_image_path()).unwrap();
    let last_data_byte = bytes.len() - 17;
    bytes[last_data_byte] ^= 1;
    fs::write(fixture.boot_image_path(), &bytes).unwrap();
    let (fs, store, stats) = fixture.mirror();
    let (_, opened) = open_disk(&fs);
    assert!(!opened.from_boot_image);
    check_random_reads(&fs, &opened, &fixture.content, 2);
    assert_eq!(stats.snapshot(Some("disk"))["disk"].bytes_memory, 0);
    let rejected = store.rejected();
    assert!(rejected[0].1.contains("checksum"), "{rejected:?}");
}

#[test]
fn a_boot_image_of_other_data_is_never_served() {
    let fixture = Fixture::new();
    fixture.build_boot_image();
    // The base file changes after the boot image was built (same size, other bytes).
    let mut other = fixture.content.clone();
    other[600] ^= 0xff;
    fs::write(fixture.base().join("disk"), &other).unwrap();
    let (fs, store, stats) = fixture.mirror();
    let (_, opened) = open_disk(&fs);
    assert!(!opened.from_boot_image);
    check_random_reads(&fs, &opened, &other, 3);
    assert_eq!(stats.snapshot(Some("disk"))["disk"].bytes_memory, 0);
    assert!(store.rejected()[0].1.contains("differs"), "{:?}", store.rejected());
}

#[test]
fn a_boot_image_for_another_size_is_never_served() {
    let fixture = Fixture::new();
    fixture.build_boot_image();
    fs::OpenOptions::new()
        .append(true)
        .open(fixture.base().join("disk"))
        .unwrap()
        .write_all(b"more")
        .unwrap();
    let (fs, store, _) = fixture.mirror();
    let (_, opened) = open_disk(&fs);
    assert!(!opened.from_boot_image);
    assert!(store.rejected()[0].1.contains("bytes"), "{:?}", store.rejected());
}

#[test]
fn verification_is_stamped_and_the_stamp_binds_the_file() {
    let fixture = Fixture::new();
    let image = fixture.build_boot_image();
    let stamp = store::stamp_path(&fixture.boot_image_path());
    assert!(!stamp.exists());
    {
        let (fs, _, _) = fixture.mirror();
        assert!(open_disk(&fs).1.from_boot_image);
    }
    assert!(stamp.exists(), "the daemon records its verification");
    // A stamp for another base file (a copy: new inode) does not carry over.
    let copy = fixture.base().join("disk.copy");
    fs::copy(fixture.base().join("disk"), &copy).unwrap();
    fs::rename(&copy, fixture.base().join("disk")).unwrap();
    let source = File::open(fixture.base().join("disk")).unwrap();
    let key = store::SourceKey::of(&source).unwrap();
    let recorded: store::Stamp = serde_json::from_slice(&fs::read(&stamp).unwrap()).unwrap();
    assert_ne!(recorded.source, key);
    let (fs, _, _) = fixture.mirror();
    assert!(
        open_disk(&fs).1.from_boot_image,
        "re-verified against the new file, which has the same bytes"
    );
    let recorded: store::Stamp = serde_json::from_slice(&fs::read(&stamp).unwrap()).unwrap();
    assert_eq!(recorded.source, key);
    assert_eq!(recorded.boot_image, store::BootImageKey::of(&image));
}

#[test]
fn writes_are_refused() {
    let fixture = Fixture::new();
    let (fs, _, _) = fixture.mirror();
    let attr = fs.lookup(ROOT_INO, "disk".as_ref()).unwrap();
    for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
        assert_eq!(fs.open(attr.ino, flags).err().unwrap().errno(), libc::EROFS);
    }
    assert_eq!(attr.perm & 0o222, 0);
}

#[test]
fn renames_and_deletions_in_the_source_show_up() {
    let fixture = Fixture::new();
    let (fs, _, _) = fixture.mirror();
    fs::write(fixture.base().join("img.part"), b"downloading").unwrap();
    let part = fs.lookup(ROOT_INO, "img.part".as_ref()).unwrap();
    fs::rename(fixture.base().join("img.part"), fixture.base().join("img")).unwrap();
    let done = fs.lookup(ROOT_INO, "img".as_ref()).unwrap();
    assert_eq!(part.ino, done.ino, "a rename keeps the inode");
    assert_eq!(
        fs.lookup(ROOT_INO, "img.part".as_ref()).err().unwrap().errno(),
        libc::ENOENT
    );
    let names: Vec<String> = fs
        .readdir(ROOT_INO)
        .unwrap()
        .into_iter()
        .map(|(_, _, n)| n.into_string().unwrap())
        .collect();
    assert!(
        names.contains(&"img".to_string()) && !names.contains(&"img.part".to_string()),
        "{names:?}"
    );
    fs::remove_file(fixture.base().join("img")).unwrap();
    assert_eq!(fs.getattr(done.ino, None).err().unwrap().errno(), libc::ENOENT);
    assert_eq!(fs.lookup(ROOT_INO, "img".as_ref()).err().unwrap().errno(), libc::ENOENT);
}

#[test]
fn a_file_deleted_while_open_keeps_its_own_bytes() {
    let fixture = Fixture::new();
    fixture.build_boot_image();
    let (fs, _, _) = fixture.mirror();
    let (_, opened) = open_disk(&fs);
    fs::remove_file(fixture.base().join("disk")).unwrap();
    fs::write(fixture.base().join("disk"), vec![0u8; SIZE]).unwrap();
    check_random_reads(&fs, &opened, &fixture.content, 4);
}

#[test]
fn a_source_truncated_under_a_boot_image_is_read_as_it_now_is() {
    let fixture = Fixture::new();
    let image = fixture.build_boot_image();
    let (fs, _, _) = fixture.mirror();
    let (_, opened) = open_disk(&fs);
    // Nova never does this to a base file; if something does, reads see the file as it now is,
    // not the boot image's bytes past its new end, nor invented zeros.
    File::options()
        .write(true)
        .open(fixture.base().join("disk"))
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let gap_after_last = image.extents.last().unwrap().source_end();
    assert!(gap_after_last > 1 << 20);
    assert!(fs
        .read(opened.ino, opened.fh, gap_after_last - 100, 5000)
        .unwrap()
        .is_empty());
    assert_eq!(
        fs.read(opened.ino, opened.fh, 0, 4096).unwrap(),
        fixture.content[..4096]
    );
}

#[test]
fn a_mixed_read_past_the_end_of_a_shorter_source_gives_eio_not_zeros() {
    let fixture = Fixture::new();
    let image = fixture.build_boot_image();
    let short = tempfile::tempfile().unwrap();
    short.set_len(1 << 20).unwrap();
    let gap_after_last = image.extents.last().unwrap().source_end();
    let err = yolofs::fs::read_mixed(&image, &short, gap_after_last - 100, 5000)
        .err()
        .unwrap();
    assert_eq!(err.errno(), libc::EIO);
}

#[test]
fn the_recorder_learns_a_boot_image_after_an_idle_gap() {
    let fixture = Fixture::new();
    let (fs, recorder) = fixture.learning_mirror(BOOT_IDLE);
    // Nova says which image the base file is before the boot: the boot image carries it.
    fixture.store().remember_image_id("disk", IMAGE_ID).unwrap();
    let (_, opened) = open_disk(&fs);
    assert!(opened.direct_io && !opened.from_boot_image);
    let reads = [(1_000_000u64, 4096u32), (0, 512), (2_000_000, 70_000)];
    for (offset, size) in reads {
        fs.read(opened.ino, opened.fh, offset, size).unwrap();
    }
    fs.release(opened.fh);
    // The window closes after the idle gap; the build runs in the background.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !Path::new(&fixture.boot_image_path()).exists() || !recorder.active().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no boot image learned");
        std::thread::sleep(Duration::from_millis(100));
    }
    recorder.wait_idle();
    let image = BootImage::open(&fixture.boot_image_path()).unwrap();
    assert_eq!(image.identity.image_id, IMAGE_ID);
    let listed = fixture.store().boot_images(&fixture.base());
    assert_eq!(listed.len(), 1);
    assert!(listed[0].verified && listed[0].image_id.as_deref() == Some(IMAGE_ID));
    let offsets: Vec<(u64, u64)> = image.extents.iter().map(|e| (e.source_offset, e.length)).collect();
    assert_eq!(
        offsets,
        vec![
            (0, 4096),
            (1_000_000 / 4096 * 4096, 8192),
            (2_000_000 / 4096 * 4096, 73_728)
        ]
    );
    // The next open is served from what was learned (and watched, to extend it).
    let (_, opened) = open_disk(&fs);
    assert!(opened.from_boot_image && opened.direct_io);
    check_random_reads(&fs, &opened, &fixture.content, 5);
    assert!(fixture.dir.path().join("images/disk.trace").exists());
}

/// Waits for every boot window to end and its work to be done.
fn windows_ended(recorder: &Recorder) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !recorder.active().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the boot window never ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    recorder.wait_idle();
}

// Past the ranges Fixture::build_boot_image covers (up to 2.8 MB).
const OUTSIDE: (u64, u32) = (3_000_000, 65_536);

#[test]
fn boots_from_a_boot_image_report_their_coverage() {
    let fixture = Fixture::new();
    let before = fixture.build_boot_image();
    let (fs, recorder, stats) = fixture.watching_mirror(BOOT_IDLE, false);
    let (_, opened) = open_disk(&fs);
    assert!(opened.from_boot_image && !opened.direct_io);
    let first = before.extents[0];
    fs.read(opened.ino, opened.fh, first.source_offset, first.length as u32)
        .unwrap();
    fs.read(opened.ino, opened.fh, OUTSIDE.0, OUTSIDE.1).unwrap();
    windows_ended(&recorder);
    let boots = stats.snapshot(Some("disk"))["disk"].boots.clone();
    assert_eq!(boots.len(), 1);
    let boot = &boots[0];
    assert_eq!(
        (boot.bytes_memory, boot.bytes_passthrough),
        (first.length, OUTSIDE.1 as u64)
    );
    assert!(boot.partial && boot.coverage < 0.9 && boot.ended_by == "idle");
    // Without --learn the boot image is left as it is.
    assert_eq!(boot.extended_bytes, 0);
    let after = BootImage::open(&fixture.boot_image_path()).unwrap();
    assert_eq!(after.header_crc32c, before.header_crc32c);
}

#[test]
fn what_a_boot_reads_outside_its_boot_image_extends_it_when_learning() {
    let fixture = Fixture::new();
    let before = fixture.build_boot_image();
    let (fs, recorder, stats) = fixture.watching_mirror(BOOT_IDLE, true);
    let (_, opened) = open_disk(&fs);
    fs.read(opened.ino, opened.fh, OUTSIDE.0, OUTSIDE.1).unwrap();
    check_random_reads(&fs, &opened, &fixture.content, 8);
    fs.release(opened.fh);
    windows_ended(&recorder);
    let after = BootImage::open(&fixture.boot_image_path()).unwrap();
    // Bounded: at most doubled in one boot; what was covered stays covered.
    assert!(after.covered_bytes() > before.covered_bytes());
    assert!(after.covered_bytes() <= 2 * before.covered_bytes() + 4096);
    for extent in &before.extents {
        assert!(after.uncovered(extent.source_offset, extent.length).is_empty());
    }
    assert!(
        after.uncovered(OUTSIDE.0, OUTSIDE.1 as u64).is_empty(),
        "the first read outside is in"
    );
    assert_eq!(after.identity, before.identity);
    let boot = stats.snapshot(Some("disk"))["disk"].boots[0].clone();
    assert_eq!(boot.extended_bytes, after.covered_bytes() - before.covered_bytes());
    // Stamped (built from the file) and served: the next boot reads that range from memory.
    assert!(fixture.store().boot_images(&fixture.base())[0].verified);
    let (_, opened) = open_disk(&fs);
    fs.read(opened.ino, opened.fh, OUTSIDE.0, OUTSIDE.1).unwrap();
    windows_ended(&recorder);
    let boot = stats.snapshot(Some("disk"))["disk"].boots[1].clone();
    assert_eq!((boot.bytes_memory, boot.bytes_passthrough), (OUTSIDE.1 as u64, 0));
    assert!(!boot.partial && boot.coverage == 1.0 && boot.extended_bytes == 0);
    // A complete boot with a few reads outside leaves it as it is.
    let extended = BootImage::open(&fixture.boot_image_path()).unwrap();
    let (_, opened) = open_disk(&fs);
    for extent in &extended.extents {
        fs.read(opened.ino, opened.fh, extent.source_offset, extent.length as u32)
            .unwrap();
    }
    let (gap, _) = *extended
        .uncovered(0, SIZE as u64)
        .iter()
        .find(|(_, length)| *length >= 4096)
        .unwrap();
    fs.read(opened.ino, opened.fh, gap, 4096).unwrap();
    windows_ended(&recorder);
    let boot = stats.snapshot(Some("disk"))["disk"].boots[2].clone();
    assert!(
        !boot.partial && boot.bytes_passthrough == 4096 && boot.extended_bytes == 0,
        "{boot:?}"
    );
    let after = BootImage::open(&fixture.boot_image_path()).unwrap();
    assert_eq!(after.header_crc32c, extended.header_crc32c);
}

#[test]
fn files_without_a_boot_image_get_a_kernel_served_inode_until_one_arrives() {
    let fixture = Fixture::new();
    let (fs, _, stats) = fixture.mirror();
    fs.set_kernel_passthrough(true);
    let (first_ino, opened) = open_disk(&fs);
    assert!(opened.kernel_passthrough && !opened.from_boot_image);
    // Transient downloads are never kernel-served: they change while written.
    fs::write(fixture.base().join("next.part"), b"downloading").unwrap();
    let part = fs.lookup(ROOT_INO, "next.part".as_ref()).unwrap();
    assert!(!fs.open(part.ino, libc::O_RDONLY).unwrap().kernel_passthrough);
    // A boot image arrives: the next lookup hands out another inode, served by yolofs.
    fixture.build_boot_image();
    let (second_ino, reopened) = open_disk(&fs);
    assert_ne!(first_ino, second_ino);
    assert!(reopened.from_boot_image && !reopened.kernel_passthrough);
    // The kernel-served inode still opens as before (running VMs reopen their backing files).
    let again = fs.open(first_ino, libc::O_RDONLY).unwrap();
    assert!(again.kernel_passthrough);
    check_random_reads(&fs, &reopened, &fixture.content, 6);
    assert!(stats.snapshot(Some("disk"))["disk"].bytes_memory > 0);
    // Passthrough refused by the kernel: the kernel-served inode is then served by yolofs.
    fs.set_kernel_passthrough(false);
    assert!(!fs.open(first_ino, libc::O_RDONLY).unwrap().kernel_passthrough);
}

#[test]
fn learning_mounts_never_hand_out_kernel_served_inodes() {
    let fixture = Fixture::new();
    let (fs, _recorder) = fixture.learning_mirror(Duration::from_secs(60));
    fs.set_kernel_passthrough(true);
    let (_, opened) = open_disk(&fs);
    assert!(opened.direct_io && !opened.kernel_passthrough);
}

#[test]
fn a_boot_image_installed_while_mounted_is_served_from_the_next_open() {
    let fixture = Fixture::new();
    let (fs, store, _) = fixture.mirror();
    let (_, opened) = open_disk(&fs);
    assert!(!opened.from_boot_image);
    // Built elsewhere (a download), installed through the store, which verifies it.
    fixture.build_boot_image();
    let candidate = fixture.dir.path().join("candidate.yolo");
    fs::rename(fixture.boot_image_path(), &candidate).unwrap();
    let base = File::open(fixture.base().join("disk")).unwrap();
    store.install("disk", &base, &candidate, IMAGE_ID, None).unwrap();
    let (_, reopened) = open_disk(&fs);
    assert!(reopened.from_boot_image);
    check_random_reads(&fs, &reopened, &fixture.content, 9);
    // The open from before keeps reading the source file, with the same bytes.
    check_random_reads(&fs, &opened, &fixture.content, 10);
}

#[test]
fn a_later_process_understands_the_inodes_and_handles_of_an_earlier_one() {
    let fixture = Fixture::new();
    fixture.build_boot_image();
    fs::write(fixture.base().join("other"), b"no boot image").unwrap();
    let (earlier, _, _) = fixture.mirror();
    earlier.set_kernel_passthrough(true);
    let (ino, opened) = open_disk(&earlier);
    let kernel_ino = earlier.lookup(ROOT_INO, "other".as_ref()).unwrap().ino;
    assert!(earlier.open(kernel_ino, libc::O_RDONLY).unwrap().kernel_passthrough);

    // The process that takes the mount over: what the kernel holds means the same files to it.
    let (later, _, stats) = fixture.mirror();
    later.set_kernel_passthrough(true);
    assert_eq!(later.getattr(ino, None).unwrap().size, SIZE as u64);
    // A handle opened by the earlier process reads on, from the boot image.
    check_random_reads(&later, &opened, &fixture.content, 11);
    assert!(stats.snapshot(Some("disk"))["disk"].bytes_memory > 0);
    // Its own lookups give the same numbers for files served by yolofs, new ones for files the
    // kernel serves (their passthrough opens belong to the earlier process).
    assert_eq!(later.lookup(ROOT_INO, "disk".as_ref()).unwrap().ino, ino);
    let own_kernel_ino = later.lookup(ROOT_INO, "other".as_ref()).unwrap().ino;
    assert_ne!(own_kernel_ino, kernel_ino);
    assert!(later.open(own_kernel_ino, libc::O_RDONLY).unwrap().kernel_passthrough);
    // The earlier process's kernel-served inode opens, served by yolofs with direct I/O.
    let inherited = later.open(kernel_ino, libc::O_RDONLY).unwrap();
    assert!(inherited.direct_io && !inherited.kernel_passthrough);
    assert_eq!(later.read(kernel_ino, inherited.fh, 0, 100).unwrap(), b"no boot image");
    // Handles never repeat the earlier process's.
    assert_ne!(inherited.fh, opened.fh);
    // A number no process gave out is still unknown.
    assert_eq!(later.getattr(ino ^ 2, None).unwrap_err().errno(), libc::ENOENT);
}

#[test]
fn a_file_recreated_under_the_same_inode_number_is_another_inode() {
    let fixture = Fixture::new();
    let (fs, _, _) = fixture.mirror();
    let path = fixture.base().join("disk");
    let (first, _) = open_disk(&fs);
    // ext4 hands a freed inode number out again at once; the birth time tells the files apart.
    fs::remove_file(&path).unwrap();
    fs::write(&path, &fixture.content).unwrap();
    let (second, _) = open_disk(&fs);
    assert_ne!(first, second);
}

/// A fill file of the fixture's disk (sparse, at its final size) served from its boot image.
fn filling_mirror(fixture: &Fixture, read_timeout: Duration) -> (Arc<MirrorFs>, BootImage, yolofs::fs::Opened) {
    let image = fixture.build_boot_image();
    File::create(fixture.base().join("disk.yolo-fill"))
        .unwrap()
        .set_len(SIZE as u64)
        .unwrap();
    let (fs, _, _) = fixture.mirror();
    fs.set_fill_read_timeout(read_timeout);
    let (_, new) = fs
        .begin_fill("disk.yolo-fill", BootImage::open(&fixture.boot_image_path()).unwrap())
        .unwrap();
    assert!(new);
    let attr = fs.lookup(ROOT_INO, "disk.yolo-fill".as_ref()).unwrap();
    let opened = fs.open(attr.ino, libc::O_RDONLY).unwrap();
    assert!(!opened.immutable && !opened.kernel_passthrough);
    (Arc::new(fs), image, opened)
}

/// The boot image's first extent reads as the source's bytes (a fill file serves it at once).
fn check_first_extent(fs: &MirrorFs, opened: &yolofs::fs::Opened, image: &BootImage, fixture: &Fixture) {
    let extent = &image.extents[0];
    let covered = fs
        .read(opened.ino, opened.fh, extent.source_offset, extent.length as u32)
        .unwrap();
    assert_eq!(
        covered,
        &fixture.content[extent.source_offset as usize..extent.source_end() as usize]
    );
}

fn fill(fixture: &Fixture, fs: &MirrorFs, range: std::ops::Range<u64>) {
    let file = fs::OpenOptions::new()
        .write(true)
        .open(fixture.base().join("disk.yolo-fill"))
        .unwrap();
    use std::os::unix::fs::FileExt;
    file.write_all_at(&fixture.content[range.start as usize..range.end as usize], range.start)
        .unwrap();
    fs.filling("disk.yolo-fill").unwrap().fill.filled(range).unwrap();
}

#[test]
fn a_fill_file_serves_its_boot_image_at_once_and_waits_for_the_rest() {
    let fixture = Fixture::new();
    let (fs, image, opened) = filling_mirror(&fixture, Duration::from_secs(30));
    check_first_extent(&fs, &opened, &image, &fixture);

    // A read across the boot image and holes waits until the holes are filled: it is the fill's
    // wants meanwhile, and then it gets the source's bytes.
    let reader = {
        let fs = fs.clone();
        thread::spawn(move || fs.read(opened.ino, opened.fh, 0, 256 << 10).unwrap())
    };
    let filling = fs.filling("disk.yolo-fill").unwrap();
    let mut served = 0;
    while !reader.is_finished() {
        for range in filling.fill.wants(Duration::from_millis(100)) {
            fill(&fixture, &fs, range);
            served += 1;
        }
    }
    assert!(served > 0);
    assert_eq!(reader.join().unwrap(), &fixture.content[..256 << 10]);
}

#[test]
fn a_hole_read_times_out_and_a_failed_fill_fails_every_read() {
    let fixture = Fixture::new();
    let (fs, image, opened) = filling_mirror(&fixture, Duration::from_millis(50));
    let hole = image.uncovered(0, SIZE as u64)[0];
    let error = fs.read(opened.ino, opened.fh, hole.0, hole.1 as u32).unwrap_err();
    assert_eq!(error.errno(), libc::EIO, "{error}");
    let extent = &image.extents[1];
    assert!(fs.read(opened.ino, opened.fh, extent.source_offset, 1).is_ok());

    fs.end_fill(
        "disk.yolo-fill",
        yolofs::fill::Outcome::Failed("glance unreachable".into()),
    );
    let error = fs.read(opened.ino, opened.fh, extent.source_offset, 1).unwrap_err();
    assert_eq!(error.errno(), libc::EIO, "{error}");
}

#[test]
fn a_complete_fill_is_read_from_its_file_and_no_fill_is_never_read() {
    let fixture = Fixture::new();
    let (fs, _, opened) = filling_mirror(&fixture, Duration::from_secs(30));
    fill(&fixture, &fs, 0..SIZE as u64);
    fs.end_fill("disk.yolo-fill", yolofs::fill::Outcome::Complete);
    check_random_reads(&fs, &opened, &fixture.content, 5);

    // A fill file yolofs serves no fill of (it was restarted, say) may hold holes: not opened.
    let attr = fs.lookup(ROOT_INO, "disk.yolo-fill".as_ref()).unwrap();
    let error = fs.open(attr.ino, libc::O_RDONLY).unwrap_err();
    assert_eq!(error.errno(), libc::EIO, "{error}");
}

#[test]
fn a_base_file_being_filled_is_found_under_its_own_name_until_it_is_there() {
    let fixture = Fixture::new();
    let (fs, image, _) = filling_mirror(&fixture, Duration::from_secs(30));
    fs::remove_file(fixture.base().join("disk")).unwrap();
    let attr = fs.lookup(ROOT_INO, "disk".as_ref()).unwrap();
    let opened = fs.open(attr.ino, libc::O_RDONLY).unwrap();
    check_first_extent(&fs, &opened, &image, &fixture);

    // Complete and renamed to the base file, it is the base file; without a fill, a missing
    // base file is missing.
    fill(&fixture, &fs, 0..SIZE as u64);
    fs.end_fill("disk.yolo-fill", yolofs::fill::Outcome::Complete);
    fs::rename(fixture.base().join("disk.yolo-fill"), fixture.base().join("disk")).unwrap();
    check_random_reads(&fs, &opened, &fixture.content, 5);
    // An open of the inode looked up during the fill (the kernel keeps its entry a while).
    let reopened = fs.open(attr.ino, libc::O_RDONLY).unwrap();
    check_random_reads(&fs, &reopened, &fixture.content, 5);
    assert!(fs.lookup(ROOT_INO, "disk".as_ref()).is_ok());
    fs::remove_file(fixture.base().join("disk")).unwrap();
    let error = fs.lookup(ROOT_INO, "disk".as_ref()).unwrap_err();
    assert_eq!(error.errno(), libc::ENOENT, "{error}");
}
