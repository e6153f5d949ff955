"""``openstack yolo host list``: what each compute host's yolofs can do."""

from osc_lib.command import command

from yolo_client import common
from yolo_common import contract

LIST_COLUMNS = ('Host', 'Touch Safety')


class ListHost(command.Lister):
    """List compute hosts with what keeps their boot images verified (admin only).

    Nova and yolofs touch base files as Nova marks them in use; a boot image then stays verified
    without reading its base file again where yolofs holds file leases ("leases"), or, for the
    touches made through yolofs only, where the kernel has multigrain timestamps
    ("multigrain_timestamps"). "none": every touch costs the next boot a verification, reading
    the boot's bytes from the disk (a filesystem without leases: docs/install.md says what is
    lost). "unknown": no base file was there to try yet. Blank: the host does not run YOLO's
    driver, or its yolofs is down. Read from the traits YOLO's driver sets on the host's
    resource provider in placement at each resource update (every minute by default).
    """

    def take_action(self, parsed_args):
        common.require_admin(self.app.client_manager, 'openstack yolo host list')
        placement = self.app.client_manager.yolo.placement
        providers = placement.get('/resource_providers').json()['resource_providers']
        rows = []
        for provider in sorted(providers, key=lambda p: p['name']):
            if provider.get('root_provider_uuid', provider['uuid']) != provider['uuid']:
                continue    # a nested provider (a GPU, a NUMA node), not a host
            traits = placement.get('/resource_providers/%s/traits'
                                   % provider['uuid']).json()['traits']
            mechanism = contract.touch_safety_of_traits(traits)
            rows.append(common.blank_none((provider['name'], mechanism)))
        return LIST_COLUMNS, rows
