"""The boot I/O replay: traces, think times, and boots replayed at once (not timings)."""

import json
import os

import pytest

from yolo_bench import io_replay

TRACE = """# yolofs trace v2
# file 0123
0 4096 0 100
65536 8192 1100 1300
4096 512 1200 1250
1048576 4096 5250 5260
"""


def test_think_time_is_the_wait_after_the_last_answer():
    reads = io_replay.parse_trace(TRACE)
    assert [(r.offset, r.length) for r in reads] == [
        (0, 4096), (65536, 8192), (4096, 512), (1048576, 4096)]
    # 1 ms after the first answer; in flight beside the second (none); 4 ms after the second's
    # answer, the later of the two.
    assert [r.think for r in reads] == [0.0, 0.001, 0.0, 0.00395]


def test_a_trace_without_times_replays_without_think_time():
    reads = io_replay.parse_trace('# yolofs trace v1\n0 4096\n8192 4096\n')
    assert [r.think for r in reads] == [0.0, 0.0]


@pytest.mark.parametrize('line', ['0', '0 4096 12', 'a 4096', '0 0', '-1 10 0 1'])
def test_a_bad_trace_line_is_named(line):
    with pytest.raises(ValueError, match='trace line 2'):
        io_replay.parse_trace('# header\n%s\n' % line)


@pytest.fixture
def disk_file(tmp_path):
    path = tmp_path / 'base'
    path.write_bytes(os.urandom(2 << 20))
    return path


def test_a_replayed_boot_reads_what_the_trace_says_after_its_think_times(
        disk_file, monkeypatch):
    slept = []
    monkeypatch.setattr(io_replay.time, 'sleep', slept.append)
    reads = io_replay.parse_trace(TRACE)
    replayed = io_replay.replay_boot(disk_file, reads, factor=2.0)
    assert replayed.bytes == 4096 + 8192 + 512 + 4096
    assert len(replayed.latencies) == 4
    assert slept == [0.002, 0.0079]
    assert replayed.seconds >= replayed.io_seconds
    # At factor 0, no think time at all.
    slept.clear()
    io_replay.replay_boot(disk_file, reads, factor=0)
    assert slept == []


def test_direct_reads_are_widened_to_whole_pages(disk_file):
    reads = [io_replay.Read(4096 + 100, 512, 0.0), io_replay.Read(0, 10, 0.0)]
    replayed = io_replay.replay_boot(disk_file, reads, direct=True)
    assert replayed.bytes == 2 * io_replay.PAGE


def test_boots_replayed_at_once_each_read_their_own_file(tmp_path, disk_file):
    other = tmp_path / 'other'
    other.write_bytes(bytes(4096))
    reads = io_replay.parse_trace(TRACE)
    results = io_replay.storm([(disk_file, reads), (disk_file, reads),
                               (other, reads[:1])], factor=0)
    assert [r.bytes for r in results] == [16896, 16896, 4096]
    summary = io_replay.summary(results)
    assert summary['boots'] == 3 and summary['bytes'] == 16896 * 2 + 4096
    assert summary['io_p50'] <= summary['io_p99'] <= summary['io_max']


def test_a_boot_that_fails_fails_the_storm_once_the_others_end(tmp_path, disk_file):
    reads = io_replay.parse_trace(TRACE)
    with pytest.raises(FileNotFoundError):
        io_replay.storm([(disk_file, reads), (tmp_path / 'missing', reads)], factor=0)


def test_percentiles_interpolate_between_ranks():
    values = list(range(1, 101))
    assert io_replay.percentile(values, 50) == 50.5
    assert io_replay.percentile(values, 99) == pytest.approx(99.01)
    assert io_replay.percentile([7.0], 99) == 7.0


def test_a_read_the_kernel_split_is_one_read_again():
    # 256 KiB read by the guest: two FUSE reads of 128 KiB in flight at once, then a read that
    # follows on, after the answers: a read of its own.
    reads = io_replay.parse_trace('0 131072 0 500\n131072 131072 10 520\n'
                                  '262144 4096 900 950\n')
    assert [(r.offset, r.length) for r in reads] == [(0, 262144), (262144, 4096)]
    assert reads[1].think == pytest.approx(0.00038)


def test_only_a_trace_with_times_has_think_times():
    assert io_replay.timed(TRACE)
    assert not io_replay.timed('# yolofs trace v1\n0 4096\n')
    assert not io_replay.timed('# empty\n')


def test_the_open_is_timed_with_the_boots_io(disk_file):
    replayed = io_replay.replay_boot(disk_file, io_replay.parse_trace(TRACE), factor=0)
    assert replayed.open_seconds >= 0
    assert replayed.io_seconds == pytest.approx(replayed.open_seconds + sum(replayed.latencies))
    assert replayed.first_read == replayed.open_seconds + replayed.latencies[0]


def test_the_kvm_factor_scales_a_boots_think_time_to_an_idle_kvm_boots():
    reads = [io_replay.Read(0, 4096, 0.0), io_replay.Read(4096, 4096, 20.0),
             io_replay.Read(8192, 4096, 15.0)]
    factor = io_replay.kvm_factor(reads)
    assert sum(r.think for r in reads) * factor == pytest.approx(io_replay.KVM_BOOT_THINK_SECONDS)
    # Never slower than the boot learned (1 s of think time stays 1 s); none, nothing to scale.
    assert io_replay.kvm_factor([io_replay.Read(0, 4096, 1.0)]) == 1.0
    assert io_replay.kvm_factor(reads[:1]) == 0.0


def test_boots_at_once_can_replay_traces_of_their_own(tmp_path, capsys):
    small, large = tmp_path / 'small.trace', tmp_path / 'large.trace'
    small.write_text('# yolofs trace v2\n0 4096 0 10\n')
    large.write_text('# yolofs trace v2\n0 4096 0 10\n8192 8192 20 30\n')
    base = tmp_path / 'base'
    base.write_bytes(os.urandom(1 << 16))
    assert io_replay.main(['--factor', '0', '--boot', str(small), str(base),
                           '--boot', str(large), str(base)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [boot['bytes'] for boot in printed['boots']] == [4096, 12288]
    # A file needs a trace to replay.
    with pytest.raises(SystemExit):
        io_replay.main([str(base)])


def test_the_kvm_factor_is_each_traces_own(monkeypatch, tmp_path):
    quick = [io_replay.Read(0, 4096, 0.0), io_replay.Read(4096, 4096, 7.0)]
    slow = [io_replay.Read(0, 4096, 0.0), io_replay.Read(4096, 4096, 70.0)]
    factors = {}

    def replay_boot(path, reads, factor, direct, start):
        factors[path] = factor
        return io_replay.BootReplay([], 0, 0.0)
    monkeypatch.setattr(io_replay, 'replay_boot', replay_boot)
    io_replay.storm([('quick', quick), ('slow', slow)], factor='kvm')
    assert factors == {'quick': io_replay.kvm_factor(quick), 'slow': io_replay.kvm_factor(slow)}
    assert factors['quick'] == pytest.approx(10 * factors['slow'])
