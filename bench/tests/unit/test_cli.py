"""yolo-boot-bench refuses bad arguments with a usage error, not a traceback, and its help
shows each option's default."""

import pytest

from yolo_bench import cli as bench_cli


@pytest.mark.parametrize('argv', [
    ['report', '/nonexistent/boot.csv'],
    ['run', '--test-image', '/nonexistent/image.qcow2'],
])
def test_a_missing_file_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert '/nonexistent/' in err and 'no such file' in err
    assert 'Traceback' not in err


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        bench_cli.main(['run', '--help'])
    assert '(default: 3)' in capsys.readouterr().out


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
