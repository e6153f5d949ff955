"""The command-line tools refuse bad arguments with a usage error, not a traceback, and their
help shows each option's default."""

import pytest

from yolo_bench import cli as bench_cli
from yolo_nova.cmd import calibrate


@pytest.mark.parametrize('main, argv', [
    (calibrate.main, ['--image', '/nonexistent/image.qcow2']),
    (bench_cli.main, ['report', '/nonexistent/boot.csv']),
    (bench_cli.main, ['run', '--test-image', '/nonexistent/image.qcow2']),
])
def test_a_missing_file_is_a_usage_error(main, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert '/nonexistent/' in err and 'no such file' in err
    assert 'Traceback' not in err


@pytest.mark.parametrize('main, argv, expected', [
    (calibrate.main, ['--help'], '(default: 3)'),
    (bench_cli.main, ['run', '--help'], '(default: 3)'),
])
def test_help_shows_defaults(main, argv, expected, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert expected in capsys.readouterr().out


def test_a_bad_ready_pattern_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_cli.main(['run', '--ready-pattern', 'login: ('])
    assert exit_info.value.code == 2
    assert 'not a regular expression' in capsys.readouterr().err


def test_the_boot_benchmark_takes_cache_modes_and_a_ready_pattern():
    args = bench_cli.parse_args(['run', '--cache', 'none,writethrough',
                                 '--ready-pattern', r'login: ?$'])
    assert args.cache == ['none', 'writethrough']
    assert args.ready_pattern.search(b'yolo-guest login: ') is not None
    assert bench_cli.parse_args(['run']).ready_pattern == b'YOLO-GUEST-READY'


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
