//! The command line: `yolofs` and its subcommands, as clap parses them.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use yolofs::control;

const DEFAULT_SOCKET: &str = "/run/yolofs/control.sock";

#[derive(Parser)]
#[command(
    name = "yolofs",
    version,
    about = "YOLO boot images and the FUSE filesystem that serves them"
)]
pub struct Cli {
    /// Log level (error, warn, info, debug, trace); RUST_LOG overrides it.
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
    /// What boot images would take with each distinct block's bytes kept once (blocks compared
    /// by their SHA-256): their data bytes against their distinct blocks' bytes.
    Shared {
        #[arg(required = true)]
        boot_images: Vec<PathBuf>,
        #[arg(long, default_value_t = 4096)]
        block_size: usize,
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
pub struct MountArgs {
    /// Directory to mirror (Nova's instances/_base). Nova makes it, as its own user, when it
    /// caches its first image: until it exists yolofs waits for it, then mounts.
    #[arg(long)]
    pub source: PathBuf,
    /// Where to mount the mirror.
    #[arg(long)]
    pub mountpoint: PathBuf,
    /// Boot image store, private to yolofs: boot images come in learned (--learn) or through the
    /// control socket's `install` request.
    #[arg(long, default_value = "/var/lib/yolo/boot-images")]
    pub boot_images: PathBuf,
    /// Control socket (its directory is created, mode 0755, if missing).
    #[arg(long, default_value = DEFAULT_SOCKET)]
    pub control_socket: PathBuf,
    /// Group of the control socket (name or id): with --control-socket-mode 0660, its members
    /// (nova-compute's user) may talk to yolofs.
    #[arg(long)]
    pub control_socket_group: Option<String>,
    /// Mode of the control socket, in octal.
    #[arg(long, default_value = "0660", value_parser = control::parse_mode)]
    pub control_socket_mode: u32,
    /// Control socket clients served at once; one more is told so and let go.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub control_max_clients: u32,
    /// Seconds a control socket client may send nothing (or read no answer) before it is let go.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub control_idle_secs: u64,
    /// Largest boot image file an `install` request may hand in, in bytes.
    #[arg(long, default_value_t = 1 << 30)]
    pub max_boot_image_bytes: u64,
    /// Most MiB of boot image data kept in memory (least recently used evicted first).
    #[arg(long, default_value_t = 2048)]
    pub memory_budget_mib: u64,
    /// Boot images loaded from the store at a time: loads share its disk, and a few at a time
    /// make the first guests of a storm ready sooner than all at once, which end together.
    #[arg(long, default_value_t = yolofs::store::DEFAULT_LOADS_AT_ONCE as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub loads_at_once: u32,
    /// Keep each loaded boot image's data apart: no block pool shared between boot images
    /// (each distinct block of the loaded boot images is otherwise held once).
    #[arg(long)]
    pub no_block_sharing: bool,
    /// Lock loaded boot images in RAM (mlock).
    #[arg(long)]
    pub mlock: bool,
    /// At start, load the store's boot images into memory, those of the base files Nova used
    /// last first, until the memory budget is full (a host back from a reboot resumes its guests
    /// all at once). Boot reads never wait for it; `yolofs ctl status` shows its progress.
    #[arg(long)]
    pub preload: bool,
    /// Learn a boot image for every base file opened without one, from its first boot, and
    /// extend boot images with what later boots read outside them.
    #[arg(long)]
    pub learn: bool,
    /// Boot windows end after this many seconds without a read (a TCG boot can pause for
    /// several seconds: a short gap learns part of a boot, which later boots then extend).
    #[arg(long, default_value_t = 30.0)]
    pub record_idle_secs: f64,
    /// Boot windows end this many seconds after the first read at the latest.
    #[arg(long, default_value_t = 300.0)]
    pub record_max_secs: f64,
    /// A read of a base file being filled (docs/first-boot.md) waits at most this many seconds
    /// for bytes not filled yet, then fails with EIO.
    #[arg(long, default_value_t = yolofs::fs::DEFAULT_FILL_READ_TIMEOUT.as_secs_f64())]
    pub fill_read_timeout_secs: f64,
    /// Block size of learned boot images, in bytes.
    #[arg(long, default_value_t = 4096)]
    pub block_size: u32,
    /// FUSE worker threads: each passthrough read blocks one, so as many as the disk queue depth
    /// QEMU drives (cold random 4 KiB reads at queue depth 16: 0.5 of direct with 8, 0.7 with 32).
    #[arg(long, default_value_t = 32)]
    pub threads: usize,
    /// Seconds the kernel may cache attributes and directory entries.
    #[arg(long, default_value_t = 1.0)]
    pub attr_timeout_secs: f64,
    /// Do not let the kernel keep the page cache of base files across opens.
    #[arg(long)]
    pub no_keep_cache: bool,
    /// Serve files without a boot image through yolofs instead of kernel FUSE passthrough.
    #[arg(long)]
    pub no_kernel_passthrough: bool,
    /// Pin QEMU's files in page cache for as long as the mount runs.
    #[arg(long)]
    pub pin_qemu: bool,
    /// Host load sampling interval in seconds.
    #[arg(long, default_value_t = 1.0)]
    pub load_interval_secs: f64,
    /// Host load smoothing time constant in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub load_smoothing_secs: f64,
    /// Serve Prometheus metrics at http://ADDRESS/metrics (for example 127.0.0.1:9466; port 0
    /// picks a free one, logged). Off when not given.
    #[arg(long)]
    pub metrics_address: Option<std::net::SocketAddr>,
}

#[derive(clap::Args)]
pub struct BuildArgs {
    /// Read trace: `OFFSET LENGTH` per line.
    #[arg(long, required_unless_present = "like", conflicts_with = "like")]
    pub trace: Option<PathBuf>,
    /// Instead of a trace: the boot image of a related image (the one this image was derived
    /// from); the new boot image holds the blocks of its extents that the source holds too.
    #[arg(long)]
    pub like: Option<PathBuf>,
    /// The source file the trace was taken on (the raw base file).
    #[arg(long)]
    pub source: PathBuf,
    #[arg(long)]
    pub output: PathBuf,
    #[arg(long, default_value_t = 4096)]
    pub block_size: u32,
    /// Glance image id of the source image.
    #[arg(long, default_value = "")]
    pub image_id: String,
    /// `algorithm:hex` digest of the source image, or `auto` to hash the source file (sha256).
    #[arg(long, default_value = "")]
    pub source_digest: String,
    /// How the source file was produced from the image.
    #[arg(long, default_value = "raw")]
    pub rendition: String,
    /// Also write the verification stamp (the boot image is built from the source itself).
    #[arg(long)]
    pub mark: bool,
    #[arg(long)]
    pub json: bool,
}
