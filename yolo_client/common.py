"""What the yolo commands share: the admin check, finding images, the boot image columns."""

from cliff import columns
from glanceclient import exc as glance_exc
from keystoneauth1 import exceptions as ks_exceptions
from osc_lib import exceptions

from yolo_common import contract

# Glance lets only admins (and the worker's service role) change yolo_* properties (the property
# protections of yolo-configure), deleting the worker's boot images needs admin, and Nova shows
# servers' hosts to admins only.
ADMIN_ROLE = 'admin'

MiB = 1 << 20
GiB = 1 << 30
# Placement's filter of resource providers by trait.
REQUIRED_TRAITS_MICROVERSION = '1.18'


class Blank(columns.FormattableColumn):
    """Nothing known: null for -f json, blank in a table (like the measured columns)."""

    def human_readable(self):
        return ''


def blank_none(values):
    return tuple(Blank(None) if v is None else v for v in values)


class Bytes(columns.FormattableColumn):
    """A size: bytes for -f json, MiB or GiB in a table."""

    def human_readable(self):
        if self._value is None:
            return ''
        if self._value >= GiB:
            return '%.1f GiB' % (self._value / GiB)
        return '%.1f MiB' % (self._value / MiB)


class Fraction(columns.FormattableColumn):
    """A fraction: as is for -f json, a percentage in a table."""

    def human_readable(self):
        return '' if self._value is None else '%.1f%%' % (self._value * 100)


class Seconds(columns.FormattableColumn):

    def human_readable(self):
        return '' if self._value is None else '%.1f s' % self._value


def number(value, kind=float):
    """A measured property (Glance properties are strings) as a number, None if absent or
    unreadable."""
    try:
        return None if value is None else kind(value)
    except (TypeError, ValueError):
        return None


def require_admin(client_manager, action):
    """Refuses ``action`` early, with the reason, unless the token carries the admin role."""
    auth_ref = client_manager.auth_ref
    if auth_ref is None:
        return    # no Keystone (auth type "none"): the services decide
    roles = sorted(auth_ref.role_names or [])
    if ADMIN_ROLE not in (r.lower() for r in roles):
        raise exceptions.CommandError(
            '%s needs the %s role: only admins may change YOLO\'s image properties, delete '
            'boot images and see servers\' hosts (your roles: %s)'
            % (action, ADMIN_ROLE, ', '.join(roles) or 'none'))


def images_and_boot_images(glance):
    """Every image the user may see, hidden ones included, and the boot images by id.

    Two listings, whatever the number of images: Glance lists hidden images only when asked
    with ``os_hidden=True``, and then only them.
    """
    images, boot_images = [], {}
    for hidden in (False, True):
        for image in glance.images.list(filters={'visibility': 'all', 'os_hidden': hidden}):
            image = dict(image)
            if contract.is_boot_image(image):
                boot_images[image['id']] = image
            else:
                images.append(image)
    return images, boot_images


def find_image(glance, name_or_id):
    """An image by id, or by name if exactly one image has it."""
    try:
        return dict(glance.images.get(name_or_id))
    except glance_exc.HTTPNotFound:
        pass
    found = [dict(i) for i in glance.images.list(
        filters={'name': name_or_id, 'visibility': 'all'})]
    if not found:
        raise exceptions.CommandError('No image with a name or ID of %r' % name_or_id)
    if len(found) > 1:
        raise exceptions.CommandError(
            'More than one image is named %r: give its ID' % name_or_id)
    return found[0]


def linked_boot_image(glance, image):
    """The boot image ``image`` links to, or None (no link, or not visible to the user)."""
    boot_image_id = image.get(contract.BOOT_IMAGE_ID)
    if not boot_image_id:
        return None
    try:
        return dict(glance.images.get(boot_image_id))
    except glance_exc.HTTPNotFound:
        return None


def boot_image_size(boot_image):
    return number(boot_image.get(contract.BOOT_IMAGE_BYTES, boot_image.get('size')), int)


def find_aggregate(aggregates, name_or_id):
    """A host aggregate by name, ID or UUID (``aggregates``: novaclient's, at 2.41 at least)."""
    for aggregate in aggregates.list():
        if name_or_id in (aggregate.name, str(aggregate.id), aggregate.uuid):
            return aggregate
    raise exceptions.CommandError('No host aggregate with a name or ID of %r' % name_or_id)


def hosts_holding(placement, image_ids):
    """{image id: how many compute hosts hold its boot image warm}, from the traits of their
    resource providers in placement; {} if placement does not answer (it answers admins, and
    may be unreachable from where the command runs)."""
    if not image_ids:
        return {}
    try:
        existing = set(placement.get('/traits?name=startswith:%s' % (
            contract.WARM_TRAIT_PREFIX)).json()['traits'])
        holding = {}
        for image_id in image_ids:
            trait = contract.warm_trait(image_id)
            holding[image_id] = 0 if trait not in existing else len(placement.get(
                '/resource_providers?required=%s' % trait,
                microversion=REQUIRED_TRAITS_MICROVERSION).json()['resource_providers'])
        return holding
    except ks_exceptions.ClientException:
        return {}
