//! The `yolofs` command: mount the filesystem, build, inspect and verify boot images, talk to a
//! running mount, pin the hypervisor's files.

use std::fs::File;
use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use log::{info, warn};
use serde_json::json;
use sha2::{Digest, Sha256};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use yolofs::build::{self, BuildSummary};
use yolofs::control::{self, Daemon, SocketAccess};
use yolofs::format::{BootImage, SourceIdentity};
use yolofs::fs::MirrorFs;
use yolofs::fuse::FuseAdapter;
use yolofs::hostload::HostLoadSampler;
use yolofs::keeper;
use yolofs::lease;
use yolofs::pin;
use yolofs::recorder::{RecordConfig, Recorder};
use yolofs::stats::StatsRegistry;
use yolofs::store::{self, BootImageStore, StoreConfig};

const DEFAULT_SOCKET: &str = "/run/yolofs/control.sock";

#[derive(Parser)]
#[command(
    name = "yolofs",
    version,
    about = "YOLO boot images and the FUSE filesystem that serves them"
)]
struct Cli {
    /// Log level (error, warn, info, debug, trace); RUST_LOG overrides it.
    #[arg(long, global = true, default_value = "info")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount a read-only mirror of SOURCE that serves boot reads from boot images (runs in the
    /// foreground until SIGTERM or SIGINT, then unmounts).
    ///
    /// Recovery: under a keeper (`yolofs keep`, or systemd with FileDescriptorStoreMax=) yolofs
    /// hands it the mount's /dev/fuse descriptor, and a yolofs started with it (LISTEN_FDS) takes
    /// the mount over: the kernel sends again the requests the dead one left unanswered (Linux
    /// 6.9+), open files read on, nothing in the guests fails. SIGHUP hands the mount over and
    /// exits (an upgrade). Without a keeper, a mount left by a yolofs that died is detached
    /// first; files still open on it keep failing until their guest restarts.
    Mount(MountArgs),
    /// Run COMMAND (a `yolofs mount`), hold its mount's /dev/fuse descriptor, and start it
    /// again whenever it exits while the mount lives (crash, OOM kill, SIGHUP for an upgrade):
    /// guests reading through the mount wait for the restart instead of failing. SIGTERM and
    /// SIGINT are passed on; the keeper ends once yolofs has unmounted. systemd's file descriptor
    /// store (FileDescriptorStoreMax=1) does the same for a yolofs it runs directly.
    Keep {
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Build a boot image from a read trace and the source file.
    Build(BuildArgs),
    /// Show a boot image's header and extents.
    Inspect {
        boot_image: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// List every extent.
        #[arg(long)]
        extents: bool,
    },
    /// Compare every extent of a boot image with a source file; exit 1 if any byte differs.
    Verify {
        boot_image: PathBuf,
        source: PathBuf,
        /// On success, write the verification stamp the daemon trusts instead of verifying again.
        #[arg(long)]
        mark: bool,
        #[arg(long)]
        json: bool,
    },
    /// Send a request to a running mount's control socket and print the JSON answer.
    Ctl {
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        #[command(subcommand)]
        request: control::Request,
    },
    /// Lock QEMU's binary, libraries and firmware (or the named binaries') in page cache until killed.
    Pin {
        binaries: Vec<String>,
        /// Only list the files that would be pinned.
        #[arg(long)]
        list: bool,
    },
}

#[derive(clap::Args)]
struct MountArgs {
    /// Directory to mirror (Nova's instances/_base). Nova makes it, as its own user, when it
    /// caches its first image: until it exists yolofs waits for it, then mounts.
    #[arg(long)]
    source: PathBuf,
    /// Where to mount the mirror.
    #[arg(long)]
    mountpoint: PathBuf,
    /// Boot image store, private to yolofs: boot images come in learned (--learn) or through the
    /// control socket's `install` request.
    #[arg(long, default_value = "/var/lib/yolo/boot-images")]
    boot_images: PathBuf,
    /// Control socket (its directory is created, mode 0755, if missing).
    #[arg(long, default_value = DEFAULT_SOCKET)]
    control_socket: PathBuf,
    /// Group of the control socket (name or id): with --control-socket-mode 0660, its members
    /// (nova-compute's user) may talk to yolofs.
    #[arg(long)]
    control_socket_group: Option<String>,
    /// Mode of the control socket, in octal.
    #[arg(long, default_value = "0660", value_parser = control::parse_mode)]
    control_socket_mode: u32,
    /// Control socket clients served at once; one more is told so and let go.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    control_max_clients: u32,
    /// Seconds a control socket client may send nothing (or read no answer) before it is let go.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    control_idle_secs: u64,
    /// Largest boot image file an `install` request may hand in, in bytes.
    #[arg(long, default_value_t = 1 << 30)]
    max_boot_image_bytes: u64,
    /// Most MiB of boot image data kept in memory (least recently used evicted first).
    #[arg(long, default_value_t = 2048)]
    memory_budget_mib: u64,
    /// Lock loaded boot images in RAM (mlock).
    #[arg(long)]
    mlock: bool,
    /// Learn a boot image for every base file opened without one, from its first boot, and
    /// extend boot images with what later boots read outside them.
    #[arg(long)]
    learn: bool,
    /// Boot windows end after this many seconds without a read (a TCG boot can pause for
    /// several seconds: a short gap learns part of a boot, which later boots then extend).
    #[arg(long, default_value_t = 30.0)]
    record_idle_secs: f64,
    /// Boot windows end this many seconds after the first read at the latest.
    #[arg(long, default_value_t = 300.0)]
    record_max_secs: f64,
    /// A read of a base file being filled (docs/first-boot.md) waits at most this many seconds
    /// for bytes not filled yet, then fails with EIO.
    #[arg(long, default_value_t = yolofs::fs::DEFAULT_FILL_READ_TIMEOUT.as_secs_f64())]
    fill_read_timeout_secs: f64,
    /// Block size of learned boot images, in bytes.
    #[arg(long, default_value_t = 4096)]
    block_size: u32,
    /// FUSE worker threads: each passthrough read blocks one, so as many as the disk queue depth
    /// QEMU drives (cold random 4 KiB reads at queue depth 16: 0.5 of direct with 8, 0.7 with 32).
    #[arg(long, default_value_t = 32)]
    threads: usize,
    /// Seconds the kernel may cache attributes and directory entries.
    #[arg(long, default_value_t = 1.0)]
    attr_timeout_secs: f64,
    /// Do not let the kernel keep the page cache of base files across opens.
    #[arg(long)]
    no_keep_cache: bool,
    /// Serve files without a boot image through yolofs instead of kernel FUSE passthrough.
    #[arg(long)]
    no_kernel_passthrough: bool,
    /// Pin QEMU's files in page cache for as long as the mount runs.
    #[arg(long)]
    pin_qemu: bool,
    /// Host load sampling interval in seconds.
    #[arg(long, default_value_t = 1.0)]
    load_interval_secs: f64,
    /// Host load smoothing time constant in seconds.
    #[arg(long, default_value_t = 10.0)]
    load_smoothing_secs: f64,
    /// Serve Prometheus metrics at http://ADDRESS/metrics (for example 127.0.0.1:9466; port 0
    /// picks a free one, logged). Off when not given.
    #[arg(long)]
    metrics_address: Option<std::net::SocketAddr>,
}

#[derive(clap::Args)]
struct BuildArgs {
    /// Read trace: `OFFSET LENGTH` per line.
    #[arg(long)]
    trace: PathBuf,
    /// The source file the trace was taken on (the raw base file).
    #[arg(long)]
    source: PathBuf,
    #[arg(long)]
    output: PathBuf,
    #[arg(long, default_value_t = 4096)]
    block_size: u32,
    /// Glance image id of the source image.
    #[arg(long, default_value = "")]
    image_id: String,
    /// `algorithm:hex` digest of the source image, or `auto` to hash the source file (sha256).
    #[arg(long, default_value = "")]
    source_digest: String,
    /// How the source file was produced from the image.
    #[arg(long, default_value = "raw")]
    rendition: String,
    /// Also write the verification stamp (the boot image is built from the source itself).
    #[arg(long)]
    mark: bool,
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Mount(_) | Command::Keep { .. } | Command::Pin { list: false, .. }
    ) {
        // A command whose output goes into `head` ends quietly when the pipe closes, as other
        // Unix tools do. The daemons keep ignoring SIGPIPE: a control client that goes away must
        // not stop the mount.
        // SAFETY: called before any other thread exists; SIG_DFL is a valid disposition.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(&cli.log_level))
        .format_timestamp_millis()
        .init();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("yolofs: error: {}", error_message(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once: most of ours already quote their cause in their
/// own message (for the control socket's answers), which `{:#}` would print a second time.
fn error_message(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Mount(args) => mount(args),
        Command::Keep { command } => std::process::exit(yolofs::keeper::keep(&command)?),
        Command::Build(args) => build_command(args),
        Command::Inspect {
            boot_image,
            json,
            extents,
        } => inspect(&boot_image, json, extents),
        Command::Verify {
            boot_image,
            source,
            mark,
            json,
        } => verify(&boot_image, &source, mark, json),
        Command::Ctl { socket, request } => ctl(&socket, request),
        Command::Pin { binaries, list } => pin_command(&binaries, list),
    }
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(format!("sha256:{:x}", hasher.finalize()))
}

fn build_command(args: BuildArgs) -> Result<()> {
    let started = Instant::now();
    let reads = build::read_trace(&args.trace).with_context(|| format!("reading trace {}", args.trace.display()))?;
    let source = File::open(&args.source).with_context(|| format!("opening source {}", args.source.display()))?;
    let source_digest = if args.source_digest == "auto" {
        sha256_file(&args.source)?
    } else {
        args.source_digest
    };
    let identity = SourceIdentity {
        image_id: args.image_id,
        source_digest,
        rendition: args.rendition,
        source_size: source.metadata()?.len(),
    };
    // Taken before the build reads the source: the stamp vouches for the bytes as they were then.
    let source_key = store::SourceKey::of(&source)?;
    let summary: BuildSummary = build::build_boot_image(&reads, &source, &identity, args.block_size, &args.output)
        .with_context(|| format!("building {}", args.output.display()))?;
    if args.mark {
        let image = BootImage::open(&args.output)?;
        store::write_stamp(&args.output, &image, source_key)?;
    }
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        println!("{}", json!({ "summary": summary, "seconds": seconds }));
    } else {
        println!(
            "built {}: {} reads ({} bytes) -> {} extents, {} bytes covered, boot image {} bytes ({:.1}% of the {}-byte source) in {:.2}s",
            args.output.display(),
            summary.reads,
            summary.read_bytes,
            summary.extents,
            summary.covered_bytes,
            summary.boot_image_bytes,
            100.0 * summary.covered_bytes as f64 / summary.source_size.max(1) as f64,
            summary.source_size,
            seconds
        );
    }
    Ok(())
}

fn open_boot_image(path: &Path) -> Result<BootImage> {
    BootImage::open(path).with_context(|| format!("invalid boot image {}", path.display()))
}

fn inspect(path: &Path, as_json: bool, list_extents: bool) -> Result<()> {
    let image = open_boot_image(path)?;
    let summary = json!({
        "path": path,
        "format_version": yolofs::format::VERSION,
        "identity": image.identity,
        "block_size": image.block_size,
        "created_unix": image.created_unix,
        "extent_count": image.extents.len(),
        "covered_bytes": image.covered_bytes(),
        "coverage": image.covered_bytes() as f64 / image.identity.source_size.max(1) as f64,
        "header_crc32c": format!("{:08x}", image.header_crc32c),
        "index_crc32c": format!("{:08x}", image.index_crc32c),
    });
    if as_json {
        let mut out = summary;
        if list_extents {
            out["extents"] = serde_json::to_value(&image.extents)?;
        }
        println!("{out}");
        return Ok(());
    }
    println!("boot image    {}", path.display());
    println!("format        version {}", yolofs::format::VERSION);
    println!(
        "image id      {}",
        if image.identity.image_id.is_empty() {
            "-"
        } else {
            &image.identity.image_id
        }
    );
    println!(
        "source digest {}",
        if image.identity.source_digest.is_empty() {
            "-"
        } else {
            &image.identity.source_digest
        }
    );
    println!("rendition     {}", image.identity.rendition);
    println!("source size   {} bytes", image.identity.source_size);
    println!("block size    {} bytes", image.block_size);
    println!("extents       {}", image.extents.len());
    println!(
        "covered       {} bytes ({:.2}% of the source)",
        image.covered_bytes(),
        100.0 * image.covered_bytes() as f64 / image.identity.source_size.max(1) as f64
    );
    if list_extents {
        println!(
            "{:>14} {:>10} {:>12} {:>10}",
            "offset", "length", "data offset", "crc32c"
        );
        for e in &image.extents {
            println!(
                "{:>14} {:>10} {:>12} {:>10x}",
                e.source_offset, e.length, e.data_offset, e.crc32c
            );
        }
    }
    Ok(())
}

fn verify(path: &Path, source_path: &Path, mark: bool, as_json: bool) -> Result<()> {
    let image = open_boot_image(path)?;
    let source = File::open(source_path).with_context(|| format!("opening source {}", source_path.display()))?;
    let started = Instant::now();
    let verified = if mark {
        store::verify_and_stamp(path, &image, &source)
    } else {
        image.verify_against(&source).map_err(store::StampError::from)
    };
    match verified {
        Ok(()) => {}
        Err(store::StampError::Write(e)) => return Err(e).context("writing the verification stamp"),
        Err(e) => {
            return Err(e).with_context(|| format!("{} does not match {}", path.display(), source_path.display()))
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    if as_json {
        println!(
            "{}",
            json!({ "ok": true, "extents": image.extents.len(), "bytes": image.covered_bytes(), "seconds": seconds, "marked": mark })
        );
    } else {
        println!(
            "ok: {} extents ({} bytes) match {} ({seconds:.2}s)",
            image.extents.len(),
            image.covered_bytes(),
            source_path.display()
        );
    }
    Ok(())
}

fn ctl(socket: &Path, mut request: control::Request) -> Result<()> {
    // The daemon resolves paths from its own working directory: send an absolute one.
    if let control::Request::Install { boot_image, .. } = &mut request {
        *boot_image = std::path::absolute(&*boot_image)?;
    }
    let request = serde_json::to_value(&request)?;
    let answer = match control::call(socket, &request) {
        Ok(answer) => answer,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => bail!(
            "no yolofs is running with control socket {} (nothing listens there; --socket names another)",
            socket.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("talking to {}", socket.display())),
    };
    println!("{}", serde_json::to_string_pretty(&answer)?);
    if answer["ok"] != json!(true) {
        bail!("{}", answer["error"].as_str().unwrap_or("request failed"));
    }
    Ok(())
}

/// The next of the signals caught. They are caught before a command says it is ready, so that a
/// signal sent as soon as it is (an init system's, a test's) is waited for, not fatal.
fn next_signal(signals: &mut Signals) -> i32 {
    signals.forever().next().unwrap_or(SIGTERM)
}

fn pin_command(binaries: &[String], list: bool) -> Result<()> {
    let files = pin::files_to_pin(binaries);
    if list {
        for file in &files {
            println!("{}", file.display());
        }
        return Ok(());
    }
    let mut signals = Signals::new([SIGTERM, SIGINT])?;
    let pinned = pin::pin(&files);
    for (path, bytes) in pinned.files() {
        println!("{bytes:>12} {}", path.display());
    }
    println!("pinned {} bytes; holding until SIGTERM", pinned.bytes());
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
    next_signal(&mut signals);
    Ok(())
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
    if control::call_within(control_socket, &json!({"op": "status"}), Duration::from_secs(2)).is_ok() {
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

fn mount(args: MountArgs) -> Result<()> {
    // Bad arguments fail at once, before any wait.
    let socket_access = SocketAccess {
        mode: args.control_socket_mode,
        group: match &args.control_socket_group {
            Some(name) => Some(
                control::group_id(name)
                    .map_err(anyhow::Error::msg)
                    .context("--control-socket-group")?,
            ),
            None => None,
        },
    };
    // SIGHUP asks a running yolofs to hand its mount over; until this one runs, it is ignored
    // (its default would end the process, and with it a mount not yet handed to the keeper).
    // SAFETY: SIG_IGN is a valid disposition; no handler of ours is replaced.
    unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
    let source = wait_for_source(&args.source)?;
    let inherited = inherited_mount(&args.mountpoint, &args.control_socket)?.filter(|fd| {
        keeper::resend_in_flight(fd.as_fd()) || {
            keeper::forget();
            false
        }
    });
    if inherited.is_none() {
        prepare_mount_point(&args.mountpoint, &args.control_socket)?;
    }
    std::fs::create_dir_all(&args.boot_images)
        .with_context(|| format!("boot image store {}", args.boot_images.display()))?;
    let store = Arc::new(BootImageStore::new(StoreConfig {
        dir: args.boot_images.clone(),
        memory_budget: args.memory_budget_mib << 20,
        lock_in_memory: args.mlock,
        max_boot_image_bytes: args.max_boot_image_bytes,
    }));
    if let Err(e) = store.clear_incoming() {
        warn!("could not empty the store's staging directory: {e}");
    }
    probe_touch_safety(&store, &args.source);
    let stats = Arc::new(StatsRegistry::default());
    // Always: boots served from boot images are observed (their coverage); --learn learns.
    let recorder = Some(Recorder::new(
        RecordConfig {
            idle: Duration::from_secs_f64(args.record_idle_secs),
            max_duration: Duration::from_secs_f64(args.record_max_secs),
            block_size: args.block_size,
            learn: args.learn,
        },
        store.clone(),
        stats.clone(),
    ));
    let fs = Arc::new(MirrorFs::new(&source, store.clone(), stats.clone(), recorder.clone())?);
    fs.set_fill_read_timeout(Duration::from_secs_f64(args.fill_read_timeout_secs));
    let host_load = HostLoadSampler::start(
        &source,
        Duration::from_secs_f64(args.load_interval_secs),
        Duration::from_secs_f64(args.load_smoothing_secs),
    );
    let pinned = args.pin_qemu.then(|| pin::pin(&pin::files_to_pin(&[])));

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
        forget_cached_entries(&session.notifier(), &source);
    }

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
        took_over_mount: resumed,
    });
    if let Some(address) = args.metrics_address {
        let bound =
            yolofs::metrics::serve(address, daemon.clone()).with_context(|| format!("metrics address {address}"))?;
        info!("metrics on http://{bound}/metrics");
    }
    let client_limits = control::ClientLimits {
        max_clients: args.control_max_clients as usize,
        idle: Duration::from_secs(args.control_idle_secs),
    };
    control::serve(&args.control_socket, socket_access, daemon, client_limits)
        .with_context(|| format!("control socket {}", args.control_socket.display()))?;
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    info!(
        "mounted {} on {} (boot images in {}, control socket {}, learning {})",
        source.display(),
        args.mountpoint.display(),
        args.boot_images.display(),
        args.control_socket.display(),
        if args.learn { "on" } else { "off" }
    );
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);

    let signal = loop {
        match next_signal(&mut signals) {
            SIGHUP if !kept => warn!("SIGHUP: no keeper holds the mount to hand it over; ignored"),
            SIGHUP => {
                // Not a destructor runs: the session's would unmount.
                info!(
                    "SIGHUP: handing the mount on {} over to the next yolofs",
                    args.mountpoint.display()
                );
                std::process::exit(0);
            }
            signal => break signal,
        }
    };
    info!("signal {signal}: unmounting {}", args.mountpoint.display());
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    if let Some(recorder) = &recorder {
        recorder.wait_idle();
    }
    if kept {
        keeper::forget();
    }
    if resumed {
        // The session did not mount, so it cannot unmount: the connection ends with the mount.
        detach(&absolute_mount_point(&args.mountpoint));
        session.join().context("unmounting")?;
    } else {
        session.umount_and_join().context("unmounting")?;
    }
    let _ = std::fs::remove_file(&args.control_socket);
    drop(pinned);
    info!("unmounted");
    Ok(())
}
