"""Glance, Nova and placement, over the Keystone session of the ``openstack`` command."""

import functools

GLANCE_API_VERSION = '2'
# The oldest microversion is enough: it shows admins each server's host and filters by host.
NOVA_API_VERSION = '2.1'
# Host aggregates' uuids, which name them to compute hosts.
NOVA_AGGREGATES_API_VERSION = '2.41'
# Traits of resource providers (1.6) and their root providers (1.14).
PLACEMENT_API_VERSION = '1.14'


class Client:

    def __init__(self, session, region_name=None, interface=None):
        self.session = session
        self.region_name = region_name
        self.interface = interface

    @functools.cached_property
    def glance(self):
        import glanceclient
        return glanceclient.Client(GLANCE_API_VERSION, session=self.session,
                                   region_name=self.region_name, interface=self.interface)

    @functools.cached_property
    def nova(self):
        from novaclient import client as nova_client
        return nova_client.Client(NOVA_API_VERSION, session=self.session,
                                  region_name=self.region_name, endpoint_type=self.interface)

    @functools.cached_property
    def nova_aggregates(self):
        from novaclient import client as nova_client
        return nova_client.Client(NOVA_AGGREGATES_API_VERSION, session=self.session,
                                  region_name=self.region_name,
                                  endpoint_type=self.interface).aggregates

    @functools.cached_property
    def placement(self):
        from keystoneauth1 import adapter
        return adapter.Adapter(self.session, service_type='placement',
                               region_name=self.region_name, interface=self.interface,
                               default_microversion=PLACEMENT_API_VERSION)
