"""The cloud first-boot benchmark's report (its boots run on the all-in-one:
bench/aio/first-boot-times) and its rate limit on Glance's link."""

import contextlib
import http.server
import os
import subprocess
import threading
from unittest import mock
import urllib.request

import pytest

from yolo_bench import first_boots


def test_summary_gives_each_first_boot_against_the_cached_boot_of_its_round():
    results = {(1000, 'cached'): [30.0, 32.0, 31.0], (1000, 'nova'): [60.0, 56.0, 62.0],
               (1000, 'yolo'): [33.0, 32.0, 31.0],
               (100, 'cached'): [30.0, 30.0, 30.0], (100, 'nova'): [210.0, 200.0, 220.0],
               (100, 'yolo'): [39.0, 36.0, 33.0]}
    lines = first_boots.summary(results).splitlines()
    assert lines[0].startswith('| Glance link | cached boot | Nova first boot |')
    # Ratios are per round (60/30, 56/32, 62/31), then their median.
    assert lines[2] == '| 1000 Mbit/s | 31.0 s | 60.0 s | 32.0 s | 2.00x | 1.00x |'
    assert lines[3] == '| 100 Mbit/s | 30.0 s | 210.0 s | 36.0 s | 7.00x | 1.20x |'


def tc_root(device='lo'):
    return subprocess.run(['tc', 'qdisc', 'show', 'dev', device], check=True,
                          capture_output=True, text=True).stdout


class Data(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header('Content-Length', str(1 << 20))
        self.end_headers()
        self.wfile.write(bytes(1 << 20))

    def log_message(self, *args):
        pass


# tc needs root (CI runs as root).
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason='tc needs root (CI runs as root)')


@contextlib.contextmanager
def serving(address):
    """An HTTP server on ``address`` that answers 1 MiB; yields its port."""
    server = http.server.ThreadingHTTPServer((address, 0), Data)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def fetch(address, port):
    with urllib.request.urlopen('http://%s:%d/' % (address, port)) as answer:
        assert len(answer.read()) == 1 << 20


def tc_class(classid):
    return subprocess.run(['tc', '-s', 'class', 'show', 'dev', 'lo', 'classid', classid],
                          check=True, capture_output=True, text=True).stdout


def sent_through(classid):
    return int(tc_class(classid).split('Sent ', 1)[1].split()[0])


@AS_ROOT
def test_the_link_carries_what_leaves_glances_port_and_is_gone_afterwards():
    with serving('127.0.0.1') as port:
        with first_boots.glance_link(port=port) as set_rate:
            set_rate(800)
            assert 'htb' in tc_root()
            fetch('127.0.0.1', port)
            assert 'rate 800Mbit' in tc_class('1:10')
            assert sent_through('1:10') > 1 << 20
        assert 'htb' not in tc_root()


@AS_ROOT
def test_a_link_of_one_address_carries_only_what_its_clients_receive():
    # The server answers on every loopback address; the clients of 127.0.0.2 alone are limited.
    with serving('0.0.0.0') as port:
        with first_boots.glance_link(port=port, address='127.0.0.2') as set_rate:
            set_rate(800)
            fetch('127.0.0.1', port)
            assert sent_through('1:10') < 1 << 16
            fetch('127.0.0.2', port)
            assert sent_through('1:10') > 1 << 20


def test_the_large_image_keeps_the_test_image_and_adds_data_beyond_it(tmp_path):
    raw = tmp_path / 'image.raw'
    original = bytes(range(256)) * 4096         # 1 MiB
    raw.write_bytes(original)
    first_boots.grow_with_random_data(raw, size=8 << 20, data_at=6 << 20, data=1 << 20)
    grown = raw.read_bytes()
    assert len(grown) == 8 << 20
    assert grown[:1 << 20] == original
    assert grown[1 << 20:6 << 20] == bytes(5 << 20)
    assert grown[6 << 20:7 << 20] != bytes(1 << 20)
    assert grown[7 << 20:] == bytes(1 << 20)


def test_the_large_image_boots_with_a_flavor_that_holds_it():
    admin = mock.Mock()
    admin.compute.find_flavor.return_value = None
    args = first_boots.parse_args(['--large'])
    flavor = first_boots.boot_flavor(admin, args.flavor, args.large)
    assert flavor is admin.compute.create_flavor.return_value
    admin.compute.create_flavor.assert_called_once_with(name='m1.yolo-8g', ram=1024, vcpus=1,
                                                        disk=8)
    admin.compute.find_flavor.return_value = 'existing'
    assert first_boots.boot_flavor(admin, None, True) == 'existing'
    first_boots.boot_flavor(admin, None, False)
    admin.compute.find_flavor.assert_called_with('m1.yolo', ignore_missing=False)
