"""``yolo-configure``: the one place that knows how YOLO is wired into Nova and Glance.

The devstack plugin and the all-in-one cloud (tools/aio) both call this, role by role, on
configuration files that the deployment already wrote for Nova, Glance and the worker. Only YOLO's
settings are touched; everything else in the file (comments, order, repeated keys such as
``available_filters``) is kept, and running it twice changes nothing.

    yolo-configure nova-compute --config-file /etc/nova/nova.conf --mount-point ... \\
        --control-socket ... [--boot-image-signing-key-file /etc/yolo/boot-image-signing.pub]
    yolo-configure nova-scheduler --config-file /etc/nova/nova.conf
    yolo-configure nova-api --config-file /etc/nova/nova.conf
    yolo-configure cinder-api --config-file /etc/cinder/cinder.conf
    yolo-configure glance-api --config-file /etc/glance/glance-api.conf \\
        [--import-config-file /etc/glance/glance-image-import.conf] \\
        [--property-protection-file /etc/glance/property-protections.conf]
    yolo-configure worker --config-file /etc/yolo/yolo-glance-worker.conf --transport-url ... \\
        --auth-url ... --username ... --password-stdin [--project-name service] \\
        [--signing-key-file /etc/yolo/boot-image-signing.key] <<<"$PASSWORD"

The worker's password is read from standard input (its first line), never from the command
line, which every user of the host can read.

The worker's signing key is made if missing (readable by the user who runs yolo-configure, which
must be the worker's), and its public key written beside it (``.pub``, one base64 line): the
line compute hosts get in ``[yolo] boot_image_signing_keys`` (``--boot-image-signing-key-file``
reads it).
"""

import argparse
import importlib
import os
import re
import sys

from yolo_common import contract
from yolo_common import signing

DRIVER = 'yolo.YoloLibvirtDriver'
NOVA_ALL_FILTERS = 'nova.scheduler.filters.all_filters'
FILTER_CLASS = 'yolo_nova.scheduler.filters.boot_time_filter.YoloBootFilter'
FILTER_NAME = 'YoloBootFilter'
NOVA_ALL_WEIGHERS = 'nova.scheduler.weights.all_weighers'
WEIGHER_CLASS = 'yolo_nova.scheduler.weights.boot_time.YoloBootTimeWeigher'
CONTAINER_FORMAT = contract.CONTAINER_FORMAT
IMPORT_PLUGIN = 'yolo_boot_image'
# Glance property protections (roles format): only admins and services (the worker) create,
# change or delete YOLO's properties; everyone reads them. First match wins, so this section goes
# before the operator's own; a file YOLO creates also gets a rule that leaves every other
# property as it is without protections.
PROTECTION_SECTION = '^yolo_.*'
PROPERTY_PREFIX = 'yolo_'
PROTECTION_RULES = {'create': 'admin,service', 'read': '@', 'update': 'admin,service',
                    'delete': 'admin,service'}
# Where an image is warm (contract.WARM) makes every host there download and hold its boot image:
# admins alone set it, not the service role that every compute host's Nova user holds; hosts
# read it (a host aggregate's uuid, which tenants need not see). Before the section above.
WARM_SECTION = '^%s$' % contract.WARM
WARM_RULES = {'create': 'admin', 'read': 'admin,service', 'update': 'admin', 'delete': 'admin'}
PROTECTIONS = ((WARM_SECTION, WARM_RULES), (PROTECTION_SECTION, PROTECTION_RULES))
OTHER_PROPERTIES = '.*'
# The worker's own notification topic, added to glance-api's (which keep theirs: Ceilometer's,
# or the default "notifications").
NOTIFICATION_TOPIC = 'yolo_notifications'


class ConfigFile:
    """An oslo.config ini file edited in place, line by line, keeping what YOLO does not own.

    configparser (and libraries built on it) cannot keep a key that repeats in a section, which
    is how oslo.config spells a multi-valued option (``available_filters``).
    """

    SECTION = re.compile(r'^\[(?P<name>[^\]]+)\]\s*$')
    OPTION = re.compile(r'^(?P<key>[A-Za-z0-9_.-]+)\s*=\s?(?P<value>.*)$')

    def __init__(self, path):
        self.path = path
        self.lines = []
        if os.path.exists(path):
            with open(path) as f:
                self.lines = f.read().splitlines()

    def _options(self, section):
        """(line index, key, value) of each option of a section, and the section's last line."""
        current, found, end = None, [], None
        for index, line in enumerate(self.lines):
            header = self.SECTION.match(line)
            if header:
                current = header.group('name')
                if current == section:
                    end = index
                continue
            if current == section:
                if line.strip():
                    end = index
                option = self.OPTION.match(line)
                if option:
                    found.append((index, option.group('key'), option.group('value').strip()))
        return found, end

    def _insert_at_section_end(self, section, line):
        _, end = self._options(section)
        if end is None:
            if self.lines and self.lines[-1].strip():
                self.lines.append('')
            self.lines += ['[%s]' % section, line]
        else:
            self.lines.insert(end + 1, line)

    def get_all(self, section, key):
        return [value for _, k, value in self._options(section)[0] if k == key]

    def get(self, section, key):
        """The value of a single-valued key (its last occurrence, as oslo.config reads it)."""
        values = self.get_all(section, key)
        return values[-1] if values else None

    def set(self, section, key, value):
        indexes = [index for index, k, _ in self._options(section)[0] if k == key]
        line = '%s = %s' % (key, value)
        if not indexes:
            self._insert_at_section_end(section, line)
            return
        self.lines[indexes[-1]] = line
        for index in reversed(indexes[:-1]):
            del self.lines[index]

    def add(self, section, key, value):
        """Adds a value to a multi-valued key unless it is already one of its values."""
        options = [(index, v) for index, k, v in self._options(section)[0] if k == key]
        if any(v == value for _, v in options):
            return
        line = '%s = %s' % (key, value)
        if options:
            self.lines.insert(options[-1][0] + 1, line)
        else:
            self._insert_at_section_end(section, line)

    def add_to_list(self, section, key, item, default):
        """Adds an item to a comma-separated list option, starting from its default if unset."""
        current = self.get(section, key)
        items = [i.strip() for i in (current.split(',') if current is not None else default)]
        items = [i for i in items if i]
        if item not in items:
            items.append(item)
        self.set(section, key, ','.join(items))

    def save(self, new_mode=0o600):
        """Replaces the file atomically, with the original's owner and mode (``new_mode`` for
        a new one: 0600 by default, as these files hold passwords)."""
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        tmp = self.path + '.yolo-configure.tmp'
        if os.path.exists(tmp):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, 'w') as f:
            if os.path.exists(self.path):
                st = os.stat(self.path)
                os.fchown(f.fileno(), st.st_uid, st.st_gid)
                os.fchmod(f.fileno(), st.st_mode & 0o7777)
            else:
                os.fchmod(f.fileno(), new_mode)
            f.write('\n'.join(self.lines) + '\n')
        os.replace(tmp, self.path)


def _nova_default(group, name, fallback):
    """Nova's own default of an option, so that adding to a list keeps Nova's entries."""
    try:
        import nova.conf
        return list(nova.conf.CONF[group][name])
    except Exception:
        return list(fallback)


class ConfigureError(Exception):
    pass


def check_driver_loadable():
    """Nova loads the driver as nova.virt.yolo: make sure this Python can, before nova-compute
    starts and fails with an ImportError. Skipped where Nova is not importable here."""
    try:
        importlib.import_module('nova.virt')
    except ImportError:
        print('yolo-configure: nova is not importable here; not checking that nova-compute can '
              'load the driver', file=sys.stderr)
        return
    try:
        importlib.import_module('nova.virt.yolo')
    except ImportError as e:
        raise ConfigureError(
            'nova-compute cannot load the driver: nova.virt.yolo is not importable (%s). '
            "Install YOLO with pip into the Python that runs nova-compute (or into a site "
            "directory of it): its yolo-openstack-nova-virt.pth provides the module." % e)


def nova_compute(conf, args):
    check_driver_loadable()
    conf.set('DEFAULT', 'compute_driver', DRIVER)
    conf.set('yolo', 'enabled', 'True')
    conf.set('yolo', 'mount_point', args.mount_point)
    conf.set('yolo', 'control_socket', args.control_socket)
    for path in args.boot_image_signing_key_file:
        try:
            with open(path) as f:
                key = f.read().strip()
            signing.Verifier([key])
        except (OSError, signing.SigningError) as e:
            raise ConfigureError('--boot-image-signing-key-file %s: %s' % (path, e))
        conf.add_to_list('yolo', 'boot_image_signing_keys', key, [])


def nova_scheduler(conf, args):
    # A first available_filters line replaces Nova's default: keep Nova's filters.
    if not conf.get_all('filter_scheduler', 'available_filters'):
        conf.add('filter_scheduler', 'available_filters', NOVA_ALL_FILTERS)
    conf.add('filter_scheduler', 'available_filters', FILTER_CLASS)
    conf.add_to_list('filter_scheduler', 'enabled_filters', FILTER_NAME,
                     _nova_default('filter_scheduler', 'enabled_filters',
                                   ['ComputeFilter', 'ComputeCapabilitiesFilter',
                                    'ImagePropertiesFilter', 'ServerGroupAntiAffinityFilter',
                                    'ServerGroupAffinityFilter']))
    conf.add_to_list('filter_scheduler', 'weight_classes', WEIGHER_CLASS, [NOVA_ALL_WEIGHERS])


def nova_api(conf, args):
    # Snapshots are created by nova-api with the server's image properties.
    for name in contract.NOT_INHERITED:
        conf.add_to_list('DEFAULT', 'non_inheritable_image_properties', name,
                         _nova_default('DEFAULT', 'non_inheritable_image_properties',
                                       ['cache_in_nova', 'bittorrent']))


def property_protections(path):
    """Puts YOLO's rules first in a Glance property protection file (made if missing)."""
    protections = ConfigFile(path)
    if not protections.lines:
        for key, value in PROTECTION_RULES.items():
            protections.set(OTHER_PROPERTIES, key, '@')
    ours = []
    for section, rules in PROTECTIONS:
        header = '[%s]' % section
        if header in protections.lines:
            start = protections.lines.index(header)
            end = start + 1
            while end < len(protections.lines) and not protections.lines[end].startswith('['):
                end += 1
            del protections.lines[start:end]
        ours += [header] + ['%s = %s' % kv for kv in rules.items()] + ['']
    protections.lines[:0] = ours
    # glance-api reads it as its own user (an unreadable file is silently no rules at all, and
    # Glance then refuses every property); it holds no secret.
    protections.save(new_mode=0o644)


def cinder_api(conf, args):
    # Cinder copies an image's properties into the volumes made from it and sends them back
    # to Glance when a volume is uploaded as an image: Glance's protections of yolo_* would
    # refuse a tenant's upload. Cinder (2023.1 and later) leaves out these prefixes.
    conf.add_to_list('DEFAULT', 'reserved_image_namespaces', PROPERTY_PREFIX, [])


def glance_api(conf, args):
    """Adds what the worker and the import plugin need to glance-api.conf; never takes away
    what is there (another notification driver or topic, the operator's property protections),
    and refuses where YOLO's needs and the operator's settings cannot both hold."""
    if args.property_protection_file:
        check_protections_coexist(conf, args.property_protection_file)
    # Both multi-valued: another driver or consumer (Ceilometer) keeps what it has. Unset,
    # topics is oslo.messaging's default, ``notifications``, kept too.
    conf.add('oslo_messaging_notifications', 'driver', 'messagingv2')
    conf.add_to_list('oslo_messaging_notifications', 'topics', NOTIFICATION_TOPIC,
                     ['notifications'])
    conf.add_to_list('image_format', 'container_formats', CONTAINER_FORMAT,
                     ['ami', 'ari', 'aki', 'bare', 'ovf', 'ova', 'docker', 'compressed'])
    if args.import_config_file:
        import_conf = ConfigFile(args.import_config_file)
        plugins = import_conf.get('image_import_opts', 'image_import_plugins') or '[]'
        names = [p.strip(" '\"") for p in plugins.strip('[]').split(',') if p.strip(" '\"")]
        if IMPORT_PLUGIN not in names:
            names.append(IMPORT_PLUGIN)
        import_conf.set('image_import_opts', 'image_import_plugins',
                        '[%s]' % ', '.join("'%s'" % n for n in names))
        import_conf.save()
    if args.property_protection_file:
        property_protections(args.property_protection_file)
        conf.set('DEFAULT', 'property_protection_file', args.property_protection_file)
        conf.set('DEFAULT', 'property_protection_rule_format', 'roles')


def check_protections_coexist(conf, path):
    """ConfigureError where YOLO's property protections (roles format, in ``path``) would
    replace the operator's: rules in the policies format, or another file."""
    rule_format = conf.get('DEFAULT', 'property_protection_rule_format') or 'roles'
    if rule_format != 'roles':
        raise ConfigureError(
            'glance-api uses property_protection_rule_format = %s; YOLO writes its rules in the '
            'roles format. Add a first section [%s] to %s with create, update and delete '
            'allowed to policies that admit only the admin and service roles and read to all, '
            'and run yolo-configure glance-api without --property-protection-file '
            '(docs/install.md)' % (rule_format, PROTECTION_SECTION,
                                   conf.get('DEFAULT', 'property_protection_file')))
    current = conf.get('DEFAULT', 'property_protection_file')
    if current and os.path.abspath(current) != os.path.abspath(path):
        raise ConfigureError(
            'glance-api already reads its property protections from %s: run yolo-configure '
            'glance-api with --property-protection-file %s, which adds YOLO\'s rules to it'
            % (current, current))


def read_password():
    password = sys.stdin.readline().rstrip('\n')
    if not password:
        raise ConfigureError('--password-stdin: no password on standard input')
    return password


def worker(conf, args):
    conf.set('DEFAULT', 'transport_url', args.transport_url)
    conf.set('yolo_worker', 'notification_topics', NOTIFICATION_TOPIC)
    if args.work_dir:
        conf.set('yolo_worker', 'work_dir', args.work_dir)
    if args.yolofs_binary:
        conf.set('yolo_worker', 'yolofs_binary', args.yolofs_binary)
    if args.signing_key_file:
        try:
            signer = signing.Signer.create(args.signing_key_file)
            with open(args.signing_key_file + '.pub', 'w') as f:
                f.write(signer.public_key + '\n')
        except (OSError, ValueError, signing.SigningError) as e:
            raise ConfigureError('--signing-key-file %s: %s' % (args.signing_key_file, e))
        conf.set('yolo_worker', 'signing_key_file', args.signing_key_file)
    glance = {
        'auth_type': 'password',
        'auth_url': args.auth_url,
        'username': args.username,
        'password': read_password(),
        'user_domain_name': 'Default',
        'project_name': args.project_name,
        'project_domain_name': 'Default',
    }
    if args.region_name:
        glance['region_name'] = args.region_name
    for key, value in glance.items():
        conf.set('glance', key, value)


ROLES = {
    'nova-compute': nova_compute,
    'nova-scheduler': nova_scheduler,
    'nova-api': nova_api,
    'cinder-api': cinder_api,
    'glance-api': glance_api,
    'worker': worker,
}


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog='yolo-configure',
        description="Write YOLO's settings into an existing Nova, Glance or worker "
                    "configuration file, keeping everything else.")
    roles = parser.add_subparsers(dest='role', required=True, metavar='ROLE')

    def role(name, help_text):
        sub = roles.add_parser(name, help=help_text)
        sub.add_argument('--config-file', required=True, help='The file to edit in place.')
        return sub

    compute = role('nova-compute', "nova.conf of a compute node: the driver and [yolo]")
    compute.add_argument('--mount-point', default='/var/lib/nova/yolofs',
                         help='yolofs mount point (default: %(default)s)')
    compute.add_argument('--control-socket', default='/run/yolofs/control.sock',
                         help="yolofs' control socket (default: %(default)s)")
    compute.add_argument('--boot-image-signing-key-file', action='append', default=[],
                         help="A public key of the worker's (the .pub file `yolo-configure "
                              "worker --signing-key-file` writes), added to [yolo] "
                              "boot_image_signing_keys; may be repeated")
    role('nova-scheduler', 'nova.conf of nova-scheduler: YoloBootFilter and the weigher')
    role('nova-api', "nova.conf of nova-api: snapshots do not inherit YOLO's links")
    role('cinder-api', "cinder.conf of cinder-api: volumes uploaded as images do not carry "
                       "YOLO's properties")
    api = role('glance-api', 'glance-api.conf: notifications and the yolo container format')
    api.add_argument('--import-config-file', default=None,
                     help='glance-image-import.conf, to add the import plugin (optional)')
    api.add_argument('--property-protection-file', default=None,
                     help="Glance's property protection file (roles format), where YOLO's "
                          "rules go first; made if missing (optional)")
    work = role('worker', 'yolo-glance-worker.conf: transport and service identity')
    work.add_argument('--transport-url', required=True,
                      help="The transport_url of glance-api's notifications")
    work.add_argument('--auth-url', required=True, help="Keystone's URL")
    work.add_argument('--username', required=True, help="The worker's service user")
    work.add_argument('--password-stdin', action='store_true', required=True,
                      help="Read the service user's password from standard input (its first "
                           "line): never on the command line")
    work.add_argument('--project-name', default='service',
                      help="The service user's project (default: %(default)s)")
    work.add_argument('--region-name', default=None, help='Region of the Glance endpoint')
    work.add_argument('--work-dir', default=None, help="The worker's scratch directory")
    work.add_argument('--yolofs-binary', default=None, help='The yolofs command')
    work.add_argument('--signing-key-file', default=None,
                      help="The worker's signing key, made if missing, its public key written "
                           "to FILE.pub (recommended: compute hosts serve only signed boot "
                           "images before a download)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    conf = ConfigFile(args.config_file)
    try:
        ROLES[args.role](conf, args)
    except ConfigureError as e:
        print('yolo-configure: %s' % e, file=sys.stderr)
        return 1
    try:
        conf.save()
    except OSError as e:
        print('yolo-configure: cannot write %s: %s' % (args.config_file, e.strerror),
              file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
