//! Prometheus metrics of a running mount, served over HTTP (`yolofs mount --metrics-address`).
//!
//! Every value is read from the daemon's own counters at scrape time (a [`Collector`]), so the
//! read path pays nothing for metrics beyond the counters `yolofs ctl stats` already keeps.
//! Per-file series are labelled by base file name (Nova's image cache holds one per image) and
//! by the Glance image id Nova told yolofs it belongs to (empty where it did not).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread;

use log::{debug, warn};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::control::Daemon;
use crate::fill::FILL_SUFFIX;
use crate::stats::{FileStatsSnapshot, ReadSource};

/// The OpenMetrics text format's content type.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

struct DaemonMetrics(Arc<Daemon>);

impl fmt::Debug for DaemonMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DaemonMetrics")
    }
}

/// One metric without labels.
fn single(encoder: &mut DescriptorEncoder, name: &str, help: &str, metric: impl EncodeMetric) -> fmt::Result {
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// A counter family: one series per label set.
fn counters<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, u64)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in series {
        ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A gauge family: one series per label set.
fn gauges<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, i64)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in series {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for DaemonMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let daemon = &self.0;
        let e = &mut encoder;
        single(e, "yolofs_up", "1 while the mount serves.", ConstGauge::new(1i64))?;
        single(
            e,
            "yolofs_uptime_seconds",
            "Seconds since the mount started.",
            ConstGauge::new(daemon.started.elapsed().as_secs_f64()),
        )?;

        let files = daemon.stats.snapshot(None);
        // The Glance image each base file belongs to, where Nova told (base file names are an
        // opaque hash of it); a fill file's is its base file's.
        let images: BTreeMap<&String, String> = files
            .keys()
            .map(|file| {
                let base = file.strip_suffix(FILL_SUFFIX).unwrap_or(file);
                (file, daemon.store.image_id(base).unwrap_or_default())
            })
            .collect();
        let file_labels = |file: &String| [("file", file.clone()), ("image", images[file].clone())];
        type Count = fn(&FileStatsSnapshot) -> u64;
        // Series of one per-file family: for each file, one per (label value, counter).
        let by_file = |label: &'static str, values: &'static [(&'static str, Count)]| {
            files.iter().flat_map(move |(file, s)| {
                values.iter().map(move |(value, count)| {
                    let [file, image] = file_labels(file);
                    ([file, image, (label, value.to_string())], count(s))
                })
            })
        };
        counters(
            e,
            "yolofs_read_bytes",
            "Bytes read, by base file and by where they came from (boot_image: memory; base_file: passthrough).",
            by_file(
                "from",
                &[
                    ("boot_image", |s| s.bytes_memory),
                    ("base_file", |s| s.bytes_passthrough),
                ],
            ),
        )?;
        counters(
            e,
            "yolofs_read_requests",
            "Read requests, by base file and by where their bytes came from (mixed: both).",
            by_file(
                "from",
                &[
                    ("boot_image", |s| s.requests_memory),
                    ("base_file", |s| s.requests_passthrough),
                    ("mixed", |s| s.requests_mixed),
                ],
            ),
        )?;
        counters(
            e,
            "yolofs_opens",
            "Opens, by base file and by who serves the reads (kernel: FUSE passthrough, not counted in reads).",
            by_file(
                "served_by",
                &[("yolofs", |s| s.opens), ("kernel", |s| s.opens_kernel_passthrough)],
            ),
        )?;
        counters(
            e,
            "yolofs_read_errors",
            "Reads answered with an error, by base file.",
            files.iter().map(|(file, s)| (file_labels(file), s.errors)),
        )?;
        let mut latencies = e.encode_descriptor(
            "yolofs_read_seconds",
            "Time to serve a read, by where it was served from (fill: a file being filled, whose reads may wait for the download).",
            None,
            MetricType::Histogram,
        )?;
        for source in ReadSource::ALL {
            daemon
                .stats
                .latency(source)
                .encode(latencies.encode_family(&[("from", source.label())])?)?;
        }
        let (in_flight, oldest) = daemon.stats.in_flight.count_and_oldest();
        single(
            e,
            "yolofs_reads_in_flight",
            "Reads being served now.",
            ConstGauge::new(in_flight as i64),
        )?;
        single(
            e,
            "yolofs_oldest_read_in_flight_seconds",
            "How long the oldest read in flight has been waiting (0: none): a hung read shows here.",
            ConstGauge::new(oldest.as_secs_f64()),
        )?;
        if let Some(resident) = resident_memory_bytes() {
            single(
                e,
                "yolofs_resident_memory_bytes",
                "yolofs' own resident memory, boot images loaded included.",
                ConstGauge::new(resident as i64),
            )?;
        }
        let fills = daemon.fs.fills();
        single(
            e,
            "yolofs_fills_in_progress",
            "First boots' base files being filled (downloaded while their guests boot).",
            ConstGauge::new(fills.len() as i64),
        )?;
        gauges(
            e,
            "yolofs_fill_filled_bytes",
            "Bytes of each fill file filled so far (its size: yolofs_fill_size_bytes).",
            fills
                .iter()
                .map(|(name, _, filled)| ([("file", name.clone())], *filled as i64)),
        )?;
        gauges(
            e,
            "yolofs_fill_size_bytes",
            "Size of each fill file.",
            fills
                .iter()
                .map(|(name, size, _)| ([("file", name.clone())], *size as i64)),
        )?;
        counters(
            e,
            "yolofs_fuse_errors",
            "Errors answered to the kernel, by FUSE operation and errno (lookup ENOENT=2 is ordinary).",
            daemon
                .stats
                .operation_errors()
                .into_iter()
                .map(|((operation, errno), n)| {
                    ([("operation", operation.to_string()), ("errno", errno.to_string())], n)
                }),
        )?;

        let store = &daemon.store;
        let store_counters = store.counters();
        single(
            e,
            "yolofs_boot_image_loads",
            "Boot images loaded into memory (verified first when their stamp did not match).",
            ConstCounter::new(store_counters.loads.load(Relaxed)),
        )?;
        single(
            e,
            "yolofs_boot_image_evictions",
            "Boot images dropped from memory to stay within the memory budget.",
            ConstCounter::new(store_counters.evictions.load(Relaxed)),
        )?;
        counters(
            e,
            "yolofs_boot_image_rejections",
            "Boot images refused at load or install, by reason; their base files are passed through.",
            store_counters
                .rejections()
                .into_iter()
                .map(|(reason, n)| ([("reason", reason)], n)),
        )?;
        single(
            e,
            "yolofs_boot_images_refused",
            "Boot images currently refused (until their file changes).",
            ConstGauge::new(store.rejected().len() as i64),
        )?;
        let safety = store.touch_safety();
        gauges(
            e,
            "yolofs_touch_safety",
            "1 for what keeps boot images verified across touches of their base files: leases, \
             multigrain_timestamps (touches through yolofs only), none, or unknown before a base file was seen.",
            [([("mechanism", safety.mechanism)], 1)],
        )?;
        single(
            e,
            "yolofs_boot_images_loaded",
            "Boot images in memory.",
            ConstGauge::new(store.loaded().len() as i64),
        )?;
        single(
            e,
            "yolofs_memory_budget_bytes",
            "Most bytes of boot image data kept in memory (--memory-budget-mib).",
            ConstGauge::new(store.config().memory_budget as i64),
        )?;
        single(
            e,
            "yolofs_memory_used_bytes",
            "Bytes of boot image data in memory.",
            ConstGauge::new(store.used_bytes() as i64),
        )?;
        single(
            e,
            "yolofs_memory_locked_bytes",
            "Bytes locked in RAM for boot images (--mlock; with the block pool, its slabs).",
            ConstGauge::new(store.locked_bytes() as i64),
        )?;
        if let Some(pool) = store.pool_stats() {
            single(
                e,
                "yolofs_memory_unshared_bytes",
                "Bytes of the boot images in memory, each its own: what they take without the pool.",
                ConstGauge::new(pool.charged_image_bytes as i64),
            )?;
            single(
                e,
                "yolofs_block_pool_bytes",
                "Bytes of the distinct blocks in the block pool (those of open files too).",
                ConstGauge::new(pool.bytes as i64),
            )?;
            single(
                e,
                "yolofs_block_pool_mapped_bytes",
                "Bytes of memory the block pool's slabs take.",
                ConstGauge::new(pool.mapped_bytes as i64),
            )?;
        }
        if let Some(blocks) = store.block_file_stats() {
            single(
                e,
                "yolofs_block_file_bytes",
                "Bytes of the distinct blocks of the boot images installed, in the store's block file.",
                ConstGauge::new(blocks.bytes as i64),
            )?;
            single(
                e,
                "yolofs_block_file_image_bytes",
                "Bytes of data of the boot images packed in the store, each its own: what they take unpacked.",
                ConstGauge::new(blocks.image_bytes as i64),
            )?;
        }
        single(
            e,
            "yolofs_pinned_bytes",
            "Bytes of the hypervisor's files pinned in page cache (--pin-qemu).",
            ConstGauge::new(daemon.pinned_bytes as i64),
        )?;
        single(
            e,
            "yolofs_open_files",
            "Files open through the mount.",
            ConstGauge::new(daemon.fs.open_handles() as i64),
        )?;

        if let Some(recorder) = &daemon.recorder {
            let c = recorder.counters();
            counters(
                e,
                "yolofs_learning_windows",
                "Learning windows by outcome (started; learned: a boot image built; failed: none).",
                [
                    ([("outcome", "started")], c.started.load(Relaxed)),
                    ([("outcome", "learned")], c.learned.load(Relaxed)),
                    ([("outcome", "failed")], c.failed.load(Relaxed)),
                ],
            )?;
            single(
                e,
                "yolofs_learning_windows_open",
                "Boots being learned now.",
                ConstGauge::new(recorder.learning().len() as i64),
            )?;
            counters(
                e,
                "yolofs_observed_boots",
                "Boots served from a boot image, by whether they were partial (under 90% of the bytes that reached yolofs came from it).",
                [
                    ([("partial", "false")], c.complete.load(Relaxed)),
                    ([("partial", "true")], c.partial.load(Relaxed)),
                ],
            )?;
            single(
                e,
                "yolofs_boot_image_extensions",
                "Boot images extended with what a partial boot read outside them (--learn).",
                ConstCounter::new(c.extended.load(Relaxed)),
            )?;
        }

        let load = daemon.host_load.current();
        single(
            e,
            "yolofs_host_io_utilisation",
            "Smoothed utilisation of the disk holding the source directory, 0..1.",
            ConstGauge::new(load.io_utilisation),
        )?;
        single(
            e,
            "yolofs_host_cpu_utilisation",
            "Smoothed CPU utilisation of the host, 0..1.",
            ConstGauge::new(load.cpu_utilisation),
        )?;
        single(
            e,
            "yolofs_host_idlest_cpu_utilisation",
            "Smoothed utilisation of the least busy CPU, 0..1.",
            ConstGauge::new(load.idlest_cpu_utilisation),
        )?;
        single(
            e,
            "yolofs_host_runnable_per_cpu",
            "Smoothed runnable tasks per CPU.",
            ConstGauge::new(load.runnable_per_cpu),
        )?;
        if let Some(pressure) = load.cpu_pressure {
            single(
                e,
                "yolofs_host_cpu_pressure",
                "Smoothed fraction of time some runnable task waited for a CPU, 0..1.",
                ConstGauge::new(pressure),
            )?;
        }
        Ok(())
    }
}

/// This process' resident memory (`/proc/self/statm`), if it can be read.
fn resident_memory_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page_size).ok()?)
}

/// The registry of a daemon's metrics.
pub fn registry(daemon: Arc<Daemon>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(DaemonMetrics(daemon)));
    registry
}

/// The metrics of `registry` in the OpenMetrics text format.
pub fn render(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("writing to a String cannot fail");
    text
}

/// Serves `GET /metrics` on `address` from a thread of its own; the listener is bound before
/// this returns, so a taken port fails the mount at start rather than later.
pub fn serve(address: SocketAddr, daemon: Arc<Daemon>) -> std::io::Result<SocketAddr> {
    let server = tiny_http::Server::http(address).map_err(std::io::Error::other)?;
    let bound = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| std::io::Error::other("metrics listener has no IP address"))?;
    let registry = registry(daemon);
    thread::Builder::new().name("yolofs-metrics".into()).spawn(move || {
        let content_type = tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE).expect("a valid header");
        for request in server.incoming_requests() {
            let response = match (request.method(), request.url()) {
                (tiny_http::Method::Get, "/metrics") => {
                    tiny_http::Response::from_string(render(&registry)).with_header(content_type.clone())
                }
                _ => tiny_http::Response::from_string("yolofs serves /metrics only\n").with_status_code(404),
            };
            if let Err(e) = request.respond(response) {
                debug!("metrics client: {e}");
            }
        }
        warn!("metrics listener on {bound} closed");
    })?;
    Ok(bound)
}
