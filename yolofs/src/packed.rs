//! Boot images packed in a store: each distinct 4 KiB block of their data kept once on disk.
//!
//! The boot images of related images hold many of the same blocks (the block pool shares them in
//! memory, [`crate::pool`]). A store keeps the boot images installed in it *packed*: the boot
//! image's header and extent index as they are, then, for its data, a table of 4 KiB blocks cut
//! from each extent's start, each naming a slot of the store's block file (`blocks.pack`) that
//! holds its bytes. A slot is shared by every packed boot image with that block and freed (its
//! disk space given back) with the last. Reading a packed boot image gives back the boot image
//! it was made from, byte for byte, so its CRCs, its verification stamp and every reader see
//! what was installed. Layout and rules: `docs/boot-image-format.md`, "Packed boot images".
//!
//! [`read`] is the readers' side (any process); [`BlockFile`] is the store's writer, the one
//! process that adds and frees slots. Readers hold a shared `flock` on the block file while they
//! read a packed boot image and its blocks, and the writer an exclusive one while it frees slots
//! (a slot it writes is one no boot image in the store names): no reader sees a slot it reads
//! change under it.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use log::{info, warn};
use serde::Serialize;
use sha2::{Digest, Sha256};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::format::{self, BootImage, FormatError};

/// First bytes of a packed boot image.
pub const MAGIC: [u8; 8] = *b"YOLOPACK";
pub const VERSION: u32 = 1;
/// Size of the packed header, before the boot image's own header.
pub const HEADER_SIZE: usize = 64;
/// Size of a block, and of a slot of the block file.
pub const BLOCK: u64 = 4096;
/// The block file, in the store beside the packed boot images.
pub const BLOCK_FILE: &str = "blocks.pack";
/// One block file read or written asks for at most this much...
const IO_CHUNK: u64 = 8 << 20;
const READ_CHUNK_SLOTS: u64 = IO_CHUNK / BLOCK;
/// ... and a read takes the slots between two it needs when they are this close.
const READ_GAP_SLOTS: u64 = 16;
/// The writer waits this long for readers to let go before it frees slots (else they stay held
/// until the next start).
const FREE_WAIT: Duration = Duration::from_secs(30);
/// A reader waits this long for the writer to free its slots.
const READ_WAIT: Duration = Duration::from_secs(60);
/// The writer's lock file: one process at a time adds and frees slots.
const WRITER_LOCK: &str = ".blocks.lock";
/// Most slots a block file may have (16 TiB).
const MAX_SLOTS: u64 = 1 << 32;

/// A block's name: the first 16 bytes of SHA-256 of its length and bytes.
type BlockHash = [u8; 16];

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct PackedHeader {
    /// [`MAGIC`].
    magic: [u8; 8],
    /// [`VERSION`].
    version: U32,
    /// CRC32C of this header (this field zero) and the block table.
    crc32c: U32,
    /// Bytes of the boot image's header and extent index, which follow this header.
    head_length: U64,
    /// Entries of the block table, which follows them.
    block_count: U64,
    reserved: [u8; 32],
}

#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct TableEntry {
    /// Slot of the block file holding the block (bytes `slot * 4096` on).
    slot: U64,
    hash: BlockHash,
}

const _: () = assert!(std::mem::size_of::<PackedHeader>() == HEADER_SIZE);
const TABLE_ENTRY_SIZE: usize = std::mem::size_of::<TableEntry>();

pub fn is_packed(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

/// Whether the file at `path` is a packed boot image (by its first bytes).
pub fn file_is_packed(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    File::open(path).and_then(|f| f.read_exact_at(&mut magic, 0)).is_ok() && magic == MAGIC
}

/// Whether a boot image can be packed: its extents start on 4 KiB boundaries of the base file
/// and hold whole 4 KiB blocks (but at the file's end), their data one after another, so that
/// each 4 KiB block of its data is one of the file's and takes one slot. Others (blocks under
/// 4 KiB; a handed-in file of many tiny extents, which would take a slot each) are kept whole.
pub fn packable(image: &BootImage) -> bool {
    let size = image.identity.source_size;
    let aligned = image
        .extents
        .iter()
        .all(|e| e.source_offset % BLOCK == 0 && (e.length % BLOCK == 0 || e.source_offset + e.length == size));
    let mut data: Vec<(u64, u64)> = image.extents.iter().map(|e| (e.data_offset, e.length)).collect();
    data.sort_unstable();
    let mut end = 0;
    let tiled = data.iter().all(|&(offset, length)| {
        let follows = offset == end;
        end = offset + length;
        follows
    });
    image.block_size as u64 % BLOCK == 0 && aligned && tiled && end == image.data_len()
}

fn block_hash(bytes: &[u8]) -> BlockHash {
    let digest = Sha256::new()
        .chain_update((bytes.len() as u32).to_le_bytes())
        .chain_update(bytes)
        .finalize();
    digest[..16].try_into().unwrap()
}

fn invalid(field: &'static str, value: impl ToString) -> FormatError {
    FormatError::InvalidField {
        field,
        value: value.to_string(),
    }
}

/// A packed boot image's parts, checked: the boot image's head and the block table, with the
/// data pieces each entry holds.
struct Parts<'a> {
    head: &'a [u8],
    table: &'a [TableEntry],
    pieces: Vec<(u64, u64)>,
}

fn parts(packed: &[u8]) -> Result<Parts<'_>, FormatError> {
    let (header, _) = PackedHeader::read_from_prefix(packed).map_err(|_| FormatError::Truncated {
        what: "packed header",
        needed: HEADER_SIZE as u64,
        available: packed.len() as u64,
    })?;
    if header.magic != MAGIC {
        return Err(FormatError::BadMagic(header.magic));
    }
    if header.version.get() != VERSION {
        return Err(invalid("packed.version", header.version.get()));
    }
    let head_length = header.head_length.get();
    let block_count = header.block_count.get();
    let length = head_length
        .checked_add(block_count.saturating_mul(TABLE_ENTRY_SIZE as u64))
        .and_then(|n| n.checked_add(HEADER_SIZE as u64));
    if length != Some(packed.len() as u64) {
        return Err(invalid(
            "packed.length",
            format!("{} bytes for {block_count} blocks", packed.len()),
        ));
    }
    let stored = header.crc32c.get();
    let mut zeroed = [0u8; HEADER_SIZE];
    zeroed.copy_from_slice(&packed[..HEADER_SIZE]);
    zeroed[12..16].fill(0);
    let table_bytes = &packed[HEADER_SIZE + head_length as usize..];
    let computed = crc32c::crc32c_append(crc32c::crc32c(&zeroed), table_bytes);
    if stored != computed {
        return Err(FormatError::ChecksumMismatch {
            what: "packed header and block table".into(),
            stored,
            computed,
        });
    }
    let head = &packed[HEADER_SIZE..HEADER_SIZE + head_length as usize];
    let pieces = format::data_pieces(head, BLOCK)?;
    if pieces.len() as u64 != block_count {
        return Err(invalid("packed.block_count", block_count));
    }
    let table = <[TableEntry]>::ref_from_bytes(table_bytes).map_err(|_| invalid("packed.block_count", block_count))?;
    Ok(Parts { head, table, pieces })
}

/// A hold of the block file (`flock`), let go when dropped.
struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    /// A shared hold (readers), once the writer has freed its slots (a short while), or an
    /// error after [`READ_WAIT`].
    fn shared(file: &'a File) -> io::Result<Flock<'a>> {
        Flock::take(file, libc::LOCK_SH, READ_WAIT)?
            .ok_or_else(|| io::Error::other("the block file stayed held by its writer"))
    }

    /// An exclusive hold, once readers have let go, or None after `wait`.
    fn exclusive(file: &'a File, wait: Duration) -> io::Result<Option<Flock<'a>>> {
        Flock::take(file, libc::LOCK_EX, wait)
    }

    fn take(file: &'a File, operation: i32, wait: Duration) -> io::Result<Option<Flock<'a>>> {
        let deadline = Instant::now() + wait;
        loop {
            // SAFETY: flock on the descriptor of an open file.
            if unsafe { libc::flock(file.as_raw_fd(), operation | libc::LOCK_NB) } == 0 {
                return Ok(Some(Flock(file)));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EWOULDBLOCK) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                Some(libc::EWOULDBLOCK) => return Ok(None),
                Some(libc::EINTR) => {}
                _ => return Err(e),
            }
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        // SAFETY: unlocking the descriptor of an open file this hold locked.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// The bytes of the boot image at `path`: a packed one put together from its blocks in the
/// block file beside it, byte for byte the boot image it was made from; any other as it is.
pub fn read(path: &Path) -> Result<Vec<u8>, FormatError> {
    let block_file_path = path.with_file_name(BLOCK_FILE);
    let block_file = File::open(&block_file_path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => invalid("block file", format!("{} is missing", block_file_path.display())),
        _ => FormatError::Io(e),
    })?;
    let _shared = Flock::shared(&block_file)?;
    // Read again under the hold: the slots it names stay as they are while it lasts (and it may
    // have been replaced meanwhile, by a boot image kept whole).
    let packed = fs::read(path)?;
    if !is_packed(&packed) {
        return Ok(packed);
    }
    let Parts { head, table, pieces } = parts(&packed)?;
    let data_length: u64 = pieces.iter().map(|(_, len)| len).sum();
    let file_length = head.len() as u64 + data_length + format::FOOTER_SIZE as u64;
    let mut out = vec![0u8; file_length as usize];
    out[..head.len()].copy_from_slice(head);
    let data = &mut out[head.len()..head.len() + data_length as usize];
    // Each distinct slot read once, in the file's order, nearby slots in one read.
    let mut order: Vec<usize> = (0..table.len()).collect();
    order.sort_unstable_by_key(|&i| table[i].slot.get());
    let mut buffer = Vec::new();
    let mut i = 0;
    while i < order.len() {
        let first = table[order[i]].slot.get();
        let mut j = i + 1;
        while j < order.len() {
            let slot = table[order[j]].slot.get();
            if slot - first >= READ_CHUNK_SLOTS || slot > table[order[j - 1]].slot.get().saturating_add(READ_GAP_SLOTS)
            {
                break;
            }
            j += 1;
        }
        let last = table[order[j - 1]].slot.get();
        let at = first.checked_mul(BLOCK).ok_or_else(|| invalid("packed.slot", first))?;
        buffer.resize(((last - first + 1) * BLOCK) as usize, 0);
        let filled = read_fully_at(&block_file, &mut buffer, at)?;
        for &k in &order[i..j] {
            let (offset, len) = pieces[k];
            let from = ((table[k].slot.get() - first) * BLOCK) as usize;
            if from + len as usize > filled {
                return Err(invalid(
                    "packed.slot",
                    format!("{} lies past the block file's end", table[k].slot.get()),
                ));
            }
            data[offset as usize..(offset + len) as usize].copy_from_slice(&buffer[from..from + len as usize]);
        }
        i = j;
    }
    let footer_at = out.len() - format::FOOTER_SIZE;
    out[footer_at..].copy_from_slice(&format::footer_bytes(file_length));
    Ok(out)
}

/// Reads into `buffer` from `at` until it is full or the file ends; returns the bytes read.
fn read_fully_at(file: &File, buffer: &mut [u8], at: u64) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read_at(&mut buffer[filled..], at + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The slots a packing holds until its boot image is in place ([`BlockFile::commit`]) or given
/// up ([`BlockFile::abandon`]).
#[must_use]
pub struct Pending {
    slots: Vec<u64>,
}

/// What the block file holds, for `status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlockFileStats {
    /// Packed boot images, and the bytes of their data, each its own.
    pub boot_images: u64,
    pub image_bytes: u64,
    /// Distinct blocks held, and the bytes of the slots they take.
    pub blocks: u64,
    pub bytes: u64,
    /// Slots of the file, held or free.
    pub slots: u64,
}

#[derive(Default)]
struct Slots {
    /// Per slot: how many packed boot images (and packings under way) hold it.
    refs: Vec<u32>,
    /// Per held slot, the hash of its block; `by_hash` finds a slot by it (each entry names a
    /// held slot whose hash it is).
    hashes: Vec<BlockHash>,
    by_hash: HashMap<BlockHash, u64>,
    /// Free slots, highest first (taken from the end: lowest first).
    free: Vec<u64>,
    /// The slots of each packed boot image in the store, by base file name, and its data bytes.
    owners: HashMap<String, (Vec<u64>, u64)>,
    held: u64,
    image_bytes: u64,
    /// Slots nothing holds, to free once readers have let go ([`BlockFile::free_unfreed`]).
    unfreed: Vec<u64>,
    /// Whether slots may be freed: not after a start that could not read every boot image of
    /// the store (one of those may hold any slot).
    frees: bool,
}

/// The store's block file and what its packed boot images hold of it: the writer's side.
pub struct BlockFile {
    path: PathBuf,
    file: File,
    /// Held (flock) for as long as this lives: no other process adds or frees slots.
    _writer: File,
    slots: Mutex<Slots>,
}

impl BlockFile {
    /// Opens (or makes) the block file of the store `dir` and reads what its packed boot images
    /// (`NAME.yolo`) hold. Slots none holds (a packing cut short by a crash) are freed, but only
    /// if every boot image could be read: one that could not may hold any.
    pub fn open(dir: &Path) -> io::Result<BlockFile> {
        let writer = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.join(WRITER_LOCK))?;
        // SAFETY: flock on the descriptor of an open file.
        if unsafe { libc::flock(writer.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EWOULDBLOCK) => io::Error::other("another process writes this store's block file"),
                _ => e,
            });
        }
        let path = dir.join(BLOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        let meta = file.metadata()?;
        let slot_count = meta.len().div_ceil(BLOCK);
        if !meta.file_type().is_file() || slot_count > MAX_SLOTS {
            return Err(io::Error::other(format!(
                "{} is not a block file (not a regular file, or over 16 TiB)",
                path.display()
            )));
        }
        let mut slots = Slots {
            refs: vec![0; slot_count as usize],
            hashes: vec![[0; 16]; slot_count as usize],
            frees: true,
            ..Slots::default()
        };
        let mut all_read = true;
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let file_name = entry.file_name();
            let Some(name) = file_name
                .to_str()
                .and_then(|n| n.strip_suffix(crate::store::BOOT_IMAGE_SUFFIX))
            else {
                continue;
            };
            match read_packed(&entry.path()) {
                // Kept whole, or gone meanwhile: it holds no slot.
                Ok(None) => {}
                Ok(Some(packed)) => match parts(&packed) {
                    Ok(parts) if slots.hold(name, &parts, slot_count) => {}
                    Ok(_) => {
                        warn!(
                            "{}: its block table names slots past the block file's end",
                            entry.path().display()
                        );
                        all_read = false;
                    }
                    Err(e) => {
                        warn!("{}: not a valid packed boot image: {e}", entry.path().display());
                        all_read = false;
                    }
                },
                Err(e) => {
                    warn!("{}: {e}", entry.path().display());
                    all_read = false;
                }
            }
        }
        if all_read {
            // Freed once readers of boot images replaced meanwhile have let go.
            slots.unfreed = (0..slot_count).filter(|&s| slots.refs[s as usize] == 0).collect();
            slots.free_unfreed(&file, &path);
        } else {
            slots.frees = false;
            warn!(
                "{}: not every boot image of the store could be read: no slot is freed until the next start",
                path.display()
            );
        }
        info!(
            "block file {}: {} boot images packed, {} blocks",
            path.display(),
            slots.owners.len(),
            slots.held
        );
        Ok(BlockFile {
            path,
            file,
            _writer: writer,
            slots: Mutex::new(slots),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Packs `bytes` (the boot image `image`, valid, verified and [`packable`]): writes the
    /// blocks the file does not hold yet (durably) and returns the packed boot image, whose
    /// slots stay held until it is committed or abandoned. A block is taken for one the file
    /// holds only if their bytes are equal: the hash finds it, the bytes decide.
    pub fn pack(&self, bytes: &[u8], image: &BootImage) -> Result<(Vec<u8>, Pending), FormatError> {
        let head_length = format::HEADER_SIZE + image.extents.len() * format::EXTENT_ENTRY_SIZE;
        let head = &bytes[..head_length];
        let pieces = format::data_pieces(head, BLOCK)?;
        let data = &bytes[head_length..];
        let block = |k: usize| &data[pieces[k].0 as usize..(pieces[k].0 + pieces[k].1) as usize];
        let hashes: Vec<BlockHash> = (0..pieces.len()).map(|k| block_hash(block(k))).collect();
        let mut table: Vec<u64> = Vec::with_capacity(pieces.len());
        let mut found = Vec::new();
        let mut new_blocks = Vec::new();
        // The block each slot taken here was taken for: a later one of the same hash is
        // compared with it (it is not in the file yet).
        let mut taken_here: HashMap<u64, usize> = HashMap::new();
        {
            let mut slots = self.slots.lock().unwrap();
            for (k, hash) in hashes.iter().enumerate() {
                let slot = match slots.by_hash.get(hash).copied() {
                    Some(slot) => match taken_here.get(&slot) {
                        Some(&first) if block(first) != block(k) => None,
                        Some(_) => Some(slots.take(slot)),
                        None => {
                            found.push(k);
                            Some(slots.take(slot))
                        }
                    },
                    None => None,
                };
                let slot = slot.unwrap_or_else(|| {
                    let slot = slots.take_free(hash);
                    new_blocks.push(k);
                    taken_here.insert(slot, k);
                    slot
                });
                table.push(slot);
            }
        }
        let mut pending = Pending { slots: table };
        // Neither lock is needed from here: the slots written are named by no boot image in
        // the store, and those compared are held by this packing.
        let mut write = || -> io::Result<()> {
            let differ = self.differing(&found, &pending.slots, block)?;
            if !differ.is_empty() {
                let mut slots = self.slots.lock().unwrap();
                for k in differ {
                    // Another block under the same hash (the slot's bytes changed on disk): a
                    // slot of its own, found by the hash from now on.
                    slots.release(&[pending.slots[k]]);
                    pending.slots[k] = slots.take_free(&hashes[k]);
                    slots.by_hash.insert(hashes[k], pending.slots[k]);
                    new_blocks.push(k);
                }
            }
            new_blocks.sort_unstable_by_key(|&k| pending.slots[k]);
            write_blocks(&self.file, &new_blocks, &pending.slots, block)?;
            self.file.sync_data()
        };
        if let Err(e) = write() {
            self.abandon(pending);
            return Err(e.into());
        }
        let table: Vec<TableEntry> = pending
            .slots
            .iter()
            .zip(&hashes)
            .map(|(&slot, hash)| TableEntry {
                slot: U64::new(slot),
                hash: *hash,
            })
            .collect();
        let mut header = PackedHeader {
            magic: MAGIC,
            version: U32::new(VERSION),
            crc32c: U32::new(0),
            head_length: U64::new(head_length as u64),
            block_count: U64::new(table.len() as u64),
            reserved: [0; 32],
        };
        let table_bytes = table.as_bytes();
        header.crc32c = U32::new(crc32c::crc32c_append(crc32c::crc32c(header.as_bytes()), table_bytes));
        let mut packed = Vec::with_capacity(HEADER_SIZE + head_length + table_bytes.len());
        packed.extend_from_slice(header.as_bytes());
        packed.extend_from_slice(head);
        packed.extend_from_slice(table_bytes);
        Ok((packed, pending))
    }

    /// Of the blocks `found` (indexes into `slots`) by their hash, those whose slot holds other
    /// bytes (read in the file's order, nearby slots at once).
    fn differing<'a>(
        &self,
        found: &[usize],
        slots: &[u64],
        block: impl Fn(usize) -> &'a [u8],
    ) -> io::Result<Vec<usize>> {
        let mut order = found.to_vec();
        order.sort_unstable_by_key(|&k| slots[k]);
        let mut differ = Vec::new();
        let mut buffer = Vec::new();
        let mut i = 0;
        while i < order.len() {
            let first = slots[order[i]];
            let mut j = i + 1;
            while j < order.len()
                && slots[order[j]] - first < READ_CHUNK_SLOTS
                && slots[order[j]] <= slots[order[j - 1]].saturating_add(READ_GAP_SLOTS)
            {
                j += 1;
            }
            buffer.resize(((slots[order[j - 1]] - first + 1) * BLOCK) as usize, 0);
            let filled = read_fully_at(&self.file, &mut buffer, first * BLOCK)?;
            for &k in &order[i..j] {
                let from = ((slots[k] - first) * BLOCK) as usize;
                let bytes = block(k);
                if from + bytes.len() > filled || buffer[from..from + bytes.len()] != *bytes {
                    differ.push(k);
                }
            }
            i = j;
        }
        Ok(differ)
    }

    /// The packed boot image of `pending` is now the store's `name` (`data_bytes` of data).
    /// What an earlier one of `name` held is let go if the rename is `durable` (else it stays
    /// held until the next start: the old file may come back after a crash).
    pub fn commit(&self, name: &str, pending: Pending, data_bytes: u64, durable: bool) {
        let mut slots = self.slots.lock().unwrap();
        slots.image_bytes += data_bytes;
        if let Some((old, bytes)) = slots.owners.insert(name.to_owned(), (pending.slots, data_bytes)) {
            slots.image_bytes -= bytes;
            if durable {
                slots.release(&old);
            }
        }
        drop(slots);
        self.free_unfreed();
    }

    /// A packing whose boot image never took its place.
    pub fn abandon(&self, pending: Pending) {
        self.slots.lock().unwrap().release(&pending.slots);
        self.free_unfreed();
    }

    /// The store's boot images `names` are no longer packed (removed, or replaced by ones kept
    /// whole), durably: what they held is let go.
    pub fn forget(&self, names: &[&str]) {
        let mut slots = self.slots.lock().unwrap();
        for name in names {
            if let Some((old, bytes)) = slots.owners.remove(*name) {
                slots.image_bytes -= bytes;
                slots.release(&old);
            }
        }
        drop(slots);
        self.free_unfreed();
    }

    /// Frees the slots nothing holds any more, once readers that may still read the boot
    /// images that held them have let go of the file; if they do not in time, at a later call.
    fn free_unfreed(&self) {
        if self.slots.lock().unwrap().unfreed.is_empty() {
            return;
        }
        match Flock::exclusive(&self.file, FREE_WAIT) {
            Ok(Some(_exclusive)) => self.slots.lock().unwrap().free_unfreed(&self.file, &self.path),
            outcome => warn!(
                "{}: slots to free wait for the next change ({})",
                self.path.display(),
                outcome
                    .err()
                    .map_or("readers held the file".to_string(), |e| e.to_string())
            ),
        }
    }

    pub fn stats(&self) -> BlockFileStats {
        let slots = self.slots.lock().unwrap();
        BlockFileStats {
            boot_images: slots.owners.len() as u64,
            image_bytes: slots.image_bytes,
            blocks: slots.held,
            bytes: slots.held * BLOCK,
            slots: slots.refs.len() as u64,
        }
    }
}

/// The file at `path` if it is a packed boot image, None if it is not (or is gone).
fn read_packed(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let mut magic = [0u8; 8];
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match file.read_exact_at(&mut magic, 0) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
        Ok(()) if magic != MAGIC => return Ok(None),
        Ok(()) => {}
    }
    let mut bytes = Vec::new();
    (&file).read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

/// Writes the blocks `new` (indexes into `slots`, in slot order), consecutive slots at once.
fn write_blocks<'a>(file: &File, new: &[usize], slots: &[u64], block: impl Fn(usize) -> &'a [u8]) -> io::Result<()> {
    let mut buffer = Vec::new();
    let mut i = 0;
    while i < new.len() {
        let first = slots[new[i]];
        buffer.clear();
        let mut j = i;
        while j < new.len() && slots[new[j]] == first + (j - i) as u64 && (buffer.len() as u64) < IO_CHUNK {
            buffer.extend_from_slice(block(new[j]));
            // A short block (an extent's last, at the base file's end) takes a whole slot.
            buffer.resize(buffer.len().next_multiple_of(BLOCK as usize), 0);
            j += 1;
        }
        file.write_all_at(&buffer, first * BLOCK)?;
        i = j;
    }
    Ok(())
}

/// Gives the disk space of free slots back to the file system (holes), runs at once.
fn punch(file: &File, free: &[u64]) {
    let mut sorted = free.to_vec();
    sorted.sort_unstable();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i + 1;
        while j < sorted.len() && sorted[j] == sorted[i] + (j - i) as u64 {
            j += 1;
        }
        // SAFETY: fallocate on the descriptor of an open file; punching a hole changes no byte
        // anything reads (the slots are free) and keeps the file's size.
        let punched = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (sorted[i] * BLOCK) as libc::off_t,
                ((j - i) as u64 * BLOCK) as libc::off_t,
            )
        };
        if punched != 0 {
            // A file system without holes keeps the space until the slots are used again.
            log::debug!("punching slots from {}: {}", sorted[i], io::Error::last_os_error());
        }
        i = j;
    }
}

impl Slots {
    /// Counts the slots of a packed boot image found in the store; false (counting nothing) if
    /// it names slots past the file's end.
    fn hold(&mut self, name: &str, parts: &Parts<'_>, slot_count: u64) -> bool {
        if parts.table.iter().any(|e| e.slot.get() >= slot_count) {
            return false;
        }
        for entry in parts.table {
            let slot = entry.slot.get();
            if self.refs[slot as usize] == 0 {
                self.held += 1;
                self.hashes[slot as usize] = entry.hash;
                self.by_hash.entry(entry.hash).or_insert(slot);
            } else if self.hashes[slot as usize] != entry.hash {
                // Two tables disagree on what the slot holds: found by no hash (reading
                // compares its bytes anyway).
                let hash = self.hashes[slot as usize];
                if self.by_hash.get(&hash) == Some(&slot) {
                    self.by_hash.remove(&hash);
                }
            }
            self.refs[slot as usize] += 1;
        }
        let data_bytes = parts.pieces.iter().map(|(_, len)| len).sum();
        let held = parts.table.iter().map(|e| e.slot.get()).collect();
        self.image_bytes += data_bytes;
        self.owners.insert(name.to_owned(), (held, data_bytes));
        true
    }

    /// One more hold of a slot found by its hash (held, or waiting to be freed).
    fn take(&mut self, slot: u64) -> u64 {
        if self.refs[slot as usize] == 0 {
            self.held += 1;
        }
        self.refs[slot as usize] += 1;
        slot
    }

    /// A free slot (lowest first, else a new one at the end), held, for a block of `hash`.
    fn take_free(&mut self, hash: &BlockHash) -> u64 {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.refs.push(0);
                self.hashes.push([0; 16]);
                self.refs.len() as u64 - 1
            }
        };
        self.refs[slot as usize] = 1;
        self.held += 1;
        self.hashes[slot as usize] = *hash;
        self.by_hash.entry(*hash).or_insert(slot);
        slot
    }

    /// Lets go of `held`: slots nothing holds any more are to be freed.
    fn release(&mut self, held: &[u64]) {
        for &slot in held {
            let refs = &mut self.refs[slot as usize];
            if *refs == 0 {
                warn!("slot {slot} let go of more often than it was held");
                continue;
            }
            *refs -= 1;
            if *refs == 0 {
                self.held -= 1;
                if self.frees {
                    self.unfreed.push(slot);
                }
            }
        }
    }

    /// Frees the slots to free that nothing took again meanwhile, their space given back (the
    /// caller holds the file exclusively).
    fn free_unfreed(&mut self, file: &File, path: &Path) {
        let mut freed = std::mem::take(&mut self.unfreed);
        freed.retain(|&slot| self.refs[slot as usize] == 0);
        freed.sort_unstable();
        freed.dedup();
        for &slot in &freed {
            let hash = self.hashes[slot as usize];
            if self.by_hash.get(&hash) == Some(&slot) {
                self.by_hash.remove(&hash);
            }
        }
        punch(file, &freed);
        self.free.extend(freed);
        self.free.sort_unstable_by(|a, b| b.cmp(a));
        if let Err(e) = self.trim(file) {
            warn!("{}: {e}", path.display());
        }
    }

    /// Cuts free slots off the file's end.
    fn trim(&mut self, file: &File) -> io::Result<()> {
        if !self.frees {
            return Ok(());
        }
        let mut len = self.refs.len();
        while len > 0 && self.refs[len - 1] == 0 {
            len -= 1;
        }
        if len < self.refs.len() {
            self.refs.truncate(len);
            self.hashes.truncate(len);
            self.free.retain(|&s| s < len as u64);
            file.set_len(len as u64 * BLOCK)?;
        }
        Ok(())
    }
}
