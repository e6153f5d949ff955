"""The openstackclient plugin interface (entry point ``openstack.cli.extension``).

openstackclient imports this module at every start: it must stay light, and the clients are
made only when a ``yolo`` command runs. The commands live in the ``openstack.yolo.v1`` entry
point group.
"""

from osc_lib import utils

API_NAME = 'yolo'
API_VERSION_OPTION = 'os_yolo_api_version'
DEFAULT_API_VERSION = '1'
API_VERSIONS = {'1': 'yolo_client.client.Client'}


def make_client(instance):
    """The ``yolo`` client of openstackclient's client manager: Glance and Nova over its
    session, region and interface."""
    from yolo_client import client
    return client.Client(instance.session, region_name=instance.region_name,
                         interface=instance.interface)


def build_option_parser(parser):
    parser.add_argument(
        '--os-yolo-api-version', metavar='<yolo-api-version>',
        default=utils.env('OS_YOLO_API_VERSION'),
        help='Version of the yolo commands (env: OS_YOLO_API_VERSION; default: %s)'
        % DEFAULT_API_VERSION)
    return parser
