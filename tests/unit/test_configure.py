"""yolo-configure: YOLO's settings written into existing Nova, Glance and worker files."""

import io
import pathlib

import pytest

from yolo_common import configure
from yolo_common import contract
from yolo_common import signing

NOVA_CONF = """# written by the deployment
[DEFAULT]
debug = true

[filter_scheduler]
# the operator's choice
enabled_filters = ComputeFilter,ImagePropertiesFilter
available_filters = nova.scheduler.filters.all_filters
available_filters = custom.filters.Mine
"""


def run(tmp_path, text, *args):
    path = tmp_path / 'service.conf'
    path.write_text(text)
    assert configure.main([args[0], '--config-file', str(path), *args[1:]]) == 0
    return path.read_text()


def test_scheduler_keeps_the_operators_filters_and_is_idempotent(tmp_path):
    once = run(tmp_path, NOVA_CONF, 'nova-scheduler')
    twice = run(tmp_path, once, 'nova-scheduler')
    assert once == twice
    assert '# the operator\'s choice' in once and 'debug = true' in once
    conf = configure.ConfigFile(str(tmp_path / 'service.conf'))
    assert conf.get_all('filter_scheduler', 'available_filters') == [
        'nova.scheduler.filters.all_filters', 'custom.filters.Mine', configure.FILTER_CLASS]
    assert conf.get('filter_scheduler', 'enabled_filters') == \
        'ComputeFilter,ImagePropertiesFilter,YoloBootFilter'
    assert conf.get('filter_scheduler', 'weight_classes') == \
        'nova.scheduler.weights.all_weighers,' + configure.WEIGHER_CLASS


def test_scheduler_starts_from_novas_defaults_where_nothing_is_set(tmp_path):
    run(tmp_path, '', 'nova-scheduler')
    conf = configure.ConfigFile(str(tmp_path / 'service.conf'))
    # A first available_filters line would replace Nova's default one: it is kept.
    assert conf.get_all('filter_scheduler', 'available_filters') == [
        configure.NOVA_ALL_FILTERS, configure.FILTER_CLASS]
    enabled = conf.get('filter_scheduler', 'enabled_filters').split(',')
    assert enabled[-1] == 'YoloBootFilter' and 'ComputeFilter' in enabled


def test_scheduler_adds_the_filter_only_if_absent_and_the_weigher_to_the_operators(tmp_path):
    text = NOVA_CONF.replace(
        'enabled_filters = ComputeFilter,ImagePropertiesFilter',
        'enabled_filters = ComputeFilter, YoloBootFilter ,ImagePropertiesFilter\n'
        'weight_classes = nova.scheduler.weights.ram.RAMWeigher')
    run(tmp_path, text, 'nova-scheduler')
    conf = configure.ConfigFile(str(tmp_path / 'service.conf'))
    # Already enabled: kept where the operator put it, not added again.
    assert conf.get('filter_scheduler', 'enabled_filters') == \
        'ComputeFilter,YoloBootFilter,ImagePropertiesFilter'
    # The operator's weighers stay (Nova's all_weighers is not brought back); ours is added.
    assert conf.get('filter_scheduler', 'weight_classes') == \
        'nova.scheduler.weights.ram.RAMWeigher,' + configure.WEIGHER_CLASS


def test_compute_sets_the_driver_and_the_mount(tmp_path):
    text = run(tmp_path, NOVA_CONF, 'nova-compute', '--mount-point', '/m',
               '--control-socket', '/s.sock')
    conf = configure.ConfigFile(str(tmp_path / 'service.conf'))
    assert conf.get('DEFAULT', 'compute_driver') == 'yolo.YoloLibvirtDriver'
    assert (conf.get('yolo', 'mount_point'), conf.get('yolo', 'control_socket')) == (
        '/m', '/s.sock')
    # The DEFAULT section is not repeated.
    assert text.count('[DEFAULT]') == 1


def test_glance_api_notifies_the_workers_topic(tmp_path):
    imports = tmp_path / 'glance-image-import.conf'
    run(tmp_path, '[oslo_messaging_notifications]\ntopics = notifications\n', 'glance-api',
        '--import-config-file', str(imports))
    conf = configure.ConfigFile(str(tmp_path / 'service.conf'))
    assert conf.get('oslo_messaging_notifications', 'driver') == 'messagingv2'
    # Another consumer's topic stays; the worker's is added.
    assert conf.get('oslo_messaging_notifications', 'topics') == \
        'notifications,yolo_notifications'
    assert conf.get('image_format', 'container_formats').endswith(',yolo')
    assert configure.ConfigFile(str(imports)).get(
        'image_import_opts', 'image_import_plugins') == "['yolo_boot_image']"


def test_the_workers_password_is_required_on_standard_input(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr('sys.stdin', io.StringIO(''))
    assert configure.main(['worker', '--config-file', str(tmp_path / 'w.conf'),
                           '--transport-url', 'rabbit://h/', '--auth-url', 'http://k',
                           '--username', 'yolo', '--password-stdin']) == 1
    assert 'no password' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        configure.main(['worker', '--config-file', str(tmp_path / 'w.conf'), '--transport-url',
                        'rabbit://h/', '--auth-url', 'http://k', '--username', 'yolo',
                        '--password', 'on-the-command-line'])


def test_glance_api_keeps_the_default_topic_and_other_drivers(tmp_path):
    # topics unset is oslo.messaging's "notifications", which Ceilometer listens to.
    run(tmp_path, '[oslo_messaging_notifications]\ndriver = log\n', 'glance-api')
    conf = configure.ConfigFile(str(tmp_path / 'service.conf'))
    assert conf.get('oslo_messaging_notifications', 'topics') == \
        'notifications,yolo_notifications'
    assert conf.get_all('oslo_messaging_notifications', 'driver') == ['log', 'messagingv2']


def test_glance_api_refuses_to_replace_the_operators_property_protections(tmp_path, capsys):
    protections = tmp_path / 'property-protections.conf'
    policies = ('[DEFAULT]\nproperty_protection_file = /etc/glance/prop.conf\n'
                'property_protection_rule_format = policies\n')
    for before, words in ((policies, 'policies'), (policies.replace('policies\n', 'roles\n'),
                                                   '/etc/glance/prop.conf')):
        (tmp_path / 'service.conf').write_text(before)
        assert configure.main(['glance-api', '--config-file', str(tmp_path / 'service.conf'),
                               '--property-protection-file', str(protections)]) == 1
        assert words in capsys.readouterr().err
        assert (tmp_path / 'service.conf').read_text() == before
        assert not protections.exists()


def test_worker_gets_its_service_identity_and_topic(tmp_path, monkeypatch):
    monkeypatch.setattr('sys.stdin', io.StringIO('the password\n'))
    run(tmp_path, '', 'worker', '--transport-url', 'rabbit://u:p@h:5672/', '--auth-url',
        'http://k:5000', '--username', 'yolo', '--password-stdin')
    conf = configure.ConfigFile(str(tmp_path / 'service.conf'))
    # Read from standard input, never taken from the command line.
    assert conf.get('glance', 'password') == 'the password'
    assert conf.get('yolo_worker', 'notification_topics') == configure.NOTIFICATION_TOPIC
    assert (conf.get('glance', 'username'), conf.get('glance', 'project_name')) == (
        'yolo', 'service')
    assert conf.get('DEFAULT', 'transport_url') == 'rabbit://u:p@h:5672/'


def test_the_workers_signing_key_is_made_once_and_its_public_key_given_to_compute_hosts(
        tmp_path, capsys, monkeypatch):
    key = tmp_path / 'signing.key'
    worker_args = ('worker', '--transport-url', 'rabbit://u:p@h:5672/', '--auth-url',
                   'http://k:5000', '--username', 'yolo', '--password-stdin',
                   '--signing-key-file', str(key))
    monkeypatch.setattr('sys.stdin', io.StringIO('pw\npw\n'))
    run(tmp_path, '', *worker_args)
    assert configure.ConfigFile(str(tmp_path / 'service.conf')).get(
        'yolo_worker', 'signing_key_file') == str(key)
    assert key.stat().st_mode & 0o777 == 0o600
    public_key = (tmp_path / 'signing.key.pub').read_text().strip()
    # Run again: the same key.
    run(tmp_path, '', *worker_args)
    assert (tmp_path / 'signing.key.pub').read_text().strip() == public_key
    signer = signing.Signer.from_file(key)
    assert signer.public_key == public_key

    compute = tmp_path / 'nova.conf'
    compute.write_text(NOVA_CONF)
    for _ in range(2):
        assert configure.main(['nova-compute', '--config-file', str(compute),
                               '--boot-image-signing-key-file', str(key) + '.pub']) == 0
    assert configure.ConfigFile(str(compute)).get('yolo', 'boot_image_signing_keys') == \
        public_key
    # A file that is not a public key is refused, the configuration left as it was.
    before = compute.read_text()
    assert configure.main(['nova-compute', '--config-file', str(compute),
                           '--boot-image-signing-key-file', str(key)]) == 1
    assert 'not an Ed25519 public key' in capsys.readouterr().err
    assert compute.read_text() == before


def test_cinder_leaves_yolos_properties_out_of_volume_uploads(tmp_path):
    # Cinder's reserved_image_namespaces: prefixes of the properties it does not send to
    # Glance when a volume is uploaded as an image (an operator's own are kept).
    run(tmp_path, '[DEFAULT]\nreserved_image_namespaces = custom_\n', 'cinder-api')
    conf = configure.ConfigFile(str(tmp_path / 'service.conf'))
    assert conf.get('DEFAULT', 'reserved_image_namespaces') == 'custom_,yolo_'
    assert all(name.startswith(configure.PROPERTY_PREFIX)
               for name in contract.NOT_INHERITED + (contract.SOURCE_IMAGE_ID,))


def test_unwritable_file_is_a_clear_error(tmp_path, capsys):
    missing_dir = tmp_path / 'file-not-dir'
    missing_dir.write_text('')
    assert configure.main(['nova-scheduler', '--config-file',
                           str(missing_dir / 'nova.conf')]) == 1
    assert 'yolo-configure: cannot write' in capsys.readouterr().err


def test_nova_api_keeps_yolos_links_out_of_snapshots(tmp_path):
    run(tmp_path, '', 'nova-api')
    conf = configure.ConfigFile(str(tmp_path / 'service.conf'))
    names = conf.get('DEFAULT', 'non_inheritable_image_properties').split(',')
    assert names[:2] == ['cache_in_nova', 'bittorrent']
    assert set(contract.NOT_INHERITED) <= set(names)


def test_property_protections_go_before_the_operators_own(tmp_path):
    protections = tmp_path / 'property-protections.conf'
    protections.write_text('[^x_.*]\ncreate = admin\nread = @\nupdate = admin\ndelete = admin\n')
    for _ in range(2):
        run(tmp_path, '', 'glance-api', '--property-protection-file', str(protections))
    text = protections.read_text()
    assert text.index('[^yolo_warm$]') < text.index('[^yolo_.*]') < text.index('[^x_.*]')
    assert text.count('[^yolo_.*]') == 1 and text.count('[^yolo_warm$]') == 1
    assert '[.*]' not in text
    conf = configure.ConfigFile(str(tmp_path / 'service.conf'))
    assert conf.get('DEFAULT', 'property_protection_rule_format') == 'roles'
    assert conf.get('DEFAULT', 'property_protection_file') == str(protections)


def test_a_new_property_protection_file_leaves_other_properties_free(tmp_path):
    protections = tmp_path / 'property-protections.conf'
    run(tmp_path, '', 'glance-api', '--property-protection-file', str(protections))
    rules = configure.ConfigFile(str(protections))
    assert rules.get('^yolo_.*', 'update') == 'admin,service'
    # Where an image is warm: admins only, not every compute host's service role.
    assert [rules.get('^yolo_warm$', k) for k in ('create', 'update', 'delete')] == ['admin'] * 3
    # Readable by glance-api's user; Glance reads an unreadable file as no rules, refusing all.
    assert protections.stat().st_mode & 0o777 == 0o644
    assert rules.get('.*', 'create') == '@'


def test_the_shipped_property_protections_sample_is_what_yolo_configure_writes(tmp_path):
    protections = tmp_path / 'property-protections.conf'
    run(tmp_path, '', 'glance-api', '--property-protection-file', str(protections))
    sample = pathlib.Path(__file__).parents[2] / 'etc' / 'glance-property-protections.conf.sample'
    rules = [line for line in sample.read_text().splitlines() if not line.startswith('#')]
    assert rules == protections.read_text().splitlines()


def test_a_new_file_is_private_and_an_existing_one_keeps_its_mode(tmp_path):
    new = configure.ConfigFile(str(tmp_path / 'new.conf'))
    new.set('glance', 'password', 'secret')
    new.save()
    assert (tmp_path / 'new.conf').stat().st_mode & 0o777 == 0o600
    existing = tmp_path / 'existing.conf'
    existing.write_text('[DEFAULT]\n')
    existing.chmod(0o640)
    conf = configure.ConfigFile(str(existing))
    conf.set('glance', 'password', 'secret')
    conf.save()
    assert existing.stat().st_mode & 0o777 == 0o640
