"""The command-line tools refuse bad arguments with a usage error, not a traceback, and their
help shows each option's default."""

import pytest

from yolo_nova.cmd import calibrate


def test_a_missing_file_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        calibrate.main(['--image', '/nonexistent/image.qcow2'])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert '/nonexistent/' in err and 'no such file' in err
    assert 'Traceback' not in err


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        calibrate.main(['--help'])
    assert '(default: 3)' in capsys.readouterr().out


def test_calibrate_boots_with_novas_accelerator_or_asks_for_one(tmp_path, capsys):
    nova_conf = tmp_path / 'nova.conf'
    for virt_type, accel in (('kvm', 'kvm'), ('qemu', 'tcg'), ('lxc', None)):
        nova_conf.write_text('[DEFAULT]\ndebug = %%(x)s\n[libvirt]\nvirt_type = %s\n' % virt_type)
        assert calibrate.novas_accel(str(nova_conf)) == accel
    assert calibrate.novas_accel(str(tmp_path / 'missing.conf')) is None
    image = tmp_path / 'image.qcow2'
    image.write_bytes(b'')
    with pytest.raises(SystemExit) as exit_info:
        calibrate.main(['--image', str(image), '--nova-config', str(nova_conf)])
    assert exit_info.value.code == 2
    assert 'say --accel kvm or tcg' in capsys.readouterr().err
