"""yolo-glance-worker as an OpenStack daemon (oslo.service, threading backend): the real
command, with oslo.messaging's in-memory transport (no broker) and no Glance (no scan)."""

import os
import pathlib
import signal
import subprocess
import sys

import psutil

from yolo_common import yolofs
from yolo_testing.wait import wait as wait_until

WORKER = pathlib.Path(sys.executable).parent / 'yolo-glance-worker'


def write_conf(tmp_path, pool):
    conf = tmp_path / 'worker.conf'
    conf.write_text(f"""[DEFAULT]
transport_url = fake://
log_file = {tmp_path / 'worker.log'}
[yolo_worker]
work_dir = {tmp_path / 'work'}
yolofs_binary = {yolofs.binary()}
scan_interval = 0
metrics_port = 0
notification_pool = {pool}
[oslo_reports]
log_dir = {tmp_path / 'reports'}
""")
    return conf


def test_reload_report_and_graceful_stop(tmp_path):
    (tmp_path / 'reports').mkdir()
    conf = write_conf(tmp_path, 'first')
    log = tmp_path / 'worker.log'
    main = subprocess.Popen([WORKER, '--config-file', conf], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        def listening(pool):
            text = log.read_text() if log.exists() else ''
            return 'listening on yolo_notifications (pool %s)' % pool in text

        wait_until('the worker listening', 60, lambda: listening('first'))
        [worker] = psutil.Process(main.pid).children()

        # SIGUSR2: a Guru Meditation Report of the worker process' threads, builders included.
        os.kill(worker.pid, signal.SIGUSR2)
        reports = wait_until('a Guru Meditation Report', 30,
                             lambda: list((tmp_path / 'reports').iterdir()))
        report = wait_until('the whole report', 30,
                            lambda: 'in _serve' in reports[0].read_text() and reports[0])
        assert 'yolo-glance-worker' in report.read_text()

        # SIGHUP: the configuration files read again, in a new worker process.
        write_conf(tmp_path, 'second')
        os.kill(main.pid, signal.SIGHUP)
        wait_until('the worker listening with the new configuration', 60,
                   lambda: listening('second'))
        [new_worker] = psutil.Process(main.pid).children()
        assert new_worker.pid != worker.pid
        wait_until('the old worker process gone', 30, lambda: not worker.is_running())

        # SIGTERM: no new work, the builds under way finished (none here), a clean exit.
        main.terminate()
        assert main.wait(60) == 0
        assert 'yolo-glance-worker stopped' in log.read_text()
        assert not new_worker.is_running()
    finally:
        if main.poll() is None:
            main.kill()
            main.wait()
