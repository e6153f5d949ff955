"""The Nova storm's log scan, process sampling and report (not the cloud)."""

import os

from yolo_bench import nova_storm


def test_only_error_lines_and_tracebacks_written_since_the_start_are_found(tmp_path):
    nova = tmp_path / 'nova-compute.log'
    nova.write_text('2026-12-02 08:00:00.000 1 ERROR nova.compute.manager [-] before the run\n')
    (tmp_path / 'other.txt').write_text('x ERROR y\n')
    positions = nova_storm.log_positions(tmp_path)
    with open(nova, 'a') as f:
        f.write('2026-12-02 08:01:00.000 1 INFO nova.compute.manager [-] an ERROR word\n'
                '2026-12-02 08:01:01.000 1 ERROR nova.compute.manager [-] it broke\n'
                'Traceback (most recent call last):\n')
    (tmp_path / 'glance-api.log').write_text('[2026-12-02 08:01:02] [7] [ERROR] worker died\n'
                                             '2026-12-02 08:01:03.000 1 WARNING glance [-] ok\n')
    (tmp_path / 'yolofs.log').write_text('[2026-12-02T08:01:04Z ERROR yolofs::control] x\n'
                                         '[2026-12-02T08:01:05Z INFO yolofs] ERROR: none\n')
    found = nova_storm.errors_since(positions, tmp_path)
    assert found == {
        'glance-api.log': ['[2026-12-02 08:01:02] [7] [ERROR] worker died'],
        'nova-compute.log': ['2026-12-02 08:01:01.000 1 ERROR nova.compute.manager [-] it broke',
                             'Traceback (most recent call last):'],
        'yolofs.log': ['[2026-12-02T08:01:04Z ERROR yolofs::control] x']}
    assert nova_storm.errors_since(nova_storm.log_positions(tmp_path), tmp_path) == {}


def test_a_process_is_sampled_for_its_cpu_and_peak_memory():
    with nova_storm.ProcessSampler(os.getpid, interval=0.05) as sampler:
        sum(i * i for i in range(3_000_000))
    assert sampler.cpu_seconds > 0
    assert sampler.peak_rss_bytes > 1 << 20


def test_the_report_says_ready_errors_and_the_schedulers_view():
    run = {'kind': 'distinct', 'servers': 8, 'stressors': 8, 'ready': True,
           'ready_seconds': 240.5, 'active_seconds': 30.2, 'yolofs_cpu_seconds': 12.5,
           'yolofs_peak_rss_mib': 900.4, 'errors': {},
           'scheduler': [{'host': 'aio-compute', 'predicted_seconds': 24.0,
                          'io_utilisation': 0.5, 'verdict': 'passes'},
                         {'host': 'aio-compute', 'predicted_seconds': 31.5,
                          'io_utilisation': 0.7, 'verdict': 'passes'}]}
    lines = nova_storm.report_lines(run)
    assert lines[0] == ('8 servers at once (distinct images), 8 stressors: every guest ready, '
                        'the last 240.5 s after the request (ACTIVE 30.2 s)')
    assert lines[1] == '  yolofs: 12.5 CPU s, peak resident memory 900 MiB'
    assert lines[2] == "  errors in the cloud's logs: none"
    assert lines[3] == '  scheduler: 2 predictions, 24.0-31.5 s, aio-compute passes'
    failed = dict(run, ready=False, failure='server x went to ERROR',
                  errors={'nova-compute.log': ['a', 'b']})
    lines = nova_storm.report_lines(failed)
    assert lines[0].endswith('FAILED: server x went to ERROR')
    assert lines[2] == "  errors in the cloud's logs: nova-compute.log: 2 lines"
