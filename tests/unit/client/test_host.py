"""``openstack yolo host list`` against an in-memory placement."""

from unittest import mock

from osc_lib import exceptions
import pytest

from tests.unit.client import fakes
from yolo_client import host as host_cmd


def provider(name, uuid, root=None):
    return {'name': name, 'uuid': uuid, 'root_provider_uuid': root or uuid}


class FakePlacement:
    """GET /resource_providers and /resource_providers/{uuid}/traits."""

    def __init__(self, providers, traits):
        self.providers, self.traits = providers, traits

    def get(self, url):
        if url == '/resource_providers':
            body = {'resource_providers': self.providers}
        else:
            body = {'traits': self.traits[url.split('/')[2]]}
        return mock.Mock(json=lambda: body)


def run(app):
    command = host_cmd.ListHost(app, None)
    return command.take_action(command.get_parser('openstack yolo host list').parse_args([]))


def test_each_host_with_what_keeps_its_boot_images_verified():
    app = fakes.app()
    app.client_manager.yolo.placement = FakePlacement(
        [provider('compute2', 'u2'), provider('compute1', 'u1'),
         provider('compute1_gpu', 'u3', root='u1'), provider('old-host', 'u4')],
        {'u1': ['HW_CPU_X86_AVX', 'CUSTOM_YOLO_TOUCH_SAFETY_LEASES'],
         'u2': ['CUSTOM_YOLO_TOUCH_SAFETY_NONE'], 'u4': []})
    columns, rows = run(app)
    assert columns == ('Host', 'Touch Safety')
    rows = [tuple(getattr(v, 'machine_readable', lambda: v)() for v in row) for row in rows]
    assert rows == [('compute1', 'leases'), ('compute2', 'none'), ('old-host', None)]


def test_needs_the_admin_role():
    app = fakes.app(roles=('member',))
    with pytest.raises(exceptions.CommandError, match='needs the admin role'):
        run(app)
