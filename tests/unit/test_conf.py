"""YOLO's options reach oslo-config-generator through the package's entry points."""

import pathlib
import subprocess
import sys


def test_config_generator_lists_scheduler_and_compute_options():
    generator = pathlib.Path(sys.executable).parent / 'oslo-config-generator'
    sample = subprocess.run([str(generator), '--namespace', 'yolo_nova'], check=True,
                            capture_output=True, text=True).stdout
    assert '[yolo]' in sample
    for option in ('max_boot_time_ratio', 'mount_point', 'download_dir', 'control_socket',
                   'install_timeout', 'fetch_boot_images', 'boot_time_alpha'):
        assert '#%s = ' % option in sample, option


def test_config_generator_lists_the_worker_options():
    generator = pathlib.Path(sys.executable).parent / 'oslo-config-generator'
    sample = subprocess.run([str(generator), '--namespace', 'yolo_glance'], check=True,
                            capture_output=True, text=True).stdout
    for group in ('[yolo_worker]', '[yolo_profiling]', '[glance]'):
        assert group in sample
    for option in ('max_concurrent_builds', 'notification_pool', 'scan_interval',
                   'ready_pattern', 'idle_seconds', 'max_seconds', 'endpoint_override'):
        assert '#%s = ' % option in sample, option
