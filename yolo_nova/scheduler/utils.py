"""What YOLO's filter and weigher share: options, the requested image, each host's prediction."""

import dataclasses
import math
import weakref

from oslo_log import log as logging

import nova.conf
from nova.scheduler.filters import utils as filter_utils

from yolo_nova import conf as yolo_conf
from yolo_nova.model import host_stats
from yolo_nova.model import parameters
from yolo_nova.model import prediction

CONF = nova.conf.CONF
yolo_conf.register_opts(CONF)
LOG = logging.getLogger(__name__)
# Aggregate metadata keys that override the parameters hosts report (operators' settings win
# over a host's calibration), and the parameter each sets: the model's table.
AGGREGATE_PARAMETERS = {p.aggregate_key: p.name for p in parameters.PARAMETERS
                        if p.aggregate_key}


def requested_image(spec_obj):
    """The image of the request (a prediction.RequestedImage), None for a volume-backed
    server or an unknown image. A server booted from a volume made of an image carries that
    image's metadata too: it still boots from its volume."""
    if spec_obj.obj_attr_is_set('is_bfv') and spec_obj.is_bfv:
        return None
    image = getattr(spec_obj, 'image', None)
    if image is None or not image.obj_attr_is_set('id') or not image.id:
        return None

    def known(field):
        return getattr(image, field) if image.obj_attr_is_set(field) else None
    return prediction.RequestedImage(image.id, size=known('size'),
                                     disk_format=known('disk_format'))


# Per request spec (Nova passes the same one to the filters and the weighers of a request): the
# image as the filter saw it and each host's prediction, which the weigher then reuses. Keyed by
# the host as it is: its report and the boots under way, which Nova counts up between the
# instances of one request.
_PER_REQUEST = weakref.WeakKeyDictionary()


def request_predictions(spec_obj, host_states):
    """:func:`predictions` for request ``spec_obj``, made once per host and request."""
    try:
        memo = _PER_REQUEST.setdefault(spec_obj, {})
    except TypeError:
        memo = {}
    return _predictions(host_states, requested_image(spec_obj), memo)


def predictions(host_states, image):
    """For each host, (its host_stats.Prediction or None, its state or None) for a VM of
    ``image`` (see :func:`requested_image`; none for a volume-backed server, which boots from
    its volume, not from an image YOLO serves). The scheduler asks Glance nothing: the image
    has a boot image if more hosts hold one than their filters' false positives explain
    (:func:`has_boot_image`)."""
    return _predictions(host_states, image, {})


def _predictions(host_states, image, memo):
    if image is None:
        return [(None, None)] * len(host_states)

    def key(host):
        return host.host, host.nodename, host.num_io_ops, id(host.stats)
    missing = [host for host in host_states if key(host) not in memo]
    if missing:
        states = [state_of(host) for host in missing]
        if 'image' not in memo:
            memo['image'] = dataclasses.replace(image, boot_image=has_boot_image(
                [state for state in states if state is not None], image.id))
        memo.update((key(host), (_predict(host, state, memo['image']), state))
                    for host, state in zip(missing, states))
    return [memo[key(host)] for host in host_states]


def has_boot_image(states, image_id):
    """Whether the hosts' reports say that image ``image_id`` has a published boot image: more
    hosts hold one than three standard deviations above the false positives their filters
    expect (a Poisson count of mean the sum of their rates). At 1,000 hosts of 0.04% each (0.4
    expected), three are needed; on a few hosts, one. An image that too few hosts hold yet is
    predicted as Nova's download on the hosts without it: a bias towards those that hold it."""
    holders = sum(state.holds_boot_image(image_id) for state in states)
    expected = sum(state.held_false_positives for state in states)
    return holders > expected + 3 * math.sqrt(expected)


def state_of(host_state):
    """The host's reported state with its aggregates' parameters, None if it reported none."""
    state = host_stats.from_stats(host_state.stats, CONF.yolo.stats_max_age)
    return None if state is None else with_aggregate_parameters(host_state, state)


def _predict(host_state, state, image):
    if state is None:
        return None
    try:
        return state.predict(image, host_state.num_io_ops)
    except (ArithmeticError, TypeError, ValueError) as e:
        # Inputs are bounded where they are parsed; whatever slips through costs this host its
        # prediction, never the scheduling request.
        LOG.warning('%s: no boot time prediction: %s', host_state, e)
        return None


def with_aggregate_parameters(host_state, state):
    """``state`` with the parameters its host's aggregates set; if several aggregates disagree,
    the value that predicts the slowest boot (a cautious prediction): the largest, or the
    smallest rate."""
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
            overrides[field] = (min if parameters.BY_NAME[field].rate else max)(numbers)
    if not overrides:
        return state
    try:
        params = dataclasses.replace(state.params, **parameters.with_thesis_poles(overrides))
    except ValueError as e:
        LOG.warning('%s: aggregate boot-time parameters ignored: %s', host_state, e)
        return state
    return dataclasses.replace(state, params=params)
