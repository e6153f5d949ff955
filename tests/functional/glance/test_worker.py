"""The worker's decisions: what it skips, retries, repeats, deletes.

Glance is an in-memory fake here (tests/functional/glance/fakes.py) and the profiling boot is
replaced by a fixed trace (tests/functional/test_glance_worker.py uses the real Glance API and
real boots); downloads, format checks, the qemu-img conversion and every yolofs step are real.
"""

import copy
import datetime
import hashlib
import os
import re
import socket
import subprocess
import threading
from unittest import mock

import pytest

from tests.functional.glance.fakes import fake_learner
from tests.functional.glance.fakes import MiB
from tests.functional.glance.fakes import publish_signed
from tests.functional.glance.fakes import raw_disk
from yolo_common import contract
from yolo_common import images
from yolo_common import learning
from yolo_common import signing
from yolo_common import yolofs
from yolo_glance import glance as glance_api
from yolo_glance import sandbox as sandbox_mod
from yolo_glance import service
from yolo_glance import worker as worker_mod
from yolo_testing.wait import wait as wait_until


def raw_of(glance, image_id, tmp_path):
    raw = tmp_path / 'check.raw'
    subprocess.run(['qemu-img', 'convert', '-O', 'raw', '-f', glance.images[image_id][
        'disk_format'], str(glance.images[image_id]['file']), str(raw)], check=True)
    return raw


def test_builds_publishes_and_links_a_verified_boot_image(glance, make_worker, tmp_path):
    source = glance.add(raw_disk(), os_hash_algo='sha512', os_hash_value='ab' * 64)
    worker = make_worker()
    assert worker.build(source) == 'ready'
    image = glance.images[source]
    assert image[glance_api.STATUS] == 'ready'
    assert glance_api.CLAIM not in image and glance_api.REASON not in image
    boot_image = glance.images[image[glance_api.BOOT_IMAGE_ID]]
    assert boot_image[glance_api.SOURCE_IMAGE_ID] == source
    assert boot_image['os_hidden'] is True and boot_image['container_format'] == 'yolo'
    assert int(boot_image['yolo_covered_bytes']) == 65536 + 8192
    assert float(boot_image['yolo_coverage']) == pytest.approx(73728 / (4 * MiB), abs=1e-4)
    assert boot_image['yolo_window_ended_by'] == 'ready'
    # Every measurement openstack yolo shows, under the names on the wire.
    for name in ('yolo_boot_image_bytes', 'yolo_source_raw_size', 'yolo_boot_seconds',
                 'yolo_build_seconds'):
        assert float(boot_image[name]) >= 0, name
    # It verifies against the raw conversion of the source, and carries its identity.
    yolofs.run('verify', boot_image['file'], raw_of(glance, source, tmp_path))
    info = yolofs.run('inspect', '--json', boot_image['file']).stdout
    assert source in info and 'sha512:' + 'ab' * 64 in info
    # The profiling boot got the configured window.
    assert worker.learner.calls[0]['boot_timeout'] == 600.0
    assert worker.learner.calls[0]['idle_seconds'] == 30.0
    assert worker.learner.calls[0]['ready_marker'].pattern == b'login:'
    assert not (tmp_path / 'work' / source).exists()


def test_building_again_changes_nothing(glance, make_worker):
    source = glance.add(raw_disk())
    worker = make_worker()
    worker.build(source)
    before = copy.deepcopy(glance.images)
    assert worker.build(source) == 'present'
    assert glance.images == before
    assert glance.downloads == 1
    assert not worker.needs_build(glance.get(source))


def test_qcow2_images_are_converted_to_raw_first(glance, make_worker, tmp_path):
    raw = tmp_path / 'disk.raw'
    raw.write_bytes(raw_disk())
    qcow2 = tmp_path / 'disk.qcow2'
    subprocess.run(['qemu-img', 'convert', '-O', 'qcow2', str(raw), str(qcow2)], check=True)
    source = glance.add(qcow2.read_bytes(), disk_format='qcow2')
    assert make_worker().build(source) == 'ready'
    boot_image = glance.images[glance.images[source][glance_api.BOOT_IMAGE_ID]]
    yolofs.run('verify', boot_image['file'], raw)


@pytest.mark.parametrize('fields, reason', [
    ({'disk_format': 'aki', 'container_format': 'aki'}, 'kernel or ramdisk'),
    ({'disk_format': 'ari', 'container_format': 'ari'}, 'kernel or ramdisk'),
    ({'disk_format': 'iso'}, 'ISO'),
    ({'disk_format': 'ploop'}, "disk format 'ploop'"),
    ({'container_format': 'docker'}, "container format 'docker'"),
    ({'kernel_id': 'k1'}, 'separate kernel'),
    ({'size': 0}, 'empty image'),
])
def test_unbootable_images_are_skipped_with_a_reason(glance, make_worker, fields, reason):
    source = glance.add(raw_disk(), **fields)
    before = copy.deepcopy(glance.images[source])
    worker = make_worker()
    assert worker.build(source) == 'skipped'
    image = glance.images[source]
    assert image[glance_api.STATUS] == 'skipped'
    assert reason in image[glance_api.REASON]
    # Nothing but the two status properties changed, and nothing was published or downloaded.
    assert {k: v for k, v in image.items() if not k.startswith('yolo_')} == before
    assert len(glance.images) == 1 and glance.downloads == 0
    assert not worker.needs_build(glance.get(source))


def test_boot_images_themselves_are_ignored(glance, make_worker):
    boot_image = glance.add(b'x', container_format='yolo', os_hidden=True,
                            **{glance_api.SOURCE_IMAGE_ID: 'img-9'})
    assert make_worker().build(boot_image) == 'ignored'
    assert glance_api.STATUS not in glance.images[boot_image]


def test_corrupt_upload_fails_with_a_reason_and_touches_nothing_else(glance, make_worker):
    source = glance.add(raw_disk(), disk_format='qcow2')   # says qcow2, is not
    assert make_worker().build(source) == 'failed'
    image = glance.images[source]
    assert 'not the declared qcow2' in image[glance_api.REASON]
    assert image['status'] == 'active' and len(glance.images) == 1
    assert glance.images[source]['file'].read_bytes() == raw_disk()


def test_unsafe_qcow2_is_refused(glance, make_worker, tmp_path):
    qcow2 = tmp_path / 'backed.qcow2'
    subprocess.run(['qemu-img', 'create', '-f', 'qcow2', '-F', 'raw', '-b', '/etc/passwd',
                    str(qcow2)], check=True, capture_output=True)
    source = glance.add(qcow2.read_bytes(), disk_format='qcow2')
    assert make_worker().build(source) == 'failed'
    assert 'safety check' in glance.images[source][glance_api.REASON]


def test_a_boot_that_teaches_nothing_fails_with_its_reason(glance, make_worker, caplog):
    source = glance.add(raw_disk())
    learner = mock.Mock(side_effect=learning.LearningFailed(
        "QEMU exited with 1 before the guest was ready; console tail: 'Booting'",
        'qemu-system-x86_64: /var/lib/yolo/worker/job/disk.raw: Permission denied'))
    worker = make_worker(learner=learner)
    assert worker.build(source) == 'failed'
    # The owner reads what its guest did; what QEMU said (the worker's paths) is in the log.
    assert glance.images[source][glance_api.REASON] == (
        "QEMU exited with 1 before the guest was ready; console tail: 'Booting'")
    assert 'QEMU said: qemu-system-x86_64: /var/lib/yolo/worker/job/disk.raw' in caplog.text
    learner.assert_called_once()  # not retried: it would fail the same way
    # Its learning mount runs the yolofs the worker is configured with, as its builds do.
    assert learner.call_args.kwargs['yolofs_binary'] == worker.yolofs_binary
    assert worker.metrics.registry.get_sample_value(
        'yolo_worker_builds_refused_total', {'reason': 'not_bootable'}) == 1


def test_transient_errors_are_retried(glance, make_worker):
    source = glance.add(raw_disk())
    glance.fail_downloads = 2
    assert make_worker(retries=2).build(source) == 'ready'
    assert glance.downloads == 3


def test_gives_up_after_the_retries(glance, make_worker):
    source = glance.add(raw_disk())
    glance.fail_downloads = 10
    assert make_worker(retries=1).build(source) == 'failed'
    assert glance.downloads == 2
    # The owner reads the reason: no exception text (URLs, paths), which the log has.
    assert glance.images[source][glance_api.REASON] == (
        'gave up after 2 attempts: the worker met a transient error (its log says which)')


def test_image_deleted_mid_build_leaves_nothing_behind(glance, make_worker):
    source = glance.add(raw_disk())
    learner = fake_learner()

    def deleting_learner(base, work, **options):
        glance.delete(source)
        return learner(base, work, **options)
    assert make_worker(learner=deleting_learner).build(source) == 'gone'
    assert glance.images == {}


def test_a_fresh_claim_is_respected_a_stale_one_taken_over(glance, make_worker):
    source = glance.add(raw_disk(), **{glance_api.STATUS: 'building',
                                       glance_api.CLAIM: 'w2 1000'})
    assert make_worker(clock=lambda: 1000 + 60).build(source) == 'claimed'
    assert glance.downloads == 0
    assert make_worker(clock=lambda: 1000 + 7201).build(source) == 'ready'


def test_a_claim_names_no_host_and_no_process(glance, make_worker):
    # The claim is tenant-readable: an opaque id per worker, its host and pid in its log only.
    source = glance.add(raw_disk())
    claims = []
    real_set_properties = glance.set_properties

    def set_properties(image_id, remove=(), **properties):
        claims.append(properties.get(glance_api.CLAIM))
        return real_set_properties(image_id, remove=remove, **properties)
    glance.set_properties = set_properties
    worker = make_worker(worker_id=None)
    assert worker.build(source) == 'ready'
    claim = next(c for c in claims if c)
    assert re.fullmatch(r'worker-[0-9a-f]{12} \d+', claim), claim
    assert socket.gethostname() not in claim and str(os.getpid()) not in claim.split()[0]


def test_racing_workers_converge_on_one_boot_image(glance, make_worker, signer):
    source = glance.add(raw_disk())
    # Another worker published first (an older image) while this one was booting.
    earlier = publish_signed(glance, signer, source, created_at='2000-01-01T00:00:00')
    assert make_worker().build(source) == 'present'
    assert glance.images[source][glance_api.BOOT_IMAGE_ID] == earlier
    assert [i['id'] for i in glance.boot_images_of(source, 'yolo')] == [earlier]


def test_boot_images_the_workers_key_did_not_sign_are_deleted_however_old(
        glance, make_worker, signer):
    source = glance.add(raw_disk())
    # Planted in the worker's project before the build (by Nova's service user, say): one
    # unsigned, one signed with another key, one with the signature of other data.
    planted = [
        glance.add(b'planted', container_format='yolo', os_hidden=True,
                   created_at='2000-01-01T00:00:00', **{glance_api.SOURCE_IMAGE_ID: source}),
        publish_signed(glance, signing.Signer.generate(), source,
                       created_at='2000-01-01T00:00:01'),
        publish_signed(glance, signer, source, created_at='2000-01-01T00:00:02')]
    glance.images[planted[2]].update(os_hash_value=hashlib.sha512(b'x').hexdigest())
    # Linked from the source too: not "present" for that.
    glance.set_properties(source, **{glance_api.BOOT_IMAGE_ID: planted[0]})
    worker = make_worker()
    assert worker.build(source) == 'ready'
    kept = glance.images[source][glance_api.BOOT_IMAGE_ID]
    assert kept not in planted
    assert [i['id'] for i in glance.boot_images_of(source, 'yolo')] == [kept]
    boot_image = glance.images[kept]
    assert signer.verifier().verify(boot_image[contract.SIGNATURE], source, 'sha512',
                                    hashlib.sha512(boot_image['file'].read_bytes()).hexdigest())


def test_a_young_unsigned_boot_image_may_be_another_workers_and_is_left_for_now(
        glance, make_worker):
    source = glance.add(raw_disk())
    now = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')
    being_signed = glance.add(b'another worker\'s', container_format='yolo', os_hidden=True,
                              created_at=now, **{glance_api.SOURCE_IMAGE_ID: source})
    assert make_worker().build(source) == 'ready'
    assert being_signed in glance.images


def test_boot_images_that_no_longer_count_are_built_again_by_the_scan(
        glance, make_worker, signer):
    """A boot image a compute host rejected, and one published unsigned (before the worker had
    its key): the periodic scan builds a new one, the old one goes."""
    rejected, unsigned = glance.add(raw_disk()), glance.add(raw_disk())
    assert make_worker().build(rejected) == 'ready'
    assert make_worker(signer=None).build(unsigned) == 'ready'
    old = {source: glance.images[source][glance_api.BOOT_IMAGE_ID]
           for source in (rejected, unsigned)}
    glance.set_properties(old[rejected], **{contract.REJECTED: 'compute-1 2026-11-28: mismatch'})
    dispatcher = service.Dispatcher(make_worker(), glance)
    assert sorted(dispatcher.scan()) == sorted([rejected, unsigned])
    for source in (rejected, unsigned):
        wait_until('a new boot image of %s' % source, 60, lambda: glance.images[source].get(
            glance_api.BOOT_IMAGE_ID) not in (old[source], None), interval=0.1)
        assert old[source] not in glance.images
    assert dispatcher.scan() == []
    dispatcher.shutdown()


@pytest.mark.parametrize('glance_algorithm', ['sha512', 'sha256'])
def test_a_boot_image_is_signed_from_its_creation(glance, make_worker, signer, glance_algorithm):
    """Never active unsigned: a scan (another worker's) would delete it as planted. Signed over
    the digest Glance computes, with the algorithm Glance used for the source; signed again if
    Glance uses another for the boot image (a changed hashing_algorithm)."""
    source = glance.add(raw_disk())
    created = []
    publish = glance.publish

    def publish_and_see(source_image, path, container_format, properties):
        created.append(dict(properties))
        glance.add = add_with(glance_algorithm)
        try:
            return publish(source_image, path, container_format, properties)
        finally:
            del glance.add

    def add_with(algorithm):
        add = type(glance).add.__get__(glance)
        return lambda data=None, **fields: add(data, os_hash_algo=algorithm, os_hash_value=(
            hashlib.new(algorithm, data).hexdigest()), **fields)

    glance.publish = publish_and_see
    assert make_worker().build(source) == 'ready'
    boot_image = glance.images[glance.images[source][glance_api.BOOT_IMAGE_ID]]
    data = boot_image['file'].read_bytes()
    assert signer.verifier().verify(created[0][contract.SIGNATURE], source, 'sha512',
                                    hashlib.sha512(data).hexdigest())
    assert signer.verifier().verify(boot_image[contract.SIGNATURE], source, glance_algorithm,
                                    hashlib.new(glance_algorithm, data).hexdigest())


def test_without_a_key_boot_images_are_published_unsigned(glance, make_worker):
    source = glance.add(raw_disk())
    assert make_worker(signer=None).build(source) == 'ready'
    assert contract.SIGNATURE not in glance.images[glance.images[source][
        glance_api.BOOT_IMAGE_ID]]


def test_deleting_the_source_deletes_its_boot_images(glance, make_worker):
    source = glance.add(raw_disk())
    other = glance.add(raw_disk())
    worker = make_worker()
    worker.build(source)
    worker.build(other)
    glance.delete(source)
    assert worker.delete(source) == 1
    assert glance.boot_images_of(source, 'yolo') == []
    assert len(glance.boot_images_of(other, 'yolo')) == 1


def test_per_image_profiling_overrides(glance, make_worker):
    source = glance.add(raw_disk(), min_ram=2048, **{
        worker_mod.READY_PATTERN_PROPERTY: 'Welcome', worker_mod.IDLE_PROPERTY: '5',
        worker_mod.MAX_PROPERTY: '120'})
    worker = make_worker()
    worker.build(source)
    call = worker.learner.calls[0]
    assert call['ready_marker'].pattern == b'Welcome'
    assert (call['idle_seconds'], call['boot_timeout'], call['memory_mib']) == (5.0, 120.0, 2048)


def test_profiling_boots_have_no_network_and_run_sandboxed(glance, make_worker):
    worker = make_worker()
    worker.build(glance.add(raw_disk()))
    call = worker.learner.calls[0]
    assert call['network'] is False
    assert call['extra_args'][0] == '-sandbox' and call['extra_args'][1].startswith('on,')
    assert '-nodefaults' in call['extra_args']
    # QEMU runs in the worker's sandbox, with the boot's memory and window as its limits.
    assert call['sandbox'].memory_bytes == (1024 << 20) + sandbox_mod.QEMU_OVERHEAD_BYTES
    assert call['sandbox'].devices == ()
    unboxed = make_worker(sandboxed=False)
    assert unboxed.build(glance.add(raw_disk())) == 'ready'
    assert unboxed.learner.calls[0]['sandbox'] is None


@pytest.mark.parametrize('value, has_port', [
    ('yes', True), ('True', True), ('no', False), (None, False)])
def test_profiling_boots_have_the_guest_agent_port_nova_gives(
        glance, make_worker, value, has_port):
    worker = make_worker()
    worker.build(glance.add(raw_disk(), **({'hw_qemu_guest_agent': value} if value else {})))
    extra_args = worker.learner.calls[0]['extra_args']
    assert extra_args[:2] == worker_mod.SANDBOX
    port = 'virtserialport,chardev=yolo-qga,name=org.qemu.guest_agent.0'
    assert (port in extra_args) is has_port
    # Nothing but the agent's port: no other chardev, no network.
    assert ('-nic' in extra_args, extra_args.count('-chardev')) == (False, int(has_port))


def test_per_image_overrides_stay_within_the_operators_maxima(glance, make_worker):
    source = glance.add(raw_disk(), min_ram=1 << 20, **{
        worker_mod.IDLE_PROPERTY: '0', worker_mod.MAX_PROPERTY: '1e9'})
    worker = make_worker(profiling=worker_mod.ProfilingOptions(
        'login:', 30.0, 600.0, max_memory_mib=2048))
    worker.build(source)
    call = worker.learner.calls[0]
    assert (call['idle_seconds'], call['boot_timeout'], call['memory_mib']) == (1.0, 600.0, 2048)


def test_an_unreadable_override_is_ignored(glance, make_worker):
    worker = make_worker()
    worker.build(glance.add(raw_disk(), **{worker_mod.MAX_PROPERTY: 'forever'}))
    assert worker.learner.calls[0]['boot_timeout'] == 600.0


def test_ready_patterns_cannot_backtrack_for_ever(glance, make_worker):
    # (a+)+$ takes exponential time in a backtracking matcher on a's followed by another
    # character; RE2 answers in linear time.
    options = worker_mod.ProfilingOptions('(a+)+$', 30.0, 600.0)
    assert options.compiled_pattern().search(b'a' * 100000 + b'!') is None
    with pytest.raises(worker_mod.Unbootable, match='longer than'):
        worker_mod.ProfilingOptions('a' * 1000, 30.0, 600.0).compiled_pattern()


def test_without_re2_an_images_pattern_is_plain_text(monkeypatch):
    monkeypatch.setattr(worker_mod, 're2', None)
    image = worker_mod.ProfilingOptions('login:', 30.0, 600.0).for_image(
        {worker_mod.READY_PATTERN_PROPERTY: '(a+)+$'})
    assert image.compiled_pattern().search(b'a' * 100000 + b'!') is None
    assert image.compiled_pattern().search(b'booted (a+)+$') is not None
    # The operator's own pattern stays a pattern.
    assert worker_mod.ProfilingOptions('log(in)?:', 30.0, 600.0).compiled_pattern().search(
        b'login:')


def test_a_bad_ready_pattern_is_a_recorded_failure(glance, make_worker):
    source = glance.add(raw_disk(), **{worker_mod.READY_PATTERN_PROPERTY: '('})
    assert make_worker().build(source) == 'failed'
    assert 'bad ready pattern' in glance.images[source][glance_api.REASON]


def test_scan_queues_only_what_needs_work(glance, make_worker):
    todo = glance.add(raw_disk())
    glance.add(raw_disk(), **{glance_api.STATUS: 'skipped'})
    glance.add(raw_disk(), **{glance_api.STATUS: 'failed'})
    glance.add(raw_disk(), status='queued')
    glance.add(b'x', container_format='yolo', **{glance_api.SOURCE_IMAGE_ID: todo})
    dispatcher = service.Dispatcher(make_worker(), glance)
    assert dispatcher.scan() == [todo]
    wait_until('the build queued', 60,
               lambda: glance.images[todo].get(glance_api.STATUS) == 'ready', interval=0.1)
    dispatcher.shutdown()
    assert glance.images[todo][glance_api.STATUS] == 'ready'


def test_the_worker_converts_uploads_under_its_limits(glance, make_worker, tmp_path):
    source = glance.add(raw_disk())
    with mock.patch.object(images, 'convert_to_raw', wraps=images.convert_to_raw) as convert:
        make_worker().build(source)
    limits = convert.call_args.kwargs['limits']
    assert (limits.address_space, limits.cpu_time, limits.stack_size) == (
        1 << 30, 1800, 2 << 20)
    # No file it writes may outgrow the disk: the raw image's 4 MiB.
    assert limits.file_size == 4 * MiB


def test_shutdown_lets_running_builds_finish_and_drops_queued_ones(glance, make_worker):
    worker = make_worker()
    started = threading.Event()
    finish = threading.Event()
    built = []

    def slow_build(image_id):
        started.set()
        finish.wait(30)
        built.append(image_id)
        return 'built'
    worker.build = slow_build
    dispatcher = service.Dispatcher(worker, glance)
    running = dispatcher.build('img-1')
    queued = dispatcher.build('img-2')
    assert started.wait(10)
    threading.Timer(0.5, finish.set).start()
    dispatcher.shutdown(wait=True)
    assert running.result(0) == 'built' and queued.cancelled() and built == ['img-1']
