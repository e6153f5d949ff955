"""What YOLO's filter and weigher share: options, the requested image, each host's prediction."""

import dataclasses

from oslo_log import log as logging

import nova.conf
from nova.scheduler.filters import utils as filter_utils

from yolo_nova import conf as yolo_conf
from yolo_nova.model import host_stats
from yolo_nova.model import parameters

CONF = nova.conf.CONF
yolo_conf.register_opts(CONF)
LOG = logging.getLogger(__name__)
# Aggregate metadata keys that override the parameters hosts report (operators' settings win
# over a host's calibration), and the parameter each sets: the model's table.
AGGREGATE_PARAMETERS = {p.aggregate_key: p.name for p in parameters.PARAMETERS
                        if p.aggregate_key}


def requested_image_id(spec_obj):
    """The Glance image id of the request ('' for volume-backed or unknown). A server booted
    from a volume made of an image carries that image's metadata too: it still boots from its
    volume."""
    if spec_obj.obj_attr_is_set('is_bfv') and spec_obj.is_bfv:
        return ''
    image = getattr(spec_obj, 'image', None)
    if image is None or not image.obj_attr_is_set('id'):
        return ''
    return image.id or ''


def predict(host_state, image_id):
    """(predicted boot time in seconds or None, the host's state or None) for a VM of
    ``image_id`` (see :func:`requested_image_id`; none for a volume-backed server, which boots
    from its volume, not from an image YOLO serves)."""
    if not image_id:
        return None, None
    state = host_stats.from_stats(host_state.stats, CONF.yolo.stats_max_age)
    if state is None:
        return None, None
    state = with_aggregate_parameters(host_state, state)
    try:
        return state.predict(image_id, host_state.num_io_ops), state
    except (ArithmeticError, TypeError, ValueError) as e:
        # Inputs are bounded where they are parsed; whatever slips through costs this host its
        # prediction, never the scheduling request.
        LOG.warning('%s: no boot time prediction: %s', host_state, e)
        return None, None


def with_aggregate_parameters(host_state, state):
    """``state`` with the parameters its host's aggregates set; the largest value if several
    aggregates disagree (a cautious prediction)."""
    if not host_state.aggregates:
        return state
    overrides = {}
    for key, field in AGGREGATE_PARAMETERS.items():
        values = filter_utils.aggregate_values_from_key(host_state, key)
        try:
            numbers = [float(v) for v in values]
        except ValueError:
            LOG.warning('%s: aggregate metadata %s=%s is not a number; ignored',
                        host_state, key, sorted(values))
            continue
        if numbers:
            overrides[field] = max(numbers)
    if not overrides:
        return state
    try:
        params = dataclasses.replace(state.params, **parameters.with_thesis_poles(overrides))
    except ValueError as e:
        LOG.warning('%s: aggregate boot-time parameters ignored: %s', host_state, e)
        return state
    return dataclasses.replace(state, params=params)
