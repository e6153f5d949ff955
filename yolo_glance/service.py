"""``yolo-glance-worker``: Glance notifications and a periodic scan feed the worker.

Notifications arrive through oslo.messaging on a topic of the worker's own, which glance-api
publishes to beside any other. Builds run on a bounded thread pool, at most one per image
at a time; a periodic scan of active images catches whatever notifications were lost and the
images uploaded before the worker ran. Its metrics are served for Prometheus on
``[yolo_worker] metrics_address`` and ``metrics_port``.
"""

import collections
import concurrent.futures
import logging
import os
import re
import sys
import threading
import time

from oslo_config import cfg
from oslo_log import log as oslo_logging
import oslo_messaging
from oslo_reports import guru_meditation_report as gmr
from oslo_reports import opts as gmr_opts
from oslo_service.backend import base as service_base
from oslo_service import opts as service_opts
import pbr.version

from yolo_common import boot_reports
from yolo_common import signing
from yolo_glance import conf as yolo_conf
from yolo_glance import fleet
from yolo_glance import glance as glance_api
from yolo_glance import metrics as metrics_mod
from yolo_glance import profiling
from yolo_glance import worker as worker_mod

LOG = logging.getLogger(__name__)
EVENTS = r'^image\.(activate|update|delete)$'
# A stop waits for the builds under way: a download, a conversion, a profiling boot of at most
# [yolo_profiling] max_seconds (600 s) and the publication (etc/yolo-glance-worker.service's
# TimeoutStopSec).
GRACEFUL_STOP_SECONDS = 1200
# Statuses our own updates set: the image.update notifications they cause need no work.
OWN_STATUSES = (worker_mod.BUILDING, worker_mod.READY, worker_mod.SKIPPED, worker_mod.FAILED)


class Dispatcher:
    """Runs the worker's builds and deletions on ``max_concurrent_builds`` threads, one job per
    image at a time, fairly between projects: each project (an image's owner) has a queue of
    its own, at most ``max_queued_per_project`` long, and the threads take the next job from
    the project served longest ago, so that one project's backlog delays another's next build
    by the builds running at most. Deletions (cheap, and of images whose owner is gone) have a
    queue of their own, served first. A job refused for a full queue is counted; the periodic
    scan queues it again.
    """

    DELETIONS = object()     # the queue of deletions
    MERGES = object()        # the queue of fleet merges, which takes turns with the projects'

    def __init__(self, worker, glance, max_concurrent_builds=1, activation_timeout=120,
                 max_queued_per_project=50, reports=None, merge_interval=600,
                 clock=time.monotonic):
        self.worker = worker
        self.glance = glance
        # The boot reports of compute hosts (fleet.ReportStore; None: no fleet learning), and
        # when each image's were last merged.
        self.reports = reports
        self.merge_interval = merge_interval
        self.clock = clock
        self.merged_at = {}
        self.activation_timeout = activation_timeout
        self.max_queued_per_project = max_queued_per_project
        self.metrics = worker.metrics   # one registry for the worker's and the queue's
        self.lock = threading.Lock()
        self.work = threading.Condition(self.lock)
        self.in_flight = {}
        # Project -> its queued jobs; project -> when it was last served (a count of jobs).
        self.queues = {}
        self.served = {}
        self.jobs_started = 0
        self.stopping = False
        self.threads = [threading.Thread(target=self._serve, name='yolo-build-%d' % n,
                                         daemon=True) for n in range(max_concurrent_builds)]
        for thread in self.threads:
            thread.start()

    def submit(self, image_id, job, *args, project=None):
        """Queues ``job(image_id, *args)`` for ``project``'s turn; returns its future (the one
        already queued or running for the image, if any; one already cancelled if the project's
        queue is full)."""
        with self.lock:
            if image_id in self.in_flight:
                return self.in_flight[image_id]
            future = concurrent.futures.Future()
            queue = self.queues.setdefault(project, collections.deque())
            if self.stopping or (project is not self.DELETIONS
                                 and len(queue) >= self.max_queued_per_project):
                if not queue:
                    del self.queues[project]
                if not self.stopping:
                    LOG.warning('%s: not queued: project %s has %d jobs queued already (the '
                                'scan queues it again)', image_id, project, len(queue))
                    self.metrics.jobs_refused.inc()
                future.cancel()
                return future
            queue.append((image_id, job, args, future))
            self.in_flight[image_id] = future
            self.metrics.backlog.labels('queued').inc()
            self.work.notify()
            return future

    def _next(self):
        """The next job: a deletion, else the next job of the project with jobs queued that
        was served longest ago (never: first); None once stopping."""
        with self.lock:
            while not self.queues and not self.stopping:
                self.work.wait()
            if self.stopping:
                return None
            project = self.DELETIONS if self.DELETIONS in self.queues else min(
                self.queues, key=lambda p: self.served.get(p, -1))
            queue = self.queues[project]
            job = queue.popleft()
            if not queue:
                del self.queues[project]
            self.jobs_started += 1
            self.served[project] = self.jobs_started
            return job

    def _serve(self):
        while True:
            job = self._next()
            if job is None:
                return
            image_id, function, args, future = job
            if future.set_running_or_notify_cancel():
                future.set_result(self._run(image_id, function, *args))

    def _run(self, image_id, job, *args):
        self.metrics.backlog.labels('queued').dec()
        self.metrics.backlog.labels('running').inc()
        try:
            outcome = job(image_id, *args)
            LOG.info('%s: %s', image_id, outcome)
            return outcome
        except Exception:
            LOG.exception('%s: unexpected failure', image_id)
            return 'error'
        finally:
            with self.lock:
                self.in_flight.pop(image_id, None)
            self.metrics.backlog.labels('running').dec()

    def build(self, image_id, wait_active=False, project=None):
        """Queues the build of ``image_id``, owned by ``project``."""
        return self.submit(image_id, self._build, wait_active, project=project)

    def delete(self, image_id):
        return self.submit(image_id, self._delete, project=self.DELETIONS)

    def _delete(self, image_id):
        if self.reports is not None:
            self.reports.forget(image_id)
        try:
            return 'deleted %d' % self.worker.delete(image_id)
        except Exception:
            self.metrics.deletions_failed.inc()
            raise

    def merge(self, image_id):
        """Queues a merge of ``image_id``'s boot reports unless one published a version less
        than ``merge_interval`` ago (the periodic scan queues it then); returns its future, or
        None."""
        if self.reports is None:
            return None
        with self.lock:
            if self.clock() - self.merged_at.get(image_id, float('-inf')) < self.merge_interval:
                return None
        return self.submit(image_id, self._merge, project=self.MERGES)

    def _merge(self, image_id):
        outcome = 'error'
        try:
            outcome = self.worker.merge(image_id, self.reports.reports(image_id))
            if outcome == 'gone':
                self.reports.forget(image_id)
            return 'merge: %s' % outcome
        finally:
            # The next merge of the image waits after one that published or failed (each
            # downloads the image); one that added nothing does not hold back the reports
            # that come after it.
            if outcome in ('merged', 'error'):
                with self.lock:
                    self.merged_at[image_id] = self.clock()
            self.metrics.merges.labels(outcome).inc()

    def _build(self, image_id, wait_active):
        self.metrics.builds_started.inc()
        started = time.monotonic()
        outcome = 'error'   # unless the build returns one
        try:
            outcome = self._wait_and_build(image_id, wait_active)
            return outcome
        finally:
            self.metrics.build_finished(outcome, time.monotonic() - started)

    def _wait_and_build(self, image_id, wait_active):
        if wait_active:
            # image.activate is sent before the database says active.
            deadline = time.monotonic() + self.activation_timeout
            while True:
                try:
                    if self.glance.get(image_id).get('status') == 'active':
                        break
                except glance_api.NotFound:
                    return 'gone'
                if time.monotonic() > deadline:
                    LOG.warning('%s: not active after %ss', image_id, self.activation_timeout)
                    return 'inactive'
                time.sleep(1)
        return self.worker.build(image_id)

    def scan(self):
        """Queues every active image that still needs a boot image (none, or one that no
        longer counts: rejected, unsigned), and the deletion of the boot images of images that
        are gone (their image.delete notification lost); returns the ids of the images queued
        for a build."""
        queued, active = [], set()
        published = self.worker.published()
        usable = self.worker.usable_ids(published)
        for image in self.glance.active_images():
            active.add(image['id'])
            if self.worker.needs_build(image, usable):
                self.build(image['id'], project=image.get('owner'))
                queued.append(image['id'])
        for source_id in self.worker.orphaned_sources(active, published):
            self.delete(source_id)
        if self.reports is not None:
            for image_id in self.reports.image_ids():
                self.merge(image_id)
        return queued

    def shutdown(self, wait=True):
        """Stops: queued jobs are dropped (a scan queues them again), running ones finish if
        ``wait``."""
        with self.lock:
            self.stopping = True
            for queue in self.queues.values():
                for image_id, _, _, future in queue:
                    future.cancel()
                    self.in_flight.pop(image_id, None)
                    self.metrics.backlog.labels('queued').dec()
            self.queues.clear()
            self.work.notify_all()
        if wait:
            for thread in self.threads:
                thread.join()


class NotificationEndpoint:
    filter_rule = oslo_messaging.NotificationFilter(event_type=EVENTS)

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        image_id = (payload or {}).get('id')
        if not image_id:
            return oslo_messaging.NotificationResult.HANDLED
        if event_type == 'image.delete':
            self.dispatcher.delete(image_id)
        elif event_type == 'image.activate':
            self.dispatcher.build(image_id, wait_active=True, project=payload.get('owner'))
        elif payload.get('status') == 'active' \
                and (payload.get('properties') or {}).get(glance_api.STATUS) not in OWN_STATUSES:
            self.dispatcher.build(image_id, project=payload.get('owner'))
        return oslo_messaging.NotificationResult.HANDLED

    def warn(self, ctxt, publisher_id, event_type, payload, metadata):
        # Consumed so that the topic's warn and error queues (a failed upload) do not fill:
        # nothing to build from them.
        return oslo_messaging.NotificationResult.HANDLED

    error = warn


class BootReportEndpoint:
    """Compute hosts' boot reports (yolo_common/boot_reports.py): each checked, kept, and a
    merge of the image's reports queued."""

    filter_rule = oslo_messaging.NotificationFilter(
        event_type='^%s$' % re.escape(boot_reports.EVENT_TYPE))

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        try:
            report = boot_reports.BootReport.from_payload(payload)
        except boot_reports.BadReport as e:
            LOG.warning('boot report from %s refused: %s', publisher_id, e)
            self.dispatcher.metrics.boot_reports.labels('refused').inc()
            return oslo_messaging.NotificationResult.HANDLED
        try:
            new = self.dispatcher.reports.add(report)
        except OSError:
            LOG.exception('%s: could not keep a boot report from %s', report.image_id,
                          report.host)
            return oslo_messaging.NotificationResult.HANDLED
        if not new:
            self.dispatcher.metrics.boot_reports.labels('duplicate').inc()
            return oslo_messaging.NotificationResult.HANDLED
        self.dispatcher.metrics.boot_reports.labels('accepted').inc()
        LOG.info('%s: boot report from %s: %d bytes in %d extents read outside its boot image',
                 report.image_id, report.host, report.bytes, len(report.extents))
        self.dispatcher.merge(report.image_id)
        return oslo_messaging.NotificationResult.HANDLED


def notification_listener(conf, dispatcher, transport=None):
    transport = transport or oslo_messaging.get_notification_transport(conf)
    targets = [oslo_messaging.Target(topic=topic, exchange=conf.yolo_worker.notification_exchange)
               for topic in conf.yolo_worker.notification_topics]
    endpoints = [NotificationEndpoint(dispatcher)]
    if dispatcher.reports is not None:
        targets.append(oslo_messaging.Target(topic=conf.yolo_fleet.report_topic,
                                             exchange=conf.yolo_fleet.report_exchange))
        endpoints.append(BootReportEndpoint(dispatcher))
    return oslo_messaging.get_notification_listener(
        transport, targets, endpoints, executor='threading',
        pool=conf.yolo_worker.notification_pool)


def make_worker(conf, glance=None, metrics=None):
    """The worker from ``conf``; raises profiling.PluginError if a profiling plugin is unknown
    or cannot work here, signing.SigningError if the signing key is unusable."""
    glance = glance or glance_api.Glance.from_conf(conf)
    options = conf.yolo_profiling
    worker = worker_mod.Worker(
        glance, conf.yolo_worker.work_dir,
        worker_mod.ProfilingOptions(
            ready_pattern=options.ready_pattern, idle_seconds=options.idle_seconds,
            max_seconds=options.max_seconds,
            memory_mib=options.memory_mib, block_size=options.block_size,
            min_boot_bytes=options.min_boot_bytes, max_memory_mib=options.max_memory_mib),
        container_format=conf.yolo_worker.container_format, retries=conf.yolo_worker.retries,
        claim_timeout=conf.yolo_worker.claim_timeout,
        yolofs_binary=conf.yolo_worker.yolofs_binary,
        runner=profiling.load_runner(options.runner),
        readiness=profiling.load_readiness(options.readiness),
        metrics=metrics or metrics_mod.Metrics(),
        signer=load_signer(conf.yolo_worker.signing_key_file),
        sandboxed=options.sandbox,
        max_virtual_size=conf.yolo_worker.max_virtual_size_gib * worker_mod.GiB,
        merging=fleet.MergeOptions(
            threshold=conf.yolo_fleet.threshold, host_votes=conf.yolo_fleet.host_votes,
            max_growth=conf.yolo_fleet.max_growth,
            max_bytes=conf.yolo_fleet.max_boot_image_mib << 20))
    worker.check()
    return worker


def make_dispatcher(conf, glance=None, metrics=None):
    """The worker and its dispatcher from ``conf`` (:func:`make_worker` says what it raises)."""
    glance = glance or glance_api.Glance.from_conf(conf)
    reports = fleet.ReportStore(
        os.path.join(conf.yolo_worker.work_dir, 'boot-reports'),
        host_votes=conf.yolo_fleet.host_votes,
        max_age_seconds=conf.yolo_fleet.max_report_age_days * 86400,
    ) if conf.yolo_fleet.enabled else None
    return Dispatcher(make_worker(conf, glance, metrics), glance,
                      conf.yolo_worker.max_concurrent_builds,
                      conf.yolo_worker.activation_timeout,
                      conf.yolo_worker.max_queued_per_project,
                      reports=reports, merge_interval=conf.yolo_fleet.merge_interval)


def load_signer(path):
    """The worker's signing key, None if it has none (raises signing.SigningError if the
    file cannot be read as one)."""
    if not path:
        LOG.warning('[yolo_worker] signing_key_file is not set: boot images are published '
                    'unsigned, and compute hosts boot images only once they are downloaded')
        return None
    try:
        return signing.Signer.from_file(path)
    except (OSError, ValueError, signing.SigningError) as e:
        raise signing.SigningError('[yolo_worker] signing_key_file: %s' % e) from None


def serve_metrics(conf, metrics):
    """Serves ``metrics`` on ``[yolo_worker] metrics_address:metrics_port``; returns the
    server, or None if the port is 0."""
    if not conf.yolo_worker.metrics_port:
        return None
    server = metrics_mod.serve(metrics, conf.yolo_worker.metrics_address,
                               conf.yolo_worker.metrics_port)
    LOG.info('metrics on http://%s:%d/metrics', conf.yolo_worker.metrics_address,
             server.server_port)
    return server


class Version:
    """What a Guru Meditation Report names as its package."""

    info = pbr.version.VersionInfo('yolo-openstack')

    @staticmethod
    def vendor_string():
        return 'YOLO for OpenStack'

    @staticmethod
    def product_string():
        return 'yolo-glance-worker'

    def version_string_with_package(self):
        return self.info.version_string()


class WorkerService(service_base.ServiceBase):
    """The worker as an oslo.service service: its notification listener, its build threads,
    its periodic scan and its metrics, all started in the service's process and stopped with
    it. A stop takes no new work and waits for the builds under way (a half-built boot image
    would only be built again)."""

    def __init__(self, conf):
        self.conf = conf
        self.dispatcher = self.listener = self.metrics_server = None
        self.stopping = threading.Event()

    def start(self):
        self.dispatcher = make_dispatcher(self.conf)
        try:
            self.metrics_server = serve_metrics(self.conf, self.dispatcher.metrics)
        except OSError as e:   # the port is taken, say
            LOG.critical('cannot serve metrics on %s port %d: %s',
                         self.conf.yolo_worker.metrics_address,
                         self.conf.yolo_worker.metrics_port, e)
            raise
        self.listener = notification_listener(self.conf, self.dispatcher)
        self.listener.start()
        threading.Thread(target=self._scan_periodically, name='yolo-scan', daemon=True).start()
        LOG.info('yolo-glance-worker listening on %s (pool %s)',
                 ', '.join(self.conf.yolo_worker.notification_topics),
                 self.conf.yolo_worker.notification_pool)

    def _scan_periodically(self):
        interval = self.conf.yolo_worker.scan_interval
        while not self.stopping.is_set():
            if interval:
                try:
                    queued = self.dispatcher.scan()
                    LOG.info('scan: %d image(s) need a boot image', len(queued))
                except Exception:
                    LOG.exception('scan failed; next one in %ss', interval)
            self.stopping.wait(interval or None)

    def stop(self, graceful=True):
        LOG.info('yolo-glance-worker stopping: no new builds, waiting for those under way')
        self.stopping.set()
        if self.listener is not None:
            self.listener.stop()
            self.listener.wait()
        if self.dispatcher is not None:
            self.dispatcher.shutdown(wait=graceful)
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
        LOG.info('yolo-glance-worker stopped')

    def wait(self):
        self.stopping.wait()

    def reset(self):
        # SIGHUP: oslo.service has read the configuration files again and starts a new process.
        pass


def main(argv=None):
    """``yolo-glance-worker`` (:mod:`yolo_glance.cmd.worker`): oslo.service runs the worker in
    a process of its own (its threading backend: no eventlet). SIGTERM stops it gracefully
    (``[DEFAULT] graceful_shutdown_timeout``, 1200 s by default here: the longest build),
    SIGHUP reads the configuration files again and restarts it, SIGUSR2 to the worker process
    writes a Guru Meditation Report (docs/glance-worker.md, "Running it")."""
    from oslo_service import service as oslo_service   # once the backend is chosen (cmd)

    conf = cfg.ConfigOpts()
    yolo_conf.register_opts(conf)
    oslo_logging.register_options(conf)
    service_opts.register_service_opts(conf)
    service_opts.set_service_opts_defaults(conf, graceful_shutdown_timeout=GRACEFUL_STOP_SECONDS)
    gmr_opts.set_defaults(conf)
    conf(argv if argv is not None else sys.argv[1:], project='yolo',
         prog='yolo-glance-worker', default_config_files=None)
    oslo_logging.setup(conf, 'yolo')
    # What cannot work is said at once, before a process is started for it.
    try:
        make_worker(conf)
    except (profiling.PluginError, signing.SigningError) as e:
        LOG.critical('%s', e)
        sys.exit(1)
    gmr.TextGuruMeditation.setup_autorun(Version(), conf=conf)
    launcher = oslo_service.launch(conf, WorkerService(conf), restart_method='reload')
    sys.exit(launcher.wait())
