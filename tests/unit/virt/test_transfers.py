"""The host's rates from its own transfers: recorded, kept across restarts, never failing."""

import json

from yolo_nova.virt import transfers

MIB = 1 << 20


def test_the_rate_is_the_bytes_over_the_seconds_of_the_last_transfers(tmp_path):
    moved = transfers.Transfers(str(tmp_path / 'transfers.json'))
    assert moved.rate(transfers.DOWNLOAD) is None
    moved.record(transfers.DOWNLOAD, 100 * MIB, 1.0)
    moved.record(transfers.DOWNLOAD, 300 * MIB, 3.0)
    assert moved.rate(transfers.DOWNLOAD) == 100 * MIB
    assert moved.rate(transfers.CONVERSION) is None
    # Only the last KEEP count: a link that changed shows.
    for _ in range(transfers.KEEP):
        moved.record(transfers.DOWNLOAD, 10 * MIB, 1.0)
    assert moved.rate(transfers.DOWNLOAD) == 10 * MIB


def test_small_transfers_measure_latency_and_are_left_out(tmp_path):
    moved = transfers.Transfers(str(tmp_path / 'transfers.json'))
    moved.record(transfers.DOWNLOAD, transfers.MIN_BYTES - 1, 0.001)
    moved.record(transfers.DOWNLOAD, 64 * MIB, 0.0)
    assert moved.rate(transfers.DOWNLOAD) is None
    assert not (tmp_path / 'transfers.json').exists()


def test_a_restarted_host_keeps_its_rates(tmp_path):
    path = tmp_path / 'yolo' / 'transfers.json'
    transfers.Transfers(str(path)).record(transfers.CONVERSION, 400 * MIB, 2.0)
    assert transfers.Transfers(str(path)).rate(transfers.CONVERSION) == 200 * MIB


def test_a_damaged_file_is_ignored(tmp_path):
    path = tmp_path / 'transfers.json'
    for text in ('not json', json.dumps({'download': [['x', 1]]}), json.dumps([1, 2])):
        path.write_text(text)
        assert transfers.Transfers(str(path)).rate(transfers.DOWNLOAD) is None


def test_a_file_that_cannot_be_written_loses_nothing_but_its_keeping(tmp_path):
    (tmp_path / 'blocked').write_text('a file where the directory should be')
    moved = transfers.Transfers(str(tmp_path / 'blocked' / 'transfers.json'))
    moved.record(transfers.DOWNLOAD, 64 * MIB, 1.0)
    assert moved.rate(transfers.DOWNLOAD) == 64 * MIB
