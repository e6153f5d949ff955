//! The thin `fuser::Filesystem` adapter over [`MirrorFs`].
//!
//! Each operation calls the filesystem core and has one error path: log (expected misses at
//! debug, the rest at warn) and reply with the error's errno.
//!
//! Opening picks how the kernel serves the file:
//! - files being learned (and, with `--learn`, boots watched to extend their boot image):
//!   `direct_io`, so every read the guest makes reaches the recorder instead of being absorbed by
//!   the page cache, and kernel readahead adds nothing the guest did not read;
//! - files on a kernel-served inode (`Serving::Kernel`: no boot image): FUSE passthrough, the
//!   kernel reads the source file itself and yolofs is off the I/O path (Linux >= 6.9);
//! - the rest (files with a boot image): through the page cache, with `keep_cache` (base files are
//!   immutable once renamed into place, so their pages stay valid across opens).
//!
//! The passthrough opens of one inode must share one kernel backing id, held while any is open.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyXattr, Request,
};
use log::{debug, warn};

use crate::fs::{Attr, FsError, Kind, MirrorFs};

/// Kernel backing ids of inodes with passthrough opens, and which open uses which inode.
#[derive(Default)]
struct Backings {
    by_inode: HashMap<u64, (Arc<BackingId>, usize)>,
    inode_of: HashMap<u64, u64>,
}

pub struct FuseAdapter {
    fs: Arc<MirrorFs>,
    /// How long the kernel may cache attributes and entries.
    attr_ttl: Duration,
    /// Let the kernel keep the page cache of immutable files across opens.
    keep_cache: bool,
    /// Ask the kernel for FUSE passthrough at mount time.
    kernel_passthrough: bool,
    backings: Mutex<Backings>,
}

impl FuseAdapter {
    pub fn new(fs: Arc<MirrorFs>, attr_ttl: Duration, keep_cache: bool, kernel_passthrough: bool) -> FuseAdapter {
        FuseAdapter {
            fs,
            attr_ttl,
            keep_cache,
            kernel_passthrough,
            backings: Mutex::default(),
        }
    }

    /// Replies to a passthrough open, sharing the inode's backing id. On failure, passthrough is
    /// turned off for good and this open goes through the page cache (the inode has no
    /// passthrough opens, or its backing id would exist already).
    fn open_passthrough(&self, ino: u64, fh: u64, reply: ReplyOpen) {
        let mut backings = self.backings.lock().unwrap();
        let backing = match backings.by_inode.get_mut(&ino) {
            Some((backing, opens)) => {
                *opens += 1;
                backing.clone()
            }
            None => match self.fs.with_source(fh, |file| reply.open_backing(file)) {
                Ok(Ok(backing)) => {
                    let backing = Arc::new(backing);
                    backings.by_inode.insert(ino, (backing.clone(), 1));
                    backing
                }
                Ok(Err(e)) | Err(FsError::Io(e)) => {
                    warn!("kernel passthrough refused ({e}); yolofs serves every file from now on");
                    self.fs.set_kernel_passthrough(false);
                    return reply.opened(FileHandle(fh), FopenFlags::empty());
                }
                Err(e) => return reply.error(self.errno("open", &e)),
            },
        };
        backings.inode_of.insert(fh, ino);
        drop(backings);
        self.fs.note_kernel_passthrough(fh);
        reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &backing);
    }

    fn release_passthrough(&self, fh: u64) {
        let mut backings = self.backings.lock().unwrap();
        let Some(ino) = backings.inode_of.remove(&fh) else {
            return;
        };
        if let Some((_, opens)) = backings.by_inode.get_mut(&ino) {
            *opens -= 1;
            if *opens == 0 {
                // Closing the id is safe: the kernel holds the backing file of open files itself.
                backings.by_inode.remove(&ino);
            }
        }
    }
}

fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.blocks,
        atime: attr.atime,
        mtime: attr.mtime,
        ctime: attr.ctime,
        crtime: attr.ctime,
        kind: match attr.kind {
            Kind::File | Kind::Other => FileType::RegularFile,
            Kind::Directory => FileType::Directory,
            Kind::Symlink => FileType::Symlink,
        },
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: 0,
        blksize: attr.blksize,
        flags: 0,
    }
}

impl FuseAdapter {
    /// The errno to answer `op` with, logged and counted.
    fn errno(&self, op: &'static str, err: &FsError) -> Errno {
        if err.is_expected() {
            debug!("{op}: {err}");
        } else {
            warn!("{op}: {err}");
        }
        self.fs.stats().operation_error(op, err.errno());
        Errno::from_i32(err.errno())
    }
}

impl fuser::Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Without ASYNC_DIO the kernel serialises O_DIRECT AIO (QEMU with cache=none) to one
        // request at a time; PARALLEL_DIROPS lets lookups of different names run at once.
        // AUTO_INVAL_DATA: the kernel drops its cache of a file whose mtime or size it sees change
        // (the source directory watcher drops it at once; this is the net under it).
        for capability in [
            InitFlags::FUSE_ASYNC_DIO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_AUTO_INVAL_DATA,
        ] {
            if config.add_capabilities(capability).is_err() {
                warn!("the kernel does not offer {capability:?}");
            }
        }
        if self.kernel_passthrough {
            // Stack depth 2: the source directory may itself be on a stacked filesystem (overlayfs).
            let granted =
                config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok() && config.set_max_stack_depth(2).is_ok();
            self.fs.set_kernel_passthrough(granted);
            if !granted {
                warn!("the kernel offers no FUSE passthrough: files without a boot image are read through yolofs");
            }
        }
        // Readahead as large as the kernel allows, and many readahead requests in flight.
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(parent.0, name) {
            Ok(attr) => reply.entry(&self.attr_ttl, &file_attr(&attr), Generation(0)),
            Err(e) => reply.error(self.errno("lookup", &e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0, fh.map(|f| f.0)) {
            Ok(attr) => reply.attr(&self.attr_ttl, &file_attr(&attr)),
            Err(e) => reply.error(self.errno("getattr", &e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(target) => reply.data(target.as_encoded_bytes()),
            Err(e) => reply.error(self.errno("readlink", &e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.open(ino.0, flags.0) {
            Ok(opened) if opened.kernel_passthrough => self.open_passthrough(ino.0, opened.fh, reply),
            Ok(opened) => {
                let flags = if opened.direct_io {
                    FopenFlags::FOPEN_DIRECT_IO
                } else if self.keep_cache && opened.immutable {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                reply.opened(FileHandle(opened.fh), flags)
            }
            Err(e) => reply.error(self.errno("open", &e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(ino.0, fh.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(self.errno("read", &e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.release_passthrough(fh.0);
        self.fs.release(fh.0);
        reply.ok();
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // Nothing to flush on a read-only mirror. ENOSYS tells the kernel never to ask again, so
        // that no close(2) waits for yolofs (a process closing files while yolofs restarts).
        reply.error(Errno::ENOSYS);
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let entries = match self.fs.readdir(ino.0) {
            Ok(entries) => entries,
            Err(e) => return reply.error(self.errno("readdir", &e)),
        };
        let dots = [
            (ino.0, FileType::Directory, OsStr::new(".")),
            (ino.0, FileType::Directory, OsStr::new("..")),
        ];
        let all = dots.into_iter().chain(entries.iter().map(|(child, kind, name)| {
            let kind = match kind {
                Kind::Directory => FileType::Directory,
                Kind::Symlink => FileType::Symlink,
                Kind::File | Kind::Other => FileType::RegularFile,
            };
            (*child, kind, name.as_os_str())
        }));
        // Offsets are positions in this listing; the kernel passes back the last one it took.
        for (position, (child, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), position as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(self.errno("statfs", &e)),
        }
    }

    fn getxattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::NO_XATTR);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        // No extended attributes: an empty list.
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
        }
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // Base files are plain files: no ioctls (isatty() probes land here).
        reply.error(Errno::ENOTTY);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        if mask.bits() & libc::W_OK != 0 {
            return reply.error(Errno::EROFS);
        }
        match self.fs.getattr(ino.0, None) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(self.errno("access", &e)),
        }
    }
}
