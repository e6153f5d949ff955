//! Per-file read statistics: how many bytes and requests were served from boot images and how
//! many were passed through to the base file. Lock-free counters, one set per file name. And,
//! for the whole mount, how long reads take by where they were served from, and the reads in
//! flight (a hung read shows as the oldest one's age).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::Histogram;
use serde::Serialize;

#[derive(Default)]
pub struct FileStats {
    opens: AtomicU64,
    opens_kernel_passthrough: AtomicU64,
    requests_memory: AtomicU64,
    requests_passthrough: AtomicU64,
    requests_mixed: AtomicU64,
    bytes_memory: AtomicU64,
    bytes_passthrough: AtomicU64,
    errors: AtomicU64,
    /// The last boots served from a boot image, oldest first.
    boots: Mutex<VecDeque<BootRecord>>,
}

/// How many boots of each file `stats` remembers.
pub const BOOTS_KEPT: usize = 8;

/// One boot served from a boot image, over its boot window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BootRecord {
    pub started_unix: u64,
    /// From its first read to its last.
    pub seconds: f64,
    /// What ended the window: "idle", "max" or "stop".
    pub ended_by: String,
    pub bytes_memory: u64,
    pub bytes_passthrough: u64,
    /// Share of the bytes read that came from the boot image.
    pub coverage: f64,
    /// Coverage under 0.9: the boot image misses part of what boots read.
    pub partial: bool,
    /// Bytes the boot image grew by from this boot's reads outside it (with --learn).
    pub extended_bytes: u64,
    /// What the boot read outside the boot image: `[offset, length]` of the base file in whole
    /// blocks (the last one may end at the file's end), in the order first read, at most
    /// [`crate::recorder::OUTSIDE_EXTENTS_KEPT`]. Compute hosts report them for fleet learning.
    pub outside: Vec<(u64, u64)>,
}

/// A snapshot of one file's counters.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct FileStatsSnapshot {
    pub opens: u64,
    /// Opens whose reads the kernel served from the source file itself (not counted below).
    pub opens_kernel_passthrough: u64,
    /// Requests served entirely from the boot image.
    pub requests_memory: u64,
    /// Requests served entirely from the base file.
    pub requests_passthrough: u64,
    /// Requests that needed both.
    pub requests_mixed: u64,
    pub bytes_memory: u64,
    pub bytes_passthrough: u64,
    pub errors: u64,
    /// The last boots served from a boot image (at most [`BOOTS_KEPT`]), oldest first.
    pub boots: Vec<BootRecord>,
}

impl FileStats {
    pub fn opened(&self) {
        self.opens.fetch_add(1, Relaxed);
    }

    pub fn kernel_passthrough_opened(&self) {
        self.opens_kernel_passthrough.fetch_add(1, Relaxed);
    }

    /// Counts one read request by where its bytes came from.
    pub fn read(&self, bytes_memory: u64, bytes_passthrough: u64) {
        let requests = match ReadSource::of(bytes_memory, bytes_passthrough) {
            ReadSource::Mixed => &self.requests_mixed,
            ReadSource::BootImage => &self.requests_memory,
            _ => &self.requests_passthrough,
        };
        requests.fetch_add(1, Relaxed);
        self.bytes_memory.fetch_add(bytes_memory, Relaxed);
        self.bytes_passthrough.fetch_add(bytes_passthrough, Relaxed);
    }

    pub fn error(&self) {
        self.errors.fetch_add(1, Relaxed);
    }

    pub fn boot_ended(&self, boot: BootRecord) {
        let mut boots = self.boots.lock().unwrap();
        if boots.len() == BOOTS_KEPT {
            boots.pop_front();
        }
        boots.push_back(boot);
    }

    pub fn snapshot(&self) -> FileStatsSnapshot {
        FileStatsSnapshot {
            opens: self.opens.load(Relaxed),
            opens_kernel_passthrough: self.opens_kernel_passthrough.load(Relaxed),
            requests_memory: self.requests_memory.load(Relaxed),
            requests_passthrough: self.requests_passthrough.load(Relaxed),
            requests_mixed: self.requests_mixed.load(Relaxed),
            bytes_memory: self.bytes_memory.load(Relaxed),
            bytes_passthrough: self.bytes_passthrough.load(Relaxed),
            errors: self.errors.load(Relaxed),
            boots: self.boots.lock().unwrap().iter().cloned().collect(),
        }
    }
}

/// Where a read was served from, as its latency is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadSource {
    /// Entirely from a boot image in memory.
    BootImage,
    /// Entirely from the base file.
    BaseFile,
    /// Both.
    Mixed,
    /// A file being filled (first boot before the download): what is not filled yet is waited for.
    Fill,
    /// Answered with an error.
    Error,
}

impl ReadSource {
    pub const ALL: [ReadSource; 5] = [
        ReadSource::BootImage,
        ReadSource::BaseFile,
        ReadSource::Mixed,
        ReadSource::Fill,
        ReadSource::Error,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ReadSource::BootImage => "boot_image",
            ReadSource::BaseFile => "base_file",
            ReadSource::Mixed => "mixed",
            ReadSource::Fill => "fill",
            ReadSource::Error => "error",
        }
    }

    /// The source of a read that returned `memory` bytes from a boot image and `passthrough`
    /// from the base file.
    pub fn of(memory: u64, passthrough: u64) -> ReadSource {
        match (memory > 0, passthrough > 0) {
            (true, true) => ReadSource::Mixed,
            (true, false) => ReadSource::BootImage,
            _ => ReadSource::BaseFile,
        }
    }
}

/// Read latency buckets, in seconds: from a read served from memory (tens of microseconds) to
/// one waiting for a fill, which times out after 300 s by default.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.0, 10.0, 60.0, 300.0,
];

/// The reads being served now, by when each began.
#[derive(Default)]
pub struct InFlight {
    next: AtomicU64,
    started: Mutex<HashMap<u64, Instant>>,
}

/// One read in flight, counted until dropped.
pub struct InFlightRead<'a> {
    in_flight: &'a InFlight,
    id: u64,
}

impl Drop for InFlightRead<'_> {
    fn drop(&mut self) {
        self.in_flight.started.lock().unwrap().remove(&self.id);
    }
}

impl InFlight {
    pub fn begin(&self) -> InFlightRead<'_> {
        let id = self.next.fetch_add(1, Relaxed);
        self.started.lock().unwrap().insert(id, Instant::now());
        InFlightRead { in_flight: self, id }
    }

    /// How many reads are in flight, and how long the oldest has been.
    pub fn count_and_oldest(&self) -> (usize, Duration) {
        let started = self.started.lock().unwrap();
        let oldest = started.values().min().map_or(Duration::ZERO, |t| t.elapsed());
        (started.len(), oldest)
    }
}

/// Counters of every file read since the mount started, by file name, and of the errors yolofs
/// answered the kernel with, by FUSE operation and errno; read latencies and reads in flight.
pub struct StatsRegistry {
    files: Mutex<BTreeMap<String, Arc<FileStats>>>,
    operation_errors: Mutex<BTreeMap<(&'static str, i32), u64>>,
    latencies: Vec<Histogram>,
    pub in_flight: InFlight,
}

impl Default for StatsRegistry {
    fn default() -> Self {
        StatsRegistry {
            files: Mutex::default(),
            operation_errors: Mutex::default(),
            latencies: ReadSource::ALL
                .iter()
                .map(|_| Histogram::new(LATENCY_BUCKETS))
                .collect(),
            in_flight: InFlight::default(),
        }
    }
}

impl StatsRegistry {
    pub fn for_file(&self, name: &str) -> Arc<FileStats> {
        self.files.lock().unwrap().entry(name.to_string()).or_default().clone()
    }

    pub fn snapshot(&self, only: Option<&str>) -> BTreeMap<String, FileStatsSnapshot> {
        let files = self.files.lock().unwrap();
        files
            .iter()
            .filter(|(name, _)| only.is_none_or(|o| o == name.as_str()))
            .map(|(name, stats)| (name.clone(), stats.snapshot()))
            .collect()
    }

    pub fn operation_error(&self, operation: &'static str, errno: i32) {
        *self
            .operation_errors
            .lock()
            .unwrap()
            .entry((operation, errno))
            .or_default() += 1;
    }

    /// Errors answered so far, by (FUSE operation, errno).
    pub fn operation_errors(&self) -> BTreeMap<(&'static str, i32), u64> {
        self.operation_errors.lock().unwrap().clone()
    }

    pub fn read_took(&self, source: ReadSource, took: Duration) {
        self.latency(source).observe(took.as_secs_f64());
    }

    /// The latency histogram of reads served from `source`.
    pub fn latency(&self, source: ReadSource) -> &Histogram {
        let index = ReadSource::ALL
            .iter()
            .position(|s| *s == source)
            .expect("every source is in ALL");
        &self.latencies[index]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_in_flight_are_counted_until_done_with_the_oldest_age() {
        let stats = StatsRegistry::default();
        assert_eq!(stats.in_flight.count_and_oldest(), (0, Duration::ZERO));
        let first = stats.in_flight.begin();
        std::thread::sleep(Duration::from_millis(20));
        let before_second = Instant::now();
        let second = stats.in_flight.begin();
        let (count, oldest) = stats.in_flight.count_and_oldest();
        assert_eq!(count, 2);
        assert!(oldest >= Duration::from_millis(20));
        drop(first);
        // The oldest is now the second, however long the machine paused meanwhile.
        let (count, oldest) = stats.in_flight.count_and_oldest();
        assert_eq!(count, 1);
        assert!(oldest <= before_second.elapsed());
        drop(second);
        assert_eq!(stats.in_flight.count_and_oldest(), (0, Duration::ZERO));
    }

    #[test]
    fn reads_are_timed_by_where_they_were_served_from() {
        assert_eq!(ReadSource::of(10, 0), ReadSource::BootImage);
        assert_eq!(ReadSource::of(0, 10), ReadSource::BaseFile);
        assert_eq!(ReadSource::of(10, 10), ReadSource::Mixed);
        let stats = StatsRegistry::default();
        stats.read_took(ReadSource::Fill, Duration::from_secs(3));
        stats.read_took(ReadSource::BootImage, Duration::from_micros(50));
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("fill", "", stats.latency(ReadSource::Fill).clone());
        registry.register("memory", "", stats.latency(ReadSource::BootImage).clone());
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("fill_count 1\n"), "{text}");
        assert!(text.contains("fill_bucket{le=\"2.0\"} 0\n"), "{text}");
        assert!(text.contains("fill_bucket{le=\"10.0\"} 1\n"), "{text}");
        assert!(text.contains("memory_bucket{le=\"0.0001\"} 1\n"), "{text}");
    }
}
