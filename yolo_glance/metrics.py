"""The worker's Prometheus metrics (docs/operations.md lists them).

They live on a registry of their own rather than prometheus_client's global one: a worker's
metrics are only its own, and each test gets a fresh set.
"""

import prometheus_client

# A build is a download, a raw conversion and a profiling boot of up to max_seconds (600 s by
# default, far longer under TCG on a busy host).
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200)
# 1 MiB to 4 GiB, by factors of 4.
SIZE_BUCKETS = tuple(float(1 << shift) for shift in range(20, 33, 2))
COVERAGE_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# Outcomes shown at 0 before the first build, so that rate() and alerts see them from the start.
MAIN_OUTCOMES = ('ready', 'skipped', 'failed', 'error')
# Why an image gets no boot image (its yolo_boot_image_reason says it in words): not a disk
# image to boot (a kernel, an ISO, an empty image...), over the size limit, no scratch space,
# the guest not booting (no ready pattern, nothing read), not ready in time, a profiling plugin's
# error, transient errors through every retry.
MERGE_OUTCOMES = ('merged', 'unchanged', 'no_boot_image', 'gone', 'error')
REFUSALS = ('unsupported', 'too_large', 'no_room', 'not_bootable', 'not_ready', 'plugin',
            'transient')


class Metrics:
    """The worker's metrics, on ``registry`` (a new one by default)."""

    def __init__(self, registry=None):
        self.registry = registry if registry is not None else prometheus_client.CollectorRegistry()
        on = {'registry': self.registry}
        self.builds_started = prometheus_client.Counter(
            'yolo_worker_builds_started', 'Build jobs taken from the queue.', **on)
        self.builds_finished = prometheus_client.Counter(
            'yolo_worker_builds_finished', 'Build jobs finished, by outcome.', ['outcome'], **on)
        self.build_duration = prometheus_client.Histogram(
            'yolo_worker_build_duration_seconds', 'Duration of build jobs, by outcome.',
            ['outcome'], buckets=DURATION_BUCKETS, **on)
        self.builds_refused = prometheus_client.Counter(
            'yolo_worker_builds_refused',
            'Images given no boot image (skipped or failed), by reason.', ['reason'], **on)
        self.build_transient_errors = prometheus_client.Counter(
            'yolo_worker_build_transient_errors',
            'Build attempts that failed on a transient error (Glance, disk, yolofs).', **on)
        self.profiling_boot_duration = prometheus_client.Histogram(
            'yolo_worker_profiling_boot_duration_seconds',
            'Profiling boots, QEMU start to the end of the window, by what ended it.',
            ['ended_by'], buckets=DURATION_BUCKETS, **on)
        self.boot_image_bytes = prometheus_client.Histogram(
            'yolo_worker_boot_image_bytes', 'Size of published boot images.',
            buckets=SIZE_BUCKETS, **on)
        self.boot_image_coverage = prometheus_client.Histogram(
            'yolo_worker_boot_image_coverage_ratio',
            'Share of the raw image that published boot images hold.',
            buckets=COVERAGE_BUCKETS, **on)
        self.backlog = prometheus_client.Gauge(
            'yolo_worker_backlog_jobs', 'Jobs (builds, deletions, merges) queued or running.',
            ['state'], **on)
        self.boot_images_deleted = prometheus_client.Counter(
            'yolo_worker_boot_images_deleted', 'Boot images deleted, by reason.', ['reason'],
            **on)
        self.jobs_refused = prometheus_client.Counter(
            'yolo_worker_jobs_refused',
            "Builds not queued: their project's queue was full ([yolo_worker] "
            'max_queued_per_project; the periodic scan queues them again).', **on)
        self.boot_reports = prometheus_client.Counter(
            'yolo_worker_boot_reports',
            "Compute hosts' boot reports received, by outcome (accepted, duplicate: a boot "
            'already reported, refused: not a valid report).', ['outcome'], **on)
        self.merges = prometheus_client.Counter(
            'yolo_worker_merges',
            'Fleet merges of boot reports, by outcome (merged: a new version published; '
            'unchanged: nothing to add; no_boot_image; gone; error).', ['outcome'], **on)
        self.deletions_failed = prometheus_client.Counter(
            'yolo_worker_deletions_failed',
            'Deletion jobs that failed (the boot images of a deleted image may remain).', **on)
        for refusal in REFUSALS:
            self.builds_refused.labels(refusal)
        for outcome in MAIN_OUTCOMES:
            self.builds_finished.labels(outcome)
            self.build_duration.labels(outcome)
        for ended_by in ('ready', 'idle', 'max'):
            self.profiling_boot_duration.labels(ended_by)
        for state in ('queued', 'running'):
            self.backlog.labels(state)
        for reason in ('source_deleted', 'duplicate', 'rejected', 'not_signed', 'superseded'):
            self.boot_images_deleted.labels(reason)
        for outcome in ('accepted', 'duplicate', 'refused'):
            self.boot_reports.labels(outcome)
        for outcome in MERGE_OUTCOMES:
            self.merges.labels(outcome)

    def build_finished(self, outcome, seconds):
        self.builds_finished.labels(outcome).inc()
        self.build_duration.labels(outcome).observe(seconds)


def serve(metrics, address, port):
    """Serves ``metrics`` on http://ADDRESS:PORT/metrics from a thread; returns the server
    (``server.server_port`` is the port, chosen by the system if ``port`` is 0)."""
    server, _ = prometheus_client.start_http_server(port, addr=address,
                                                    registry=metrics.registry)
    return server
