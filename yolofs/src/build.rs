//! Turning a read trace into a boot image.
//!
//! A trace is the list of reads a boot made on one base file, in arrival order. Building rounds
//! each read out to the block size, drops blocks already taken, and appends what is new as an
//! extent, so the data section ends up in first-access order. Extents that follow each other both
//! in the file and in access order are merged, which keeps the index small: a boot's reads are
//! mostly short sequential runs.
//!
//! Trace file format (text, one read per line): `OFFSET LENGTH` in decimal bytes; blank lines and
//! lines starting with `#` are ignored.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use thiserror::Error;

use crate::format::{self, BootImage, Extent, FormatError, SourceIdentity, MAX_EXTENT_LEN};

/// One read of the source file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRead {
    pub offset: u64,
    pub length: u64,
}

#[derive(Debug, Error)]
pub enum BuildError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("trace line {line}: {reason}")]
    BadTrace { line: usize, reason: String },
    #[error("block size {0} is not a power of two of at least 512")]
    BadBlockSize(u32),
    #[error("the trace has no reads inside the source file")]
    EmptyTrace,
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// Parses a trace file.
pub fn read_trace(path: &Path) -> Result<Vec<TraceRead>, BuildError> {
    let mut reads = Vec::new();
    for (number, line) in BufReader::new(File::open(path)?).lines().enumerate() {
        let line = line?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |reason: &str| BuildError::BadTrace {
            line: number + 1,
            reason: format!("{reason}: {line:?}"),
        };
        // v2 adds when each read arrived and was answered, which builds do not need.
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (offset, length) = match fields[..] {
            [offset, length] => (offset, length),
            [offset, length, start, end] => {
                for time in [start, end] {
                    time.parse::<u64>().map_err(|_| bad("a time is not a number"))?;
                }
                (offset, length)
            }
            _ => return Err(bad("expected `OFFSET LENGTH [START_US END_US]`")),
        };
        let offset = offset.parse().map_err(|_| bad("offset is not a number"))?;
        let length = length.parse().map_err(|_| bad("length is not a number"))?;
        reads.push(TraceRead { offset, length });
    }
    Ok(reads)
}

/// Writes a trace file (the format [`read_trace`] reads); `times`, if not empty: when each read
/// arrived and was answered, in microseconds from the first's arrival (v2).
pub fn write_trace<W: Write>(out: &mut W, header: &str, reads: &[TraceRead], times: &[(u64, u64)]) -> io::Result<()> {
    for line in header.lines() {
        writeln!(out, "# {line}")?;
    }
    for (index, read) in reads.iter().enumerate() {
        match times.get(index) {
            Some((start, end)) => writeln!(out, "{} {} {start} {end}", read.offset, read.length)?,
            None => writeln!(out, "{} {}", read.offset, read.length)?,
        }
    }
    Ok(())
}

/// The block runs a trace covers, in first-access order: (first block, block count).
pub fn plan_extents(reads: &[TraceRead], block_size: u64, source_size: u64) -> Vec<(u64, u64)> {
    let total_blocks = source_size.div_ceil(block_size);
    // Runs taken so far, keyed by first block: lets each read find what is already covered.
    let mut taken: BTreeMap<u64, u64> = BTreeMap::new();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for read in reads {
        if read.length == 0 || read.offset >= source_size {
            continue;
        }
        let first = read.offset / block_size;
        let end = (read.offset.saturating_add(read.length).div_ceil(block_size)).min(total_blocks);
        let mut block = first;
        while block < end {
            // Skip a run that already covers `block`.
            if let Some((&start, &count)) = taken.range(..=block).next_back() {
                if block < start + count {
                    block = start + count;
                    continue;
                }
            }
            let next_taken = taken.range(block..).next().map_or(end, |(&start, _)| start.min(end));
            let count = next_taken - block;
            taken.insert(block, count);
            match runs.last_mut() {
                Some((start, n)) if *start + *n == block => *n += count,
                _ => runs.push((block, count)),
            }
            block = next_taken;
        }
    }
    runs
}

/// The blocks of `relative`'s extents whose bytes `source` holds at the same offsets, as reads in
/// `relative`'s data order. For an image derived from `relative`'s (a snapshot of one of its
/// servers, a respin with a few more packages), what its boots most likely read, keeping only the
/// bytes the two images share.
pub fn shared_blocks(relative: &BootImage, source: &File) -> io::Result<Vec<TraceRead>> {
    let block = relative.block_size as u64;
    let size = source.metadata()?.len();
    let mut extents: Vec<(usize, &Extent)> = relative.extents.iter().enumerate().collect();
    extents.sort_by_key(|(_, e)| e.data_offset);
    let mut reads: Vec<TraceRead> = Vec::new();
    let mut ours = Vec::new();
    for (index, extent) in extents {
        let theirs = relative.extent_data(index);
        let end = extent.source_end().min(size);
        let mut offset = extent.source_offset;
        while offset < end {
            let length = (block - offset % block).min(end - offset);
            ours.resize(length as usize, 0);
            source.read_exact_at(&mut ours, offset)?;
            let at = (offset - extent.source_offset) as usize;
            if ours[..] == theirs[at..at + length as usize] {
                match reads.last_mut() {
                    Some(run) if run.offset + run.length == offset => run.length += length,
                    _ => reads.push(TraceRead { offset, length }),
                }
            }
            offset += length;
        }
    }
    Ok(reads)
}

/// What boot images hold, and what they would hold with each distinct block's bytes kept once.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Sharing {
    /// The bytes of their data, each boot image's own.
    pub data_bytes: u64,
    /// The bytes of their distinct blocks (by SHA-256; a short last block of an extent counts
    /// as a block of its own).
    pub distinct_bytes: u64,
    pub blocks: u64,
    pub distinct_blocks: u64,
}

impl Sharing {
    pub fn of(images: &[BootImage], block_size: usize) -> Sharing {
        use sha2::{Digest, Sha256};
        let mut seen = std::collections::HashSet::new();
        let mut sharing = Sharing::default();
        for image in images {
            for index in 0..image.extents.len() {
                // Extents start on a block of the source: so do their chunks.
                for block in image.extent_data(index).chunks(block_size) {
                    sharing.data_bytes += block.len() as u64;
                    sharing.blocks += 1;
                    if seen.insert(<[u8; 32]>::from(Sha256::digest(block))) {
                        sharing.distinct_bytes += block.len() as u64;
                        sharing.distinct_blocks += 1;
                    }
                }
            }
        }
        sharing
    }
}

/// Statistics of a built boot image.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BuildSummary {
    pub reads: usize,
    pub read_bytes: u64,
    pub extents: usize,
    pub covered_bytes: u64,
    pub boot_image_bytes: u64,
    pub source_size: u64,
}

/// Builds a boot image from `reads` and the source file, writing it atomically to `output`.
pub fn build_boot_image(
    reads: &[TraceRead],
    source: &File,
    identity: &SourceIdentity,
    block_size: u32,
    output: &Path,
) -> Result<BuildSummary, BuildError> {
    if !block_size.is_power_of_two() || block_size < 512 {
        return Err(BuildError::BadBlockSize(block_size));
    }
    let source_size = identity.source_size;
    let runs = plan_extents(reads, block_size as u64, source_size);
    if runs.is_empty() {
        return Err(BuildError::EmptyTrace);
    }
    let mut extents = Vec::with_capacity(runs.len());
    for (first_block, count) in runs {
        let mut offset = first_block * block_size as u64;
        let end = ((first_block + count) * block_size as u64).min(source_size);
        while offset < end {
            let length = (end - offset).min(MAX_EXTENT_LEN);
            let mut data = vec![0u8; length as usize];
            source.read_exact_at(&mut data, offset)?;
            extents.push((offset, data));
            offset += length;
        }
    }
    let covered_bytes = extents.iter().map(|(_, d)| d.len() as u64).sum();
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let tmp = output.with_extension("yolo.tmp");
    let mut out = io::BufWriter::new(File::create(&tmp)?);
    let written = format::write_boot_image(&mut out, identity, block_size, created, &extents)?;
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&tmp, output)?;
    Ok(BuildSummary {
        reads: reads.len(),
        read_bytes: reads.iter().map(|r| r.length).sum(),
        extents: extents.len(),
        covered_bytes,
        boot_image_bytes: written,
        source_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(offset: u64, length: u64) -> TraceRead {
        TraceRead { offset, length }
    }

    #[test]
    fn reads_round_out_to_blocks_in_first_access_order() {
        let runs = plan_extents(&[read(10_000, 10), read(0, 100), read(4096, 4096)], 4096, 1 << 20);
        // 10_000 lies in block 2; block 0 next; block 1 then joins block 0's run (adjacent in both orders).
        assert_eq!(runs, vec![(2, 1), (0, 2)]);
    }

    #[test]
    fn already_covered_blocks_are_not_taken_twice() {
        let runs = plan_extents(&[read(4096, 4096), read(0, 16384)], 4096, 1 << 20);
        assert_eq!(runs, vec![(1, 1), (0, 1), (2, 2)]);
    }

    #[test]
    fn reads_past_the_end_are_clipped() {
        let runs = plan_extents(&[read(8000, 1 << 20), read(1 << 21, 10)], 4096, 10_000);
        assert_eq!(runs, vec![(1, 2)]);
    }

    #[test]
    fn building_then_reading_gives_the_source_bytes() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let mut source = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("src"))
            .unwrap();
        let content: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        source.write_all(&content).unwrap();
        let identity = SourceIdentity {
            source_size: content.len() as u64,
            rendition: "raw".into(),
            ..Default::default()
        };
        let out = dir.path().join("b.yolo");
        let reads = [read(299_990, 100), read(5000, 3), read(100_000, 20_000)];
        let summary = build_boot_image(&reads, &source, &identity, 4096, &out).unwrap();
        assert_eq!(summary.extents, 3);
        let image = format::BootImage::open(&out).unwrap();
        image.verify_against(&source).unwrap();
        for (index, extent) in image.extents.iter().enumerate() {
            let range = extent.source_offset as usize..extent.source_end() as usize;
            assert_eq!(&image.extent_data(index)[..], &content[range]);
        }
        // The last extent is clipped to the end of the source file.
        assert_eq!(image.extents.last().unwrap().source_end(), content.len() as u64);
    }

    #[test]
    fn a_bad_trace_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, "# header\n0 4096\n12 x\n").unwrap();
        let err = read_trace(&path).err().unwrap();
        assert!(err.to_string().contains("line 3"), "{err}");
        std::fs::write(&path, "0 4096 10\n").unwrap();
        assert!(read_trace(&path).is_err());
    }

    #[test]
    fn a_trace_with_times_reads_back_as_its_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let reads = [read(0, 4096), read(65536, 512)];
        let mut out = Vec::new();
        write_trace(&mut out, "yolofs trace v2\nfile f", &reads, &[(0, 120), (900, 1000)]).unwrap();
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            "# yolofs trace v2\n# file f\n0 4096 0 120\n65536 512 900 1000\n"
        );
        std::fs::write(&path, out).unwrap();
        assert_eq!(read_trace(&path).unwrap(), reads);
    }

    #[test]
    fn a_derived_image_keeps_the_blocks_it_shares_with_its_relative_in_its_order() {
        const B: usize = 4096;
        let dir = tempfile::tempdir().unwrap();
        let parent: Vec<u8> = (0..64 * B).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join("parent"), &parent).unwrap();
        let identity = SourceIdentity {
            source_size: parent.len() as u64,
            ..Default::default()
        };
        let relative = dir.path().join("parent.yolo");
        let boot = [
            read(40 * B as u64, 4 * B as u64),
            read(0, 3 * B as u64),
            read(62 * B as u64, 2 * B as u64),
        ];
        build_boot_image(
            &boot,
            &File::open(dir.path().join("parent")).unwrap(),
            &identity,
            4096,
            &relative,
        )
        .unwrap();
        // The derived image changed block 41 and 1, and is 63 blocks long plus 100 bytes.
        let mut child = parent.clone();
        child[41 * B + 5] ^= 0xff;
        child[B] ^= 0xff;
        child.truncate(63 * B + 100);
        std::fs::write(dir.path().join("child"), &child).unwrap();
        let source = File::open(dir.path().join("child")).unwrap();
        let shared = shared_blocks(&BootImage::open(&relative).unwrap(), &source).unwrap();
        let b = B as u64;
        assert_eq!(
            shared,
            vec![
                read(40 * b, b),
                read(42 * b, 2 * b),
                read(0, b),
                read(2 * b, b),
                read(62 * b, b + 100)
            ]
        );
        let child_identity = SourceIdentity {
            source_size: child.len() as u64,
            ..Default::default()
        };
        let output = dir.path().join("child.yolo");
        build_boot_image(&shared, &source, &child_identity, 4096, &output).unwrap();
        BootImage::open(&output).unwrap().verify_against(&source).unwrap();
    }

    #[test]
    fn sharing_counts_each_distinct_block_once_across_boot_images() {
        const B: usize = 4096;
        let dir = tempfile::tempdir().unwrap();
        // Two images alike but for one block, a third other.
        let one: Vec<u8> = (0..16 * B).map(|i| (i / B) as u8).collect();
        let mut two = one.clone();
        two[3 * B] = 0xff;
        let three = vec![0xeeu8; 16 * B];
        let mut images = Vec::new();
        for (name, data) in [("one", &one), ("two", &two), ("three", &three)] {
            std::fs::write(dir.path().join(name), data).unwrap();
            let identity = SourceIdentity {
                source_size: data.len() as u64,
                ..Default::default()
            };
            let output = dir.path().join(format!("{name}.yolo"));
            let reads = [read(0, 4 * B as u64), read(8 * B as u64, B as u64 + 10)];
            build_boot_image(
                &reads,
                &File::open(dir.path().join(name)).unwrap(),
                &identity,
                4096,
                &output,
            )
            .unwrap();
            images.push(BootImage::open(&output).unwrap());
        }
        let sharing = Sharing::of(&images, B);
        // Each holds 6 blocks (0-3, 8, 9); one and two share 5; three's are all alike.
        assert_eq!(sharing.blocks, 18);
        assert_eq!(sharing.data_bytes, 18 * B as u64);
        assert_eq!(sharing.distinct_blocks, 6 + 1 + 1);
        assert_eq!(sharing.distinct_bytes, 8 * B as u64);
    }
}
