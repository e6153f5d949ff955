//! Host I/O and CPU utilisation, smoothed, for the boot-time model (`x` and `y` in
//! `t = e^x * alpha / (1 - x) + beta / (1 - y)`).
//!
//! For the disk holding the source directory: the fraction of wall time it had I/O in flight
//! (`io_ticks`, field 13 of `/proc/diskstats`, as `iostat`'s %util), and its read and write
//! rates (operations and bytes per second), from which the compute driver derives the thesis'
//! throughput utilisation once the disk's capacity is calibrated. CPU utilisation is the non-idle
//! fraction of all CPU time in `/proc/stat`, and that of the least busy CPU. CPU pressure is the
//! fraction of wall time some runnable task waited for a CPU (`some` in `/proc/pressure/cpu`):
//! utilisation cannot tell load a new guest's vCPU waits behind (runnable tasks) from load that
//! mostly sleeps, pressure can. All are sampled every interval and smoothed with an
//! exponentially weighted moving average, so one busy second does not swing the scheduler.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

#[derive(Clone, Debug, Default, Serialize)]
pub struct HostLoad {
    /// Smoothed I/O utilisation of `device`, 0..1.
    pub io_utilisation: f64,
    /// Smoothed CPU utilisation of the host, 0..1.
    pub cpu_utilisation: f64,
    /// Smoothed utilisation of the least busy CPU of each sample, 0..1: Linux places a new
    /// boot's vCPU thread on the idlest CPU, so on a host whose load sits on some CPUs a boot
    /// gets a whole CPU however busy the others are.
    pub idlest_cpu_utilisation: f64,
    /// Smoothed operations and bytes per second of `device` (reads + writes).
    pub iops: f64,
    pub bytes_per_second: f64,
    /// Smoothed runnable tasks per CPU, not counting the sampler itself (`procs_running` of
    /// /proc/stat): how many tasks a new boot's vCPU would share a CPU with.
    pub runnable_per_cpu: f64,
    /// Smoothed fraction of wall time some runnable task waited for a CPU, 0..1; None where the
    /// kernel does not report CPU pressure (before Linux 4.20, or booted with `psi=0`).
    pub cpu_pressure: Option<f64>,
    /// The block device measured (the one holding the source directory).
    pub device: String,
    /// Smoothing time constant in seconds.
    pub smoothing_seconds: f64,
    /// Samples taken so far.
    pub samples: u64,
}

/// The block device (as named in /proc/diskstats) holding `path`: its whole disk, since a
/// partition's queue is its disk's.
pub fn device_of(path: &Path) -> Option<String> {
    let dev = fs::metadata(path).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    // A partition's sysfs directory sits inside its disk's and has a `partition` file.
    let disk = if sys.join("partition").exists() {
        sys.parent()?.to_path_buf()
    } else {
        sys
    };
    disk.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// The busiest real disk, for sources on filesystems without a block device (tmpfs, overlay).
fn busiest_disk(diskstats: &str) -> Option<String> {
    diskstats
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let name = f.get(2)?;
            let ticks: u64 = f.get(12)?.parse().ok()?;
            let virtual_dev = name.starts_with("loop") || name.starts_with("ram") || name.starts_with("zram");
            (!virtual_dev && Path::new(&format!("/sys/block/{name}")).exists()).then(|| (ticks, name.to_string()))
        })
        .max()
        .map(|(_, name)| name)
}

/// Cumulative counters of one disk in /proc/diskstats.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct DiskCounters {
    operations: u64,
    sectors: u64,
    io_ticks_ms: u64,
}

fn disk_counters(diskstats: &str, device: &str) -> Option<DiskCounters> {
    diskstats.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.get(2) != Some(&device) {
            return None;
        }
        let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        // reads completed (4), sectors read (6), writes completed (8), sectors written (10),
        // io_ticks (13), 1-based.
        Some(DiskCounters {
            operations: field(3)? + field(7)?,
            sectors: field(5)? + field(9)?,
            io_ticks_ms: field(12)?,
        })
    })
}

/// CPU figures of one /proc/stat reading.
#[derive(Clone, Debug, PartialEq)]
struct CpuCounters {
    busy_jiffies: u64,
    total_jiffies: u64,
    runnable_per_cpu: f64,
    /// (busy, total) jiffies of each CPU.
    per_cpu: Vec<(u64, u64)>,
}

/// (busy, total) jiffies of one `cpu` line of /proc/stat.
fn busy_and_total(line: &str) -> Option<(u64, u64)> {
    let values: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    if values.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest is already counted in user).
    let total: u64 = values.iter().take(8).sum();
    let idle = values[3] + values.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

fn cpu_counters(stat: &str) -> Option<CpuCounters> {
    let (busy_jiffies, total_jiffies) = busy_and_total(stat.lines().next()?)?;
    let per_cpu: Vec<(u64, u64)> = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .filter_map(busy_and_total)
        .collect();
    let running: f64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("procs_running "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1.0);
    Some(CpuCounters {
        busy_jiffies,
        total_jiffies,
        runnable_per_cpu: (running - 1.0).max(0.0) / per_cpu.len().max(1) as f64,
        per_cpu,
    })
}

/// Microseconds runnable tasks have waited for a CPU since boot (`some ... total=` of
/// /proc/pressure/cpu).
fn cpu_pressure_total(pressure: &str) -> Option<u64> {
    pressure
        .lines()
        .find_map(|l| l.strip_prefix("some "))?
        .split_whitespace()
        .find_map(|field| field.strip_prefix("total="))?
        .parse()
        .ok()
}

/// Utilisation of the least busy CPU between two readings (None if they do not match).
fn idlest_cpu(a: &CpuCounters, b: &CpuCounters) -> Option<f64> {
    if a.per_cpu.len() != b.per_cpu.len() {
        return None;
    }
    a.per_cpu
        .iter()
        .zip(&b.per_cpu)
        .filter(|((_, t0), (_, t1))| t1 > t0)
        .map(|((b0, t0), (b1, t1))| (b1.saturating_sub(*b0) as f64 / (t1 - t0) as f64).clamp(0.0, 1.0))
        .reduce(f64::min)
}

/// When, the disk's counters, the CPUs', the CPU pressure's total.
type Sample = (Instant, Option<DiskCounters>, Option<CpuCounters>, Option<u64>);

pub struct HostLoadSampler {
    current: Mutex<HostLoad>,
}

impl HostLoadSampler {
    /// Starts sampling every `interval` in a background thread.
    pub fn start(source: &Path, interval: Duration, smoothing: Duration) -> Arc<HostLoadSampler> {
        let stats = fs::read_to_string("/proc/diskstats").unwrap_or_default();
        let device = device_of(source)
            .filter(|d| disk_counters(&stats, d).is_some())
            .or_else(|| busiest_disk(&stats));
        let sampler = Arc::new(HostLoadSampler {
            current: Mutex::new(HostLoad {
                device: device.clone().unwrap_or_default(),
                smoothing_seconds: smoothing.as_secs_f64(),
                ..Default::default()
            }),
        });
        let weak = Arc::downgrade(&sampler);
        thread::Builder::new()
            .name("yolofs-hostload".into())
            .spawn(move || {
                let read = || {
                    let now = Instant::now();
                    let io = device
                        .as_deref()
                        .and_then(|d| disk_counters(&fs::read_to_string("/proc/diskstats").ok()?, d));
                    let cpu = fs::read_to_string("/proc/stat").ok().and_then(|s| cpu_counters(&s));
                    let pressure = fs::read_to_string("/proc/pressure/cpu")
                        .ok()
                        .and_then(|p| cpu_pressure_total(&p));
                    (now, io, cpu, pressure)
                };
                let mut previous = read();
                loop {
                    thread::sleep(interval);
                    let Some(sampler) = weak.upgrade() else { return };
                    let next = read();
                    sampler.update(&previous, &next, smoothing);
                    previous = next;
                }
            })
            .expect("spawn host load thread");
        sampler
    }

    fn update(&self, (t0, io0, cpu0, waited0): &Sample, (t1, io1, cpu1, waited1): &Sample, smoothing: Duration) {
        let elapsed = (*t1 - *t0).as_secs_f64();
        if elapsed <= 0.0 {
            return;
        }
        let per_second = |a: u64, b: u64| b.saturating_sub(a) as f64 / elapsed;
        let io = match (io0, io1) {
            (Some(a), Some(b)) => Some((
                (per_second(a.io_ticks_ms, b.io_ticks_ms) / 1000.0).clamp(0.0, 1.0),
                per_second(a.operations, b.operations),
                per_second(a.sectors, b.sectors) * 512.0,
            )),
            _ => None,
        };
        let cpu = match (cpu0, cpu1) {
            (Some(a), Some(b)) if b.total_jiffies > a.total_jiffies => Some((
                ((b.busy_jiffies - a.busy_jiffies) as f64 / (b.total_jiffies - a.total_jiffies) as f64).clamp(0.0, 1.0),
                b.runnable_per_cpu,
                idlest_cpu(a, b),
            )),
            _ => None,
        };
        let pressure = match (waited0, waited1) {
            (Some(a), Some(b)) => Some((per_second(*a, *b) / 1e6).clamp(0.0, 1.0)),
            _ => None,
        };
        // EWMA weight for this sample given the time constant; the first sample is taken as is.
        let mut current = self.current.lock().unwrap();
        let weight = if current.samples == 0 {
            1.0
        } else {
            1.0 - (-elapsed / smoothing.as_secs_f64().max(1e-3)).exp()
        };
        let smooth = |old: &mut f64, new: f64| *old += weight * (new - *old);
        if let Some((utilisation, iops, bytes)) = io {
            smooth(&mut current.io_utilisation, utilisation);
            smooth(&mut current.iops, iops);
            smooth(&mut current.bytes_per_second, bytes);
        }
        if let Some((utilisation, runnable, idlest)) = cpu {
            smooth(&mut current.cpu_utilisation, utilisation);
            smooth(&mut current.runnable_per_cpu, runnable);
            // The least busy CPU is never busier than their mean; the kernel's per-CPU and total
            // counters are read a few ticks apart, so a reading can say otherwise.
            smooth(
                &mut current.idlest_cpu_utilisation,
                idlest.unwrap_or(utilisation).min(utilisation),
            );
        }
        if let Some(pressure) = pressure {
            let mut smoothed = current.cpu_pressure.unwrap_or(pressure);
            smooth(&mut smoothed, pressure);
            current.cpu_pressure = Some(smoothed);
        }
        current.samples += 1;
    }

    pub fn current(&self) -> HostLoad {
        self.current.lock().unwrap().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DISKSTATS: &str = "   7       0 loop0 10 0 80 5 0 0 0 0 0 999999 5 0 0 0 0 0 0\n \
        254       0 vda 8000 20 900000 4000 300 10 5000 200 0 4500 4200 0 0 0 0 0 0\n";

    #[test]
    fn disk_counters_add_reads_and_writes() {
        let vda = disk_counters(DISKSTATS, "vda").unwrap();
        assert_eq!(
            vda,
            DiskCounters {
                operations: 8300,
                sectors: 905000,
                io_ticks_ms: 4500
            }
        );
        assert_eq!(disk_counters(DISKSTATS, "sdz"), None);
    }

    #[test]
    fn cpu_busy_excludes_idle_and_iowait_and_runnable_excludes_the_reader() {
        let stat = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\ncpu1 1 2 3 4\nprocs_running 4\n";
        assert_eq!(
            cpu_counters(stat),
            Some(CpuCounters {
                busy_jiffies: 150,
                total_jiffies: 1000,
                runnable_per_cpu: 1.5,
                per_cpu: vec![(6, 10), (6, 10)],
            })
        );
    }

    #[test]
    fn cpu_pressure_is_the_some_lines_total() {
        let pressure = "some avg10=0.03 avg60=0.92 avg300=5.56 total=4385158141\n\
                        full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(cpu_pressure_total(pressure), Some(4385158141));
        assert_eq!(cpu_pressure_total("full avg10=0.00 total=7\n"), None);
        assert_eq!(cpu_pressure_total(""), None);
    }

    #[test]
    fn the_idlest_cpu_is_the_least_busy_one_between_two_readings() {
        let before = cpu_counters("cpu  0 0 0 0\ncpu0 0 0 0 0\ncpu1 0 0 0 0\n").unwrap();
        // cpu0 busy all of its 100 jiffies, cpu1 a quarter of them.
        let after = cpu_counters("cpu  125 0 0 75\ncpu0 100 0 0 0\ncpu1 25 0 0 75\n").unwrap();
        assert_eq!(idlest_cpu(&before, &after), Some(0.25));
        let hotplugged = cpu_counters("cpu  125 0 0 75\ncpu0 100 0 0 0\n").unwrap();
        assert_eq!(idlest_cpu(&before, &hotplugged), None);
    }

    #[test]
    fn smoothing_moves_toward_new_samples_and_clamps() {
        let sampler = HostLoadSampler {
            current: Mutex::default(),
        };
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let cpu = |busy_jiffies, total_jiffies| {
            Some(CpuCounters {
                busy_jiffies,
                total_jiffies,
                runnable_per_cpu: 0.5,
                per_cpu: vec![(busy_jiffies, total_jiffies / 2), (0, total_jiffies / 2)],
            })
        };
        let disk = |operations, sectors, io_ticks_ms| {
            Some(DiskCounters {
                operations,
                sectors,
                io_ticks_ms,
            })
        };
        // 2 s of io_ticks in 1 s (merged queues) clamps to 1.0.
        sampler.update(
            &(t0, disk(0, 0, 0), cpu(0, 100), None),
            &(t1, disk(300, 2048, 2000), cpu(50, 200), None),
            Duration::from_secs(10),
        );
        let load = sampler.current();
        assert_eq!(load.io_utilisation, 1.0);
        assert_eq!(load.cpu_utilisation, 0.5);
        assert_eq!(load.iops, 300.0);
        assert_eq!(load.bytes_per_second, 1048576.0);
        assert_eq!(load.runnable_per_cpu, 0.5);
        assert_eq!(load.idlest_cpu_utilisation, 0.0);
        assert_eq!(load.cpu_pressure, None);
        // Tasks waited 0.4 s for a CPU in the second: the first pressure is taken as is.
        sampler.update(
            &(t0, disk(0, 0, 0), cpu(0, 100), Some(1_000_000)),
            &(t1, disk(0, 0, 0), cpu(0, 200), Some(1_400_000)),
            Duration::from_secs(10),
        );
        let load = sampler.current();
        assert!(load.io_utilisation < 1.0 && load.io_utilisation > 0.85, "{load:?}");
        assert!(load.iops < 300.0 && load.iops > 255.0, "{load:?}");
        assert_eq!(load.cpu_pressure, Some(0.4));
        sampler.update(
            &(t0, disk(0, 0, 0), cpu(0, 100), Some(1_400_000)),
            &(t1, disk(0, 0, 0), cpu(0, 200), Some(1_400_000)),
            Duration::from_secs(10),
        );
        let pressure = sampler.current().cpu_pressure.unwrap();
        assert!(pressure < 0.4 && pressure > 0.35, "{pressure}");
    }

    #[test]
    fn the_idlest_cpu_is_never_reported_busier_than_the_mean() {
        let sampler = HostLoadSampler {
            current: Mutex::new(HostLoad::default()),
        };
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        // Per-CPU lines a tick ahead of the total line: both CPUs 30% busy, the total 20%.
        let cpu = |busy_jiffies, total_jiffies, per_cpu_busy| {
            Some(CpuCounters {
                busy_jiffies,
                total_jiffies,
                runnable_per_cpu: 0.0,
                per_cpu: vec![(per_cpu_busy, total_jiffies / 2); 2],
            })
        };
        sampler.update(
            &(t0, None, cpu(0, 100, 0), None),
            &(t1, None, cpu(20, 200, 15), None),
            Duration::from_secs(1),
        );
        let load = sampler.current();
        assert_eq!(load.cpu_utilisation, 0.2);
        assert_eq!(load.idlest_cpu_utilisation, 0.2);
    }
}
