//! Per-file read statistics: how many bytes and requests were served from boot images and how
//! many were passed through to the base file. Lock-free counters, one set per file name.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

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
        let requests = match (bytes_memory > 0, bytes_passthrough > 0) {
            (true, true) => &self.requests_mixed,
            (true, false) => &self.requests_memory,
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

/// Counters of every file read since the mount started, by file name, and of the errors yolofs
/// answered the kernel with, by FUSE operation and errno.
#[derive(Default)]
pub struct StatsRegistry {
    files: Mutex<BTreeMap<String, Arc<FileStats>>>,
    operation_errors: Mutex<BTreeMap<(&'static str, i32), u64>>,
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
}
