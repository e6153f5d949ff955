//! Restarts that keep the mount.
//!
//! A FUSE mount lives as long as some process holds its `/dev/fuse` descriptor. yolofs hands its
//! descriptor to a keeper with the service manager's file descriptor store protocol
//! (`sd_notify` `FDSTORE=1`, named `yolofs-fuse`); a yolofs started with that descriptor
//! (`LISTEN_FDS`) serves the existing mount instead of making one, and asks the kernel to send
//! again the requests its predecessor had read but not answered (`FUSE_NOTIFY_RESEND`, Linux
//! 6.9 and later), so a guest reading through the mount waits for the restart instead of failing.
//!
//! The keeper is systemd (`FileDescriptorStoreMax=`) or [`keep`] (`yolofs keep -- yolofs mount
//! ...`), which speaks the same protocol: it starts yolofs, holds the descriptor, and starts
//! yolofs again whenever it exits while the mount lives. It does no I/O on the mount, so it is
//! small and is not what the OOM killer picks.

use std::ffi::OsString;
use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{info, warn};
use sd_notify::NotifyState;
use sendfd::RecvWithFd;
use thiserror::Error;

/// Why `yolofs keep` could not run or keep its command.
#[derive(Debug, Error)]
pub enum KeepError {
    #[error("no command to keep (yolofs keep -- yolofs mount ...)")]
    NoCommand,
    #[error("keeper directory {dir}: {source}")]
    Directory { dir: PathBuf, source: io::Error },
    #[error("binding {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
    #[error("starting {program}: {source}")]
    Start { program: String, source: io::Error },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// The name under which the mount's `/dev/fuse` descriptor is stored.
pub const FUSE_FD_NAME: &str = "yolofs-fuse";

/// The kernel's `FUSE_NOTIFY_RESEND` notification code (include/uapi/linux/fuse.h).
const FUSE_NOTIFY_RESEND: i32 = 7;

/// The mount's descriptor, if the keeper passed one to this process.
pub fn inherited_fuse_fd() -> Option<OwnedFd> {
    let fds = match sd_notify::listen_fds_with_names(true) {
        Ok(fds) => fds,
        Err(e) => {
            warn!("ignoring the descriptors passed in LISTEN_FDS: {e}");
            return None;
        }
    };
    let mut fuse = None;
    for (fd, name) in fds {
        // SAFETY: LISTEN_FDS hands this process (LISTEN_PID) ownership of these descriptors.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        if name == FUSE_FD_NAME {
            fuse = Some(owned);
        }
    }
    fuse
}

/// Set by `yolofs keep` for its child.
const KEEPER_VARIABLE: &str = "YOLOFS_KEEPER";

/// Whether a keeper holds our descriptors: `yolofs keep`, or systemd with a file descriptor
/// store (which it says in $FDSTORE since v254; an older systemd is a keeper only through
/// `yolofs keep`, as the unit runs yolofs).
pub fn present() -> bool {
    std::env::var_os(KEEPER_VARIABLE).is_some()
        || std::env::var("FDSTORE").is_ok_and(|n| n.parse::<u32>().is_ok_and(|n| n > 0))
}

/// Hands the mount's descriptor to the keeper.
pub fn store(fd: BorrowedFd) -> io::Result<()> {
    let states = [NotifyState::FdStore, NotifyState::FdName(FUSE_FD_NAME)];
    sd_notify::notify_with_fds(false, &states, &[fd])
}

/// Tells the keeper the mount is gone: the next yolofs mounts afresh.
pub fn forget() {
    let states = [NotifyState::FdStoreRemove, NotifyState::FdName(FUSE_FD_NAME)];
    if let Err(e) = sd_notify::notify(false, &states) {
        warn!("telling the keeper to drop the mount's descriptor: {e}");
    }
}

/// Asks the kernel to queue again every request a process before us read from this connection
/// and did not answer. False if the kernel cannot (Linux < 6.9): those requests would wait for
/// ever, so the caller gives the mount up instead (they then fail, as without a keeper).
pub fn resend_in_flight(fd: BorrowedFd) -> bool {
    // struct fuse_out_header { u32 len; i32 error (the notification code); u64 unique (0) }
    let mut header = [0u8; 16];
    header[..4].copy_from_slice(&16u32.to_ne_bytes());
    header[4..8].copy_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    // SAFETY: fd is a valid descriptor and header a readable buffer of header.len() bytes.
    let written = unsafe { libc::write(fd.as_raw_fd(), header.as_ptr().cast(), header.len()) };
    if written < 0 {
        warn!(
            "the kernel cannot resend the requests the previous yolofs left unanswered ({}; \
             FUSE_NOTIFY_RESEND needs Linux 6.9): giving the mount up, they fail",
            io::Error::last_os_error()
        );
        return false;
    }
    info!("asked the kernel to resend the requests the previous yolofs left unanswered");
    true
}

/// A child exiting this soon after its start is restarted after a growing delay, not at once.
const QUICK_EXIT: Duration = Duration::from_secs(2);
const MAX_RESTART_DELAY: Duration = Duration::from_secs(5);

/// The descriptors a keeper holds, by name, kept at numbers above the ones passed to children.
#[derive(Default)]
struct Store {
    fds: Vec<(String, OwnedFd)>,
}

impl Store {
    fn put(&mut self, name: &str, fd: OwnedFd) -> io::Result<()> {
        // SAFETY: fd is valid; F_DUPFD_CLOEXEC returns a new descriptor or -1.
        let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100) };
        if high < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: high is a new descriptor that nothing else owns.
        let high = unsafe { OwnedFd::from_raw_fd(high) };
        self.remove(name);
        self.fds.push((name.to_string(), high));
        Ok(())
    }

    fn remove(&mut self, name: &str) {
        self.fds.retain(|(n, _)| n != name);
    }

    fn holds_mount(&self) -> bool {
        self.fds.iter().any(|(n, _)| n == FUSE_FD_NAME)
    }
}

/// The service manager's notification socket, if the keeper runs under one (its own
/// NOTIFY_SOCKET, which the keeper then points at itself for its child).
struct Upstream(Option<OsString>);

impl Upstream {
    fn notify(&self, message: &str) {
        self.notify_with_fds(message, &[]);
    }

    /// Also what the keeper holds goes to the service manager's own store (systemd's
    /// FileDescriptorStoreMax=): if the keeper itself is killed, the next one gets it back.
    fn notify_with_fds(&self, message: &str, fds: &[RawFd]) {
        use sendfd::SendWithFd;
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::net::SocketAddr;
        let Some(path) = &self.0 else { return };
        let address = match path.as_bytes().strip_prefix(b"@") {
            Some(name) => SocketAddr::from_abstract_name(name),
            None => SocketAddr::from_pathname(path),
        };
        let sent = address.and_then(|address| {
            let socket = UnixDatagram::unbound()?;
            socket.connect_addr(&address)?;
            socket.send_with_fd(message.as_bytes(), fds)
        });
        if let Err(e) = sent {
            warn!("telling the service manager {message:?}: {e}");
        }
    }
}

/// The keeper's notification socket and what its notifications leave: the descriptors held,
/// whether READY went to the service manager.
struct Notifications {
    socket: UnixDatagram,
    store: Store,
    upstream: Upstream,
    ready_forwarded: bool,
}

impl Notifications {
    /// Handles one notification if one arrives within the socket's timeout; false if none did.
    fn receive(&mut self) -> bool {
        let mut buffer = [0u8; 4096];
        let mut fds = [-1 as RawFd; 8];
        match self.socket.recv_with_fd(&mut buffer, &mut fds) {
            Ok((bytes, nfds)) => {
                // SAFETY: recvmsg installed these descriptors in this process for us alone.
                let owned = fds[..nfds]
                    .iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(*fd) })
                    .collect();
                self.apply(&String::from_utf8_lossy(&buffer[..bytes]), owned);
                true
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                false
            }
            Err(e) => {
                warn!("keeper socket: {e}");
                std::thread::sleep(Duration::from_millis(100));
                false
            }
        }
    }

    /// Applies one notification: FDSTORE / FDSTOREREMOVE with FDNAME, READY passed on.
    fn apply(&mut self, message: &str, fds: Vec<OwnedFd>) {
        let field = |key: &str| message.lines().find_map(|l| l.strip_prefix(key)).map(str::to_string);
        let name = field("FDNAME=").unwrap_or_else(|| "stored".to_string());
        if field("FDSTORE=").as_deref() == Some("1") {
            for fd in fds {
                self.upstream
                    .notify_with_fds(&format!("FDSTORE=1\nFDNAME={name}"), &[fd.as_raw_fd()]);
                match self.store.put(&name, fd) {
                    Ok(()) => info!("holding descriptor {name}"),
                    Err(e) => warn!("cannot hold descriptor {name}: {e}"),
                }
            }
        }
        if field("FDSTOREREMOVE=").as_deref() == Some("1") {
            self.upstream.notify(&format!("FDSTOREREMOVE=1\nFDNAME={name}"));
            self.store.remove(&name);
            info!("dropped descriptor {name}");
        }
        if field("READY=").as_deref() == Some("1") && !self.ready_forwarded {
            self.ready_forwarded = true;
            self.upstream.notify("READY=1");
        }
    }
}

/// A private directory for the keeper's notification socket (only our user may send to it).
fn socket_dir() -> Result<PathBuf, KeepError> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::var_os("RUNTIME_DIRECTORY")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("yolofs-keeper-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|source| KeepError::Directory {
            dir: dir.clone(),
            source,
        })?;
    Ok(dir)
}

fn spawn(command: &[OsString], socket: &std::path::Path, store: &Store) -> Result<Child, KeepError> {
    use std::ffi::CString;
    let mut child = Command::new(&command[0]);
    child.args(&command[1..]);
    // The child inherits the environment set here: not through Command::env, whose copy the
    // child's setenv of LISTEN_PID could not reach (the keeper runs no other thread).
    std::env::set_var("NOTIFY_SOCKET", socket);
    std::env::set_var(KEEPER_VARIABLE, "1");
    let fds: Vec<RawFd> = store.fds.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
    if fds.is_empty() {
        for key in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
            std::env::remove_var(key);
        }
    } else {
        let names: Vec<&str> = store.fds.iter().map(|(n, _)| n.as_str()).collect();
        std::env::set_var("LISTEN_FDS", fds.len().to_string());
        std::env::set_var("LISTEN_FDNAMES", names.join(":"));
    }
    let listen_pid = CString::new(b"LISTEN_PID".as_slice()).unwrap();
    // SAFETY: the closure runs between fork and exec; it calls only dup2, getpid and setenv on a
    // prepared name (std holds its environment lock across fork, so std::env cannot be used).
    unsafe {
        child.pre_exec(move || {
            for (i, fd) in fds.iter().enumerate() {
                if libc::dup2(*fd, 3 + i as RawFd) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if !fds.is_empty() {
                // LISTEN_PID must be the child's own pid, known only now.
                let mut digits = [0u8; 24];
                let pid = format_pid(libc::getpid(), &mut digits);
                if libc::setenv(listen_pid.as_ptr(), pid.as_ptr().cast(), 1) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    child.spawn().map_err(|source| KeepError::Start {
        program: command[0].to_string_lossy().into_owned(),
        source,
    })
}

/// `pid` as a NUL-terminated decimal string in `buffer`, without allocating (after fork).
fn format_pid(pid: libc::pid_t, buffer: &mut [u8; 24]) -> &[u8] {
    let mut n = pid.unsigned_abs();
    let mut start = buffer.len() - 1;
    buffer[start] = 0;
    loop {
        start -= 1;
        buffer[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buffer[start..];
        }
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (_, Some(signal)) => format!("was killed by signal {signal}"),
        _ => "ended".to_string(),
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Runs `command` (a `yolofs mount`), holding its mount's descriptor and starting it again
/// whenever it exits while the mount lives. SIGTERM and SIGINT are passed on and end the keeper
/// once the child has unmounted; SIGHUP restarts the child (to upgrade yolofs: it hands over the
/// mount). Returns the exit code of the last child.
pub fn keep(command: &[OsString]) -> Result<i32, KeepError> {
    if command.is_empty() {
        return Err(KeepError::NoCommand);
    }
    let terminate = Arc::new(AtomicBool::new(false));
    let hangup = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, terminate.clone())?;
    }
    signal_hook::flag::register(signal_hook::consts::SIGHUP, hangup.clone())?;

    let upstream = Upstream(std::env::var_os("NOTIFY_SOCKET"));
    let dir = socket_dir()?;
    let socket_path = dir.join("notify");
    let socket = UnixDatagram::bind(&socket_path).map_err(|source| KeepError::Bind {
        path: socket_path.clone(),
        source,
    })?;
    socket.set_read_timeout(Some(Duration::from_millis(100)))?;

    // A keeper started again by the service manager gets back what the last one held.
    let mut store = Store::default();
    if let Some(fd) = inherited_fuse_fd() {
        store.put(FUSE_FD_NAME, fd)?;
        info!("holding descriptor {FUSE_FD_NAME} from the service manager");
    }
    let mut notifications = Notifications {
        socket,
        store,
        upstream,
        ready_forwarded: false,
    };
    let mut delay = Duration::from_millis(100);
    let mut restarts = 0;
    let result = loop {
        let started = Instant::now();
        let mut child = match spawn(command, &socket_path, &notifications.store) {
            Ok(child) => child,
            // The binary being replaced, no memory to fork: the mount waits for the next try.
            Err(e) if notifications.store.holds_mount() && !terminate.load(Ordering::Relaxed) => {
                warn!("{e}: trying again in {delay:?}");
                std::thread::sleep(delay);
                delay = (delay * 2).min(MAX_RESTART_DELAY);
                continue;
            }
            Err(e) => return Err(e),
        };
        info!("started {} (pid {})", command[0].to_string_lossy(), child.id());
        let mut stopping_sent = false;
        let status = loop {
            notifications.receive();
            if terminate.load(Ordering::Relaxed) && !stopping_sent {
                stopping_sent = true;
                notifications.upstream.notify("STOPPING=1");
                signal_child(&child, libc::SIGTERM);
            }
            if hangup.swap(false, Ordering::Relaxed) {
                info!("SIGHUP: restarting yolofs (it hands the mount over)");
                signal_child(&child, libc::SIGHUP);
            }
            if let Some(status) = child.try_wait()? {
                break status;
            }
        };
        // Messages sent just before the exit (a clean stop's FDSTOREREMOVE) count.
        while notifications.receive() {}
        if terminate.load(Ordering::Relaxed) || !notifications.store.holds_mount() {
            info!("yolofs {}; the mount is not kept", describe(status));
            break exit_code(status);
        }
        delay = if started.elapsed() < QUICK_EXIT {
            (delay * 2).min(MAX_RESTART_DELAY)
        } else {
            Duration::from_millis(100)
        };
        restarts += 1;
        warn!(
            "yolofs {}: starting it again on the kept mount (restart {restarts})",
            describe(status)
        );
        let deadline = Instant::now() + delay;
        while Instant::now() < deadline && !terminate.load(Ordering::Relaxed) {
            notifications.receive();
        }
        if terminate.load(Ordering::Relaxed) {
            // Nobody serves the mount now: dropping its descriptor ends it (a later yolofs
            // detaches what is left).
            break exit_code(status);
        }
    };
    drop(notifications);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(result)
}

fn signal_child(child: &Child, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions; the child is not reaped yet, so its pid is
    // still its own.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
}
