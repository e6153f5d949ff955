//! The boot image file format (specified in `docs/boot-image-format.md`).
//!
//! A boot image holds the byte ranges of one base file that a boot reads, with their data. It is
//! laid out so that loading is one sequential read and lookups are a binary search:
//!
//! ```text
//! +----------------------+  offset 0
//! | Header (512 bytes)   |  magic, version, block size, source identity, counts, CRCs
//! +----------------------+  header.index_offset
//! | Extent index         |  extent_count x ExtentEntry (32 bytes), sorted by source offset
//! +----------------------+  header.data_offset
//! | Extent data          |  data_length bytes, extents in first-access order
//! +----------------------+
//! | Footer (16 bytes)    |  magic, total file length (detects truncation)
//! +----------------------+
//! ```
//!
//! All integers are little endian. Reading is load-then-validate: [`BootImage::parse`] checks every
//! field and every CRC and names the field and the bad value when something is off, so a corrupt
//! or truncated boot image is rejected as a whole and never served.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use thiserror::Error;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::pool::{self, BlockPool, PooledData};

/// First bytes of every boot image.
pub const MAGIC: [u8; 8] = *b"YOLOBOOT";
/// Last bytes of every boot image (start of the footer).
pub const FOOTER_MAGIC: [u8; 8] = *b"YOLOEND\0";
/// The only format version this build reads and writes.
pub const VERSION: u32 = 1;
/// Size of [`Header`] on disk.
pub const HEADER_SIZE: usize = 512;
/// Size of one [`ExtentEntry`] on disk.
pub const EXTENT_ENTRY_SIZE: usize = 32;
/// Size of [`Footer`] on disk.
pub const FOOTER_SIZE: usize = 16;
/// Longest extent one index entry may describe; longer runs are split so `length` fits in u32.
pub const MAX_EXTENT_LEN: u64 = 1 << 30;

/// Errors met while reading, validating or writing a boot image.
#[derive(Debug, Error)]
pub enum FormatError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("truncated boot image: {what} needs {needed} bytes, file has {available}")]
    Truncated {
        what: &'static str,
        needed: u64,
        available: u64,
    },
    #[error("not a boot image: bad magic {0:02x?}")]
    BadMagic([u8; 8]),
    #[error("unsupported boot image version {0} (this build reads version {VERSION})")]
    UnsupportedVersion(u32),
    #[error("invalid header field {field}: {value}")]
    InvalidField { field: &'static str, value: String },
    #[error("{what} checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch { what: String, stored: u32, computed: u32 },
    #[error("invalid extent {index}: {reason}")]
    InvalidExtent { index: usize, reason: String },
}

impl FormatError {
    /// The errno a filesystem operation reports when it meets this error.
    pub fn errno(&self) -> i32 {
        match self {
            FormatError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        }
    }
}

/// The fixed-size header at the start of a boot image.
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// Format version, [`VERSION`].
    pub version: U32,
    /// Size of this header in bytes, [`HEADER_SIZE`].
    pub header_size: U32,
    /// Granularity in bytes that reads were rounded to when the boot image was built.
    pub block_size: U32,
    /// Reserved flags, zero.
    pub flags: U32,
    /// Size in bytes of the source (base) file the extents were read from.
    pub source_size: U64,
    /// Number of entries in the extent index.
    pub extent_count: U64,
    /// Offset in bytes of the extent index from the start of the file.
    pub index_offset: U64,
    /// Offset in bytes of the extent data from the start of the file.
    pub data_offset: U64,
    /// Length in bytes of the extent data (the sum of all extent lengths).
    pub data_length: U64,
    /// Creation time, seconds since the Unix epoch.
    pub created_unix: U64,
    /// CRC32C of the extent index bytes.
    pub index_crc32c: U32,
    /// CRC32C of this header with this field set to zero.
    pub header_crc32c: U32,
    /// Glance image id of the source image, UTF-8, NUL padded (may be empty).
    pub image_id: [u8; 64],
    /// Digest identifying the source image, `algorithm:hex`, NUL padded (may be empty).
    pub source_digest: [u8; 160],
    /// How the source file was produced from the image, e.g. `raw` (Nova's `force_raw_images`).
    pub rendition: [u8; 16],
    /// Reserved, zero.
    pub reserved: [u8; 192],
}

/// One entry of the extent index: a byte range of the source file and where its data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct ExtentEntry {
    /// Offset in bytes of the range in the source file.
    pub source_offset: U64,
    /// Offset in bytes of the range's data from the start of the data section.
    pub data_offset: U64,
    /// Length of the range in bytes.
    pub length: U32,
    /// CRC32C of the range's data.
    pub crc32c: U32,
    /// Reserved, zero.
    pub reserved: U64,
}

/// The footer at the end of a boot image.
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Footer {
    /// [`FOOTER_MAGIC`].
    pub magic: [u8; 8],
    /// Total length of the boot image file in bytes, footer included.
    pub file_length: U64,
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<ExtentEntry>() == EXTENT_ENTRY_SIZE);
const _: () = assert!(std::mem::size_of::<Footer>() == FOOTER_SIZE);

/// Who the boot image belongs to: written into the header, shown by `inspect`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SourceIdentity {
    /// Glance image id (may be empty).
    pub image_id: String,
    /// `algorithm:hex` digest of the source image (may be empty).
    pub source_digest: String,
    /// How the source file was produced, e.g. `raw`.
    pub rendition: String,
    /// Size of the source file in bytes.
    pub source_size: u64,
}

/// A byte range of the source file held by a boot image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Extent {
    /// Offset of the range in the source file.
    pub source_offset: u64,
    /// Length of the range in bytes.
    pub length: u64,
    /// Offset of the range's data in the data section.
    pub data_offset: u64,
    /// CRC32C of the data.
    pub crc32c: u32,
}

impl Extent {
    /// End (exclusive) of the range in the source file.
    pub fn source_end(&self) -> u64 {
        self.source_offset + self.length
    }
}

/// A parsed, validated boot image: its identity, its extent index and its data.
pub struct BootImage {
    pub identity: SourceIdentity,
    pub block_size: u32,
    pub created_unix: u64,
    /// CRC32C of the header and of the index: together they identify this boot image's content.
    pub header_crc32c: u32,
    pub index_crc32c: u32,
    /// Sorted by `source_offset`, non-overlapping.
    pub extents: Vec<Extent>,
    data: ExtentData,
}

/// Storage of the extent data: the boot image's own (optionally locked in RAM so memory pressure
/// cannot evict it), or blocks of the pool it shares with other boot images.
enum ExtentData {
    Heap(Vec<u8>),
    Locked(memmap2::Mmap),
    Pooled(PooledData),
}

impl ExtentData {
    /// The data as one slice, unless it is in the pool.
    fn contiguous(&self) -> Option<&[u8]> {
        match self {
            ExtentData::Heap(v) => Some(v),
            ExtentData::Locked(m) => Some(m),
            ExtentData::Pooled(_) => None,
        }
    }
}

fn str_field<const N: usize>(field: &'static str, bytes: &[u8; N]) -> Result<String, FormatError> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(N);
    if bytes[end..].iter().any(|&b| b != 0) {
        return Err(FormatError::InvalidField {
            field,
            value: "garbage after NUL padding".into(),
        });
    }
    String::from_utf8(bytes[..end].to_vec()).map_err(|_| FormatError::InvalidField {
        field,
        value: "not UTF-8".into(),
    })
}

fn put_str<const N: usize>(field: &'static str, value: &str) -> Result<[u8; N], FormatError> {
    let mut out = [0u8; N];
    if value.len() >= N || value.as_bytes().contains(&0) {
        return Err(FormatError::InvalidField {
            field,
            value: format!("{value:?} does not fit in {N} bytes"),
        });
    }
    out[..value.len()].copy_from_slice(value.as_bytes());
    Ok(out)
}

fn header_crc(header: &Header) -> u32 {
    let mut copy = header.clone();
    copy.header_crc32c = U32::new(0);
    crc32c::crc32c(copy.as_bytes())
}

/// What the header alone says about a boot image: enough to match it with its verification stamp
/// and name its image without reading the whole file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderSummary {
    pub image_id: String,
    pub source_size: u64,
    /// Bytes of extent data: what the boot image takes in memory once loaded.
    pub data_length: u64,
    pub header_crc32c: u32,
    pub index_crc32c: u32,
}

/// Reads and checks only the header of the boot image at `path` (magic, version, header CRC).
pub fn read_header(path: &Path) -> Result<HeaderSummary, FormatError> {
    let mut bytes = [0u8; HEADER_SIZE];
    let file = File::open(path)?;
    // A packed boot image (in a store) holds the header after its own.
    let mut magic = [0u8; 8];
    let at = match file.read_exact_at(&mut magic, 0) {
        Ok(()) if crate::packed::is_packed(&magic) => crate::packed::HEADER_SIZE as u64,
        _ => 0,
    };
    let mut filled = 0;
    while filled < HEADER_SIZE {
        match file.read_at(&mut bytes[filled..], at + filled as u64)? {
            0 => {
                return Err(FormatError::Truncated {
                    what: "header",
                    needed: HEADER_SIZE as u64,
                    available: filled as u64,
                })
            }
            n => filled += n,
        }
    }
    let (header, _) = Header::read_from_prefix(&bytes[..]).map_err(|_| invalid("header", "unreadable"))?;
    let stored = check_header(&header)?;
    Ok(HeaderSummary {
        image_id: str_field("image_id", &header.image_id)?,
        source_size: header.source_size.get(),
        data_length: header.data_length.get(),
        header_crc32c: stored,
        index_crc32c: header.index_crc32c.get(),
    })
}

/// The boot image's data cut into pieces of at most `piece` bytes from the start of each extent,
/// in data order, as (offset in the data section, length), from its header and extent index
/// (`head`, checked: magic, version, CRCs; the extents' data must tile the data section).
pub fn data_pieces(head: &[u8], piece: u64) -> Result<Vec<(u64, u64)>, FormatError> {
    let (header, _) = Header::read_from_prefix(head).map_err(|_| invalid("header", "truncated"))?;
    check_header(&header)?;
    let extent_count = header.extent_count.get();
    if Some(header.data_offset.get())
        != extent_count
            .checked_mul(EXTENT_ENTRY_SIZE as u64)
            .and_then(|n| n.checked_add(HEADER_SIZE as u64))
        || header.data_offset.get() != head.len() as u64
    {
        return Err(invalid("data_offset", header.data_offset.get()));
    }
    let index_bytes = &head[HEADER_SIZE..];
    check_index(&header, index_bytes)?;
    let entries = <[ExtentEntry]>::ref_from_bytes(index_bytes).map_err(|_| invalid("extent_count", extent_count))?;
    let mut ranges: Vec<(u64, u64)> = entries
        .iter()
        .map(|e| (e.data_offset.get(), e.length.get() as u64))
        .collect();
    ranges.sort_unstable();
    let mut pieces = Vec::new();
    let mut end = 0u64;
    for (index, (offset, length)) in ranges.into_iter().enumerate() {
        if offset != end || length == 0 {
            return Err(FormatError::InvalidExtent {
                index,
                reason: format!("data at {offset}+{length} does not follow the data before it at {end}"),
            });
        }
        let mut at = 0;
        while at < length {
            let len = piece.min(length - at);
            pieces.push((offset + at, len));
            at += len;
        }
        end = offset + length;
    }
    if end != header.data_length.get() {
        return Err(invalid("data_length", header.data_length.get()));
    }
    Ok(pieces)
}

/// The footer of a boot image of `file_length` bytes.
pub fn footer_bytes(file_length: u64) -> [u8; FOOTER_SIZE] {
    let mut out = [0u8; FOOTER_SIZE];
    out.copy_from_slice(
        Footer {
            magic: FOOTER_MAGIC,
            file_length: U64::new(file_length),
        }
        .as_bytes(),
    );
    out
}

/// How much of a boot image one direct read asks for.
const DIRECT_READ_CHUNK: usize = 8 << 20;

/// What the buffer and every direct read are a multiple of: above any file system's O_DIRECT
/// alignment (4 KiB blocks, 64 KiB sectors or pages).
const DIRECT_ALIGN: usize = 64 << 10;

/// A file's bytes read with O_DIRECT: the buffer and how many of its bytes are the file's.
type DirectRead = (memmap2::MmapMut, usize);

/// A whole file read with O_DIRECT, in large aligned reads, or None where that did not work
/// (a file system without O_DIRECT, a read it cut short, a file that changed meanwhile): the
/// caller then reads it through the page cache. A load copies a boot image into yolofs' own
/// memory: a second copy in the page cache would only push out other files' pages. And
/// buffered reads follow readahead in small requests wherever the file lies in pieces: on the
/// emulated HDD (docs/evaluation/benchmarks.md, "The catalogue") a boot image of 54 MB in 215
/// pieces took 40 s that way and 0.9 s direct.
fn read_direct(path: &Path) -> io::Result<Option<DirectRead>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.kind() == io::ErrorKind::PermissionDenied => return Err(e),
        Err(_) => return Ok(None),
    };
    let len = file.metadata()?.len() as usize;
    // Anonymous memory is page-aligned. One block more tells a file that grew since.
    let Ok(mut buf) = memmap2::MmapMut::map_anon(len.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN + DIRECT_ALIGN) else {
        return Ok(None);
    };
    let mut filled = 0;
    while filled < buf.len() {
        let end = (filled + DIRECT_READ_CHUNK).min(buf.len());
        match file.read_at(&mut buf[filled..end], filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Ok(None),
        }
        if filled >= len && filled % DIRECT_ALIGN != 0 {
            break; // the end of the file
        }
    }
    Ok((filled == len).then_some((buf, len)))
}

/// Checks the extent index's bytes against the header's CRC of them.
fn check_index(header: &Header, index_bytes: &[u8]) -> Result<(), FormatError> {
    let computed = crc32c::crc32c(index_bytes);
    if computed != header.index_crc32c.get() {
        return Err(FormatError::ChecksumMismatch {
            what: "extent index".into(),
            stored: header.index_crc32c.get(),
            computed,
        });
    }
    Ok(())
}

/// Checks a header's magic, version and checksum; returns its stored checksum.
fn check_header(header: &Header) -> Result<u32, FormatError> {
    if header.magic != MAGIC {
        return Err(FormatError::BadMagic(header.magic));
    }
    if header.version.get() != VERSION {
        return Err(FormatError::UnsupportedVersion(header.version.get()));
    }
    let stored = header.header_crc32c.get();
    let computed = header_crc(header);
    if stored != computed {
        return Err(FormatError::ChecksumMismatch {
            what: "header".into(),
            stored,
            computed,
        });
    }
    Ok(stored)
}

impl BootImage {
    /// Reads and validates the boot image at `path`.
    pub fn open(path: &Path) -> Result<BootImage, FormatError> {
        BootImage::open_with(path, read_direct)
    }

    /// [`open`](Self::open), reading the file with `direct` first.
    fn open_with(path: &Path, direct: fn(&Path) -> io::Result<Option<DirectRead>>) -> Result<BootImage, FormatError> {
        // A packed one is read under the block file's lock, and once: not first with O_DIRECT.
        if crate::packed::file_is_packed(path) {
            return BootImage::parse(&crate::packed::read(path)?);
        }
        // Or it was packed since (an install replaced it).
        let parse = |bytes: &[u8]| match crate::packed::is_packed(bytes) {
            true => BootImage::parse(&crate::packed::read(path)?),
            false => BootImage::parse(bytes),
        };
        match direct(path)? {
            Some((bytes, len)) => parse(&bytes[..len]),
            None => {
                let mut bytes = Vec::new();
                File::open(path)?.read_to_end(&mut bytes)?;
                parse(&bytes)
            }
        }
    }

    /// Parses and validates a whole boot image held in memory.
    pub fn parse(bytes: &[u8]) -> Result<BootImage, FormatError> {
        let available = bytes.len() as u64;
        let truncated = |what, needed: u64| FormatError::Truncated {
            what,
            needed,
            available,
        };
        let (header, _) = Header::read_from_prefix(bytes).map_err(|_| truncated("header", HEADER_SIZE as u64))?;
        check_header(&header)?;
        if header.header_size.get() as usize != HEADER_SIZE {
            return Err(invalid("header_size", header.header_size.get()));
        }
        let block_size = header.block_size.get();
        if !block_size.is_power_of_two() || block_size < 512 {
            return Err(invalid("block_size", block_size));
        }
        if header.flags.get() != 0 {
            return Err(invalid("flags", header.flags.get()));
        }
        let extent_count = header.extent_count.get();
        let index_offset = header.index_offset.get();
        let index_len = extent_count
            .checked_mul(EXTENT_ENTRY_SIZE as u64)
            .ok_or_else(|| invalid("extent_count", extent_count))?;
        if index_offset != HEADER_SIZE as u64 {
            return Err(invalid("index_offset", index_offset));
        }
        let data_offset = header.data_offset.get();
        if data_offset != index_offset + index_len {
            return Err(invalid("data_offset", data_offset));
        }
        let data_length = header.data_length.get();
        let file_length = data_offset
            .checked_add(data_length)
            .and_then(|n| n.checked_add(FOOTER_SIZE as u64))
            .ok_or_else(|| invalid("data_length", data_length))?;
        if available < file_length {
            return Err(truncated("extent index, data and footer", file_length));
        }
        if available > file_length {
            return Err(invalid(
                "data_length",
                format!("{data_length} leaves {} trailing bytes", available - file_length),
            ));
        }
        let (footer, _) = Footer::read_from_prefix(&bytes[(file_length as usize - FOOTER_SIZE)..])
            .map_err(|_| truncated("footer", file_length))?;
        if footer.magic != FOOTER_MAGIC {
            return Err(invalid("footer.magic", format!("{:02x?}", footer.magic)));
        }
        if footer.file_length.get() != file_length {
            return Err(invalid("footer.file_length", footer.file_length.get()));
        }

        let index_bytes = &bytes[index_offset as usize..data_offset as usize];
        check_index(&header, index_bytes)?;
        let data = &bytes[data_offset as usize..(data_offset + data_length) as usize];
        let source_size = header.source_size.get();
        let mut extents = Vec::with_capacity(extent_count as usize);
        let entries =
            <[ExtentEntry]>::ref_from_bytes(index_bytes).map_err(|_| invalid("extent_count", extent_count))?;
        let mut previous_end = 0u64;
        for (index, entry) in entries.iter().enumerate() {
            let extent = Extent {
                source_offset: entry.source_offset.get(),
                length: entry.length.get() as u64,
                data_offset: entry.data_offset.get(),
                crc32c: entry.crc32c.get(),
            };
            let bad = |reason: String| FormatError::InvalidExtent { index, reason };
            if extent.length == 0 {
                return Err(bad("zero length".into()));
            }
            if extent.source_offset < previous_end {
                return Err(bad(format!(
                    "source offset {} overlaps or is out of order",
                    extent.source_offset
                )));
            }
            if extent
                .source_offset
                .checked_add(extent.length)
                .is_none_or(|end| end > source_size)
            {
                return Err(bad(format!(
                    "range {}+{} lies past the source size {source_size}",
                    extent.source_offset, extent.length
                )));
            }
            if extent
                .data_offset
                .checked_add(extent.length)
                .is_none_or(|end| end > data_length)
            {
                return Err(bad(format!(
                    "data {}+{} lies past the data section ({data_length} bytes)",
                    extent.data_offset, extent.length
                )));
            }
            let slice = &data[extent.data_offset as usize..(extent.data_offset + extent.length) as usize];
            let computed = crc32c::crc32c(slice);
            if computed != extent.crc32c {
                return Err(FormatError::ChecksumMismatch {
                    what: format!("extent {index} data"),
                    stored: extent.crc32c,
                    computed,
                });
            }
            previous_end = extent.source_end();
            extents.push(extent);
        }
        if extents.iter().map(|e| e.length).sum::<u64>() != data_length {
            return Err(invalid(
                "data_length",
                format!("{data_length} differs from the sum of extent lengths"),
            ));
        }
        Ok(BootImage {
            identity: SourceIdentity {
                image_id: str_field("image_id", &header.image_id)?,
                source_digest: str_field("source_digest", &header.source_digest)?,
                rendition: str_field("rendition", &header.rendition)?,
                source_size,
            },
            block_size,
            created_unix: header.created_unix.get(),
            header_crc32c: header.header_crc32c.get(),
            index_crc32c: header.index_crc32c.get(),
            extents,
            data: ExtentData::Heap(data.to_vec()),
        })
    }

    /// Moves the extent data into memory locked with `mlock`, so it is never paged out.
    pub fn lock_in_memory(&mut self) -> io::Result<()> {
        // Only data of its own on the heap moves: locked data is locked already, pooled data is
        // locked with its pool's slabs.
        let ExtentData::Heap(data) = &self.data else {
            return Ok(());
        };
        if data.is_empty() {
            return Ok(());
        }
        let mut map = memmap2::MmapMut::map_anon(data.len())?;
        map.copy_from_slice(data);
        let map = map.make_read_only()?;
        map.lock()?;
        self.data = ExtentData::Locked(map);
        Ok(())
    }

    /// Moves the extent data into `pool`, which holds each distinct block once for all the
    /// boot images in it (locked in RAM if the pool locks). A boot image whose extents may
    /// start within a block of the pool (a smaller block size) keeps its own memory: its blocks
    /// would take whole slots and seldom be shared.
    pub fn share_blocks(&mut self, pool: &Arc<BlockPool>) -> io::Result<()> {
        let Some(data) = self.data.contiguous() else {
            return Ok(());
        };
        if self.block_size as usize % pool::BLOCK_SIZE != 0 {
            return Ok(());
        }
        let extents = self
            .extents
            .iter()
            .map(|e| &data[e.data_offset as usize..(e.data_offset + e.length) as usize]);
        self.data = ExtentData::Pooled(pool.share(extents)?);
        Ok(())
    }

    /// Whether the extent data is locked in RAM.
    pub fn is_locked(&self) -> bool {
        match &self.data {
            ExtentData::Locked(_) => true,
            ExtentData::Pooled(pooled) => pooled.is_locked(),
            ExtentData::Heap(_) => false,
        }
    }

    /// The data in the pool, if it is there.
    pub fn pooled(&self) -> Option<&PooledData> {
        match &self.data {
            ExtentData::Pooled(pooled) => Some(pooled),
            _ => None,
        }
    }

    /// Bytes of extent data this boot image holds (in the pool: before sharing).
    pub fn data_len(&self) -> u64 {
        match &self.data {
            ExtentData::Pooled(pooled) => pooled.len(),
            data => data.contiguous().map_or(0, |d| d.len() as u64),
        }
    }

    /// Appends bytes `from..to` (offsets within the extent) of extent `index`'s data to `out`.
    pub fn copy_extent_data(&self, index: usize, from: u64, to: u64, out: &mut Vec<u8>) {
        let extent = &self.extents[index];
        assert!(from <= to && to <= extent.length, "a read outside extent {index}");
        match &self.data {
            ExtentData::Pooled(pooled) => pooled.copy_to(index, from, to, out),
            data => {
                let data = data.contiguous().expect("not pooled");
                out.extend_from_slice(&data[(extent.data_offset + from) as usize..(extent.data_offset + to) as usize]);
            }
        }
    }

    /// The data of extent `index`.
    pub fn extent_data(&self, index: usize) -> Cow<'_, [u8]> {
        let extent = &self.extents[index];
        match self.data.contiguous() {
            Some(data) => {
                Cow::Borrowed(&data[extent.data_offset as usize..(extent.data_offset + extent.length) as usize])
            }
            None => {
                let mut out = Vec::with_capacity(extent.length as usize);
                self.copy_extent_data(index, 0, extent.length, &mut out);
                Cow::Owned(out)
            }
        }
    }

    /// The parts of `[offset, offset + length)`, within the source, that no extent covers.
    pub fn uncovered(&self, offset: u64, length: u64) -> Vec<(u64, u64)> {
        let end = offset.saturating_add(length).min(self.identity.source_size);
        let mut gaps = Vec::new();
        let mut cursor = offset;
        for extent in &self.extents[self.first_extent_ending_after(offset)..] {
            if cursor >= end {
                break;
            }
            if extent.source_offset > cursor {
                gaps.push((cursor, extent.source_offset.min(end) - cursor));
            }
            cursor = cursor.max(extent.source_end());
        }
        if cursor < end {
            gaps.push((cursor, end - cursor));
        }
        gaps
    }

    /// Index of the first extent that ends after `offset` (binary search).
    pub fn first_extent_ending_after(&self, offset: u64) -> usize {
        self.extents.partition_point(|e| e.source_end() <= offset)
    }

    /// Bytes of the source file covered by this boot image.
    pub fn covered_bytes(&self) -> u64 {
        self.extents.iter().map(|e| e.length).sum()
    }

    /// Compares every extent with the source file. `Ok(())` only if each byte matches.
    pub fn verify_against(&self, source: &File) -> Result<(), VerifyError> {
        let size = source.metadata()?.len();
        if size != self.identity.source_size {
            return Err(VerifyError::SizeMismatch {
                boot_image: self.identity.source_size,
                actual: size,
            });
        }
        let mut buf = Vec::new();
        for (index, extent) in self.extents.iter().enumerate() {
            buf.resize(extent.length as usize, 0);
            source.read_exact_at(&mut buf, extent.source_offset)?;
            if buf[..] != self.extent_data(index)[..] {
                return Err(VerifyError::ExtentMismatch {
                    index,
                    offset: extent.source_offset,
                    length: extent.length,
                });
            }
        }
        Ok(())
    }
}

/// Why a boot image does not match a source file.
#[derive(Debug, Error)]
pub enum VerifyError {
    #[error("I/O error reading the source file: {0}")]
    Io(#[from] io::Error),
    #[error("source size mismatch: boot image is for {boot_image} bytes, source file has {actual}")]
    SizeMismatch { boot_image: u64, actual: u64 },
    #[error("extent {index} ({length} bytes at offset {offset}) differs from the source file")]
    ExtentMismatch { index: usize, offset: u64, length: u64 },
}

fn invalid(field: &'static str, value: impl ToString) -> FormatError {
    FormatError::InvalidField {
        field,
        value: value.to_string(),
    }
}

/// Writes a boot image: `extents` are (source offset, data) pairs in first-access order.
///
/// The data section keeps that order (loading then reads the boot's data in the order it is
/// needed); the index is sorted by source offset for lookups.
pub fn write_boot_image<W: Write>(
    out: &mut W,
    identity: &SourceIdentity,
    block_size: u32,
    created_unix: u64,
    extents_in_access_order: &[(u64, Vec<u8>)],
) -> Result<u64, FormatError> {
    let mut entries = Vec::with_capacity(extents_in_access_order.len());
    let mut data_offset = 0u64;
    for (source_offset, data) in extents_in_access_order {
        let length = data.len() as u64;
        if length == 0 || length > MAX_EXTENT_LEN {
            return Err(invalid("extent length", length));
        }
        if source_offset + length > identity.source_size {
            return Err(invalid(
                "extent",
                format!("{source_offset}+{length} past source size {}", identity.source_size),
            ));
        }
        entries.push(ExtentEntry {
            source_offset: U64::new(*source_offset),
            data_offset: U64::new(data_offset),
            length: U32::new(length as u32),
            crc32c: U32::new(crc32c::crc32c(data)),
            reserved: U64::new(0),
        });
        data_offset += length;
    }
    entries.sort_by_key(|e| e.source_offset.get());
    for pair in entries.windows(2) {
        if pair[0].source_offset.get() + pair[0].length.get() as u64 > pair[1].source_offset.get() {
            return Err(invalid(
                "extent",
                format!("overlapping extents at offset {}", pair[1].source_offset.get()),
            ));
        }
    }
    let index_bytes = entries.as_bytes();
    let index_offset = HEADER_SIZE as u64;
    let data_section_offset = index_offset + index_bytes.len() as u64;
    let file_length = data_section_offset + data_offset + FOOTER_SIZE as u64;
    let mut header = Header {
        magic: MAGIC,
        version: U32::new(VERSION),
        header_size: U32::new(HEADER_SIZE as u32),
        block_size: U32::new(block_size),
        flags: U32::new(0),
        source_size: U64::new(identity.source_size),
        extent_count: U64::new(entries.len() as u64),
        index_offset: U64::new(index_offset),
        data_offset: U64::new(data_section_offset),
        data_length: U64::new(data_offset),
        created_unix: U64::new(created_unix),
        index_crc32c: U32::new(crc32c::crc32c(index_bytes)),
        header_crc32c: U32::new(0),
        image_id: put_str("image_id", &identity.image_id)?,
        source_digest: put_str("source_digest", &identity.source_digest)?,
        rendition: put_str("rendition", &identity.rendition)?,
        reserved: [0; 192],
    };
    header.header_crc32c = U32::new(header_crc(&header));
    out.write_all(header.as_bytes())?;
    out.write_all(index_bytes)?;
    for (_, data) in extents_in_access_order {
        out.write_all(data)?;
    }
    let footer = Footer {
        magic: FOOTER_MAGIC,
        file_length: U64::new(file_length),
    };
    out.write_all(footer.as_bytes())?;
    Ok(file_length)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(size: u64) -> SourceIdentity {
        SourceIdentity {
            image_id: "0b5d7c1e-8d5e-4a55-9a57-2f5cbd1c3d3e".into(),
            source_digest: "sha256:00ff".into(),
            rendition: "raw".into(),
            source_size: size,
        }
    }

    fn sample() -> Vec<u8> {
        let extents = vec![
            (8192u64, vec![3u8; 4096]),
            (0u64, vec![1u8; 4096]),
            (65536u64, vec![7u8; 100]),
        ];
        let mut out = Vec::new();
        write_boot_image(&mut out, &identity(1 << 20), 4096, 1700000000, &extents).unwrap();
        out
    }

    #[test]
    fn round_trip_keeps_identity_index_and_data() {
        let image = BootImage::parse(&sample()).unwrap();
        assert_eq!(image.identity, identity(1 << 20));
        assert_eq!(image.block_size, 4096);
        let offsets: Vec<u64> = image.extents.iter().map(|e| e.source_offset).collect();
        assert_eq!(offsets, vec![0, 8192, 65536]);
        // Data is in first-access order: the extent at 8192 was written first.
        assert_eq!(image.extents[1].data_offset, 0);
        assert_eq!(&image.extent_data(0)[..], &[1u8; 4096][..]);
        assert_eq!(&image.extent_data(2)[..], &[7u8; 100][..]);
        assert_eq!(image.covered_bytes(), 8292);
        assert_eq!(image.first_extent_ending_after(4096), 1);
        assert_eq!(image.first_extent_ending_after(4095), 0);
        assert_eq!(image.first_extent_ending_after(70000), 3);
    }

    #[test]
    fn every_truncation_is_rejected() {
        let bytes = sample();
        for len in 0..bytes.len() {
            assert!(
                BootImage::parse(&bytes[..len]).is_err(),
                "truncated to {len} bytes was accepted"
            );
        }
    }

    #[test]
    fn every_single_byte_corruption_is_rejected() {
        let bytes = sample();
        for at in 0..bytes.len() {
            let mut corrupt = bytes.clone();
            corrupt[at] ^= 0x40;
            assert!(
                BootImage::parse(&corrupt).is_err(),
                "corruption at byte {at} was accepted"
            );
        }
    }

    #[test]
    fn unknown_version_is_named() {
        let mut bytes = sample();
        bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
        let mut header = Header::read_from_prefix(&bytes).unwrap().0;
        header.header_crc32c = U32::new(header_crc(&header));
        bytes[..HEADER_SIZE].copy_from_slice(header.as_bytes());
        let err = BootImage::parse(&bytes).err().unwrap();
        assert!(matches!(err, FormatError::UnsupportedVersion(2)), "{err}");
    }

    #[test]
    fn overlapping_extents_are_refused_by_the_writer() {
        let extents = vec![(0u64, vec![1u8; 4096]), (4000u64, vec![1u8; 4096])];
        let err = write_boot_image(&mut Vec::new(), &identity(1 << 20), 4096, 0, &extents)
            .err()
            .unwrap();
        assert!(err.to_string().contains("overlapping"), "{err}");
    }

    #[test]
    fn verify_detects_a_changed_source_byte() {
        let mut source = tempfile::tempfile().unwrap();
        let mut content = vec![0u8; 1 << 20];
        content[..4096].fill(1);
        content[8192..12288].fill(3);
        content[65536..65636].fill(7);
        source.write_all(&content).unwrap();
        let image = BootImage::parse(&sample()).unwrap();
        image.verify_against(&source).unwrap();
        source.write_all_at(&[9], 8200).unwrap();
        let err = image.verify_against(&source).err().unwrap();
        assert!(matches!(err, VerifyError::ExtentMismatch { index: 1, .. }), "{err}");
        source.set_len(1 << 19).unwrap();
        assert!(matches!(
            image.verify_against(&source),
            Err(VerifyError::SizeMismatch { .. })
        ));
    }

    /// A boot image of more than one direct read whose length is not a multiple of a page.
    fn large_sample() -> Vec<u8> {
        let extents: Vec<(u64, Vec<u8>)> = (0..3u64)
            .map(|i| {
                (
                    i << 24,
                    (0..DIRECT_READ_CHUNK as u64 / 2 + 77)
                        .map(|b| (b * 31 + i) as u8)
                        .collect(),
                )
            })
            .collect();
        let mut out = Vec::new();
        write_boot_image(&mut out, &identity(1 << 30), 4096, 1700000000, &extents).unwrap();
        out
    }

    #[test]
    fn a_boot_image_reads_the_same_direct_and_through_the_page_cache() {
        let bytes = large_sample();
        assert!(bytes.len() > DIRECT_READ_CHUNK && bytes.len() % 4096 != 0);
        let expected = BootImage::parse(&bytes).unwrap();
        // The tests' disk, and tmpfs (which takes O_DIRECT through its page cache since Linux
        // 6.6, and refused it before).
        for dir in [tempfile::tempdir().unwrap(), tempfile::tempdir_in("/dev/shm").unwrap()] {
            let path = dir.path().join("b.yolo");
            std::fs::write(&path, &bytes).unwrap();
            let image = BootImage::open(&path).unwrap();
            assert_eq!(image.extents, expected.extents);
            assert!(image
                .extents
                .iter()
                .enumerate()
                .all(|(i, _)| image.extent_data(i) == expected.extent_data(i)));
        }
    }

    #[test]
    fn a_direct_read_takes_the_whole_file_or_leaves_it_to_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.yolo");
        let bytes = large_sample();
        std::fs::write(&path, &bytes).unwrap();
        if let Some((read, len)) = read_direct(&path).unwrap() {
            assert_eq!(&read[..len], &bytes[..]);
        }
        // Where the direct read did not work, the boot image is read through the page cache.
        let image = BootImage::open_with(&path, |_| Ok(None)).unwrap();
        assert_eq!(image.extents, BootImage::parse(&bytes).unwrap().extents);
        // Missing is missing, not a fallback.
        assert_eq!(
            read_direct(&dir.path().join("none")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn the_header_alone_names_the_image_and_its_checksums() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.yolo");
        std::fs::write(&path, sample()).unwrap();
        let image = BootImage::parse(&sample()).unwrap();
        let summary = read_header(&path).unwrap();
        assert_eq!(summary.image_id, image.identity.image_id);
        assert_eq!(summary.source_size, 1 << 20);
        assert_eq!(
            (summary.header_crc32c, summary.index_crc32c),
            (image.header_crc32c, image.index_crc32c)
        );
        let mut corrupt = sample();
        corrupt[100] ^= 1;
        std::fs::write(&path, &corrupt).unwrap();
        assert!(read_header(&path).is_err());
        std::fs::write(&path, &sample()[..100]).unwrap();
        assert!(matches!(read_header(&path), Err(FormatError::Truncated { .. })));
    }

    #[test]
    fn shared_blocks_serve_the_same_bytes_and_small_blocks_keep_their_own_memory() {
        let pool = BlockPool::new(false);
        let mut image = BootImage::parse(&sample()).unwrap();
        let before: Vec<Vec<u8>> = (0..3).map(|i| image.extent_data(i).into_owned()).collect();
        image.share_blocks(&pool).unwrap();
        assert!(image.pooled().is_some());
        assert_eq!(image.data_len(), 8292);
        for (index, data) in before.iter().enumerate() {
            assert_eq!(image.extent_data(index)[..], data[..]);
            let mut part = Vec::new();
            image.copy_extent_data(index, 10, 60, &mut part);
            assert_eq!(part, data[10..60]);
        }
        let mut out = Vec::new();
        write_boot_image(&mut out, &identity(1 << 20), 512, 0, &[(512, vec![1u8; 512])]).unwrap();
        let mut small = BootImage::parse(&out).unwrap();
        small.share_blocks(&pool).unwrap();
        assert!(small.pooled().is_none());
        assert_eq!(small.extent_data(0)[..], [1u8; 512][..]);
    }

    #[test]
    #[should_panic(expected = "a read outside extent 2")]
    fn a_read_past_an_extent_is_refused_not_served_from_the_next() {
        let pool = BlockPool::new(false);
        let mut image = BootImage::parse(&sample()).unwrap();
        image.share_blocks(&pool).unwrap();
        image.copy_extent_data(2, 0, 4096, &mut Vec::new());
    }

    #[test]
    fn locking_keeps_the_data() {
        let mut image = BootImage::parse(&sample()).unwrap();
        // mlock may be refused by RLIMIT_MEMLOCK for unprivileged users; the data must survive either way.
        let _ = image.lock_in_memory();
        assert_eq!(&image.extent_data(2)[..], &[7u8; 100][..]);
    }
}
