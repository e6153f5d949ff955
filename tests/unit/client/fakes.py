"""Glance and Nova as python-glanceclient (v2) and python-novaclient answer, in memory."""

import copy
import io
from unittest import mock

from glanceclient import exc as glance_exc
from novaclient.v2 import servers as nova_servers


class FakeImages:
    """``glanceclient.Client('2').images``: images are dicts with properties as top-level keys;
    ``list`` filters as Glance does (hidden images only with ``os_hidden=True``, and then only
    them). Every call is recorded."""

    def __init__(self, *images):
        self.images = {i['id']: copy.deepcopy(i) for i in images}
        self.calls = []

    def get(self, image_id):
        self.calls.append(('get', image_id))
        if image_id not in self.images:
            raise glance_exc.HTTPNotFound()
        return copy.deepcopy(self.images[image_id])

    def list(self, filters=None):
        self.calls.append(('list', dict(filters or {})))
        filters = dict(filters or {})
        hidden = filters.pop('os_hidden', False)
        filters.pop('visibility', None)
        for image in self.images.values():
            if bool(image.get('os_hidden')) == hidden and all(
                    image.get(k) == v for k, v in filters.items()):
                yield copy.deepcopy(image)

    def update(self, image_id, remove_props=None, **properties):
        self.calls.append(('update', image_id, sorted(remove_props or []), properties))
        image = self.images[image_id]
        for key in remove_props or []:
            image.pop(key, None)
        image.update(properties)
        return copy.deepcopy(image)

    def delete(self, image_id):
        self.calls.append(('delete', image_id))
        del self.images[image_id]


def image(image_id, name=None, **fields):
    return {'id': image_id, 'name': name or image_id, 'status': 'active', 'owner': 'tenant',
            'disk_format': 'qcow2', 'container_format': 'bare', 'os_hidden': False,
            'visibility': 'public', 'size': 1 << 30, **fields}


def boot_image(image_id, source_id, owner='service', **fields):
    return image(image_id, name='yolo-boot-image-%s' % source_id, owner=owner, os_hidden=True,
                 visibility='private', disk_format='raw', container_format='yolo',
                 yolo_source_image_id=source_id, **fields)


def server(server_id, image_id, host='compute1', status='ACTIVE'):
    """A novaclient Server as ``servers.list`` returns it (microversion 2.1)."""
    image_ref = {'id': image_id, 'links': []} if image_id else ''
    return nova_servers.Server(None, {
        'id': server_id, 'name': 'vm-%s' % server_id, 'status': status, 'image': image_ref,
        'OS-EXT-SRV-ATTR:host': host, 'tenant_id': 'tenant'}, loaded=True)


def app(glance_images=None, servers=(), roles=('admin', 'member')):
    """An openstackclient application as the commands see it: ``client_manager.yolo`` (the
    plugin's client) and the token's roles."""
    app = mock.Mock(stdout=io.StringIO())
    app.client_manager.yolo.glance.images = glance_images or FakeImages()
    app.client_manager.yolo.nova.servers.list.return_value = list(servers)
    app.client_manager.auth_ref.role_names = list(roles)
    return app
