"""``YoloLibvirtDriver``: Nova's libvirt driver with root disks backed by yolofs.

Load it with ``[DEFAULT] compute_driver = yolo.YoloLibvirtDriver`` (Nova loads drivers only from
``nova.virt``; the package installs the thin ``nova.virt.yolo`` module for that).

What it changes, and where (docs/nova-driver.md has the full list of Nova's paths):

* New qcow2 root disks over a ``_base`` file get their backing file on the yolofs mount, same
  name (image backend, :mod:`yolo_nova.virt.imagebackend`); the image's published boot image is
  fetched when the base file is cached and handed to yolofs, which verifies and installs it.
  With ``[yolo] first_boot_before_download``, a base file not cached yet is filled in the
  background while the guest boots from the boot image (:mod:`yolo_nova.virt.first_boot`).
* Every start of a guest (spawn, reboot, power on, host restart, resume, rescue, unrescue,
  resize, migration, evacuation) first points its disks at the mount if yolofs is healthy, or
  back at ``_base`` if not, and asks yolofs to preload the boot images: an instance always starts.
* Once a guest's boot is over, its disks move live from the mount to ``_base``
  (:mod:`yolo_nova.virt.detach`): a running guest never depends on yolofs after its boot.
* Host load, verified boot images and boot-time parameters go to the scheduler in the node's
  ``stats``; the parameters are learned from the guests spawned here, timed to their ready line
  (:mod:`yolo_nova.virt.host_report`). After the image cache manager's cleanups yolofs prunes
  its boot image store.
* Where Nova has no hook, :mod:`yolo_nova.virt.nova_patches` replaces a function of Nova's.
"""

import functools
import os
import types

from nova.compute import utils as compute_utils
from nova.compute import vm_states
import nova.conf
from nova import context as nova_context
from nova import exception
from nova import objects
from nova.virt.libvirt import driver as libvirt_driver
from nova.virt.libvirt import guest as libvirt_guest
from nova.virt.libvirt import utils as libvirt_utils
from oslo_log import log as logging
from oslo_utils import fileutils
import tenacity

from yolo_common import contract
from yolo_common import yolofs
from yolo_nova import conf as yolo_conf
from yolo_nova.model import locality
from yolo_nova.virt import backing
from yolo_nova.virt import boot_images
from yolo_nova.virt import detach
from yolo_nova.virt import first_boot
from yolo_nova.virt import fleet_reports
from yolo_nova.virt import host_report
from yolo_nova.virt import imagebackend
from yolo_nova.virt import nova_patches
from yolo_nova.virt import transfers
from yolo_nova.virt import warming

CONF = nova.conf.CONF
yolo_conf.register_opts(CONF)
LOG = logging.getLogger(__name__)


class YoloLibvirtDriver(libvirt_driver.LibvirtDriver):

    def __init__(self, virtapi, read_only=False):
        super().__init__(virtapi, read_only)
        base_dir = os.path.join(CONF.instances_path, CONF.image_cache.subdirectory_name)
        self.yolo_backing = backing.BackingFiles(
            base_dir, CONF.yolo.mount_point, CONF.yolo.control_socket,
            CONF.yolo.control_timeout, enabled=CONF.yolo.enabled)
        self.yolo_backing.transfers = transfers.Transfers(CONF.yolo.transfers_file)
        self.yolo_boot_images = boot_images.BootImages(
            self.yolo_backing,
            CONF.yolo.download_dir or os.path.join(CONF.instances_path, 'yolo-incoming'),
            fetch=CONF.yolo.fetch_boot_images, install_timeout=CONF.yolo.install_timeout,
            owner=CONF.yolo.boot_image_owner, max_bytes=CONF.yolo.max_boot_image_bytes,
            signing_keys=CONF.yolo.boot_image_signing_keys,
            version_check_interval=CONF.yolo.boot_image_version_check_interval)
        self.yolo_backing.boot_images = self.yolo_boot_images
        self.yolo_warmer = None
        warming_on = CONF.yolo.warm_budget_mb and CONF.yolo.fetch_boot_images
        # Beside the downloads, on their file system: a first boot links its boot image.
        warm_store = warming.WarmStore(os.path.join(self.yolo_boot_images.download_dir, 'warm'),
                                       CONF.yolo.warm_budget_mb << 20 if warming_on else 0)
        if not warming_on:
            # Warming turned off: what an earlier configuration held goes.
            warm_store.evict(frozenset())
        else:
            self.yolo_boot_images.warm_store = warm_store
            self.yolo_warmer = warming.Warmer(
                self.yolo_boot_images, self.yolo_boot_images.warm_store, self.yolo_backing,
                self._yolo_aggregates, CONF.yolo.warm_interval,
                before_download=CONF.yolo.first_boot_before_download)
        self.yolo_first_boots = None
        if CONF.yolo.first_boot_before_download and CONF.yolo.fetch_boot_images:
            # Nova's image backend takes its locks of base files there (Image.lock_path).
            self.yolo_first_boots = first_boot.FirstBoots(
                self.yolo_backing, self.yolo_boot_images,
                os.path.join(CONF.instances_path, 'locks'),
                paced_rate=CONF.yolo.first_boot_paced_rate_mib << 20,
                paced_seconds=CONF.yolo.first_boot_paced_seconds)
            self.yolo_backing.first_boots = self.yolo_first_boots
            self.yolo_first_boots.on_failed = self._yolo_fail_guests_of
            self.yolo_first_boots.on_mismatch = functools.partial(
                self._yolo_fail_guests_of, failure=BootImageMismatch)
            if not CONF.service_user.send_service_user_token:
                LOG.warning('[service_user] send_service_user_token is off: a fill that '
                            "outlasts the booting user's token loses its ranges (its reads "
                            'wait for the download in order)')
            if self.yolo_boot_images.verifier is None:
                LOG.warning('No first boot before a download: [yolo] boot_image_signing_keys '
                            'is empty, and only a boot image signed by the worker may be '
                            'served before its image is downloaded')
        self.image_backend = imagebackend.YoloBackend(
            CONF.use_cow_images, self.yolo_backing, self.yolo_boot_images,
            self.yolo_first_boots)
        nova_patches.install(self.yolo_backing)
        self.yolo_detacher = detach.Detacher(
            self.yolo_backing, self._yolo_guest, CONF.yolo.detach_settle_seconds,
            CONF.yolo.detach_max_seconds) if CONF.yolo.detach_after_boot else None
        self.yolo_report = host_report.HostReport(
            self._host, self._yolo_console, self.yolo_backing, self.yolo_boot_images,
            self.yolo_first_boots)
        self.yolo_boot_reporter = fleet_reports.BootReporter(
            self.yolo_backing, CONF.host, CONF.yolo.boot_report_topic, conf=CONF,
            transport_url=CONF.yolo.boot_report_transport_url,
        ) if CONF.yolo.boot_reports else None

    def init_host(self, host):
        serves_disks = yolo_serves_disks()
        if CONF.yolo.enabled and serves_disks and not CONF.force_raw_images:
            # Nova would keep qcow2 base files as downloaded, and a boot image is of an image's
            # raw data: no boot image would ever match a base file.
            raise exception.InvalidConfiguration(
                '[DEFAULT] force_raw_images = False: YOLO serves boot images of raw base files. '
                'Set it to True (Nova\'s default), or [yolo] enabled = False.')
        if CONF.yolo.enabled and not serves_disks:
            LOG.warning('[libvirt] images_type = %s (use_cow_images = %s): YOLO serves qcow2 '
                        'instance disks over _base only; this host boots without it and reports '
                        'yolo_active=false', CONF.libvirt.images_type, CONF.use_cow_images)
        super().init_host(host)
        if not serves_disks:
            return
        # Nova makes _base when it caches its first image, and yolofs waits for it; made now, the
        # mount is up before a new host's first boot, which can then start before its download.
        fileutils.ensure_tree(self.yolo_backing.base_dir)
        self.yolo_boot_images.remove_leftover_downloads()
        if self.yolo_first_boots is not None:
            try:
                abandoned = self.yolo_first_boots.abandon_leftovers()
                if abandoned:
                    self._yolo_fail_guests_over(abandoned)
            except Exception:
                LOG.exception('Could not look for the fill files of an earlier nova-compute')
        if self.yolo_detacher is None:
            return
        # Guests that were running while nova-compute was away: what an interrupted detach left
        # is settled with libvirt (and finished), guests still on the mount are watched again.
        for guest in self._host.list_guests(only_running=False):
            try:
                on_mount, on_interim = detach.settle_guest(
                    functools.partial(self._yolo_guest, guest.uuid), self.yolo_backing)
                if on_mount or on_interim:
                    self.yolo_detacher.watch(guest.uuid, on_mount, at_once=on_interim)
            except Exception:
                LOG.exception('Could not settle the detach of guest %s', guest.uuid)

    def _yolo_fail_guests_of(self, fill, failure=None):
        """A fill failed under guests started over it: as a failed download fails a normal
        boot, each is stopped (its disk's backing file is gone, its reads would fail) and its
        server put in ERROR with the reason. A build still under way fails by itself, its guest
        gone or its backing file missing, and Nova reschedules it: its server is put in ERROR
        only if its build nevertheless ends ACTIVE. ``failure``: the fault's class
        (FirstBootFailed; BootImageMismatch when the guests read bytes the image does not
        hold)."""
        context = nova_context.get_admin_context()
        failure = (failure or FirstBootFailed)(image_id=fill.image_id, reason=fill.reason)
        for disk in sorted(fill.disks):
            instance_uuid = os.path.basename(os.path.dirname(disk))
            guest = self._yolo_guest(instance_uuid)
            LOG.error('Stopping the guest of instance %s: %s', instance_uuid, failure)
            if guest is not None:
                try:
                    guest.poweroff()
                except Exception:
                    LOG.exception('Could not stop the guest of instance %s', instance_uuid)
            try:
                error_once_built(context, instance_uuid, failure)
            except Exception:
                LOG.exception('Could not put instance %s in ERROR', instance_uuid)

    def _yolo_fail_guests_over(self, names):
        """The running guests over base files ``names``, whose fills an earlier nova-compute
        left unfinished (deleted now: the guests' reads outside their boot images could only
        fail), are stopped and their servers put in ERROR, as after a failed fill."""
        context = nova_context.get_admin_context()
        for guest in self._host.list_guests(only_running=True):
            try:
                disks = {path for _, path, name in detach.disks_on_mount(
                    guest.get_xml_desc(), self.yolo_backing) if name in names}
                if disks:
                    image_id = objects.Instance.get_by_uuid(context, guest.uuid).image_ref
                    self._yolo_fail_guests_of(types.SimpleNamespace(
                        image_id=image_id, disks=disks,
                        reason='nova-compute restarted before the download ended'))
            except Exception:
                LOG.exception('Could not stop guest %s over an unfinished fill', guest.uuid)

    def _yolo_guest(self, instance_uuid):
        """The libvirt guest of an instance, None if it has none."""
        try:
            domain = self._host.get_connection().lookupByUUIDString(instance_uuid)
        except Exception:
            return None
        return libvirt_guest.Guest(domain)

    def spawn(self, context, instance, image_meta, injected_files, admin_password,
              allocations, network_info=None, block_device_info=None, power_on=True,
              accel_info=None):
        if self.yolo_boot_reporter is not None:
            # Which flavor the boots reported were (never in a spawn's way).
            self.yolo_boot_reporter.spawning(instance.image_ref, _flavor_name(instance))
        with self.yolo_report.spawning(instance, power_on):
            super().spawn(context, instance, image_meta, injected_files, admin_password,
                          allocations, network_info=network_info,
                          block_device_info=block_device_info, power_on=power_on,
                          accel_info=accel_info)

    def _yolo_console(self, instance):
        return self.get_console_output(nova_context.get_admin_context(), instance)

    # Every path that starts a guest goes through here.
    def _create_guest(self, context, xml, instance, power_on=True, pause=False,
                      post_xml_callback=None):
        with detach.lock(instance.uuid):
            on_mount = []
            if power_on or pause:
                on_mount = self._yolo_place_backing_files(xml, instance)
                # A domain XML saved from a running guest (unrescue's) names the backing chain it
                # had, the mount maybe: libvirt would open that rather than what the disks'
                # headers now say. Without it, libvirt reads the chain from the headers just
                # placed.
                xml = nova_patches.without_backing_stores(xml)
            guest = super()._create_guest(context, xml, instance, power_on=power_on,
                                          pause=pause, post_xml_callback=post_xml_callback)
        if on_mount and self.yolo_detacher is not None:
            self.yolo_detacher.watch(instance.uuid, on_mount)
        return guest

    # A soft reboot restarts QEMU on the same domain without _create_guest. If its disks need
    # yolofs and yolofs is down, decline it: Nova then hard reboots, which rebases them first.
    def _soft_reboot(self, instance):
        root = os.path.join(libvirt_utils.get_instance_path(instance), 'disk')
        if os.path.exists(root) and self.yolo_backing.uses_mount(root) \
                and not self.yolo_backing.yolofs_healthy():
            LOG.warning('yolofs is down: hard rebooting instead, from _base', instance=instance)
            return False
        return super()._soft_reboot(instance)

    def _yolo_place_backing_files(self, xml, instance):
        """Places the disks' backing files; returns the base names of those on the mount."""
        status = self.yolo_backing.status()
        healthy = status is not None
        on_mount = []
        for _, path, _ in detach.qcow2_file_disks(xml):
            # Not caught: a start over a disk that is not the guest's latest must not happen.
            detach.recover(path)
            try:
                placed = self.yolo_backing.place(path, healthy)
            except Exception:
                # The guest start that follows reports the real problem, if there is one.
                LOG.exception('Could not set the backing file of %s', path, instance=instance)
                continue
            if healthy and placed and self.yolo_backing.directory_of(placed) == 'mount':
                on_mount.append(os.path.basename(placed))
                self._yolo_preload(os.path.basename(placed), status, instance)
        return on_mount

    def _yolo_preload(self, name, status, instance):
        # A base file being filled is served from the fill's boot image, in memory already.
        if self.yolo_first_boots is not None and self.yolo_first_boots.running(name):
            return
        if not self.yolo_boot_images.has_boot_image(name, status):
            return
        try:
            answer = self.yolo_backing.client.preload(name)
            LOG.debug('yolofs preloaded %s: %s', name, answer, instance=instance)
        except (OSError, ValueError, yolofs.YolofsError) as e:
            LOG.warning('yolofs could not preload the boot image of %s: %s', name, e,
                        instance=instance)

    # Unshelve and cross-cell resize: Nova rebases the disk from the snapshot onto the original
    # image's base file in _base, a safe rebase that reads the old backing file: that one must
    # be _base's too, in case yolofs is down. Then the disk is placed like any other. Nova calls
    # this at every spawn: any other disk is left where it is (over a base file being filled,
    # _base would mean waiting for the fill).
    def _rebase_original_qcow2_image(self, context, instance, backend):
        if not os.path.exists(backend.path) \
                or not self._needs_rebase_original_qcow2_image(instance, backend):
            return super()._rebase_original_qcow2_image(context, instance, backend)
        with self.yolo_backing.on_base(backend.path):
            super()._rebase_original_qcow2_image(context, instance, backend)

    # Live migration with a shared instance path: the running guest's disk keeps its header, so
    # if it is backed by the mount, the destination's yolofs must serve it (the header cannot be
    # rewritten under the running source guest). Checked on the destination before the
    # migration is chosen, where the conductor can still pick another host; and again just
    # before it starts, in case yolofs went down since. Without shared storage the destination
    # disk is created here and placed by this host's health, as at any start.
    def check_can_live_migrate_destination(self, context, instance, src_compute_info,
                                           dst_compute_info, block_migration=False,
                                           disk_over_commit=False):
        data = super().check_can_live_migrate_destination(
            context, instance, src_compute_info, dst_compute_info,
            block_migration=block_migration, disk_over_commit=disk_over_commit)
        try:
            self._yolo_check_shared_disk_is_served(instance)
        except exception.MigrationPreCheckError:
            self.cleanup_live_migration_destination_check(context, data)
            raise
        return data

    def pre_live_migration(self, context, instance, block_device_info, network_info,
                           disk_info, migrate_data):
        if migrate_data.is_shared_instance_path:
            self._yolo_check_shared_disk_is_served(instance)
        return super().pre_live_migration(context, instance, block_device_info, network_info,
                                          disk_info, migrate_data)

    # A guest that arrived by live migration did not start here: its disks may be on this
    # host's mount (created by the yolo backend, or shared with a source where it was). It is
    # detached as a booted guest is, at once: it is not booting.
    def post_live_migration_at_destination(self, context, instance, network_info,
                                           block_migration=False, block_device_info=None):
        super().post_live_migration_at_destination(
            context, instance, network_info, block_migration=block_migration,
            block_device_info=block_device_info)
        if self.yolo_detacher is None:
            return
        try:
            on_mount, on_interim = detach.settle_guest(
                functools.partial(self._yolo_guest, instance.uuid), self.yolo_backing)
        except Exception:
            LOG.exception('Could not read the disks of the migrated guest', instance=instance)
            return
        if on_mount or on_interim:
            self.yolo_detacher.watch(instance.uuid, on_mount, at_once=True)

    def _yolo_settle_detach(self, instance, moving):
        """Before Nova stops or moves a guest: what a detach left is settled while libvirt
        still knows where the running guest is (after Nova's destroy the next start could only
        guess); a guest that leaves this host (``moving``) must be on its own disks, not on an
        interim file Nova would not carry with its mark (a stopped one's are recovered)."""
        if self.yolo_detacher is None:
            return
        guest = self._yolo_guest(instance.uuid)
        if guest is None:
            return
        lookup = functools.partial(self._yolo_guest, instance.uuid)
        if guest.is_active():
            _, on_interim = detach.settle_guest(lookup, self.yolo_backing)
            if moving and on_interim:
                try:
                    self.yolo_detacher.detach(instance.uuid)
                except detach.DetachFailed as e:
                    raise exception.InstanceFaultRollback(
                        inner_exception=exception.NovaException(
                            'its disk could not be moved back from its detach: %s' % e))
        elif moving:
            for _, path, _ in detach.qcow2_file_disks(guest.get_xml_desc(dump_inactive=True)):
                detach.recover(detach.disk_of(path))

    def _yolo_check_shared_disk_is_served(self, instance):
        """MigrationPreCheckError if the instance's disk, seen from this host (so on storage
        shared with its source), is backed by the mount and this host's yolofs does not serve."""
        root = os.path.join(libvirt_utils.get_instance_path(instance), 'disk')
        if os.path.exists(root) and self.yolo_backing.uses_mount(root) \
                and not self.yolo_backing.yolofs_healthy():
            raise exception.MigrationPreCheckError(
                reason='the instance disk is backed by yolofs, which is %s on this host (%s)' % (
                    'not healthy' if CONF.yolo.enabled else 'disabled', CONF.yolo.mount_point))

    def cache_image(self, context, image_id):
        """Nova's caching of an image by request (``openstack aggregate cache image``, API
        2.81), and the image's boot image with it: a host warmed so boots the image from a
        verified boot image from its first boot on. Nova sets the times of a base file it holds
        already, which would have yolofs verify its boot image again: yolofs sets them."""
        name = locality.base_file_name(image_id)
        if not (yolo_serves_disks() and self.yolo_backing.status() is not None):
            return super().cache_image(context, image_id)
        if self.yolo_first_boots is not None and self.yolo_first_boots.running(name):
            # A first boot's fill is making the base file, under Nova's lock of it, which
            # Nova's caching does not take: the fill installs the boot image as it ends.
            LOG.info('Image %s is being filled by a first boot: not cached again', image_id)
            return False
        cached = False
        try:
            self.yolo_backing.client.touch(name)
            LOG.info('Image %s already cached; yolofs updated its timestamp', image_id)
        except (OSError, ValueError, yolofs.YolofsError):
            cached = super().cache_image(context, image_id)
        outcome = self.yolo_boot_images.ensure(context, image_id,
                                               self.yolo_backing.base_path(name))
        LOG.info('Boot image of image %s, cached by request: %s', image_id, outcome)
        return cached

    def manage_image_cache(self, context, all_instances):
        super().manage_image_cache(context, all_instances)
        self.yolo_boot_images.prune()

    def get_available_resource(self, nodename):
        data = super().get_available_resource(nodename)
        try:
            yolo_stats = (self.yolo_report.stats(data) if yolo_serves_disks()
                          else {'yolo_active': 'false'})
        except Exception:
            # The resource tracker's periodic task must never fail because of YOLO: the host
            # then schedules as one without it.
            LOG.exception('Reporting yolo_active=false: YOLO stats could not be computed')
            yolo_stats = {'yolo_active': 'false'}
        data['stats'] = dict(data.get('stats') or {}, **yolo_stats)
        if self.yolo_warmer is not None and yolo_stats.get('yolo_active') == 'true':
            self.yolo_warmer.maybe_run()
        if self.yolo_boot_reporter is not None and yolo_stats.get('yolo_active') == 'true':
            self._yolo_send_boot_reports()
        return data

    def _yolo_send_boot_reports(self):
        """What this host's boots read outside their boot images, to the worker
        (virt/fleet_reports.py); never fails the periodic task."""
        try:
            status = self.yolo_backing.status()
            if status is not None:
                self.yolo_boot_reporter.send_new(status)
        except Exception:
            LOG.exception('Could not send boot reports')

    @staticmethod
    def _yolo_aggregates():
        """The uuids of this host's aggregates (through the conductor)."""
        return [aggregate.uuid for aggregate in objects.AggregateList.get_by_host(
            nova_context.get_admin_context(), CONF.host)]

    def update_provider_tree(self, provider_tree, nodename, allocations=None):
        super().update_provider_tree(provider_tree, nodename, allocations=allocations)
        # What keeps boot images verified across touches here, for operators
        # (`openstack yolo host list`): one trait, none while yolofs is down.
        traits = {t for t in provider_tree.data(nodename).traits
                  if not t.startswith(contract.TOUCH_SAFETY_TRAIT_PREFIX)}
        status = self.yolo_backing.status()
        mechanism = status.touch_safety if status is not None else None
        if mechanism in contract.TOUCH_SAFETY_MECHANISMS:
            traits.add(contract.touch_safety_trait(mechanism))
        # The images warm where this host is that it holds (`openstack yolo image list`).
        traits = {t for t in traits if not t.startswith(contract.WARM_TRAIT_PREFIX)}
        if self.yolo_warmer is not None and status is not None:
            try:
                traits |= {warming.warm_trait(image_id)
                           for image_id in self.yolo_warmer.held_warm(status)}
            except Exception:
                LOG.exception('Not reporting the warm images held here')
        provider_tree.update_traits(nodename, traits)


def serialized_with_detach(name, settle=None):
    """Nova's driver method ``name``, run under the instance's detach lock (see detach.lock);
    ``settle``: 'stop' or 'move' if it stops or moves the guest (_yolo_settle_detach first)."""
    @functools.wraps(getattr(libvirt_driver.LibvirtDriver, name))
    def wrapped(self, *args, **kwargs):
        method = getattr(libvirt_driver.LibvirtDriver, name)
        instance = kwargs.get('instance')
        if instance is None:
            instance = next(a for a in args if hasattr(a, 'uuid') and hasattr(a, 'image_ref'))
        with detach.lock(instance.uuid):
            if settle == 'move':
                self._yolo_settle_detach(instance, moving=True)
            elif settle:
                # Never in the way of stopping a guest: the next start settles it then.
                try:
                    self._yolo_settle_detach(instance, moving=False)
                except Exception:
                    LOG.exception('Could not settle the detach of the guest before it stops',
                                  instance=instance)
            return method(self, *args, **kwargs)
    return wrapped


# Nova's operations on a guest's disks and domain: none runs while a detach copies its disks;
# those that stop or move the guest settle what a detach left first.
SERIALIZED_WITH_DETACH = {
    'snapshot': None, 'reboot': 'stop', 'power_off': 'stop', 'power_on': None,
    'destroy': 'stop', 'rescue': 'stop', 'unrescue': None, 'suspend': 'stop', 'resume': None,
    'pause': None, 'unpause': None, 'live_migration': 'move',
    'migrate_disk_and_power_off': 'move', 'attach_volume': None, 'detach_volume': None,
    'swap_volume': None, 'volume_snapshot_create': None, 'volume_snapshot_delete': None}
for _name, _settle in SERIALIZED_WITH_DETACH.items():
    setattr(YoloLibvirtDriver, _name, serialized_with_detach(_name, _settle))


def yolo_serves_disks():
    """Whether this host's instance disks are qcow2 overlays of base files in ``_base``,
    the only disks YOLO serves: not rbd, lvm, flat/raw or ploop ones."""
    images_type = CONF.libvirt.images_type
    return images_type == 'qcow2' or (images_type == 'default' and CONF.use_cow_images)


def _flavor_name(instance):
    """The spawn's flavor name, or None where the instance was given none (the flavor
    object loads nothing lazily, and a report never stands in a spawn's way)."""
    flavor = instance.flavor if instance.obj_attr_is_set('flavor') else None
    if flavor is None or not flavor.obj_attr_is_set('name'):
        return None
    return flavor.name


class FirstBootFailed(exception.NovaException):
    msg_fmt = ('The download of image %(image_id)s failed after the server had started: '
               '%(reason)s')


class BootImageMismatch(exception.NovaException):
    msg_fmt = ('The server was stopped: it booted from data that image %(image_id)s does not '
               'hold (%(reason)s)')


@tenacity.retry(retry=tenacity.retry_if_result(lambda built: built is None),
                wait=tenacity.wait_fixed(5), stop=tenacity.stop_after_delay(300),
                retry_error_callback=lambda state: False)
def error_once_built(context, instance_uuid, failure):
    """Puts the instance in ERROR with ``failure`` as its fault once its build on this host
    is over, if it ended ACTIVE here; whether it did (None: still building)."""
    try:
        instance = objects.Instance.get_by_uuid(context, instance_uuid)
    except exception.InstanceNotFound:
        return False
    if instance.vm_state == vm_states.BUILDING and instance.host == CONF.host:
        return None
    if instance.vm_state != vm_states.ACTIVE or instance.host != CONF.host:
        return False
    instance.vm_state = vm_states.ERROR
    instance.task_state = None
    instance.save()
    compute_utils.add_instance_fault_from_exc(context, instance, failure)
    return True
