"""``openstack yolo server list``: what YOLO's boot images mean for each server."""

from osc_lib.command import command

from yolo_client import common
from yolo_common import contract

LIST_COLUMNS = ('ID', 'Name', 'Status', 'Host', 'Image', 'Boot Image Status', 'yolofs')
# The yolofs column.
BOOT_IMAGE = 'boot image'      # image-backed; the image has a ready boot image
PASSTHROUGH = 'passthrough'    # image-backed; no ready boot image
VOLUME = 'no (volume)'         # booted from a volume: no base file
UNKNOWN = 'unknown'            # image-backed, but the image is not (or no longer) in Glance


class ListServer(command.Lister):
    """List servers with what yolofs does for their root disks (admin only).

    Nova's API shows neither the backing files of servers' disks nor which hosts run YOLO. The
    yolofs column says what a server's image implies on a host that runs YOLO's Nova driver
    (qcow2 disks, Nova's default) and had yolofs up when the server last started, where every
    image-backed root disk is read through the yolofs mount: "boot image" if the image has a
    ready boot image (boot reads are served from memory); "passthrough" if it has none (reads
    pass through to the base file, and yolofs learns a boot image where it runs with --learn);
    "no (volume)" for a server booted from a volume (never on yolofs); "unknown" if the image
    is gone from Glance (the host may still hold its boot image). A yolofs restart on a host
    touches its running servers of every kind but "no (volume)". The authoritative answer for
    a host is "yolofs ctl status" on it: the files open through the mount and the boot images
    it serves.
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('--host', metavar='<host>',
                            help='Only the servers on this compute host (default: all hosts)')
        return parser

    def take_action(self, parsed_args):
        common.require_admin(self.app.client_manager, 'openstack yolo server list')
        yolo = self.app.client_manager.yolo
        search_opts = {'all_tenants': True}
        if parsed_args.host:
            search_opts['host'] = parsed_args.host
        servers = [s.to_dict() for s in yolo.nova.servers.list(search_opts=search_opts,
                                                               limit=-1)]
        # The images of all servers in two listings, not one request per image.
        images = {i['id']: i for i in common.images_and_boot_images(yolo.glance)[0]}
        rows = []
        for server in servers:
            # Nova gives "" for a server booted from a volume, else {"id": ..., "links": ...}.
            image_id = (server.get('image') or {}).get('id')
            image = images.get(image_id)
            status = image.get(contract.STATUS) if image else None
            rows.append(common.blank_none((
                server['id'], server.get('name'), server.get('status'),
                server.get('OS-EXT-SRV-ATTR:host'), image_id, status,
                yolofs_use(image_id, image))))
        return LIST_COLUMNS, rows


def yolofs_use(image_id, image):
    if not image_id:
        return VOLUME
    if image is None:
        return UNKNOWN
    if image.get(contract.STATUS) == contract.READY and image.get(contract.BOOT_IMAGE_ID):
        return BOOT_IMAGE
    return PASSTHROUGH
