//! Boot windows: learning a boot image from a real boot, and watching the boots served from one.
//!
//! When a base file is opened, a *boot window* opens for it (one per file, shared by the opens
//! that overlap it). It ends at the first of: a `record_stop` control request, an idle gap (no
//! read for `idle`), or `max_duration` after the first read.
//!
//! - A file without a boot image is *learned* (record mode, `--learn`): every read is appended to
//!   a trace, which is written next to the boot images when the window ends, and a boot image is
//!   built from it and the base file (through the file descriptor the window holds, so it is the
//!   file that was traced). A boot image built from the file itself matches it by construction,
//!   so its verification stamp is written at once. Its header names the Glance image the base
//!   file belongs to when the store knows it (`remember`, made by Nova before the boot).
//! - A boot served from a boot image is *observed*: its window counts the bytes served from memory
//!   and passed through, which `ctl stats` reports per boot (its coverage), and a boot that read
//!   much outside its boot image is marked partial. With `--learn`, what a partial boot read
//!   outside extends the boot image, built again from the base file like a learned one and bounded (at most
//!   doubling it per boot, never past `--max-boot-image-bytes`), so a boot image learned from a
//!   window that closed too early heals at the next boot.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use log::{info, warn};
use serde::Serialize;
use thiserror::Error;

use crate::build::{self, BuildError, TraceRead};
use crate::format::{self, BootImage, FormatError, SourceIdentity};
use crate::stats::{BootRecord, StatsRegistry};
use crate::store::{self, BootImageKey, BootImageStore};

/// An observed boot that read less than this share of its bytes from its boot image is partial.
pub const PARTIAL_COVERAGE: f64 = 0.9;
/// The most extents a boot's record lists of what it read outside its boot image.
pub const OUTSIDE_EXTENTS_KEPT: usize = 2048;

/// Why a boot image was not learned, or not extended.
#[derive(Debug, Error)]
pub enum LearnError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("its boot image changed meanwhile (installed or built); it is kept")]
    Replaced,
    #[error("the base file keeps changing")]
    Changing,
    #[error("it would hold {planned} bytes, more than --max-boot-image-bytes ({limit})")]
    TooLarge { planned: u64, limit: u64 },
}

#[derive(Clone, Debug)]
pub struct RecordConfig {
    /// The window ends after this long without a read.
    pub idle: Duration,
    /// The window ends this long after the first read, whatever happens.
    pub max_duration: Duration,
    /// Block size of the boot images built.
    pub block_size: u32,
    /// Learn boot images of files without one, and extend those boots read outside of.
    pub learn: bool,
}

pub struct Recording {
    name: String,
    source: File,
    started: Instant,
    started_unix: u64,
    /// The boot image the boot is served from (an observed boot); None: a boot being learned.
    boot_image: Option<Arc<BootImage>>,
    state: Mutex<RecordingState>,
    finished: AtomicBool,
}

#[derive(Default)]
struct RecordingState {
    reads: Vec<TraceRead>,
    /// When each of `reads` arrived and was answered, since the window's first read (µs).
    times: Vec<(u64, u64)>,
    first_read: Option<Instant>,
    last_read: Option<Instant>,
    bytes_memory: u64,
    bytes_passthrough: u64,
}

impl Recording {
    /// A read of the boot, which arrived at `arrived`; `memory` and `passthrough`: where its
    /// bytes came from.
    pub fn record(&self, offset: u64, length: u64, memory: u64, passthrough: u64, arrived: Instant) {
        if self.finished.load(Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        let first = *state.first_read.get_or_insert(arrived.min(now));
        // An observed boot keeps only what it read outside its boot image.
        if self.boot_image.is_none() || passthrough > 0 {
            state.reads.push(TraceRead { offset, length });
            let micros = |at: Instant| at.saturating_duration_since(first).as_micros() as u64;
            state.times.push((micros(arrived), micros(now)));
        }
        state.bytes_memory += memory;
        state.bytes_passthrough += passthrough;
        state.last_read = Some(now);
    }

    /// Whether this window learns a new boot image (its reads must all reach yolofs).
    pub fn learning(&self) -> bool {
        self.boot_image.is_none()
    }

    /// Why the window is over at `now`, if it is.
    fn window_over(&self, config: &RecordConfig, now: Instant) -> Option<&'static str> {
        let state = self.state.lock().unwrap();
        match (state.first_read, state.last_read) {
            (Some(first), _) if now - first >= config.max_duration => Some("max"),
            (Some(_), Some(last)) if now - last >= config.idle => Some("idle"),
            // Opened but never read: give up after the longest window.
            (None, _) if now - self.started >= config.max_duration => Some("max"),
            _ => None,
        }
    }
}

/// A summary of one recording, for `status`.
#[derive(Debug, Clone, Serialize)]
pub struct RecordingInfo {
    pub name: String,
    pub reads: usize,
    pub seconds: f64,
    /// "learn" or "observe".
    pub kind: &'static str,
}

pub struct Recorder {
    config: RecordConfig,
    store: Arc<BootImageStore>,
    stats: Arc<StatsRegistry>,
    active: Mutex<HashMap<String, Arc<Recording>>>,
    /// Builds under way (and some just finished), joined by [`Recorder::wait_idle`] (tests,
    /// shutdown, `record_stop`).
    builds: Mutex<Vec<thread::JoinHandle<()>>>,
    counters: RecorderCounters,
}

/// Boot windows since the mount started, for metrics.
#[derive(Default)]
pub struct RecorderCounters {
    pub started: AtomicU64,
    /// Learning windows that ended with a boot image built.
    pub learned: AtomicU64,
    /// Learning windows that ended without reads, or whose boot image could not be built.
    pub failed: AtomicU64,
    /// Observed boots, complete and partial.
    pub complete: AtomicU64,
    pub partial: AtomicU64,
    /// Observed boots whose reads outside the boot image extended it.
    pub extended: AtomicU64,
}

impl Recorder {
    pub fn new(config: RecordConfig, store: Arc<BootImageStore>, stats: Arc<StatsRegistry>) -> Arc<Recorder> {
        let recorder = Arc::new(Recorder {
            config,
            store,
            stats,
            active: Mutex::default(),
            builds: Mutex::default(),
            counters: RecorderCounters::default(),
        });
        let weak = Arc::downgrade(&recorder);
        thread::Builder::new()
            .name("yolofs-recorder".into())
            .spawn(move || {
                while let Some(recorder) = weak.upgrade() {
                    recorder.end_finished_windows(Instant::now());
                    drop(recorder);
                    thread::sleep(Duration::from_millis(200));
                }
            })
            .expect("spawn recorder thread");
        recorder
    }

    pub fn counters(&self) -> &RecorderCounters {
        &self.counters
    }

    /// Whether this mount learns boot images (`--learn`).
    pub fn learns(&self) -> bool {
        self.config.learn
    }

    /// The learning window of `name`, opened now if none is; None if this mount does not learn.
    /// `source` is the open base file.
    pub fn begin(&self, name: &str, source: &File) -> Option<Arc<Recording>> {
        if !self.config.learn {
            return None;
        }
        self.window(name, source, None)
    }

    /// The window of a boot of `name` served from `boot_image`, opened now if none is.
    pub fn observe(&self, name: &str, source: &File, boot_image: Arc<BootImage>) -> Option<Arc<Recording>> {
        self.window(name, source, Some(boot_image))
    }

    fn window(&self, name: &str, source: &File, boot_image: Option<Arc<BootImage>>) -> Option<Arc<Recording>> {
        let mut active = self.active.lock().unwrap();
        if let Some(recording) = active.get(name) {
            return Some(recording.clone());
        }
        let source = match source.try_clone() {
            Ok(file) => file,
            Err(e) => {
                warn!("{name}: cannot watch this boot: {e}");
                return None;
            }
        };
        if boot_image.is_none() {
            info!("{name}: no boot image; recording this boot to learn one");
            self.counters.started.fetch_add(1, Ordering::Relaxed);
        }
        let recording = Arc::new(Recording {
            name: name.to_string(),
            source,
            started: Instant::now(),
            started_unix: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            boot_image,
            state: Mutex::default(),
            finished: AtomicBool::new(false),
        });
        active.insert(name.to_string(), recording.clone());
        Some(recording)
    }

    /// Ends the window of `name` now (the `record_stop` control request); false if none is open.
    pub fn stop(self: &Arc<Self>, name: &str) -> bool {
        let mut builds = self.builds.lock().unwrap();
        let recording = self.active.lock().unwrap().remove(name);
        match recording {
            Some(recording) => {
                self.finish(recording, "stop", &mut builds);
                true
            }
            None => false,
        }
    }

    pub fn active(&self) -> Vec<RecordingInfo> {
        let active = self.active.lock().unwrap();
        active
            .values()
            .map(|r| RecordingInfo {
                name: r.name.clone(),
                reads: r.state.lock().unwrap().reads.len(),
                seconds: r.started.elapsed().as_secs_f64(),
                kind: if r.learning() { "learn" } else { "observe" },
            })
            .collect()
    }

    /// Names with a learning window open.
    pub fn learning(&self) -> Vec<String> {
        let active = self.active.lock().unwrap();
        active
            .values()
            .filter(|r| r.learning())
            .map(|r| r.name.clone())
            .collect()
    }

    /// Waits for every boot image build that has started.
    pub fn wait_idle(&self) {
        let builds = std::mem::take(&mut *self.builds.lock().unwrap());
        for build in builds {
            let _ = build.join();
        }
    }

    fn end_finished_windows(self: &Arc<Self>, now: Instant) {
        // Taken before windows leave `active`: a wait_idle that finds none active waits for
        // their builds to be listed, then joins them.
        let mut builds = self.builds.lock().unwrap();
        let ended: Vec<(Arc<Recording>, &'static str)> = {
            let mut active = self.active.lock().unwrap();
            let over: Vec<(String, &'static str)> = active
                .iter()
                .filter_map(|(n, r)| r.window_over(&self.config, now).map(|why| (n.clone(), why)))
                .collect();
            over.into_iter()
                .filter_map(|(n, why)| active.remove(&n).map(|r| (r, why)))
                .collect()
        };
        for (recording, ended_by) in ended {
            self.finish(recording, ended_by, &mut builds);
        }
    }

    fn finish(
        self: &Arc<Self>,
        recording: Arc<Recording>,
        ended_by: &'static str,
        builds: &mut Vec<thread::JoinHandle<()>>,
    ) {
        recording.finished.store(true, Ordering::Relaxed);
        let recorder = self.clone();
        let name = recording.name.clone();
        let spawned = thread::Builder::new()
            .name("yolofs-build".into())
            .spawn(move || match &recording.boot_image {
                None => {
                    let outcome = match recorder.build_from(&recording) {
                        Ok(true) => &recorder.counters.learned,
                        Ok(false) => &recorder.counters.failed,
                        Err(e) => {
                            warn!("{}: could not learn a boot image: {e}", recording.name);
                            &recorder.counters.failed
                        }
                    };
                    outcome.fetch_add(1, Ordering::Relaxed);
                }
                Some(image) => recorder.conclude_observed(&recording, image, ended_by),
            });
        match spawned {
            Ok(handle) => {
                // Finished ones are dropped (detached), so only those under way are kept.
                builds.retain(|build| !build.is_finished());
                builds.push(handle);
            }
            Err(e) => warn!("{name}: the boot window ended, but nothing can be built now: {e}"),
        }
    }

    /// Builds the boot image of a finished learning window; false if there was nothing to learn.
    fn build_from(&self, recording: &Recording) -> Result<bool, LearnError> {
        let (reads, times) = {
            let mut state = recording.state.lock().unwrap();
            (std::mem::take(&mut state.reads), std::mem::take(&mut state.times))
        };
        if reads.is_empty() {
            info!("{}: recording ended with no reads; nothing to learn", recording.name);
            return Ok(false);
        }
        let started = Instant::now();
        std::fs::create_dir_all(&self.store.config().dir)?;
        let trace_path = self.store.trace_path(&recording.name);
        let mut trace = std::io::BufWriter::new(File::create(&trace_path)?);
        let header = format!("yolofs trace v2\nfile {}\nreads {}", recording.name, reads.len());
        build::write_trace(&mut trace, &header, &reads, &times)?;
        drop(trace);
        let identity = SourceIdentity {
            image_id: self.store.image_id(&recording.name).unwrap_or_default(),
            source_size: recording.source.metadata()?.len(),
            rendition: "raw".into(),
            ..Default::default()
        };
        let summary = self.build_into_store(&recording.name, &recording.source, &reads, &identity, None)?;
        info!(
            "{}: learned a boot image{} from {} reads: {} bytes in {} extents, built in {:.2}s",
            recording.name,
            if identity.image_id.is_empty() {
                String::new()
            } else {
                format!(" for image {}", identity.image_id)
            },
            summary.reads,
            summary.covered_bytes,
            summary.extents,
            started.elapsed().as_secs_f64()
        );
        Ok(true)
    }

    /// Builds a boot image of `reads` from `source` into the store, stamped as verified for the
    /// file as it was before the build read it, and drops what was known of the old one. Only
    /// if the store still holds `replaces` for `name` (None: no boot image): one installed or
    /// built meanwhile is not overwritten.
    fn build_into_store(
        &self,
        name: &str,
        source: &File,
        reads: &[TraceRead],
        identity: &SourceIdentity,
        replaces: Option<BootImageKey>,
    ) -> Result<build::BuildSummary, LearnError> {
        let _exclusive = self.store.exclusive();
        let output = self.store.path_for(name);
        let current = format::read_header(&output).ok().map(|h| BootImageKey::of_header(&h));
        if current != replaces {
            return Err(LearnError::Replaced);
        }
        let source_key = store::SourceKey::settled(source, Duration::from_secs(10))?.ok_or(LearnError::Changing)?;
        let summary = build::build_boot_image(reads, source, identity, self.config.block_size, &output)?;
        // Kept whole: it is learned here, and extended or replaced soon.
        self.store.unpacked(&[name]);
        let image = BootImage::open(&output)?;
        store::write_stamp(&output, &image, source_key)?;
        // Whatever was known of an earlier boot image of this file (refused, or in memory).
        self.store.evict(name);
        Ok(summary)
    }

    /// Records an observed boot's coverage and, when learning, extends its boot image with what
    /// it read outside of it.
    fn conclude_observed(&self, recording: &Recording, image: &BootImage, ended_by: &'static str) {
        let (reads, memory, passthrough, seconds) = {
            let mut state = recording.state.lock().unwrap();
            let seconds = match (state.first_read, state.last_read) {
                (Some(first), Some(last)) => (last - first).as_secs_f64(),
                _ => 0.0,
            };
            (
                std::mem::take(&mut state.reads),
                state.bytes_memory,
                state.bytes_passthrough,
                seconds,
            )
        };
        if memory + passthrough == 0 {
            return;
        }
        let coverage = memory as f64 / (memory + passthrough) as f64;
        let partial = coverage < PARTIAL_COVERAGE;
        if partial {
            self.counters.partial.fetch_add(1, Ordering::Relaxed);
            warn!(
                "{}: partial boot image: this boot read {:.1}% of its bytes from it ({passthrough} bytes outside)",
                recording.name,
                100.0 * coverage
            );
        } else {
            self.counters.complete.fetch_add(1, Ordering::Relaxed);
        }
        // Only a partial boot extends its boot image: a few stray reads are not worth rebuilding
        // it (which reads all of it from the base file again), and growth stays tied to what
        // boots miss, not to whatever a guest reads in its first minutes.
        let extended_bytes = if self.config.learn && partial {
            match self.extend(recording, image, &reads) {
                Ok(added) => added,
                Err(e) => {
                    warn!("{}: could not extend the boot image: {e}", recording.name);
                    0
                }
            }
        } else {
            0
        };
        self.stats.for_file(&recording.name).boot_ended(BootRecord {
            started_unix: recording.started_unix,
            seconds,
            ended_by: ended_by.into(),
            bytes_memory: memory,
            bytes_passthrough: passthrough,
            coverage,
            partial,
            extended_bytes,
            outside: outside_extents(image, &reads),
        });
    }

    /// The boot image with the ranges `reads` had outside it, built again from the base file;
    /// returns the bytes it grew by. At most as many new bytes as it holds, and never past the
    /// store's size limit.
    fn extend(&self, recording: &Recording, image: &BootImage, reads: &[TraceRead]) -> Result<u64, LearnError> {
        let old = image.covered_bytes();
        // The blocks the boot read outside the boot image, the first it read first, up to as many
        // bytes as the boot image holds.
        let block = image.block_size as u64;
        let most = old.max(block).div_ceil(block) as usize;
        let mut added = std::collections::BTreeSet::new();
        for index in uncovered_blocks(image, reads) {
            if added.len() == most {
                break;
            }
            added.insert(index);
        }
        if added.is_empty() {
            return Ok(0);
        }
        let mut new_reads: Vec<TraceRead> = Vec::new();
        for index in added {
            match new_reads.last_mut() {
                Some(run) if run.offset + run.length == index * block => run.length += block,
                _ => new_reads.push(TraceRead {
                    offset: index * block,
                    length: block,
                }),
            }
        }
        // The old extents first, in their first-access order, then the new reads.
        let mut extents = image.extents.clone();
        extents.sort_by_key(|e| e.data_offset);
        let mut all: Vec<TraceRead> = extents
            .iter()
            .map(|e| TraceRead {
                offset: e.source_offset,
                length: e.length,
            })
            .collect();
        all.extend(new_reads);
        let planned: u64 = build::plan_extents(&all, self.config.block_size as u64, image.identity.source_size)
            .iter()
            .map(|(_, blocks)| blocks * self.config.block_size as u64)
            .sum();
        let limit = self.store.config().max_boot_image_bytes;
        if planned > limit {
            return Err(LearnError::TooLarge { planned, limit });
        }
        let summary = self.build_into_store(
            &recording.name,
            &recording.source,
            &all,
            &image.identity,
            Some(BootImageKey::of(image)),
        )?;
        let added = summary.covered_bytes.saturating_sub(old);
        self.counters.extended.fetch_add(1, Ordering::Relaxed);
        info!(
            "{}: boot image extended by {added} bytes read outside it during a boot: {} bytes in {} extents",
            recording.name, summary.covered_bytes, summary.extents
        );
        Ok(added)
    }
}

/// The whole blocks `reads` touched outside `image`, in the order first read, adjacent ones
/// joined; the last block ends at the base file's end; at most [`OUTSIDE_EXTENTS_KEPT`] extents.
fn outside_extents(image: &BootImage, reads: &[TraceRead]) -> Vec<(u64, u64)> {
    let block = image.block_size as u64;
    let size = image.identity.source_size;
    let mut seen = std::collections::HashSet::new();
    let mut extents: Vec<(u64, u64)> = Vec::new();
    for index in uncovered_blocks(image, reads) {
        if !seen.insert(index) {
            continue;
        }
        let (start, end) = (index * block, ((index + 1) * block).min(size));
        if let Some((first, length)) = extents.last_mut().filter(|(first, length)| first + length == start) {
            *length = end - *first;
        } else if extents.len() == OUTSIDE_EXTENTS_KEPT {
            return extents;
        } else {
            extents.push((start, end - start));
        }
    }
    extents
}

/// The blocks of `image`'s source that `reads` touched outside it, in the order read (a block
/// read twice comes twice).
fn uncovered_blocks<'a>(image: &'a BootImage, reads: &'a [TraceRead]) -> impl Iterator<Item = u64> + 'a {
    let block = image.block_size as u64;
    reads.iter().flat_map(move |read| {
        image
            .uncovered(read.offset, read.length)
            .into_iter()
            .flat_map(move |(offset, length)| offset / block..(offset + length).div_ceil(block))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recording(started: Instant, first: Option<Instant>, last: Option<Instant>) -> Recording {
        Recording {
            name: "base".into(),
            source: tempfile::tempfile().unwrap(),
            started,
            started_unix: 0,
            boot_image: None,
            state: Mutex::new(RecordingState {
                first_read: first,
                last_read: last,
                ..Default::default()
            }),
            finished: AtomicBool::new(false),
        }
    }

    #[test]
    fn the_window_ends_at_an_idle_gap_or_the_maximum_duration() {
        let config = RecordConfig {
            idle: Duration::from_secs(5),
            max_duration: Duration::from_secs(60),
            block_size: 4096,
            learn: true,
        };
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // Opened, never read: waits up to the maximum duration.
        assert_eq!(recording(t0, None, None).window_over(&config, t0 + s(30)), None);
        assert_eq!(recording(t0, None, None).window_over(&config, t0 + s(61)), Some("max"));
        // Reading: an idle gap ends it.
        let busy = recording(t0, Some(t0), Some(t0 + s(50)));
        assert_eq!(busy.window_over(&config, t0 + s(52)), None);
        assert_eq!(busy.window_over(&config, t0 + s(56)), Some("idle"));
        // Reading without pause: the maximum duration ends it.
        let endless = recording(t0, Some(t0), Some(t0 + s(59)));
        assert_eq!(endless.window_over(&config, t0 + s(59)), None);
        assert_eq!(endless.window_over(&config, t0 + s(60)), Some("max"));
    }

    #[test]
    fn reads_after_the_window_are_not_recorded() {
        let r = recording(Instant::now(), None, None);
        r.record(0, 512, 0, 512, Instant::now());
        r.finished.store(true, Ordering::Relaxed);
        r.record(4096, 512, 0, 512, Instant::now());
        assert_eq!(
            r.state.lock().unwrap().reads,
            vec![TraceRead { offset: 0, length: 512 }]
        );
    }

    #[test]
    fn each_read_is_timed_from_the_first_reads_arrival() {
        let r = recording(Instant::now(), None, None);
        let t0 = Instant::now() - Duration::from_millis(50);
        r.record(0, 512, 0, 512, t0);
        r.record(4096, 512, 0, 512, t0 + Duration::from_millis(20));
        let state = r.state.lock().unwrap();
        assert_eq!(state.first_read, Some(t0));
        let [(start0, end0), (start1, end1)] = state.times[..] else {
            panic!("{:?}", state.times)
        };
        assert_eq!((start0, start1), (0, 20_000));
        // Answered once recorded: after their arrival.
        assert!(end0 >= 50_000 && end1 >= end0, "{:?}", state.times);
    }

    /// A boot image of a `size`-byte file (sparse: its blocks read as zeros) holding `held`.
    fn boot_image(size: u64, held: &[(u64, u64)]) -> (tempfile::TempDir, BootImage) {
        let dir = tempfile::tempdir().unwrap();
        let source = File::create(dir.path().join("base")).unwrap();
        source.set_len(size).unwrap();
        let reads: Vec<TraceRead> = held
            .iter()
            .map(|&(offset, length)| TraceRead { offset, length })
            .collect();
        let identity = SourceIdentity {
            source_size: size,
            ..Default::default()
        };
        let path = dir.path().join("base.yolo");
        build::build_boot_image(
            &reads,
            &File::open(dir.path().join("base")).unwrap(),
            &identity,
            4096,
            &path,
        )
        .unwrap();
        let image = BootImage::open(&path).unwrap();
        (dir, image)
    }

    fn reads(list: &[(u64, u64)]) -> Vec<TraceRead> {
        list.iter()
            .map(|&(offset, length)| TraceRead { offset, length })
            .collect()
    }

    #[test]
    fn a_boots_reads_outside_its_boot_image_are_listed_in_whole_blocks_once() {
        const B: u64 = 4096;
        let (_dir, image) = boot_image(10 * B + 100, &[(0, 2 * B), (5 * B, B)]);
        let outside = outside_extents(
            &image,
            &reads(&[
                (B + 10, 2 * B), // block 1 is held; block 2 is not
                (2 * B, 100),    // block 2 again: listed once
                (3 * B, 3 * B),  // 3 and 4 join 2; 5 is held
                (0, 100),        // held
                (10 * B, 100),   // the short last block
                (9 * B, 10),     // before it in the file, after it in time
            ]),
        );
        assert_eq!(outside, vec![(2 * B, 3 * B), (10 * B, 100), (9 * B, B)]);
    }

    #[test]
    fn a_boots_outside_extents_are_bounded() {
        const B: u64 = 4096;
        let (_dir, image) = boot_image(8000 * B, &[(0, B)]);
        let scattered: Vec<(u64, u64)> = (1..3000).map(|n| (2 * n * B, B)).collect();
        let outside = outside_extents(&image, &reads(&scattered));
        assert_eq!(outside.len(), OUTSIDE_EXTENTS_KEPT);
        assert_eq!(outside[..2], [(2 * B, B), (4 * B, B)]);
    }
}
