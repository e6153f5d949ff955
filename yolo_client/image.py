"""``openstack yolo image list|show|rebuild|warm|unwarm``: images and their boot images."""

from osc_lib.cli import format_columns
from osc_lib.command import command
from osc_lib import exceptions

from yolo_client import common
from yolo_common import contract

LIST_COLUMNS = ('ID', 'Name', 'Boot Image Status', 'Boot Image ID', 'Boot Image Size',
                'Coverage', 'Build Time', 'Reason', 'Warm', 'Hosts Holding')


class ListImage(command.Lister):
    """List images with their boot images.

    For every image (boot images themselves, of container format "yolo", excepted): the boot
    image status the worker recorded (pending, building, ready, skipped, failed; empty: not seen
    yet), the boot image's ID and size, the share of the raw image it holds (coverage), how long
    writing it took after the profiling boot (build time), and why a build failed or was
    skipped. Size, coverage and build time are read from the hidden boot image, which only
    admins see. For the images an operator made warm (``openstack yolo image warm``): where
    ("all", or "aggregate:UUID"), and how many compute hosts hold their boot image (read from
    placement: admins only).
    """

    def take_action(self, parsed_args):
        images, boot_images = common.images_and_boot_images(
            self.app.client_manager.yolo.glance)
        holding = common.hosts_holding(self.app.client_manager.yolo.placement, [
            image['id'] for image in images if image.get(contract.WARM)])
        rows = []
        for image in images:
            boot_image = boot_images.get(image.get(contract.BOOT_IMAGE_ID)) or {}
            rows.append(common.blank_none((
                image['id'], image.get('name'), image.get(contract.STATUS),
                image.get(contract.BOOT_IMAGE_ID),
                common.Bytes(common.boot_image_size(boot_image)),
                common.Fraction(common.number(boot_image.get(contract.COVERAGE))),
                common.Seconds(common.number(boot_image.get(contract.BUILD_SECONDS))),
                image.get(contract.REASON), image.get(contract.WARM),
                holding.get(image['id']))))
        return LIST_COLUMNS, rows


class ShowImage(command.ShowOne):
    """Show an image's boot image: status, what the worker measured, the per-image overrides of
    the profiling boot."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('image', metavar='<image>', help='Image (name or ID)')
        return parser

    def take_action(self, parsed_args):
        glance = self.app.client_manager.yolo.glance
        image = source_image(glance, parsed_args.image)
        linked = common.linked_boot_image(glance, image)
        boot_image = linked or {}
        if image.get(contract.BOOT_IMAGE_ID):
            # A link to a boot image that is gone (or hidden from this user) is worth seeing.
            boot_image_state = boot_image.get('status', 'not found')
        else:
            boot_image_state = None
        fields = (
            ('ID', image['id']),
            ('Name', image.get('name')),
            ('Status', image.get('status')),
            ('Boot Image Status', image.get(contract.STATUS)),
            ('Reason', image.get(contract.REASON)),
            ('Claim', image.get(contract.CLAIM)),
            ('Boot Image ID', image.get(contract.BOOT_IMAGE_ID)),
            ('Boot Image Glance Status', boot_image_state),
            ('Boot Image Created At', boot_image.get('created_at')),
            ('Boot Image Signed', (contract.SIGNATURE in boot_image) if linked else None),
            ('Boot Image Rejected', boot_image.get(contract.REJECTED)),
            ('Boot Image Size', common.Bytes(common.boot_image_size(boot_image))),
            ('Covered Bytes', common.Bytes(common.number(boot_image.get(contract.COVERED_BYTES),
                                                         int))),
            ('Coverage', common.Fraction(common.number(boot_image.get(contract.COVERAGE)))),
            ('Raw Image Size', common.Bytes(common.number(boot_image.get(contract.SOURCE_RAW_SIZE),
                                                          int))),
            ('Profiling Boot Time', common.Seconds(common.number(
                boot_image.get(contract.BOOT_SECONDS)))),
            ('Build Time', common.Seconds(common.number(boot_image.get(contract.BUILD_SECONDS)))),
            ('Window Ended By', boot_image.get(contract.WINDOW_ENDED_BY)),
            ('Ready Pattern', image.get(contract.READY_PATTERN)),
            ('Idle Seconds', image.get(contract.IDLE_SECONDS)),
            ('Max Seconds', image.get(contract.MAX_SECONDS)),
        )
        return tuple(f[0] for f in fields), common.blank_none(f[1] for f in fields)


class RebuildImage(command.ShowOne):
    """Ask the Glance worker to build an image's boot image again (admin only).

    Deletes the boot images the worker published for the image (the worker keeps the first
    created one its key signed, so an old one left in place would win over the new build), then
    sets the image's
    boot image status to "pending" and removes its link, reason and claim: the worker builds it
    on the image.update notification this causes, or at its next periodic scan. Compute nodes
    that already hold the old boot image keep serving it (it is still verified against their
    base file); hosts that fetch the image's boot image afterwards get the new one.
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('image', metavar='<image>', help='Image (name or ID)')
        return parser

    def take_action(self, parsed_args):
        common.require_admin(self.app.client_manager, 'openstack yolo image rebuild')
        glance = self.app.client_manager.yolo.glance
        image = source_image(glance, parsed_args.image)
        if image.get('status') != 'active':
            raise exceptions.CommandError(
                'Image %s is %s: boot images are built for active images only'
                % (image['id'], image.get('status')))
        if image.get(contract.STATUS) == contract.BUILDING:
            raise exceptions.CommandError(
                'Image %s is being built (claim: %s): wait for the build to end; a worker that '
                'died leaves a claim the others take over once it is older than their '
                'claim_timeout' % (image['id'], image.get(contract.CLAIM)))
        deleted = []
        # Deleted before the link is removed: once the status is pending a worker may start,
        # and it must not find the old boot image when it publishes. Only the linked boot
        # image's owner (the worker's project) is trusted: a tenant's hidden image naming the
        # source is none of ours.
        linked = common.linked_boot_image(glance, image)
        if linked:
            # Listed in full first: deleting the marker image of a paginated listing would
            # break its next page.
            published = list(glance.images.list(filters={
                contract.SOURCE_IMAGE_ID: image['id'], 'os_hidden': True,
                'visibility': 'all', 'container_format': contract.CONTAINER_FORMAT}))
            for boot_image in published:
                if boot_image.get('owner') == linked.get('owner'):
                    glance.images.delete(boot_image['id'])
                    deleted.append(boot_image['id'])
        glance.images.update(
            image['id'], remove_props=[contract.BOOT_IMAGE_ID, contract.REASON, contract.CLAIM],
            **{contract.STATUS: contract.PENDING})
        return (('ID', 'Name', 'Boot Image Status', 'Deleted Boot Images'),
                (image['id'], image.get('name'), contract.PENDING,
                 format_columns.ListColumn(deleted)))


class WarmImage(command.Lister):
    """Have compute hosts hold images' boot images before their first boot of them (admin
    only).

    Every compute host (or, with --aggregate, the hosts of a host aggregate) fetches the boot
    images of the images named, or without any of every public image with a published boot
    image, into its warm store (a few percent of each image, within the store's budget,
    ``[yolo] warm_budget_mb``), within ``[yolo] warm_interval``: a first boot of the image there
    then starts with nothing to fetch, its data streamed as the guest reads it
    (docs/first-boot.md); a host that has the image cached installs its boot image in yolofs.
    An image is warm in one place: every host or one aggregate, the last asked. ``openstack
    yolo image list`` shows how many hosts hold each.
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('images', metavar='<image>', nargs='*',
                            help='Image (name or ID); none: every public image with a boot '
                                 'image')
        parser.add_argument('--aggregate', metavar='<aggregate>',
                            help='Host aggregate (name or ID) whose hosts hold them; default: '
                                 'every host')
        return parser

    def take_action(self, parsed_args):
        common.require_admin(self.app.client_manager, 'openstack yolo image warm')
        yolo = self.app.client_manager.yolo
        scope = 'all'
        if parsed_args.aggregate:
            aggregate = common.find_aggregate(yolo.nova_aggregates, parsed_args.aggregate)
            scope = 'aggregate:' + aggregate.uuid
        if parsed_args.images:
            images = [source_image(yolo.glance, name) for name in parsed_args.images]
        else:
            images = [dict(i) for i in yolo.glance.images.list(filters={'visibility': 'public'})
                      if not contract.is_boot_image(dict(i))
                      and dict(i).get(contract.BOOT_IMAGE_ID)]
        for image in images:
            yolo.glance.images.update(image['id'], **{contract.WARM: scope})
        return ('ID', 'Name', 'Warm'), [(i['id'], i.get('name'), scope) for i in images]


class UnwarmImage(command.Lister):
    """Stop holding images' boot images before their first boot (admin only): hosts drop them
    from their warm stores as the budget needs room."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('images', metavar='<image>', nargs='+', help='Image (name or ID)')
        return parser

    def take_action(self, parsed_args):
        common.require_admin(self.app.client_manager, 'openstack yolo image unwarm')
        glance = self.app.client_manager.yolo.glance
        images = [source_image(glance, name) for name in parsed_args.images]
        for image in images:
            if image.get(contract.WARM):
                glance.images.update(image['id'], remove_props=[contract.WARM])
        return ('ID', 'Name', 'Warm'), [(i['id'], i.get('name'), None) for i in images]


def source_image(glance, name_or_id):
    """The image by name or id; a boot image is refused with its source's id."""
    image = common.find_image(glance, name_or_id)
    if contract.is_boot_image(image):
        raise exceptions.CommandError(
            '%s is a boot image, of image %s: give that image'
            % (image['id'], image.get(contract.SOURCE_IMAGE_ID)))
    return image
