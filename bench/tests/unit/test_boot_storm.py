"""The boot storm benchmark's synthetic base files, report and goal (not timings)."""

import argparse
import json
import os

import pytest

from yolo_bench import boot_storm
from yolo_bench import io_replay


def test_traced_runs_merge_overlapping_and_touching_reads():
    reads = [io_replay.Read(8192, 4096, 0.0), io_replay.Read(0, 4096, 0.0),
             io_replay.Read(4096, 100, 0.0), io_replay.Read(10000, 5000, 0.0)]
    assert boot_storm.traced_runs(reads) == [(0, 4196), (8192, 15000)]


def test_a_synthetic_base_holds_bytes_of_its_own_where_the_boot_reads(tmp_path):
    runs = [(0, 4096), (3 << 20, (3 << 20) + 100)]
    one, other = tmp_path / 'one', tmp_path / 'other'
    boot_storm.write_synthetic_base(one, runs, 8 << 20, seed=1)
    boot_storm.write_synthetic_base(other, runs, 8 << 20, seed=2)
    assert os.path.getsize(one) == 8 << 20
    data, data_other = one.read_bytes(), other.read_bytes()
    assert data[:4096] != bytes(4096) and data[:4096] != data_other[:4096]
    assert data[4096:3 << 20] == bytes((3 << 20) - 4096)          # sparse: never read
    # Only the runs are written: the file holds little more than them.
    assert os.stat(one).st_blocks * 512 < 1 << 20


def test_a_run_past_the_end_is_clipped(tmp_path):
    path = tmp_path / 'base'
    boot_storm.write_synthetic_base(path, [(4096, 1 << 20)], 8192, seed=0)
    assert os.path.getsize(path) == 8192


def test_storage_reads_are_counted_per_process(tmp_path):
    before = io_replay.storage_read_bytes()
    path = tmp_path / 'data'
    path.write_bytes(os.urandom(1 << 20))
    # Read with O_DIRECT: from the disk, whatever the page cache holds.
    reads = [io_replay.Read(0, 1 << 20, 0.0)]
    io_replay.replay_boot(path, reads, direct=True)
    assert io_replay.storage_read_bytes() - before >= 1 << 20


def test_this_processes_cpu_and_memory_are_read():
    assert boot_storm.process_cpu_seconds(os.getpid()) > 0
    assert boot_storm.resident_mib(os.getpid()) > 1


def point(kind, boots, base_p50, yolofs_p50, yolofs_p99):
    base = {'io_p50': base_p50, 'io_p99': base_p50, 'io_max': base_p50, 'disk_bytes': 1 << 30}
    mine = {'io_p50': yolofs_p50, 'io_p99': yolofs_p99, 'io_max': yolofs_p99,
            'disk_bytes': 0, 'yolofs_cpu_seconds_per_gib': 0.5, 'yolofs_rss_mib': 900}
    return {'stressors': 8, 'kind': kind, 'boots': boots, 'base': base, 'yolofs': mine}


def test_the_goal_is_judged_at_16_distinct_images():
    points = [point('distinct', 16, 30.0, 2.0, 2.5), point('same', 16, 30.0, 10.0, 10.0),
              point('distinct', 8, 30.0, 10.0, 10.0)]
    [line] = boot_storm.goal(points)
    assert '15.0x' in line and line.endswith('met')
    # A long tail misses it, however fast the median.
    [line] = boot_storm.goal([point('distinct', 16, 30.0, 2.0, 3.5)])
    assert line.endswith('missed')
    table = boot_storm.table(points)
    assert len(table) == 4 and '15.0x' in table[1] and '1024' in table[1]


@pytest.mark.parametrize('text', ['', 'a,2', '-1'])
def test_counts_are_checked(text):
    with pytest.raises(argparse.ArgumentTypeError):
        boot_storm.numbers(text)
    assert boot_storm.numbers('0,8') == [0, 8]
    with pytest.raises(argparse.ArgumentTypeError):
        boot_storm.positive('0,8')
    with pytest.raises(argparse.ArgumentTypeError):
        boot_storm.one_positive('2,3')


def test_a_trace_without_times_is_refused_unless_replayed_without_think_time(tmp_path, capsys):
    trace = tmp_path / 'v1.trace'
    trace.write_text('# yolofs trace v1\n0 4096\n')
    with pytest.raises(SystemExit, match='v1 trace'):
        boot_storm.main(['--trace', str(trace), '--work', str(tmp_path)])


def test_the_replay_worker_prints_each_boots_replay(tmp_path, capsys):
    (tmp_path / 'trace').write_text('# yolofs trace v2\n0 4096 0 10\n8192 4096 20 30\n')
    base = tmp_path / 'base'
    base.write_bytes(os.urandom(16384))
    assert io_replay.main(['--trace', str(tmp_path / 'trace'), '--factor', '0',
                           str(base), str(base)]) == 0
    printed = json.loads(capsys.readouterr().out)
    replays = [io_replay.BootReplay(**boot) for boot in printed['boots']]
    assert printed['storage_read_bytes'] >= 0
    assert [r.bytes for r in replays] == [8192, 8192]


def test_zipf_draws_favour_a_few_images_in_proportion_to_their_rank():
    draws = boot_storm.zipf_draws(200, 20000, 1.0, seed=3)
    counts = sorted((draws.count(i) for i in set(draws)), reverse=True)
    assert set(draws) <= set(range(200))
    # The most popular is drawn about twice as often as the second, 1/H(200) of the time.
    assert 1.6 < counts[0] / counts[1] < 2.5
    assert 0.15 < counts[0] / 20000 < 0.22
    # Which image is the most popular depends on the seed, not on its index.
    assert boot_storm.zipf_draws(200, 1000, 1.0, seed=4) != draws[:1000]


def test_the_catalogue_report_says_hits_misses_and_memory_per_image():
    boots = [{'image': 1, 'hit': True, 'first_read': 0.001, 'io_seconds': 0.1}] * 3 + [
        {'image': 2, 'hit': False, 'first_read': 0.5, 'io_seconds': 2.0}]
    lines = boot_storm.catalogue_lines({
        'boots': boots, 'images': 200, 'at_once': 4, 'zipf': 1.0, 'mlock': True,
        'memory_budget_mib': 4000, 'loads': 1, 'evictions': 0,
        'rss_beyond_data_per_image_bytes': 3 << 19, 'stressors': 8,
        'memory_used_bytes': 100 << 20, 'memory_unshared_bytes': 170 << 20,
        'block_pool_mapped_bytes': 104 << 20, 'status_seconds': [0.2, 0.01, 0.03]})
    assert lines[0].endswith('mlock on, block sharing on, 8 stressors:')
    assert '3 of 4 (75 %)' in lines[1]
    assert '0.001 s in memory, 0.500 s loaded from the store' in lines[2]
    assert lines[3].endswith('1.5 MiB per boot image')
    assert lines[4].endswith(
        '100 MiB (170 MiB without sharing, 104 MiB of slabs mapped)')
    assert lines[5].endswith('0.030 s p50, 0.200 s max')


def test_metrics_are_summed_per_family(monkeypatch):
    text = ('# TYPE yolofs_boot_image_loads counter\nyolofs_boot_image_loads_total 7\n'
            'yolofs_boot_image_loads_created 1.7e9\n'
            '# TYPE yolofs_read_bytes counter\nyolofs_read_bytes_total{source="memory"} 10\n'
            'yolofs_read_bytes_total{source="passthrough"} 5\n# EOF\n')

    class Answer:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def read(self):
            return text.encode()
    monkeypatch.setattr(boot_storm.urllib.request, 'urlopen', lambda url, timeout: Answer())
    scraped = boot_storm.scrape(1234)
    assert scraped['yolofs_boot_image_loads'] == 7
    assert scraped['yolofs_read_bytes'] == 15


def test_the_reboot_report_has_a_line_per_variant_and_no_boot_figures_for_preload_alone():
    booted = {'guests': 20, 'io_p50': 0.25, 'io_max': 1.5, 'first_read_p50': 0.2,
              'first_read_max': 1.2, 'replay_max': 30.0, 'yolofs_disk_bytes': 300 << 20,
              'yolofs_cpu_seconds': 2.0, 'yolofs_rss_mib': 700}
    preloaded = {'done': True, 'loaded': 20, 'bytes': 300 << 20, 'skipped': 0, 'seconds': 12.5}
    lines = boot_storm.reboot_lines([
        dict(booted, variant='cold', preload=None),
        dict(booted, variant='preload', preload=preloaded),
        {'variant': 'preload-alone', 'guests': 20, 'preload': preloaded,
         'yolofs_disk_bytes': 300 << 20, 'yolofs_cpu_seconds': 1.0, 'yolofs_rss_mib': 650}])
    assert len(lines) == 4
    assert lines[1].split()[:3] == ['cold', '20', '0.250'] and lines[1].split()[7] == '-'
    assert lines[2].split()[7] == '12.5'
    assert lines[3].split()[1:7] == ['-'] * 6 and lines[3].split()[7] == '12.5'
    assert lines[3].split()[8:] == ['300', '1.0', '650']


def test_distinct_images_take_the_traces_in_turn(tmp_path):
    one, other = tmp_path / 'one.trace', tmp_path / 'other.trace'
    one.write_text('# yolofs trace v2\n0 4096 0 10\n')
    other.write_text('# yolofs trace v2\n0 1048576 0 10\n4194304 1048576 20 30\n')
    storm = boot_storm.Storm(tmp_path / 'storm', [one, other], 8 << 20, 3, 0)
    assert [storm.trace_for(index) for index in range(3)] == [one, other, one]
    assert [boot_storm.run_bytes(storm.runs[trace]) for trace in (one, other)] == [4096, 2 << 20]


def test_several_traces_or_images_can_be_given():
    args = boot_storm.parse_args(['--trace', 'a', '--trace', 'b'])
    assert [str(trace) for trace in args.trace] == ['a', 'b'] and args.image is None
    with pytest.raises(SystemExit):
        boot_storm.parse_args(['--trace', 'a', '--image', 'b'])


def test_the_storms_plot_has_a_panel_per_kind(tmp_path):
    from yolo_bench import plots
    points = [point('distinct', 1, 3.0, 0.1, 0.1), point('distinct', 16, 70.0, 0.4, 0.5),
              point('same', 16, 70.0, 0.4, 0.5)]
    path = plots.storm_lines(points, tmp_path / 'storms.png')
    assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    # Two panels side by side: twice as wide as one.
    width = int.from_bytes(path.read_bytes()[16:20], 'big')
    one = plots.storm_lines(points[:2], tmp_path / 'one.png')
    assert width == 2 * int.from_bytes(one.read_bytes()[16:20], 'big')


def test_each_boot_is_replayed_with_its_own_trace(monkeypatch, tmp_path):
    ran = []

    class Disk:
        def join_cgroup(self):
            pass

    def run(command, **kwargs):
        ran.append(command)
        boots = [{'latencies': [0.1], 'bytes': 4096, 'seconds': 1.0}] * 2
        return argparse.Namespace(returncode=0, stderr='', stdout=json.dumps(
            {'boots': boots, 'storage_read_bytes': 8192}))
    monkeypatch.setattr(boot_storm.subprocess, 'run', run)
    results, read = boot_storm.replay_in(Disk(), [('a.img', 'one.trace'), ('b.img', 'two.trace')],
                                         'kvm')
    [command] = ran
    assert command[command.index('--factor') + 1] == 'kvm'
    boots = command[command.index('--direct') + 1:]
    assert boots == ['--boot', 'one.trace', 'a.img', '--boot', 'two.trace', 'b.img']
    assert len(results) == 2 and read == 8192


@pytest.mark.parametrize('text', ['-1', 'nan', 'inf', 'fast'])
def test_a_factor_is_a_number_of_0_or_more_or_kvm(text):
    with pytest.raises(argparse.ArgumentTypeError):
        io_replay.factor(text)
    assert io_replay.factor('kvm') == 'kvm' and io_replay.factor('0.5') == 0.5


def test_the_plot_is_of_storms_only():
    with pytest.raises(SystemExit):
        boot_storm.parse_args(['--trace', 'a', '--catalogue', '200', '--plot', 'x.png'])


def test_variants_of_a_family_hold_its_blocks_but_a_share_of_their_own(tmp_path):
    runs = [(0, 1 << 20), ((3 << 20) + 100, (4 << 20) + 100)]
    variants = []
    for seed in range(3):
        path = tmp_path / ('variant%d' % seed)
        boot_storm.write_synthetic_base(path, runs, 8 << 20, seed=seed, family=7,
                                        own_share=0.25)
        data = path.read_bytes()
        variants.append([data[offset:offset + 4096] for offset in range(0, 8 << 20, 4096)])
    blocks = len(variants[0])
    for one, other in [(variants[0], variants[1]), (variants[1], variants[2])]:
        same = sum(a == b for a, b in zip(one, other))
        # Where neither drew its own bytes (9/16 of the 512 blocks written), the family's.
        assert 0.4 < (same - (blocks - 513)) / 513 < 0.75
    # Another family shares nothing but the holes.
    path = tmp_path / 'stranger'
    boot_storm.write_synthetic_base(path, runs, 8 << 20, seed=5, family=8, own_share=0.25)
    data = path.read_bytes()
    assert not any(data[offset:offset + 4096] in (variants[0][offset // 4096],
                                                  variants[1][offset // 4096])
                   for offset in range(0, 1 << 20, 4096))


def test_families_boot_as_one_trace_each_and_sharing_is_on_off_or_both():
    args = boot_storm.parse_args(['--trace', 'a', '--catalogue', '200', '--families', '20',
                                  '--block-sharing', 'on,off'])
    assert (args.families, args.own_share, args.block_sharing) == (20, 0.5, [True, False])
    assert boot_storm.parse_args(['--trace', 'a', '--catalogue', '9']).block_sharing == [True]
    with pytest.raises(SystemExit):
        boot_storm.parse_args(['--trace', 'a', '--trace', 'b', '--catalogue', '200',
                               '--families', '5'])
    with pytest.raises(SystemExit):
        boot_storm.parse_args(['--trace', 'a', '--catalogue', '9', '--block-sharing', 'maybe'])
