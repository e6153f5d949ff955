//! Record mode: learning a boot image from a real boot.
//!
//! When a base file without a boot image is opened, a recording starts; every read on it is
//! appended to a trace. The boot window ends at the first of: a `record_stop` control request, an
//! idle gap (no read for `idle`), or `max_duration` after the first read. The trace is then
//! written next to the boot images and a boot image is built from it and the base file (through
//! the file descriptor the recording holds, so it is the file that was traced). A boot image built
//! from the file itself matches it by construction, so its verification stamp is written at once.
//! Its header names the Glance image the base file belongs to when the store knows it (the
//! `remember` control request, made by Nova before the boot).

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use log::{info, warn};
use serde::Serialize;

use crate::build::{self, TraceRead};
use crate::format::{BootImage, SourceIdentity};
use crate::store::{self, BootImageStore};

#[derive(Clone, Debug)]
pub struct RecordConfig {
    /// The window ends after this long without a read.
    pub idle: Duration,
    /// The window ends this long after the first read, whatever happens.
    pub max_duration: Duration,
    /// Block size of the boot images built.
    pub block_size: u32,
}

pub struct Recording {
    name: String,
    source: File,
    started: Instant,
    state: Mutex<RecordingState>,
    finished: AtomicBool,
}

struct RecordingState {
    reads: Vec<TraceRead>,
    first_read: Option<Instant>,
    last_read: Option<Instant>,
}

impl Recording {
    pub fn record(&self, offset: u64, length: u64) {
        if self.finished.load(Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        state.reads.push(TraceRead { offset, length });
        state.first_read.get_or_insert(now);
        state.last_read = Some(now);
    }

    fn window_over(&self, config: &RecordConfig, now: Instant) -> bool {
        let state = self.state.lock().unwrap();
        match (state.first_read, state.last_read) {
            (Some(first), Some(last)) => now - last >= config.idle || now - first >= config.max_duration,
            // Opened but never read: give up after the longest window.
            _ => now - self.started >= config.max_duration,
        }
    }
}

/// A summary of one recording, for `status`.
#[derive(Debug, Clone, Serialize)]
pub struct RecordingInfo {
    pub name: String,
    pub reads: usize,
    pub seconds: f64,
}

pub struct Recorder {
    config: RecordConfig,
    store: Arc<BootImageStore>,
    active: Mutex<HashMap<String, Arc<Recording>>>,
    /// Builds in progress, joined by [`Recorder::wait_idle`] (tests, shutdown).
    builds: Mutex<Vec<thread::JoinHandle<()>>>,
    counters: RecorderCounters,
}

/// Learning windows since the mount started, for metrics.
#[derive(Default)]
pub struct RecorderCounters {
    pub started: AtomicU64,
    /// Windows that ended with a boot image built.
    pub learned: AtomicU64,
    /// Windows that ended without reads, or whose boot image could not be built.
    pub failed: AtomicU64,
}

impl Recorder {
    pub fn new(config: RecordConfig, store: Arc<BootImageStore>) -> Arc<Recorder> {
        let recorder = Arc::new(Recorder {
            config,
            store,
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

    /// The recording for `name`, started now if none is under way. `source` is the open base file.
    pub fn begin(&self, name: &str, source: &File) -> Option<Arc<Recording>> {
        let mut active = self.active.lock().unwrap();
        if let Some(recording) = active.get(name) {
            return Some(recording.clone());
        }
        let source = match source.try_clone() {
            Ok(file) => file,
            Err(e) => {
                warn!("{name}: cannot record: {e}");
                return None;
            }
        };
        info!("{name}: no boot image; recording this boot to learn one");
        self.counters.started.fetch_add(1, Ordering::Relaxed);
        let recording = Arc::new(Recording {
            name: name.to_string(),
            source,
            started: Instant::now(),
            state: Mutex::new(RecordingState {
                reads: Vec::new(),
                first_read: None,
                last_read: None,
            }),
            finished: AtomicBool::new(false),
        });
        active.insert(name.to_string(), recording.clone());
        Some(recording)
    }

    /// Ends the window of `name` now (the `record_stop` control request).
    pub fn stop(self: &Arc<Self>, name: &str) -> bool {
        let recording = self.active.lock().unwrap().remove(name);
        match recording {
            Some(recording) => {
                self.finish(recording);
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
            })
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
        let ended: Vec<Arc<Recording>> = {
            let mut active = self.active.lock().unwrap();
            let names: Vec<String> = active
                .iter()
                .filter(|(_, r)| r.window_over(&self.config, now))
                .map(|(n, _)| n.clone())
                .collect();
            names.iter().filter_map(|n| active.remove(n)).collect()
        };
        for recording in ended {
            self.finish(recording);
        }
    }

    fn finish(self: &Arc<Self>, recording: Arc<Recording>) {
        recording.finished.store(true, Ordering::Relaxed);
        let recorder = self.clone();
        let handle = thread::Builder::new()
            .name("yolofs-build".into())
            .spawn(move || {
                let outcome = match recorder.build_from(&recording) {
                    Ok(true) => &recorder.counters.learned,
                    Ok(false) => &recorder.counters.failed,
                    Err(e) => {
                        warn!("{}: could not learn a boot image: {e:#}", recording.name);
                        &recorder.counters.failed
                    }
                };
                outcome.fetch_add(1, Ordering::Relaxed);
            })
            .expect("spawn build thread");
        self.builds.lock().unwrap().push(handle);
    }

    /// Builds the boot image of a finished recording; false if there was nothing to learn.
    fn build_from(&self, recording: &Recording) -> anyhow::Result<bool> {
        let reads = std::mem::take(&mut recording.state.lock().unwrap().reads);
        if reads.is_empty() {
            info!("{}: recording ended with no reads; nothing to learn", recording.name);
            return Ok(false);
        }
        let started = Instant::now();
        let dir = &self.store.config().dir;
        std::fs::create_dir_all(dir)?;
        let trace_path: PathBuf = dir.join(format!("{}{}", recording.name, store::TRACE_SUFFIX));
        let mut trace = std::io::BufWriter::new(File::create(&trace_path)?);
        let header = format!("yolofs trace v1\nfile {}\nreads {}", recording.name, reads.len());
        build::write_trace(&mut trace, &header, &reads)?;
        drop(trace);
        let identity = SourceIdentity {
            image_id: self.store.image_id(&recording.name).unwrap_or_default(),
            source_size: recording.source.metadata()?.len(),
            rendition: "raw".into(),
            ..Default::default()
        };
        let source_key = store::SourceKey::of(&recording.source)?;
        let output = self.store.path_for(&recording.name);
        let summary = build::build_boot_image(&reads, &recording.source, &identity, self.config.block_size, &output)?;
        let image = BootImage::open(&output)?;
        store::write_stamp(&output, &image, source_key)?;
        // Whatever was known of an earlier boot image of this file (refused, or in memory).
        self.store.evict(&recording.name);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recording(started: Instant, first: Option<Instant>, last: Option<Instant>) -> Recording {
        Recording {
            name: "base".into(),
            source: tempfile::tempfile().unwrap(),
            started,
            state: Mutex::new(RecordingState {
                reads: Vec::new(),
                first_read: first,
                last_read: last,
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
        };
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // Opened, never read: waits up to the maximum duration.
        assert!(!recording(t0, None, None).window_over(&config, t0 + s(30)));
        assert!(recording(t0, None, None).window_over(&config, t0 + s(61)));
        // Reading: an idle gap ends it.
        let busy = recording(t0, Some(t0), Some(t0 + s(50)));
        assert!(!busy.window_over(&config, t0 + s(52)));
        assert!(busy.window_over(&config, t0 + s(56)));
        // Reading without pause: the maximum duration ends it.
        let endless = recording(t0, Some(t0), Some(t0 + s(59)));
        assert!(!endless.window_over(&config, t0 + s(59)));
        assert!(endless.window_over(&config, t0 + s(60)));
    }

    #[test]
    fn reads_after_the_window_are_not_recorded() {
        let r = recording(Instant::now(), None, None);
        r.record(0, 512);
        r.finished.store(true, Ordering::Relaxed);
        r.record(4096, 512);
        assert_eq!(
            r.state.lock().unwrap().reads,
            vec![TraceRead { offset: 0, length: 512 }]
        );
    }
}
