//! Base files that change under a verified boot image: the read leases and multigrain
//! timestamps that keep a verification across a touch (Nova's marking of the base files in use),
//! the touches yolofs makes itself, and the background queue that verifies changed boot images
//! again.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use log::{debug, info, warn};
use serde::Serialize;

use super::files::open_regular_file;
use super::stamp::{read_stamp, save_stamp, SourceKey, Stamp, SETTLE};
use super::BootImageStore;
use crate::lease::{self, Lease, LeaseError};

/// What keeps boot images verified across a change of their base file's times (a touch), for
/// `status` and the metrics.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TouchSafety {
    /// `leases`, `multigrain_timestamps` (touches through yolofs only) or `none`, or `unknown`
    /// before the first base file was leased.
    pub mechanism: &'static str,
    /// Why leases are not used, if they are not.
    pub lease_error: Option<String>,
}

/// Set (to anything) by tests and benchmarks to make yolofs behave as on a kernel without
/// multigrain timestamps (before Linux 6.13), on any kernel.
pub const COARSE_TIMESTAMPS_ENV: &str = "YOLOFS_ASSUME_COARSE_TIMESTAMPS";

/// Whether every change to `file` after its ctime was read moves its ctime, even within the same
/// clock tick: Linux 6.13's multigrain timestamps, on ext4, XFS, Btrfs and tmpfs.
pub fn ctime_moves_at_every_change(file: &File) -> bool {
    if std::env::var_os(COARSE_TIMESTAMPS_ENV).is_some() {
        return false;
    }
    // The local filesystems of leases are those with multigrain timestamps.
    let Ok(fs_type) = lease::filesystem_type(file) else {
        return false;
    };
    let mut uts = std::mem::MaybeUninit::<libc::utsname>::uninit();
    // SAFETY: the buffer is writable and large enough, and read only after the call succeeded.
    let uts = unsafe {
        if libc::uname(uts.as_mut_ptr()) != 0 {
            return false;
        }
        uts.assume_init()
    };
    let release: String = uts
        .release
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8 as char)
        .collect();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    version >= (6, 13) && lease::LOCAL_FILESYSTEMS.contains(&fs_type)
}

/// The boot images to verify again after their base file changed, for one background thread.
#[derive(Default)]
pub(super) struct ReverifyQueue {
    /// Base file names, and when to verify each.
    due: HashMap<String, Instant>,
    /// Whether a thread works through it.
    running: bool,
}

impl BootImageStore {
    /// A read lease on `source`, or None where the kernel or the filesystem gives none (the
    /// outcome remembered for [`touch_safety`](Self::touch_safety)); an error if the file is
    /// open for writing, which says nothing of the filesystem.
    pub(super) fn take_lease(&self, source: &File) -> Result<Option<Arc<Lease>>, LeaseError> {
        let taken = Lease::take(source);
        match &taken {
            Err(LeaseError::OpenForWriting) => return Err(LeaseError::OpenForWriting),
            Err(e) => lease::warn_unavailable(e),
            Ok(_) => {}
        }
        let outcome = (
            taken.as_ref().map(|_| ()).map_err(Clone::clone),
            ctime_moves_at_every_change(source),
        );
        *self.lease_outcome.lock().unwrap() = Some(outcome);
        Ok(taken.ok())
    }

    /// What keeps boot images verified across a touch of their base file here, as the last
    /// attempt to lease one found.
    pub fn touch_safety(&self) -> TouchSafety {
        match self.lease_outcome.lock().unwrap().clone() {
            None => TouchSafety {
                mechanism: "unknown",
                lease_error: None,
            },
            Some((Ok(()), _)) => TouchSafety {
                mechanism: "leases",
                lease_error: None,
            },
            Some((Err(e), multigrain)) => TouchSafety {
                mechanism: if multigrain { "multigrain_timestamps" } else { "none" },
                lease_error: Some(e.to_string()),
            },
        }
    }

    /// Tries a lease on `file` (a base file) to learn what [`touch_safety`](Self::touch_safety)
    /// reports before any boot image is loaded; at start, on one base file.
    pub fn probe_touch_safety(&self, file: &File) {
        let _ = self.take_lease(file);
    }

    /// Base file `name` in `source_dir` changed (a write, or its times set) since its boot image
    /// was verified, and is now as `now` says. A boot image whose verification still holds (a
    /// touch under a lease) is kept, and its stamp moved once the change has settled. Otherwise,
    /// once per state of the file: the boot image is dropped from memory and, if it was there
    /// (in use), queued to be verified again by one background thread a second after the
    /// change, so that the next boots find it ready (or refused) without verifying at open.
    /// Boot images not in memory are verified when next loaded.
    pub fn source_changed(self: &Arc<Self>, source_dir: &Path, name: &str, now: SourceKey) {
        let state = self.state.lock().unwrap();
        if let Some(loaded) = state.loaded.peek(name).filter(|loaded| loaded.holds_for(&now)) {
            if loaded.key != now {
                drop(state);
                self.queue_reverify(source_dir, name);
            }
            return;
        }
        drop(state);
        {
            let mut seen = self.reverified.lock().unwrap();
            if seen.get(name) == Some(&now) || !self.path_for(name).exists() {
                return;
            }
            seen.insert(name.to_string(), now);
        }
        if self.evict(name) {
            self.queue_reverify(source_dir, name);
        }
    }

    /// Has `name` loaded (verified again if it must be) by one background thread a second from
    /// now, once its base file's ctime has settled.
    fn queue_reverify(self: &Arc<Self>, source_dir: &Path, name: &str) {
        let mut queue = self.reverify_queue.lock().unwrap();
        // A second after the last change: its ctime has settled by then.
        let due = Instant::now() + SETTLE;
        let entry = queue.due.entry(name.to_string()).or_insert(due);
        *entry = (*entry).max(due);
        if queue.running {
            return;
        }
        let (store, source_dir) = (self.clone(), source_dir.to_path_buf());
        match std::thread::Builder::new()
            .name("yolofs-reverify".into())
            .spawn(move || store.reverify_queued(&source_dir))
        {
            Ok(_) => queue.running = true,
            Err(e) => {
                warn!("cannot verify changed boot images again now: {e}");
                queue.due.clear();
            }
        }
    }

    /// The queue of [`source_changed`](Self::source_changed), until it is empty.
    fn reverify_queued(&self, source_dir: &Path) {
        loop {
            let (name, due) = {
                let mut queue = self.reverify_queue.lock().unwrap();
                let next = queue
                    .due
                    .iter()
                    .min_by_key(|(_, due)| **due)
                    .map(|(n, d)| (n.clone(), *d));
                match next {
                    Some(next) => next,
                    None => {
                        queue.running = false;
                        return;
                    }
                }
            };
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            self.reverify_queue.lock().unwrap().due.remove(&name);
            match open_regular_file(&source_dir.join(&name)) {
                Ok(source) => match self.load(&name, &source) {
                    Ok(_) => info!("{name}: boot image verified again after its base file changed"),
                    Err(e) => debug!("{name}: not verified again: {e}"),
                },
                Err(e) => debug!("{name}: not verified again: {e}"),
            }
        }
    }

    /// Sets base file `name`'s access and modification times to now, as Nova's image cache marks
    /// the base files in use (it ages them by their mtime), and keeps its boot image's
    /// verification: a time set moves the file's ctime, which would otherwise cost a verification
    /// again, reading the boot's bytes from the disk at the start of every boot. Whether a
    /// verification (in memory or stamped) was kept.
    ///
    /// A boot image held under a lease keeps its verification whatever the times (see
    /// [`Verified::holds_for`](super::Verified::holds_for)); its stamp follows once the ctime has
    /// settled. Without a lease, only where the ctime read after the touch moves at any later
    /// write, even in the same clock tick (the racily-clean rule of [`SETTLE`] cannot wait here):
    /// filesystems with multigrain
    /// timestamps, where yolofs, which changes nothing but the times under the store's lock,
    /// moves the key of the boot image and of its stamp to the file as it is. Elsewhere the times
    /// are set and the boot image is verified again.
    pub fn touch(self: &Arc<Self>, source_dir: &Path, name: &str, source: &File) -> std::io::Result<bool> {
        let multigrain = ctime_moves_at_every_change(source);
        let path = self.path_for(name);
        let mut state = self.state.lock().unwrap();
        let before = SourceKey::of(source)?;
        let now = libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        };
        // SAFETY: `source` is an open descriptor and `times` two valid timespecs.
        if unsafe { libc::futimens(source.as_raw_fd(), [now, now].as_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let after = SourceKey::of(source)?;
        if let Some(loaded) = state.loaded.peek_mut(name) {
            if loaded.lease.as_ref().is_some_and(|l| l.intact()) && loaded.holds_for(&after) {
                drop(state);
                self.queue_reverify(source_dir, name);
                return Ok(true);
            }
        }
        if !multigrain {
            return Ok(false);
        }
        let mut kept = false;
        if let Some(loaded) = state.loaded.peek_mut(name).filter(|l| l.key == before) {
            loaded.key = after;
            kept = true;
        }
        if let Some(stamp) = read_stamp(&path).filter(|stamp| stamp.source == before) {
            save_stamp(&path, &Stamp { source: after, ..stamp })?;
            kept = true;
        }
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::*;
    use crate::store::fixture::{content, Fixture, IMAGE};
    use crate::store::stamp::{stamp_matches, BootImageKey};

    #[test]
    fn a_touch_keeps_a_leased_verification_whatever_the_timestamps() {
        let f = Fixture::new(1 << 30);
        f.install(&f.candidate(&content(0), IMAGE), IMAGE).unwrap();
        let loaded = f.store.load("disk", &f.base()).unwrap();
        assert!(loaded.leased());
        let verified = SourceKey::of(&f.base()).unwrap();
        // Times set behind the store's back (Nova's image cache manager) and through it.
        let old_times = std::fs::FileTimes::new().set_modified(UNIX_EPOCH + Duration::from_secs(1000));
        f.base().set_times(old_times).unwrap();
        assert!(f.store.cached("disk", &SourceKey::of(&f.base()).unwrap()).is_some());
        assert!(f.store.touch(&f.base_dir(), "disk", &f.base()).unwrap());
        let now = SourceKey::of(&f.base()).unwrap();
        assert!(now != verified);
        let modified = f.base().metadata().unwrap().modified().unwrap();
        assert!(SystemTime::now().duration_since(modified).unwrap() < Duration::from_secs(60));
        assert!(loaded.holds_for(&now));
        assert!(f.store.cached("disk", &now).is_some());
        // The stamp follows once the change has settled, so that a restart finds it verified
        // (not before: unless the machine paused for that long since the touch).
        let stamped = stamp_matches(&f.store.path_for("disk"), BootImageKey::of(&loaded.image), &now);
        assert!(!stamped || now.is_settled());
        std::thread::sleep(SETTLE);
        assert!(f.store.cached("disk", &now).is_some());
        // Moved by that call or by the re-check the touch queued, whichever came first.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !stamp_matches(&f.store.path_for("disk"), BootImageKey::of(&loaded.image), &now) {
            assert!(Instant::now() < deadline, "the stamp did not follow the touch");
            std::thread::sleep(Duration::from_millis(10));
        }
        // An open for writing ends it, even with no byte written and the times as they were.
        let writer = fs::OpenOptions::new()
            .write(true)
            .open(f.base_dir().join("disk"))
            .unwrap();
        writer.set_times(old_times).unwrap();
        f.base()
            .set_times(std::fs::FileTimes::new().set_modified(modified))
            .unwrap();
        let changed = SourceKey::of(&f.base()).unwrap();
        assert!(!loaded.holds_for(&changed));
        assert!(f.store.cached("disk", &changed).is_none());
    }
}
