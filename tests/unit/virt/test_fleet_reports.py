"""What nova-compute sends the worker of its boots' reads outside their boot images."""

from unittest import mock

from yolo_common import boot_reports
from yolo_common import yolofs
from yolo_nova.virt import fleet_reports

IMAGE = 'c0ffee00-0000-4000-8000-00000000000a'


class Host:
    """yolofs' stats and status as the reporter reads them; a base file of ``size`` bytes."""

    def __init__(self, tmp_path, size=1 << 20):
        self.base = tmp_path / 'base'
        self.base.write_bytes(b'\0' * size)
        self.files = {}
        self.entries = {'base': yolofs.BootImage(file='base', image_id=IMAGE, verified=True)}
        self.client = mock.Mock()
        self.client.stats.side_effect = lambda: self.files

    def boot(self, started, outside):
        self.files.setdefault('base', {'boots': []})['boots'].append(
            {'started_unix': started, 'outside': outside})

    @property
    def status(self):
        return yolofs.Status(boot_images=self.entries, recording=frozenset())

    def base_path(self, name):
        return str(self.base)


def reporter(host):
    notifier = mock.Mock()
    return fleet_reports.BootReporter(host, 'compute-1', 'yolo_boot_reports',
                                      notifier=notifier), notifier


def sent(notifier):
    return [boot_reports.BootReport.from_payload(call.args[2])
            for call in notifier.info.call_args_list]


def test_each_boot_that_read_outside_is_sent_once(tmp_path):
    host = Host(tmp_path)
    host.boot(100, [[4096, 8192]])
    host.boot(200, [])                  # read nothing outside: nothing to say
    send, notifier = reporter(host)
    assert send.send_new(host.status) == 1
    [report] = sent(notifier)
    assert (report.image_id, report.host, report.boot) == (IMAGE, 'compute-1', 'base@100')
    assert report.extents == ((4096, 8192),) and report.source_size == 1 << 20
    assert notifier.info.call_args.args[1] == boot_reports.EVENT_TYPE
    # Sent: not again; a new boot is.
    assert send.send_new(host.status) == 0
    host.boot(300, [[0, 4096]])
    assert send.send_new(host.status) == 1
    assert [r.boot for r in sent(notifier)] == ['base@100', 'base@300']


def test_boot_images_learned_here_or_unverified_are_not_reported(tmp_path):
    host = Host(tmp_path)
    host.boot(100, [[4096, 8192]])
    send, notifier = reporter(host)
    host.entries['base'] = yolofs.BootImage(file='base', image_id=IMAGE, verified=True,
                                            learned=True)
    assert send.send_new(host.status) == 0
    host.entries['base'] = yolofs.BootImage(file='base', image_id=IMAGE, verified=False)
    assert send.send_new(host.status) == 0
    host.entries['base'] = yolofs.BootImage(file='base', image_id=None, verified=True)
    assert send.send_new(host.status) == 0
    notifier.info.assert_not_called()


def test_a_report_is_cut_to_its_bounds(tmp_path):
    many = [[2 * n * 4096, 4096] for n in range(boot_reports.MAX_EXTENTS + 10)]
    assert len(fleet_reports.report_extents(many)) == boot_reports.MAX_EXTENTS
    huge = [[0, boot_reports.MAX_BYTES - 4096], [1 << 31, 8192], [1 << 32, 4096]]
    # The first extents that fit; what would pass the byte bound ends the report.
    assert fleet_reports.report_extents(huge) == ((0, boot_reports.MAX_BYTES - 4096),)


def test_yolofs_or_the_bus_failing_fails_nothing(tmp_path):
    host = Host(tmp_path)
    host.boot(100, [[4096, 8192]])
    send, notifier = reporter(host)
    notifier.info.side_effect = RuntimeError('no broker')
    assert send.send_new(host.status) == 0
    host.client.stats.side_effect = yolofs.YolofsError('down')
    assert send.send_new(host.status) == 0


def test_a_report_says_the_flavor_of_the_spawn_it_was(tmp_path):
    host = Host(tmp_path)
    send, notifier = reporter(host)
    send.spawning(IMAGE, 'm1.small', now=1000)
    send.spawning('another-image', 'm1.large', now=1010)
    host.boot(1030, [[4096, 4096]])       # 30 s after its spawn began
    host.boot(990, [[8192, 4096]])        # before any spawn here: unknown
    assert send.send_new(host.status) == 2
    flavors = {r.boot: r.flavor for r in sent(notifier)}
    assert flavors == {'base@1030': 'm1.small', 'base@990': None}
    assert send.flavor_of(IMAGE, 1000 + fleet_reports.SPAWN_TO_FIRST_READ_SECONDS + 1) is None
