"""The plugin as openstackclient finds it: setup.cfg's entry points and the module's interface."""

import argparse
import configparser
import importlib
import pathlib

from cliff import command as cliff_command
from keystoneauth1 import session as ks_session

from yolo_client import client
from yolo_client import plugin

SETUP_CFG = pathlib.Path(__file__).resolve().parents[3] / 'setup.cfg'


def setup_cfg():
    config = configparser.ConfigParser(interpolation=None)
    config.read(SETUP_CFG)
    return config


def entry_points(group):
    lines = setup_cfg()['entry_points'][group].strip().splitlines()
    return dict(tuple(p.strip() for p in line.split('=', 1)) for line in lines)


def test_the_package_and_its_entry_points_are_declared():
    assert 'yolo_client' in setup_cfg()['files']['packages'].split()
    assert entry_points('openstack.cli.extension') == {'yolo': 'yolo_client.plugin'}


def test_the_command_group_is_the_one_openstackclient_derives_from_the_plugin():
    # openstackclient loads "openstack.<API_NAME>.v<major version>", and cliff turns the
    # underscores of entry point names into the words of the command.
    group = 'openstack.%s.v%s' % (plugin.API_NAME, plugin.DEFAULT_API_VERSION.split('.')[0])
    commands = entry_points(group)
    assert sorted(n.replace('_', ' ') for n in commands) == [
        'yolo host list', 'yolo image list', 'yolo image rebuild', 'yolo image show',
        'yolo image unwarm', 'yolo image warm', 'yolo server list']
    for target in commands.values():
        module, name = target.split(':')
        assert issubclass(getattr(importlib.import_module(module), name),
                          cliff_command.Command)


def test_the_module_has_openstackclients_plugin_interface():
    assert plugin.API_NAME == 'yolo'
    assert plugin.API_VERSION_OPTION == 'os_yolo_api_version'
    assert plugin.DEFAULT_API_VERSION in plugin.API_VERSIONS
    parser = plugin.build_option_parser(argparse.ArgumentParser())
    # openstackclient reads the version from the option named by API_VERSION_OPTION.
    assert getattr(parser.parse_args(['--os-yolo-api-version', '1']),
                   plugin.API_VERSION_OPTION) == '1'


def test_make_client_talks_to_glance_and_nova_over_the_openstack_session():
    session = ks_session.Session()
    manager = argparse.Namespace(session=session, region_name='RegionTwo', interface='internal')
    yolo = plugin.make_client(manager)
    assert isinstance(yolo, client.Client)
    assert yolo.glance.http_client.session is session
    assert yolo.glance.http_client.region_name == 'RegionTwo'
    assert yolo.nova.client.session is session
    assert yolo.nova.client.interface == 'internal'
    assert yolo.nova.api_version.get_string() == client.NOVA_API_VERSION
