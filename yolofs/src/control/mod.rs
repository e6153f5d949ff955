//! The control socket: a Unix stream socket speaking JSON lines.
//!
//! Each line a client writes is one [`Request`], tagged by `"op"`; each answer is one JSON line,
//! `{"ok": true, ...}` or `{"ok": false, "error": "..."}` ([`Answer`], in `answer.rs`). This is the only interface Nova's and
//! Glance's Python code use to talk to a running yolofs, and the only way a boot image from
//! elsewhere enters the store (`install`).
//!
//! Who may connect is decided by the socket file's group and mode ([`SocketAccess`]): yolofs runs
//! as root, Nova as its own user in the socket's group. The socket is bound in a private
//! directory, given its group and mode there, and renamed into place, so no client can connect
//! while it still has the mode the umask gave it.

mod answer;

use std::ffi::CString;
use std::fs::{self, DirBuilder};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use log::{debug, warn};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use answer::{
    Answer, EvictAnswer, FillBeginAnswer, FillDoneAnswer, FillEndAnswer, FillInfo, FillWantsAnswer, InstallAnswer,
    PreloadAnswer, PruneAnswer, RecordStopAnswer, RejectedInfo, RememberAnswer, StatsAnswer, StatusAnswer, TouchAnswer,
};

use crate::fill::{Outcome, FILL_SUFFIX};
use crate::fs::{self as mirror, Filling, MirrorFs};
use crate::hostload::HostLoadSampler;
use crate::recorder::Recorder;
use crate::stats::StatsRegistry;
use crate::store::{self, BootImageStore};
use answer::{json_line, reply_line, Failed};

/// Every request the control socket understands (also the subcommands of `yolofs ctl`).
#[derive(Debug, Deserialize, Serialize, PartialEq, clap::Subcommand)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Mount, memory and recording state.
    Status,
    /// Read statistics of every file, or of one.
    Stats { file: Option<String> },
    /// Load (and verify if needed) the boot image of a base file now, before the boot opens it.
    Preload { file: String },
    /// Drop a boot image from memory.
    Evict { file: String },
    /// Set a base file's access and modification times to now (Nova's image cache marks the
    /// base files in use so), keeping its boot image verified.
    Touch { file: String },
    /// Smoothed host I/O and CPU utilisation.
    HostLoad,
    /// End the recording window of a file now and build its boot image.
    RecordStop { file: String },
    /// Verify a boot image (a file yolofs can read, owned by the client) against base file FILE
    /// in full and install it in the store as the boot image of Glance image IMAGE_ID.
    Install {
        file: String,
        boot_image: PathBuf,
        image_id: String,
    },
    /// Record the Glance image id base file FILE belongs to (learned boot images carry it).
    Remember { file: String, image_id: String },
    /// Delete the store's files of base files that are gone from the source directory.
    Prune,
    /// Serve fill file FILE (in the source directory, at its final size; docs/first-boot.md)
    /// from a boot image (a file the client owns, checked but not yet compared with any data)
    /// and the ranges reported filled; reads of other ranges wait for them.
    FillBegin {
        file: String,
        boot_image: PathBuf,
        image_id: String,
    },
    /// Bytes OFFSET..OFFSET+LENGTH of fill file FILE hold their final data.
    FillDone { file: String, offset: u64, length: u64 },
    /// The ranges reads of fill file FILE wait for, waiting up to WAIT_MS (at most 10 s) for one.
    FillWants { file: String, wait_ms: u64 },
    /// End the fill of FILE: --complete once every byte is filled and verified (its boot image is
    /// then compared with it), or failed (its reads fail).
    FillEnd {
        file: String,
        #[arg(long)]
        complete: bool,
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Who may connect to the control socket: its mode bits and, if set, its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketAccess {
    pub mode: u32,
    pub group: Option<u32>,
}

impl Default for SocketAccess {
    fn default() -> SocketAccess {
        SocketAccess {
            mode: 0o660,
            group: None,
        }
    }
}

/// Parses a file mode given in octal (`0660`, `660` or `0o660`).
pub fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o777 && !digits.is_empty() => Ok(mode),
        _ => Err(format!("{text:?} is not an octal file mode between 0 and 0777")),
    }
}

/// The id of group `name` (getgrnam), or of a numeric group id.
pub fn group_id(name: &str) -> Result<u32, String> {
    let c_name = CString::new(name).map_err(|_| format!("invalid group name {name:?}"))?;
    let mut buffer = vec![0 as libc::c_char; 1024];
    loop {
        // SAFETY: all-zero bytes are a valid `group` (null pointers, zero id).
        let mut group: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the duration of the call and `buffer.len()` is the
        // size of `buffer`; getgrnam_r writes only into `group`, `buffer` and `found`.
        let rc = unsafe {
            libc::getgrnam_r(
                c_name.as_ptr(),
                &mut group,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut found,
            )
        };
        if rc == libc::ERANGE && buffer.len() < 1 << 20 {
            buffer.resize(buffer.len() * 2, 0);
            continue;
        }
        if rc == 0 && !found.is_null() {
            return Ok(group.gr_gid);
        }
        if let Ok(gid) = name.parse::<u32>() {
            return Ok(gid);
        }
        return Err(if rc == 0 {
            format!("unknown group {name:?}")
        } else {
            format!("looking up group {name:?}: {}", std::io::Error::from_raw_os_error(rc))
        });
    }
}

/// The uid of the process at the other end of a Unix socket (SO_PEERCRED).
fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable ucred and `len` its size, as SO_PEERCRED requires.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// What the control socket serves requests from.
pub struct Daemon {
    pub source: PathBuf,
    pub mountpoint: PathBuf,
    pub fs: Arc<MirrorFs>,
    pub store: Arc<BootImageStore>,
    pub stats: Arc<StatsRegistry>,
    pub recorder: Option<Arc<Recorder>>,
    pub host_load: Arc<HostLoadSampler>,
    pub pinned_bytes: u64,
    pub started: Instant,
    /// This process took the mount over from an earlier yolofs (a restart under a keeper).
    pub took_over_mount: bool,
}

fn base_file_name(file: &str) -> Result<&str, String> {
    if file.is_empty() || file.contains(['/', '\0']) || file == "." || file == ".." {
        return Err(format!("invalid base file name {file:?}"));
    }
    Ok(file)
}

/// A request that failed: `refused` when the boot image handed in is what is wrong (its bytes,
/// size, owner or image), so that the client need not offer it again; otherwise the failure may
/// pass (a full disk, a base file not there yet).
#[derive(Debug)]
pub struct Failure {
    pub error: String,
    pub refused: bool,
}

impl From<String> for Failure {
    fn from(error: String) -> Self {
        Failure { error, refused: false }
    }
}

impl From<&str> for Failure {
    fn from(error: &str) -> Self {
        error.to_string().into()
    }
}

/// The `install` request: `file` is checked and opened in `source_dir` (not through a symbolic
/// link), then [`BootImageStore::install`] does the rest. `client_uid` is the uid of the client
/// (root's requests may name any file; others' only files they own).
pub fn install(
    source_dir: &Path,
    store: &BootImageStore,
    file: &str,
    boot_image: &Path,
    image_id: &str,
    client_uid: u32,
) -> Result<InstallAnswer, Failure> {
    let name = base_file_name(file)?;
    let base = store::open_regular_file(&source_dir.join(name)).map_err(|e| format!("base file {name}: {e}"))?;
    let owner = (client_uid != 0).then_some(client_uid);
    let installed = store
        .install(name, &base, boot_image, image_id, owner)
        .map_err(|e| Failure {
            refused: e.is_refusal(),
            error: e.to_string(),
        })?;
    Ok(InstallAnswer { installed })
}

/// The name of a fill file.
fn fill_file_name(file: &str) -> Result<&str, String> {
    let name = base_file_name(file)?;
    if !mirror::is_fill_file(name) {
        return Err(format!("{name} is not a fill file (*{FILL_SUFFIX})"));
    }
    Ok(name)
}

/// Longest wait of a `fill_wants` request.
const MAX_WANTS_WAIT_MS: u64 = 10_000;

/// The `remember` request: the base file must exist in `source_dir`.
pub fn remember(
    source_dir: &Path,
    store: &BootImageStore,
    file: &str,
    image_id: &str,
) -> Result<RememberAnswer, String> {
    let name = base_file_name(file)?;
    let image_id = store::check_image_id(image_id)?;
    match fs::symlink_metadata(source_dir.join(name)) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Err(format!("base file {name} is not a regular file")),
        Err(e) => return Err(format!("base file {name}: {e}")),
    }
    let changed = store
        .remember_image_id(name, image_id)
        .map_err(|e| format!("recording the image id of {name}: {e}"))?;
    Ok(RememberAnswer {
        file: name.into(),
        image_id: image_id.into(),
        changed,
    })
}

impl Daemon {
    /// Answers one request of a client with uid `client_uid`.
    pub fn handle(&self, request: Request, client_uid: u32) -> Result<Answer, Failure> {
        match request {
            Request::Status => Ok(Answer::Status(Box::new(self.status()))),
            Request::Stats { file } => Ok(Answer::Stats(StatsAnswer {
                files: self.stats.snapshot(file.as_deref()),
            })),
            Request::Preload { file } => {
                let name = base_file_name(&file)?;
                // Not followed if a link, never a FIFO: the answers would tell a client about
                // a file it may not read, or a control thread would block.
                let source = store::open_regular_file(&self.source.join(name)).map_err(|e| format!("{name}: {e}"))?;
                let image = self.store.load(name, &source).map_err(|e| e.to_string())?.image;
                Ok(Answer::Preload(PreloadAnswer {
                    file: name.into(),
                    extents: image.extents.len(),
                    bytes: image.data_len(),
                    locked: image.is_locked(),
                }))
            }
            Request::Evict { file } => {
                let name = base_file_name(&file)?;
                Ok(Answer::Evict(EvictAnswer {
                    file: name.into(),
                    evicted: self.store.evict(name),
                }))
            }
            Request::Touch { file } => {
                let name = base_file_name(&file)?;
                let source = store::open_regular_file(&self.source.join(name)).map_err(|e| format!("{name}: {e}"))?;
                let kept = self
                    .store
                    .touch(&self.source, name, &source)
                    .map_err(|e| format!("{name}: {e}"))?;
                Ok(Answer::Touch(TouchAnswer {
                    file: name.into(),
                    verification_kept: kept,
                }))
            }
            Request::HostLoad => Ok(Answer::HostLoad(self.host_load.current())),
            Request::RecordStop { file } => {
                let name = base_file_name(&file)?;
                let recorder = self
                    .recorder
                    .as_ref()
                    .filter(|r| r.learns())
                    .ok_or("this mount is not learning boot images (--learn)")?;
                // A window that already ended (an idle gap, its maximum) is not an error: what
                // it learned is there, and later boots extend it.
                let window_was_open = recorder.stop(name);
                recorder.wait_idle();
                Ok(Answer::RecordStop(RecordStopAnswer {
                    file: name.into(),
                    window_was_open,
                    built: self.store.path_for(name).exists(),
                }))
            }
            Request::Install {
                file,
                boot_image,
                image_id,
            } => install(&self.source, &self.store, &file, &boot_image, &image_id, client_uid).map(Answer::Install),
            Request::Remember { file, image_id } => {
                Ok(Answer::Remember(remember(&self.source, &self.store, &file, &image_id)?))
            }
            Request::FillBegin {
                file,
                boot_image,
                image_id,
            } => self
                .fill_begin(&file, &boot_image, &image_id, client_uid)
                .map(Answer::FillBegin),
            Request::FillDone { file, offset, length } => {
                let (name, filling) = self.filling(&file)?;
                let range = offset..offset.checked_add(length).ok_or("range overflows")?;
                filling.fill.filled(range).map_err(|e| e.to_string())?;
                let (filled, _) = filling.fill.progress();
                Ok(Answer::FillDone(FillDoneAnswer {
                    file: name.into(),
                    filled_bytes: filled,
                    size: filling.fill.size(),
                }))
            }
            Request::FillWants { file, wait_ms } => {
                let (name, filling) = self.filling(&file)?;
                let wait = std::time::Duration::from_millis(wait_ms.min(MAX_WANTS_WAIT_MS));
                let wants: Vec<[u64; 2]> = filling
                    .fill
                    .wants(wait)
                    .into_iter()
                    .map(|r| [r.start, r.end - r.start])
                    .collect();
                Ok(Answer::FillWants(FillWantsAnswer {
                    file: name.into(),
                    wants,
                }))
            }
            Request::FillEnd { file, complete, reason } => self.fill_end(&file, complete, reason).map(Answer::FillEnd),
            Request::Prune => {
                let recording: Vec<String> = self.recorder.as_ref().map(|r| r.learning()).unwrap_or_default();
                let removed = self
                    .store
                    .prune(&self.source, |name| recording.iter().any(|r| r == name))
                    .map_err(|e| format!("pruning the store: {e}"))?;
                Ok(Answer::Prune(PruneAnswer { removed }))
            }
        }
    }

    fn status(&self) -> StatusAnswer {
        StatusAnswer {
            version: env!("CARGO_PKG_VERSION"),
            pid: std::process::id(),
            took_over_mount: self.took_over_mount,
            source: self.source.clone(),
            mountpoint: self.mountpoint.clone(),
            boot_image_dir: self.store.config().dir.clone(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            memory_budget_bytes: self.store.config().memory_budget,
            memory_used_bytes: self.store.used_bytes(),
            lock_in_memory: self.store.config().lock_in_memory,
            block_pool: self.store.pool_stats(),
            block_file: self.store.block_file_stats(),
            loaded: self.store.loaded(),
            rejected: self
                .store
                .rejected()
                .into_iter()
                .map(|(name, reason)| RejectedInfo { name, reason })
                .collect(),
            boot_images: self.store.boot_images(&self.source),
            learning: self.fs.learns(),
            recording: self.recorder.as_ref().map(|r| r.active()).unwrap_or_default(),
            open_files: self.fs.open_handles(),
            pinned_bytes: self.pinned_bytes,
            kernel_passthrough: self.fs.kernel_passthrough(),
            touch_safety: self.store.touch_safety(),
            fills: self
                .fs
                .fills()
                .into_iter()
                .map(|(file, size, filled_bytes)| FillInfo {
                    file,
                    size,
                    filled_bytes,
                })
                .collect(),
            preload: self.store.preload_progress(),
        }
    }

    /// The fill under way of fill file `file`: (its checked name, the fill).
    fn filling<'a>(&self, file: &'a str) -> Result<(&'a str, Arc<Filling>), String> {
        let name = fill_file_name(file)?;
        let filling = self.fs.filling(name).ok_or_else(|| format!("no fill of {name}"))?;
        Ok((name, filling))
    }

    fn fill_begin(
        &self,
        file: &str,
        boot_image: &Path,
        image_id: &str,
        client_uid: u32,
    ) -> Result<FillBeginAnswer, Failure> {
        let name = fill_file_name(file)?;
        let owner = (client_uid != 0).then_some(client_uid);
        let (_, image) = self
            .store
            .read_offered(boot_image, image_id, owner)
            .map_err(|e| Failure {
                refused: e.is_refusal(),
                error: e.to_string(),
            })?;
        let extents = image.extents.len();
        let (filling, new) = self.fs.begin_fill(name, image).map_err(|e| e.to_string())?;
        // Its reads are the image's (in the metrics too) before its base file exists.
        if let Some(base) = name.strip_suffix(FILL_SUFFIX) {
            if let Err(e) = self.store.remember_image_id(base, image_id) {
                log::warn!("{name}: could not record its image id: {e}");
            }
        }
        let (filled, _) = filling.fill.progress();
        log::info!(
            "{name}: serving a fill of {} bytes ({extents} boot image extents)",
            filling.fill.size()
        );
        Ok(FillBeginAnswer {
            file: name.into(),
            size: filling.fill.size(),
            new,
            filled_bytes: filled,
        })
    }

    fn fill_end(&self, file: &str, complete: bool, reason: Option<String>) -> Result<FillEndAnswer, Failure> {
        let name = fill_file_name(file)?;
        if !complete {
            let reason = reason.unwrap_or_else(|| "ended by the client".into());
            log::warn!("{name}: fill failed: {reason}");
            let ended = self.fs.end_fill(name, Outcome::Failed(reason)).is_some();
            return Ok(FillEndAnswer {
                file: name.into(),
                ended,
                boot_image_matches: None,
                mismatch: None,
            });
        }
        let (_, filling) = self.filling(name)?;
        let source = store::open_regular_file(&self.source.join(name)).map_err(|e| format!("{name}: {e}"))?;
        // The boot image was served on its publisher's word: now the data it stands for is here.
        let matches = filling.boot_image.verify_against(&source);
        self.fs.end_fill(name, Outcome::Complete);
        match matches {
            Ok(()) => Ok(FillEndAnswer {
                file: name.into(),
                ended: true,
                boot_image_matches: Some(true),
                mismatch: None,
            }),
            Err(e) => {
                log::error!("{name}: ALARM: the boot image served during the fill does not match the filled data: {e}");
                self.store.counters().rejected("fill_mismatch");
                Ok(FillEndAnswer {
                    file: name.into(),
                    ended: true,
                    boot_image_matches: Some(false),
                    mismatch: Some(e.to_string()),
                })
            }
        }
    }

    fn answer(&self, line: &str, client_uid: u32) -> Result<Answer, Failure> {
        serde_json::from_str::<Request>(line)
            .map_err(|e| Failure::from(format!("bad request: {e}")))
            .and_then(|r| self.handle(r, client_uid))
    }

    fn serve_client(&self, stream: UnixStream, limits: ClientLimits) -> std::io::Result<()> {
        // A client whose uid cannot be known is nobody's: it may install only files nobody owns.
        let client_uid = peer_uid(&stream).unwrap_or(u32::MAX);
        // A client that sends nothing, or reads no answer, for so long is let go.
        stream.set_read_timeout(Some(limits.idle))?;
        stream.set_write_timeout(Some(limits.idle))?;
        let mut writer = stream.try_clone()?;
        let mut reader = BufReader::new(stream);
        loop {
            let mut line = Vec::new();
            (&mut reader)
                .take(MAX_REQUEST_BYTES as u64 + 1)
                .read_until(b'\n', &mut line)?;
            if line.is_empty() {
                return Ok(());
            }
            if line.len() > MAX_REQUEST_BYTES {
                let refused = json_line(&Failed {
                    ok: false,
                    error: &format!("request longer than {MAX_REQUEST_BYTES} bytes"),
                    refused: None,
                });
                writeln!(writer, "{refused}")?;
                return Ok(());
            }
            let line = String::from_utf8_lossy(&line);
            if line.trim().is_empty() {
                continue;
            }
            let outcome = self.answer(&line, client_uid);
            debug!("control: {} -> ok={}", line.trim_end(), outcome.is_ok());
            writeln!(writer, "{}", reply_line(outcome))?;
        }
    }
}

/// The longest request line; a longer one is refused and its client let go.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// What one client of the control socket may take of a daemon that the OOM killer spares last.
#[derive(Clone, Copy, Debug)]
pub struct ClientLimits {
    /// Clients served at once (a thread each); one more is told so and let go.
    pub max_clients: usize,
    /// How long a client may send nothing, or read no answer, before it is let go.
    pub idle: std::time::Duration,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            max_clients: 32,
            idle: std::time::Duration::from_secs(60),
        }
    }
}

/// Creates the listening socket at `path` (replacing a stale one) with `access`'s group and mode.
/// A missing parent directory is created with mode 0755.
pub fn bind(path: &Path, access: SocketAccess) -> std::io::Result<UnixListener> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    if !dir.exists() {
        DirBuilder::new().recursive(true).mode(0o755).create(dir)?;
        // Whatever the umask: clients must reach the socket.
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    }
    // Bound where only we can reach it, given its group and mode, then renamed into place.
    let private = dir.join(format!(".ys{}", std::process::id()));
    let _ = fs::remove_dir_all(&private);
    DirBuilder::new().mode(0o700).create(&private)?;
    let bound = (|| {
        let staged = private.join("s");
        let listener = UnixListener::bind(&staged)?;
        if let Some(gid) = access.group {
            std::os::unix::fs::chown(&staged, None, Some(gid))?;
        }
        fs::set_permissions(&staged, fs::Permissions::from_mode(access.mode))?;
        fs::rename(&staged, path)?;
        Ok(listener)
    })();
    let _ = fs::remove_dir_all(&private);
    bound
}

/// Listens on `path` (see [`bind`]) and serves each client in its own thread, within `limits`.
pub fn serve(path: &Path, access: SocketAccess, daemon: Arc<Daemon>, limits: ClientLimits) -> std::io::Result<()> {
    let listener = bind(path, access)?;
    let clients = Arc::new(AtomicUsize::new(0));
    thread::Builder::new().name("yolofs-control".into()).spawn(move || {
        for stream in listener.incoming() {
            match stream {
                Ok(mut stream) => {
                    if clients.fetch_add(1, Ordering::SeqCst) >= limits.max_clients {
                        clients.fetch_sub(1, Ordering::SeqCst);
                        warn!(
                            "control socket: {} clients already: one more let go",
                            limits.max_clients
                        );
                        let _ = stream.set_write_timeout(Some(std::time::Duration::from_secs(1)));
                        let busy = json_line(&Failed {
                            ok: false,
                            error: &format!("yolofs serves {} clients already: try again", limits.max_clients),
                            refused: None,
                        });
                        let _ = writeln!(stream, "{busy}");
                        continue;
                    }
                    let daemon = daemon.clone();
                    let served = clients.clone();
                    let spawned = thread::Builder::new().name("yolofs-client".into()).spawn(move || {
                        if let Err(e) = daemon.serve_client(stream, limits) {
                            debug!("control client: {e}");
                        }
                        served.fetch_sub(1, Ordering::SeqCst);
                    });
                    if spawned.is_err() {
                        clients.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                Err(e) => warn!("control socket: {e}"),
            }
        }
    })?;
    Ok(())
}

/// Sends one request to a running yolofs and returns its answer.
pub fn call(path: &Path, request: &Value) -> std::io::Result<Value> {
    call_on(UnixStream::connect(path)?, request)
}

/// [`call`], giving up after `timeout` without an answer.
pub fn call_within(path: &Path, request: &Value, timeout: std::time::Duration) -> std::io::Result<Value> {
    let stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    call_on(stream, request)
}

fn call_on(mut stream: UnixStream, request: &Value) -> std::io::Result<Value> {
    writeln!(stream, "{request}")?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_by_op() {
        let parse = |s: &str| serde_json::from_str::<Request>(s);
        assert_eq!(parse(r#"{"op":"status"}"#).unwrap(), Request::Status);
        assert_eq!(parse(r#"{"op":"stats"}"#).unwrap(), Request::Stats { file: None });
        assert_eq!(
            parse(r#"{"op":"preload","file":"abc"}"#).unwrap(),
            Request::Preload { file: "abc".into() }
        );
        assert_eq!(
            parse(r#"{"op":"record_stop","file":"abc"}"#).unwrap(),
            Request::RecordStop { file: "abc".into() }
        );
        assert_eq!(
            parse(r#"{"op":"install","file":"abc","boot_image":"/tmp/b.yolo","image_id":"id"}"#).unwrap(),
            Request::Install {
                file: "abc".into(),
                boot_image: "/tmp/b.yolo".into(),
                image_id: "id".into()
            }
        );
        assert_eq!(
            parse(r#"{"op":"remember","file":"abc","image_id":"id"}"#).unwrap(),
            Request::Remember {
                file: "abc".into(),
                image_id: "id".into()
            }
        );
        assert_eq!(parse(r#"{"op":"prune"}"#).unwrap(), Request::Prune);
        assert!(parse(r#"{"op":"install","file":"abc","boot_image":"/b"}"#).is_err());
        assert!(parse(r#"{"op":"format_disk"}"#).is_err());
        assert!(parse(r#"{"op":"evict"}"#).is_err());
    }

    #[test]
    fn requests_serialise_to_what_they_parse_from() {
        for request in [
            Request::Status,
            Request::Stats {
                file: Some("abc".into()),
            },
            Request::RecordStop { file: "x".into() },
        ] {
            let line = serde_json::to_string(&request).unwrap();
            assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), request);
        }
        assert_eq!(
            serde_json::to_string(&Request::HostLoad).unwrap(),
            r#"{"op":"host_load"}"#
        );
    }

    #[test]
    fn file_names_cannot_escape_the_source_directory() {
        assert!(base_file_name("../etc/passwd").is_err());
        assert!(base_file_name("..").is_err());
        assert!(base_file_name("").is_err());
        assert!(base_file_name("a\0b").is_err());
        assert_eq!(base_file_name("0123abcd"), Ok("0123abcd"));
    }

    fn store_with_base(dir: &Path) -> BootImageStore {
        fs::create_dir(dir.join("base")).unwrap();
        fs::write(dir.join("base/disk"), vec![7u8; 65536]).unwrap();
        BootImageStore::new(crate::store::StoreConfig {
            dir: dir.join("store"),
            memory_budget: 1 << 20,
            lock_in_memory: false,
            share_blocks: true,
            max_boot_image_bytes: 1 << 20,
        })
    }

    #[test]
    fn install_and_remember_check_the_base_file_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_base(dir.path());
        let base = dir.path().join("base");
        let candidate = dir.path().join("candidate.yolo");
        for name in ["../base/disk", "", "..", "a/b"] {
            let err = install(&base, &store, name, &candidate, "id", 0).unwrap_err().error;
            assert!(err.contains("invalid base file name"), "{err}");
            let err = remember(&base, &store, name, "id").unwrap_err();
            assert!(err.contains("invalid base file name"), "{err}");
        }
        let err = install(&base, &store, "missing", &candidate, "id", 0).unwrap_err();
        assert!(err.error.contains("base file missing"), "{err:?}");
        // No base file yet is not the boot image's fault.
        assert!(!err.refused);
        // A base file that is a symbolic link (to anything the daemon could read) is not used.
        std::os::unix::fs::symlink("/etc/hostname", base.join("link")).unwrap();
        let err = install(&base, &store, "link", &candidate, "id", 0).unwrap_err().error;
        assert!(err.contains("symbolic link"), "{err}");
        assert!(remember(&base, &store, "link", "id").is_err());
        assert!(remember(&base, &store, "disk", "bad id").is_err());
        assert!(remember(&base, &store, "disk", "id").unwrap().changed);
        assert_eq!(store.image_id("disk").as_deref(), Some("id"));
    }

    #[test]
    fn modes_are_octal() {
        assert_eq!(parse_mode("0660"), Ok(0o660));
        assert_eq!(parse_mode("660"), Ok(0o660));
        assert_eq!(parse_mode("0o600"), Ok(0o600));
        for bad in ["", "0o", "8", "01777", "rw-rw----"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn groups_resolve_by_name_or_number() {
        assert_eq!(group_id("root"), Ok(0));
        assert_eq!(group_id("12345"), Ok(12345));
        let err = group_id("no-such-group-yolofs").unwrap_err();
        assert!(err.contains("unknown group"), "{err}");
    }

    #[test]
    fn the_socket_gets_its_group_and_mode_and_its_directory() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/yolofs/control.sock");
        // SAFETY: getegid has no preconditions.
        let gid = unsafe { libc::getegid() };
        let listener = bind(
            &path,
            SocketAccess {
                mode: 0o660,
                group: Some(gid),
            },
        )
        .unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o660);
        assert_eq!(meta.gid(), gid);
        assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
        assert_eq!(fs::metadata(path.parent().unwrap()).unwrap().mode() & 0o7777, 0o755);
        // Nothing left of the private directory it was bound in.
        let entries: Vec<_> = fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(entries.len(), 1);
        // It listens, and a stale socket is replaced by the next bind.
        let _client = UnixStream::connect(&path).unwrap();
        drop(listener);
        let _listener = bind(
            &path,
            SocketAccess {
                mode: 0o600,
                group: None,
            },
        )
        .unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
        assert_eq!(peer_uid(&UnixStream::connect(&path).unwrap()).ok(), Some(unsafe_uid()));
    }

    fn unsafe_uid() -> u32 {
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }
    }
}
