"""What YOLO's filter and weigher share: options, the requested image, each host's prediction."""

import nova.conf

from yolo_nova import conf as yolo_conf
from yolo_nova import host_stats

CONF = nova.conf.CONF
yolo_conf.register_opts(CONF)


def requested_image_id(spec_obj):
    """The Glance image id of the request ('' for volume-backed or unknown)."""
    image = getattr(spec_obj, 'image', None)
    if image is None or not image.obj_attr_is_set('id'):
        return ''
    return image.id or ''


def predict(host_state, image_id):
    """(predicted boot time in seconds or None, the host's state or None) for a VM of
    ``image_id`` (see :func:`requested_image_id`)."""
    state = host_stats.from_stats(host_state.stats, CONF.yolo.stats_max_age)
    if state is None:
        return None, None
    return state.predict(image_id, host_state.num_io_ops), state
