"""One way to the yolofs command, for every caller: a service's option, else $YOLOFS_BIN, else
PATH."""

import os

import pytest

from yolo_common import yolofs


@pytest.fixture
def commands(tmp_path, monkeypatch):
    """Two executables named yolofs: one on PATH, one elsewhere."""
    found = {}
    for where in ('on-path', 'elsewhere'):
        path = tmp_path / where / 'yolofs'
        path.parent.mkdir()
        path.write_text('#!/bin/sh\n')
        path.chmod(0o755)
        found[where] = str(path)
    monkeypatch.setenv('PATH', os.path.dirname(found['on-path']))
    monkeypatch.delenv('YOLOFS_BIN', raising=False)
    return found


def test_the_option_comes_first_then_the_environment_then_path(commands, monkeypatch):
    assert yolofs.binary() == commands['on-path']
    monkeypatch.setenv('YOLOFS_BIN', commands['elsewhere'])
    assert yolofs.binary() == commands['elsewhere']
    assert yolofs.binary('yolofs') == commands['on-path']       # the option's default
    assert yolofs.binary(commands['elsewhere']) == commands['elsewhere']


def test_a_configured_command_that_is_not_there_is_an_error(commands, tmp_path):
    with pytest.raises(yolofs.YolofsError, match='not found or not executable'):
        yolofs.binary(str(tmp_path / 'nowhere' / 'yolofs'))


def test_a_mount_runs_the_configured_command(commands, tmp_path):
    mount = yolofs.Mount(tmp_path / 'src', tmp_path / 'mnt', tmp_path / 'store',
                         tmp_path / 'sock', kept=True, yolofs_binary=commands['elsewhere'])
    command = mount.command()
    assert command[:3] == [commands['elsewhere'], 'keep', '--']
    assert command[3:5] == [commands['elsewhere'], 'mount']
