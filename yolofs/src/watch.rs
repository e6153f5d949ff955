//! Watching the source directory for writes to base files.
//!
//! Nova's base files never change once renamed into place, but YOLO must stay correct if one
//! does: a boot image describes bytes that are then gone. Reads served by yolofs check the base
//! file's ctime themselves ([`MirrorFs::read`]); what they cannot see is the kernel's page cache
//! of the mount, which answers reads without asking yolofs. This watcher drops that cache as soon
//! as a base file is written to or has its times set, and has the boot image verified again, so
//! the next boot finds it ready (or refused) instead of verifying it at open.

use std::sync::Arc;
use std::thread;

use inotify::{EventMask, Inotify, WatchMask};
use log::{debug, warn};

use crate::fs::MirrorFs;

/// Starts a thread that tells `fs` of every change to a file of its source directory; `drop_cache`
/// drops the kernel's cache of one of our inodes.
pub fn watch_source(fs: Arc<MirrorFs>, drop_cache: impl Fn(u64) + Send + 'static) -> std::io::Result<()> {
    let mut inotify = Inotify::init()?;
    // IN_MODIFY: write, truncate, fallocate; IN_ATTRIB: times (and ctime) set; IN_CLOSE_WRITE:
    // the end of a writer's session, after writes through a mapping.
    inotify.watches().add(
        fs.source_root(),
        WatchMask::MODIFY | WatchMask::ATTRIB | WatchMask::CLOSE_WRITE,
    )?;
    thread::Builder::new().name("yolofs-watch".into()).spawn(move || {
        let mut buffer = [0u8; 8192];
        loop {
            let events = match inotify.read_events_blocking(&mut buffer) {
                Ok(events) => events,
                Err(e) => {
                    warn!("watching {} for changes stopped: {e}", fs.source_root().display());
                    return;
                }
            };
            for event in events {
                let names = if event.mask.contains(EventMask::Q_OVERFLOW) {
                    // Events were lost: whatever changed, every file is to be treated as changed.
                    warn!(
                        "too many changes in {} at once: treating every file as changed",
                        fs.source_root().display()
                    );
                    std::fs::read_dir(fs.source_root())
                        .map(|entries| {
                            entries
                                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                                .collect::<Vec<_>>()
                        })
                        .unwrap_or_default()
                } else {
                    match event.name.and_then(|n| n.to_str()) {
                        Some(name) => vec![name.to_string()],
                        None => continue,
                    }
                };
                for name in names {
                    debug!("{name}: changed ({:?})", event.mask);
                    for ino in fs.source_changed(&name) {
                        drop_cache(ino);
                    }
                }
            }
        }
    })?;
    Ok(())
}
