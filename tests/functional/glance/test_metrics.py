"""The worker's Prometheus metrics: what builds, deletions and the queue leave in the registry,
and the HTTP endpoint that serves them. Builds run through the Dispatcher with test_worker.py's
in-memory Glance and fixed profiling trace."""

import threading
import urllib.request

from oslo_config import cfg
import pytest

from tests.functional.glance.fakes import MiB
from tests.functional.glance.fakes import publish_signed
from tests.functional.glance.fakes import raw_disk
from yolo_glance import conf as yolo_conf
from yolo_glance import glance as glance_api
from yolo_glance import metrics as metrics_mod
from yolo_glance import service
from yolo_testing import ports
from yolo_testing.wait import wait as wait_until


def value(metrics, name, **labels):
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_builds_by_outcome(glance, make_worker, monkeypatch):
    worker = make_worker(retries=1)
    dispatcher = service.Dispatcher(worker, glance)
    metrics = dispatcher.metrics
    assert metrics is worker.metrics
    ready = glance.add(raw_disk())
    skipped = glance.add(raw_disk(), disk_format='iso')
    failed = glance.add(raw_disk(), disk_format='qcow2')     # says qcow2, is not
    broken = glance.add(raw_disk())
    real_get = glance.get

    def get(image_id):
        if image_id == broken:
            raise RuntimeError('Glance returned nonsense')
        return real_get(image_id)
    monkeypatch.setattr(glance, 'get', get)
    glance.fail_downloads = 1      # the first build retries once
    outcomes = [dispatcher.build(i).result(60) for i in (ready, skipped, failed, broken)]
    dispatcher.shutdown()
    assert outcomes == ['ready', 'skipped', 'failed', 'error']

    assert value(metrics, 'yolo_worker_builds_started_total') == 4
    for outcome in ('ready', 'skipped', 'failed', 'error'):
        assert value(metrics, 'yolo_worker_builds_finished_total', outcome=outcome) == 1
        assert value(metrics, 'yolo_worker_build_duration_seconds_count', outcome=outcome) == 1
    assert value(metrics, 'yolo_worker_build_duration_seconds_sum', outcome='ready') > 0
    assert value(metrics, 'yolo_worker_build_transient_errors_total') == 1
    # Why the skipped and the failed image got no boot image; every reason shown from the start.
    assert {reason: value(metrics, 'yolo_worker_builds_refused_total', reason=reason)
            for reason in metrics_mod.REFUSALS} == {
        **dict.fromkeys(metrics_mod.REFUSALS, 0.0), 'unsupported': 1.0, 'not_bootable': 1.0}
    assert metrics.registry.get_sample_value('yolo_worker_builds_refused_total',
                                             {'reason': 'plugin'}) == 0.0
    # One profiling boot (the fake one: 12.5 s, ended by the ready pattern) and one boot image.
    assert value(metrics, 'yolo_worker_profiling_boot_duration_seconds_count',
                 ended_by='ready') == 1
    assert value(metrics, 'yolo_worker_profiling_boot_duration_seconds_sum',
                 ended_by='ready') == 12.5
    published = glance.images[glance.images[ready][glance_api.BOOT_IMAGE_ID]]
    assert value(metrics, 'yolo_worker_boot_image_bytes_count') == 1
    assert value(metrics, 'yolo_worker_boot_image_bytes_sum') == int(
        published['yolo_boot_image_bytes'])
    assert value(metrics, 'yolo_worker_boot_image_coverage_ratio_sum') == pytest.approx(
        (65536 + 8192) / (4 * MiB))
    assert value(metrics, 'yolo_worker_boot_image_coverage_ratio_bucket', le='0.02') == 1
    assert value(metrics, 'yolo_worker_backlog_jobs', state='queued') == 0
    assert value(metrics, 'yolo_worker_backlog_jobs', state='running') == 0


def test_outcomes_are_shown_before_the_first_build(make_worker):
    metrics = make_worker().metrics
    for outcome in metrics_mod.MAIN_OUTCOMES:
        assert metrics.registry.get_sample_value('yolo_worker_builds_finished_total',
                                                 {'outcome': outcome}) == 0


def test_backlog_counts_queued_and_running_jobs(glance, make_worker):
    worker = make_worker()
    started, finish = threading.Event(), threading.Event()

    def slow_build(image_id):
        started.set()
        finish.wait(30)
        return 'ready'
    worker.build = slow_build
    dispatcher = service.Dispatcher(worker, glance)
    metrics = dispatcher.metrics
    running = dispatcher.build('img-1')
    assert started.wait(10)
    queued = [dispatcher.build('img-2'), dispatcher.delete('img-3')]
    dispatcher.build('img-2')          # already queued: one job
    assert value(metrics, 'yolo_worker_backlog_jobs', state='running') == 1
    assert value(metrics, 'yolo_worker_backlog_jobs', state='queued') == 2
    finish.set()
    for future in [running, *queued]:
        future.result(30)
    dispatcher.shutdown()
    assert value(metrics, 'yolo_worker_backlog_jobs', state='running') == 0
    assert value(metrics, 'yolo_worker_backlog_jobs', state='queued') == 0
    assert value(metrics, 'yolo_worker_builds_finished_total', outcome='ready') == 2


def test_deletions(glance, make_worker, signer):
    dispatcher = service.Dispatcher(make_worker(), glance)
    metrics = dispatcher.metrics
    source = glance.add(raw_disk())
    raced = glance.add(raw_disk())
    # Another worker published a boot image of `raced` first: this one's is the duplicate.
    publish_signed(glance, signer, raced, created_at='2000-01-01T00:00:00')
    assert dispatcher.build(source).result(60) == 'ready'
    assert dispatcher.build(raced).result(60) == 'present'
    glance.delete(source)
    assert dispatcher.delete(source).result(60) == 'deleted 1'
    dispatcher.worker.delete = lambda image_id: 1 / 0
    assert dispatcher.delete(raced).result(60) == 'error'
    dispatcher.shutdown()
    assert value(metrics, 'yolo_worker_boot_images_deleted_total', reason='source_deleted') == 1
    assert value(metrics, 'yolo_worker_boot_images_deleted_total', reason='duplicate') == 1
    assert value(metrics, 'yolo_worker_deletions_failed_total') == 1
    assert value(metrics, 'yolo_worker_builds_finished_total', outcome='present') == 1


def test_workers_do_not_share_metrics(glance, make_worker):
    one, other = make_worker(), make_worker()
    assert one.metrics.registry is not other.metrics.registry
    one.metrics.builds_started.inc()
    assert value(other.metrics, 'yolo_worker_builds_started_total') == 0


def read(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def test_the_metrics_are_served_over_http(make_worker):
    metrics = make_worker().metrics
    metrics.builds_finished.labels('ready').inc()
    server = metrics_mod.serve(metrics, '127.0.0.1', 0)     # a port the system picks
    try:
        text = read('http://127.0.0.1:%d/metrics' % server.server_port)
    finally:
        server.shutdown()
        server.server_close()
    assert 'yolo_worker_builds_finished_total{outcome="ready"} 1.0' in text
    for name in ('yolo_worker_builds_started_total', 'yolo_worker_build_duration_seconds_bucket',
                 'yolo_worker_profiling_boot_duration_seconds', 'yolo_worker_boot_image_bytes',
                 'yolo_worker_boot_image_coverage_ratio', 'yolo_worker_backlog_jobs',
                 'yolo_worker_boot_images_deleted_total', 'yolo_worker_deletions_failed_total',
                 'yolo_worker_build_transient_errors_total'):
        assert name in text, name
    # Only the worker's own: prometheus_client's process and platform metrics are elsewhere.
    assert 'python_info' not in text


def test_the_worker_serves_its_metrics_where_configured(make_worker):
    conf = cfg.ConfigOpts()
    yolo_conf.register_opts(conf)
    conf([], project='yolo-test', default_config_files=[])
    assert conf.yolo_worker.metrics_address == '127.0.0.1'
    assert conf.yolo_worker.metrics_port == 9465
    metrics = make_worker().metrics
    conf.set_override('metrics_port', 0, group='yolo_worker')
    assert service.serve_metrics(conf, metrics) is None
    port = ports.free_port()
    conf.set_override('metrics_port', port, group='yolo_worker')
    server = service.serve_metrics(conf, metrics)
    try:
        assert 'yolo_worker_backlog_jobs{state="queued"} 0.0' in read(
            'http://127.0.0.1:%d/metrics' % port)
    finally:
        server.shutdown()
        server.server_close()


def blocked_worker(make_worker):
    """A worker whose builds wait for ``worker.finish``, recording their order."""
    worker = make_worker()
    worker.started, worker.finish, worker.order = threading.Event(), threading.Event(), []

    def slow_build(image_id):
        worker.order.append(image_id)
        worker.started.set()
        worker.finish.wait(30)
        return 'ready'
    worker.build = slow_build
    return worker


def test_projects_take_turns_and_their_queues_are_bounded(glance, make_worker):
    worker = blocked_worker(make_worker)
    dispatcher = service.Dispatcher(worker, glance, max_queued_per_project=3)
    running = dispatcher.build('a-0', project='tenant-a')
    assert worker.started.wait(10)
    # One tenant's many uploads, then another's one: the other's comes next.
    futures = [dispatcher.build('a-%d' % n, project='tenant-a') for n in range(1, 6)]
    futures.append(dispatcher.build('b-0', project='tenant-b'))
    # Past its bound, a project's builds are refused, counted, and left to the scan.
    assert [f.cancelled() for f in futures] == [False] * 3 + [True] * 2 + [False]
    assert value(dispatcher.metrics, 'yolo_worker_jobs_refused_total') == 2
    worker.finish.set()
    for future in [running] + futures:
        assert future.cancelled() or future.result(30) == 'ready'
    assert worker.order == ['a-0', 'b-0', 'a-1', 'a-2', 'a-3']
    dispatcher.shutdown()


def test_the_scan_deletes_boot_images_of_images_gone(glance, make_worker):
    dispatcher = service.Dispatcher(make_worker(), glance)
    kept, gone = glance.add(raw_disk()), glance.add(raw_disk())
    assert dispatcher.build(kept).result(60) == 'ready'
    assert dispatcher.build(gone).result(60) == 'ready'
    glance.delete(gone)       # its image.delete notification lost
    dispatcher.scan()
    wait_until('the boot images of the image gone deleted', 30,
               lambda: not glance.boot_images_of(gone, 'yolo'), interval=0.1)
    assert len(glance.boot_images_of(kept, 'yolo')) == 1
    dispatcher.shutdown()
