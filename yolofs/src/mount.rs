//! `yolofs mount`: the daemon. It makes the mount (or takes over the one a keeper passed on),
//! starts the store, the recorder, the FUSE session, the source watcher and the metrics and
//! control servers, then waits for a signal: SIGTERM or SIGINT unmount, SIGHUP under a keeper
//! hands the mount over to the next yolofs.

use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use log::{info, warn};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use yolofs::control::{self, Daemon, SocketAccess};
use yolofs::fs::MirrorFs;
use yolofs::fuse::FuseAdapter;
use yolofs::hostload::HostLoadSampler;
use yolofs::keeper;
use yolofs::lease;
use yolofs::pin;
use yolofs::recorder::{RecordConfig, Recorder};
use yolofs::stats::StatsRegistry;
use yolofs::store::{self, BootImageStore, StoreConfig};

use crate::cli::MountArgs;

/// Runs the mount until SIGTERM or SIGINT, in the steps below.
pub fn mount(args: MountArgs) -> Result<()> {
    // Bad arguments fail at once, before any wait.
    let socket_access = socket_access(&args)?;
    // SIGHUP asks a running yolofs to hand its mount over; until this one runs, it is ignored
    // (its default would end the process, and with it a mount not yet handed to the keeper).
    // SAFETY: SIG_IGN is a valid disposition; no handler of ours is replaced.
    unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
    let source = wait_for_source(&args.source)?;
    let inherited = claim_mount_point(&args)?;
    let store = open_store(&args)?;
    let stats = Arc::new(StatsRegistry::default());
    // Always: boots served from boot images are observed (their coverage); --learn learns.
    let recorder = Some(start_recorder(&args, &store, &stats));
    let fs = Arc::new(MirrorFs::new(&source, store.clone(), stats.clone(), recorder.clone())?);
    fs.set_fill_read_timeout(Duration::from_secs_f64(args.fill_read_timeout_secs));
    let host_load = HostLoadSampler::start(
        &source,
        Duration::from_secs_f64(args.load_interval_secs),
        Duration::from_secs_f64(args.load_smoothing_secs),
    );
    let pinned = args.pin_qemu.then(|| pin::pin(&pin::files_to_pin(&[])));

    let mount = start_session(&args, &fs, &source, inherited)?;
    // From the moment the mount exists, SIGTERM unmounts it cleanly: a service manager or a
    // client that stops yolofs as soon as it answers must not kill it mid-setup (a signal that
    // comes meanwhile waits in signal-hook's queue for wait_for_stop).
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    watch_source(&fs, &mount.session, &source);
    let daemon = Arc::new(Daemon {
        source: source.clone(),
        mountpoint: args.mountpoint.clone(),
        fs,
        store,
        stats,
        recorder: recorder.clone(),
        host_load,
        pinned_bytes: pinned.as_ref().map_or(0, |p| p.bytes()),
        started: Instant::now(),
        took_over_mount: mount.resumed,
    });
    if let Some(address) = args.metrics_address {
        serve_metrics(address, daemon.clone())?;
    }
    if args.preload {
        preload(&daemon.store, &source)?;
    }
    serve_control(&args, socket_access, daemon)?;
    info!(
        "mounted {} on {} (boot images in {}, control socket {}, learning {})",
        source.display(),
        args.mountpoint.display(),
        args.boot_images.display(),
        args.control_socket.display(),
        if args.learn { "on" } else { "off" }
    );
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);

    let signal = wait_for_stop(&mut signals, mount.kept, &args.mountpoint);
    info!("signal {signal}: unmounting {}", args.mountpoint.display());
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    if let Some(recorder) = &recorder {
        recorder.wait_idle();
    }
    unmount(&args.mountpoint, mount)?;
    let _ = std::fs::remove_file(&args.control_socket);
    drop(pinned);
    info!("unmounted");
    Ok(())
}

/// Loads the store's boot images in a thread of its own (`--preload`).
fn preload(store: &Arc<BootImageStore>, source: &Path) -> Result<()> {
    let (store, source) = (store.clone(), source.to_path_buf());
    std::thread::Builder::new()
        .name("preload".into())
        .spawn(move || store.preload(&source))
        .context("starting the preload thread")?;
    Ok(())
}

/// The FUSE session serving the mount, and how this process came to hold it.
struct Mount {
    session: fuser::BackgroundSession,
    /// A keeper holds the mount's descriptor: a restart keeps the mount.
    kept: bool,
    /// Taken over from an earlier yolofs: this process did not mount it.
    resumed: bool,
}

/// The control socket's mode and group (`--control-socket-mode`, `--control-socket-group`).
fn socket_access(args: &MountArgs) -> Result<SocketAccess> {
    Ok(SocketAccess {
        mode: args.control_socket_mode,
        group: match &args.control_socket_group {
            Some(name) => Some(
                control::group_id(name)
                    .map_err(anyhow::Error::msg)
                    .context("--control-socket-group")?,
            ),
            None => None,
        },
    })
}

/// The mount a keeper passed on, if it is still there and the kernel sends again what the
/// previous yolofs left unanswered; otherwise None, the mount point made ready for a new mount.
fn claim_mount_point(args: &MountArgs) -> Result<Option<OwnedFd>> {
    let inherited = inherited_mount(&args.mountpoint, &args.control_socket)?.filter(|fd| {
        keeper::resend_in_flight(fd.as_fd()) || {
            keeper::forget();
            false
        }
    });
    if inherited.is_none() {
        prepare_mount_point(&args.mountpoint, &args.control_socket)?;
    }
    Ok(inherited)
}

/// The boot image store, its staging directory emptied, what keeps its verifications across
/// touches found out.
fn open_store(args: &MountArgs) -> Result<Arc<BootImageStore>> {
    std::fs::create_dir_all(&args.boot_images)
        .with_context(|| format!("boot image store {}", args.boot_images.display()))?;
    let store = Arc::new(BootImageStore::new(StoreConfig {
        dir: args.boot_images.clone(),
        memory_budget: args.memory_budget_mib << 20,
        lock_in_memory: args.mlock,
        share_blocks: !args.no_block_sharing,
        max_boot_image_bytes: args.max_boot_image_bytes,
    }));
    store.set_loads_at_once(args.loads_at_once as usize);
    if let Err(e) = store.clear_incoming() {
        warn!("could not empty the store's staging directory: {e}");
    }
    probe_touch_safety(&store, &args.source);
    // What the boot images installed hold of the block file, read while the mount comes up.
    let opening = store.clone();
    std::thread::Builder::new()
        .name("block-file".into())
        .spawn(move || opening.open_block_file())?;
    Ok(store)
}

/// The recorder of boot windows, which learns boot images with `--learn`.
fn start_recorder(args: &MountArgs, store: &Arc<BootImageStore>, stats: &Arc<StatsRegistry>) -> Arc<Recorder> {
    let config = RecordConfig {
        idle: Duration::from_secs_f64(args.record_idle_secs),
        max_duration: Duration::from_secs_f64(args.record_max_secs),
        block_size: args.block_size,
        learn: args.learn,
    };
    Recorder::new(config, store.clone(), stats.clone())
}

/// Serves `fs` through FUSE: on the mount a keeper passed on (`inherited`), else on a new mount
/// on `--mountpoint`, whose descriptor then goes to the keeper if there is one.
fn start_session(args: &MountArgs, fs: &Arc<MirrorFs>, source: &Path, inherited: Option<OwnedFd>) -> Result<Mount> {
    let adapter = FuseAdapter::new(
        fs.clone(),
        Duration::from_secs_f64(args.attr_timeout_secs),
        !args.no_keep_cache,
        !args.no_kernel_passthrough,
    );
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("yolofs".into()),
        fuser::MountOption::Subtype("yolofs".into()),
        fuser::MountOption::RO,
        fuser::MountOption::NoAtime,
        fuser::MountOption::DefaultPermissions,
    ];
    // QEMU runs as its own user under libvirt: every user may read, the kernel checks modes.
    // An unprivileged yolofs (the Glance worker's learning mount, whose QEMU runs as the same
    // user) serves only its own user: fusermount3 refuses allow_other to users without
    // /etc/fuse.conf's user_allow_other.
    // SAFETY: geteuid has no preconditions and cannot fail.
    config.acl = if unsafe { libc::geteuid() } == 0 {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    config.n_threads = Some(args.threads.max(1));
    // The requests a dying yolofs has read wait for its successor only on the descriptor the
    // keeper holds: a cloned one would fail them (ECONNABORTED) as the process goes.
    let kept = keeper::present();
    config.clone_fd = !kept;
    let resumed = inherited.is_some();
    let session = match inherited {
        Some(fd) => {
            info!(
                "taking over the mount on {} from the previous yolofs",
                args.mountpoint.display()
            );
            fs.set_kernel_passthrough(!args.no_kernel_passthrough);
            fuser::Session::resume(adapter, fd, config.acl, config.clone())
        }
        None => {
            let session = fuser::Session::new(adapter, &args.mountpoint, &config)
                .with_context(|| format!("mounting {}", args.mountpoint.display()))?;
            if kept {
                if let Err(e) = keeper::store(session.as_fd()) {
                    warn!("cannot hand the mount's descriptor to the keeper ({e}): a restart will mount afresh");
                }
            }
            session
        }
    };
    let session = session.spawn().context("starting the FUSE session")?;
    if resumed {
        forget_cached_entries(&session.notifier(), source);
    }
    Ok(Mount { session, kept, resumed })
}

/// Has the kernel drop the page cache of the base files that change in `source`.
fn watch_source(fs: &Arc<MirrorFs>, session: &fuser::BackgroundSession, source: &Path) {
    let notifier = session.notifier();
    let watched = yolofs::watch::watch_source(fs.clone(), move |ino| {
        // ENOENT: the kernel holds nothing of that inode.
        if let Err(e) = notifier.inval_inode(fuser::INodeNo(ino), 0, 0) {
            log::debug!("dropping the page cache of inode {ino}: {e}");
        }
    });
    if let Err(e) = watched {
        warn!("cannot watch {} for changes ({e}): a changed base file's page cache on the mount lasts until its attributes expire", source.display());
    }
}

/// Serves Prometheus metrics on `address` (`--metrics-address`).
fn serve_metrics(address: SocketAddr, daemon: Arc<Daemon>) -> Result<()> {
    let bound = yolofs::metrics::serve(address, daemon).with_context(|| format!("metrics address {address}"))?;
    info!("metrics on http://{bound}/metrics");
    Ok(())
}

/// Serves the control socket, a thread per client.
fn serve_control(args: &MountArgs, access: SocketAccess, daemon: Arc<Daemon>) -> Result<()> {
    let client_limits = control::ClientLimits {
        max_clients: args.control_max_clients as usize,
        idle: Duration::from_secs(args.control_idle_secs),
    };
    control::serve(&args.control_socket, access, daemon, client_limits)
        .with_context(|| format!("control socket {}", args.control_socket.display()))
}

/// Waits for SIGTERM or SIGINT, and returns which. SIGHUP under a keeper hands the mount over
/// (the process exits); without one it is ignored.
fn wait_for_stop(signals: &mut Signals, kept: bool, mountpoint: &Path) -> i32 {
    loop {
        match next_signal(signals) {
            SIGHUP if !kept => warn!("SIGHUP: no keeper holds the mount to hand it over; ignored"),
            SIGHUP => {
                // Not a destructor runs: the session's would unmount.
                info!(
                    "SIGHUP: handing the mount on {} over to the next yolofs",
                    mountpoint.display()
                );
                std::process::exit(0);
            }
            signal => return signal,
        }
    }
}

/// Ends the mount on `mountpoint`, and with it the session; tells the keeper not to keep it.
fn unmount(mountpoint: &Path, mount: Mount) -> Result<()> {
    if mount.kept {
        keeper::forget();
    }
    if mount.resumed {
        // The session did not mount, so it cannot unmount: the connection ends with the mount.
        detach(&absolute_mount_point(mountpoint));
        mount.session.join().context("unmounting")?;
    } else {
        mount.session.umount_and_join().context("unmounting")?;
    }
    Ok(())
}

/// The next of the signals caught. They are caught before a command says it is ready, so that a
/// signal sent as soon as it is (an init system's, a test's) is waited for, not fatal.
pub fn next_signal(signals: &mut Signals) -> i32 {
    signals.forever().next().unwrap_or(SIGTERM)
}

/// The type and source of the filesystem mounted on `path` (absolute, symbolic links resolved),
/// if one is, per /proc/self/mountinfo (the last mount there): `fuse yolofs` for a yolofs.
fn mounted_filesystem(path: &Path) -> Option<String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // Field 5 is the mount point, with space, tab, newline and backslash escaped in octal; the
    // filesystem type follows the " - " separator.
    let escaped = path
        .to_string_lossy()
        .replace('\\', "\\134")
        .replace(' ', "\\040")
        .replace('\t', "\\011")
        .replace('\n', "\\012");
    mountinfo
        .lines()
        .rev()
        .filter(|line| line.split(' ').nth(4) == Some(escaped.as_str()))
        .filter_map(|line| {
            let mut fields = line.split(" - ").nth(1)?.split(' ');
            Some(format!("{} {}", fields.next()?, fields.next()?))
        })
        .next()
}

/// Detaches the mount on `path` (lazily: files still open there keep their mount).
fn detach(path: &Path) {
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: c_path is a valid NUL-terminated string; umount2 has no other preconditions.
    if unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) } != 0 {
        // Not root: fusermount3 (setuid) detaches the user's own FUSE mounts.
        let _ = std::process::Command::new("fusermount3").arg("-uz").arg(path).status();
    }
}

/// The mount point as /proc/self/mountinfo names it, resolved without touching the mount itself
/// (a mount whose yolofs is restarting answers nothing until it is back).
fn absolute_mount_point(mountpoint: &Path) -> PathBuf {
    let absolute = std::path::absolute(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent)
            .map(|p| p.join(name))
            .unwrap_or(absolute.clone()),
        _ => absolute,
    }
}

/// Whether a filesystem as [`mounted_filesystem`] names it is a yolofs.
fn is_yolofs(filesystem: Option<&str>) -> bool {
    matches!(filesystem, Some("fuse yolofs" | "fuse.yolofs yolofs"))
}

/// Fails if a yolofs answers on `control_socket` already: it is never replaced.
fn refuse_if_running(control_socket: &Path) -> Result<()> {
    let status = serde_json::to_value(control::Request::Status)?;
    if control::call_within(control_socket, &status, Duration::from_secs(2)).is_ok() {
        bail!(
            "a yolofs is already running: its control socket {} answers",
            control_socket.display()
        );
    }
    Ok(())
}

/// The descriptor of our mount if a keeper passed it (a restart), and the mount is still there.
fn inherited_mount(mountpoint: &Path, control_socket: &Path) -> Result<Option<std::os::fd::OwnedFd>> {
    let Some(fd) = keeper::inherited_fuse_fd() else {
        return Ok(None);
    };
    refuse_if_running(control_socket)?;
    if is_yolofs(mounted_filesystem(&absolute_mount_point(mountpoint)).as_deref()) {
        return Ok(Some(fd));
    }
    warn!(
        "the keeper's FUSE descriptor has no mount on {} any more: mounting afresh",
        mountpoint.display()
    );
    keeper::forget();
    Ok(None)
}

/// After a takeover: the kernel forgets the names it cached, so that the next open of each looks
/// it up again and gets an inode of this process. (The kernel requires every open of an inode that
/// is open with passthrough to be passthrough on the same backing file, which only the previous
/// process knew: an inherited inode cannot be opened again while its passthrough opens last.)
fn forget_cached_entries(notifier: &fuser::Notifier, source: &Path) {
    let Ok(entries) = std::fs::read_dir(source) else { return };
    for entry in entries.flatten() {
        // ENOENT: the kernel had not cached it.
        let _ = notifier.inval_entry(fuser::INodeNo(yolofs::fs::ROOT_INO), &entry.file_name());
    }
}

/// Makes the mount point ready. A yolofs that was killed leaves its mount, answering ENOTCONN
/// once the process is gone, and even while it is being reaped: it is detached (files still open
/// on it keep failing; new opens get the new mount). A yolofs still answering on the control
/// socket is not replaced.
fn prepare_mount_point(mountpoint: &Path, control_socket: &Path) -> Result<()> {
    refuse_if_running(control_socket)?;
    let absolute = absolute_mount_point(mountpoint);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match mounted_filesystem(&absolute).as_deref() {
            None => {}
            filesystem if is_yolofs(filesystem) => {
                warn!(
                    "{} is still mounted (a yolofs that died); detaching it",
                    absolute.display()
                );
                detach(&absolute);
            }
            Some(other) => bail!("{} is a mount point already ({other})", absolute.display()),
        }
        match std::fs::create_dir_all(&absolute) {
            Ok(()) => return Ok(()),
            // The old mount is going away (its process not reaped yet): try again shortly.
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(e).with_context(|| format!("mount point {}", mountpoint.display())),
        }
    }
}

/// Waits until the source directory exists (yolofs never makes Nova's directories).
fn wait_for_source(source: &Path) -> Result<PathBuf> {
    let mut logged = false;
    loop {
        match std::fs::canonicalize(source) {
            Ok(path) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !logged {
                    info!(
                        "waiting for {} to exist (Nova makes it when it caches an image)",
                        source.display()
                    );
                    logged = true;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => return Err(e).with_context(|| format!("source {}", source.display())),
        }
    }
}

/// Says at start what keeps boot images verified across touches of their base files, from a
/// lease tried on an unnamed file in the source directory (`O_TMPFILE`: never seen by Nova, gone
/// once closed), else on one of its base files, else (a filesystem without `O_TMPFILE`, such as
/// NFS, and no base file yet) from the directory's filesystem when no lease is taken there.
fn probe_touch_safety(store: &BootImageStore, source: &Path) {
    let bases = std::fs::read_dir(source)
        .into_iter()
        .flatten()
        .filter_map(|entry| store::open_regular_file(&entry.ok()?.path()).ok());
    let not_local = File::open(source)
        .ok()
        .filter(|dir| lease::filesystem_type(dir).is_ok_and(|t| !lease::LOCAL_FILESYSTEMS.contains(&t)));
    for file in unnamed_file_in(source)
        .into_iter()
        .chain(bases.take(8))
        .chain(not_local)
    {
        store.probe_touch_safety(&file);
        if store.touch_safety().mechanism != "unknown" {
            break;
        }
    }
    let safety = store.touch_safety();
    match &safety.lease_error {
        None => info!(
            "boot images stay verified across touches of their base files: {}",
            safety.mechanism
        ),
        Some(e) => warn!(
            "base files cannot be leased ({e}): {}",
            if safety.mechanism == "multigrain_timestamps" {
                "only touches through yolofs keep boot images verified (multigrain timestamps)"
            } else {
                "every touch of a base file costs its boot image a verification again"
            }
        ),
    }
}

/// An unnamed file in `dir`, open for reading only (its writer closed, so that it can be leased),
/// owned as `dir` is: base files are Nova's, and leasing another user's file takes CAP_LEASE.
fn unnamed_file_in(dir: &Path) -> Option<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    use std::os::unix::io::AsRawFd;
    let writer = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
        .ok()?;
    if let Ok(owner) = std::fs::metadata(dir) {
        // Not as root (without CAP_CHOWN): the file stays its own, as its base files are.
        let _ = std::os::unix::fs::fchown(&writer, Some(owner.uid()), Some(owner.gid()));
    }
    std::fs::File::open(format!("/proc/self/fd/{}", writer.as_raw_fd())).ok()
}
