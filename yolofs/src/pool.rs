//! The shared block pool: each distinct block of the loaded boot images' data, held once.
//!
//! The boot images of related images (one release's variants, a snapshot and the image it was
//! taken from, an image and its rebuild) read many of the same blocks. A boot image loaded into
//! the pool is cut into blocks of [`BLOCK_SIZE`] from the start of each of its extents (extents
//! start on a block of their base file, so equal files give equal blocks wherever they sit); a
//! block is found by the SHA-256 of its bytes and compared with them byte for byte before it is
//! shared, so two boot images share a block only when their bytes are equal: sharing never
//! changes a byte a guest reads. Each boot image was verified against its own base file before
//! its data comes here.
//!
//! Blocks live in slabs, anonymous mappings of [`SLAB_BLOCKS`] blocks, locked in RAM with `mlock`
//! when the store locks boot images. A block's slot is written once, when it is taken and before
//! any boot image refers to it, and given back when the last boot image that refers to it is
//! dropped; a slab whose slots are all free is unmapped.
//!
//! The store's memory budget counts what its cache holds ([`PooledData::charge`]): each distinct
//! block once, however many cached boot images refer to it.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use log::warn;
use memmap2::{MmapOptions, MmapRaw};
use sha2::{Digest, Sha256};

/// Bytes of one block of the pool (the page size, and the boot images' usual block size).
pub const BLOCK_SIZE: usize = 4096;
/// Blocks of one slab (1 MiB).
pub const SLAB_BLOCKS: usize = 256;

/// An anonymous mapping holding [`SLAB_BLOCKS`] blocks.
struct Slab {
    map: MmapRaw,
    locked: bool,
}

impl Slab {
    fn new(lock: bool) -> io::Result<Slab> {
        let map = MmapRaw::from(MmapOptions::new().len(SLAB_BLOCKS * BLOCK_SIZE).map_anon()?);
        let locked = lock
            && match map.lock() {
                Ok(()) => true,
                Err(e) => {
                    warn!("could not lock a slab of the block pool in RAM ({e}); it stays in ordinary memory");
                    false
                }
            };
        Ok(Slab { map, locked })
    }

    /// The bytes of block `index`.
    fn block(&self, index: usize) -> &[u8] {
        assert!(index < SLAB_BLOCKS);
        // SAFETY: the block lies within the mapping, which lives as long as self; a block's bytes
        // are written only by `write`, while its slot is free and no one holds this slice of it
        // (see the module's comment), so no write races with this shared borrow.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(index * BLOCK_SIZE), BLOCK_SIZE) }
    }

    /// Writes block `index`, whose slot the caller has just taken (nobody reads it yet).
    fn write(&self, index: usize, data: &[u8]) {
        assert!(index < SLAB_BLOCKS && data.len() <= BLOCK_SIZE);
        // SAFETY: in bounds as asserted; the slot is free until this returns, so no reference to
        // these bytes exists (the pool's lock is held, and only it hands slots out).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.map.as_mut_ptr().add(index * BLOCK_SIZE), data.len())
        };
    }
}

/// A block of a boot image's data: its slab, its slot in it, and how many of its bytes are data
/// (fewer than [`BLOCK_SIZE`] only for the last block of an extent).
#[derive(Clone)]
struct BlockRef {
    slab: Arc<Slab>,
    slot: u32,
    len: u16,
}

impl BlockRef {
    fn bytes(&self) -> &[u8] {
        &self.slab.block(self.slot as usize % SLAB_BLOCKS)[..self.len as usize]
    }
}

/// What the pool knows of one slot.
#[derive(Default, Clone)]
struct SlotState {
    /// Boot images that refer to it (0: free).
    refs: u32,
    /// Of those, the ones the store's cache holds.
    charged: u32,
    len: u16,
    /// Its SHA-256, if it is the block other boot images find by it (a block whose digest
    /// another block's bytes already have is never found: it is not shared).
    digest: Option<[u8; 32]>,
}

#[derive(Default)]
struct PoolState {
    slabs: Vec<Option<Arc<Slab>>>,
    slots: Vec<SlotState>,
    used_in_slab: Vec<u32>,
    /// Free slots of mapped slabs, lowest first (so slabs empty out and are unmapped).
    free: BTreeSet<u32>,
    by_digest: HashMap<[u8; 32], u32>,
    stats: PoolStats,
}

/// What the pool holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// Distinct blocks held, and their bytes of data.
    pub blocks: u64,
    pub bytes: u64,
    /// Bytes of data of the blocks the store's cache holds, each once.
    pub charged_bytes: u64,
    /// Of those, the bytes in slabs locked in RAM.
    pub locked_bytes: u64,
    /// Bytes of data of the boot images the store's cache holds, each its own: what they would
    /// take without sharing.
    pub charged_image_bytes: u64,
    /// Slabs mapped, and bytes they take.
    pub slabs: u64,
    pub mapped_bytes: u64,
}

/// The pool of blocks that loaded boot images share.
pub struct BlockPool {
    state: Mutex<PoolState>,
    lock_in_memory: bool,
}

impl BlockPool {
    pub fn new(lock_in_memory: bool) -> Arc<BlockPool> {
        Arc::new(BlockPool {
            state: Mutex::default(),
            lock_in_memory,
        })
    }

    pub fn stats(&self) -> PoolStats {
        self.state.lock().unwrap().stats
    }

    /// Puts the data of one boot image's extents in the pool: `extents` are its extents' data,
    /// in the image's index order.
    pub fn share<'a>(self: &Arc<Self>, extents: impl Iterator<Item = &'a [u8]> + Clone) -> io::Result<PooledData> {
        // Digests outside the pool's lock: other loads share the pool meanwhile.
        let digests: Vec<[u8; 32]> = extents
            .clone()
            .flat_map(|data| data.chunks(BLOCK_SIZE))
            .map(|block| Sha256::digest(block).into())
            .collect();
        let mut first_block = Vec::new();
        let mut blocks = Vec::with_capacity(digests.len());
        let mut len = 0u64;
        let mut state = self.state.lock().unwrap();
        let mut digests = digests.into_iter();
        let result = (|| {
            for data in extents {
                first_block.push(blocks.len() as u32);
                len += data.len() as u64;
                for block in data.chunks(BLOCK_SIZE) {
                    let digest = digests.next().expect("one digest per block");
                    blocks.push(self.take(&mut state, block, digest)?);
                }
            }
            Ok(())
        })();
        let pooled = PooledData {
            pool: self.clone(),
            blocks,
            first_block,
            len,
            charged: AtomicBool::new(false),
        };
        drop(state);
        // On failure, dropping what was taken gives it back.
        result.map(|()| pooled)
    }

    /// A reference to a block holding `data`: the pool's if it has one, else a new one.
    fn take(&self, state: &mut PoolState, data: &[u8], digest: [u8; 32]) -> io::Result<BlockRef> {
        if let Some(&slot) = state.by_digest.get(&digest) {
            let slab = state.slabs[slot as usize / SLAB_BLOCKS]
                .clone()
                .expect("a used slot's slab is mapped");
            let block = BlockRef {
                slab,
                slot,
                len: state.slots[slot as usize].len,
            };
            if block.bytes() == data {
                state.slots[slot as usize].refs += 1;
                return Ok(block);
            }
            // Two contents with one digest: kept apart, never shared.
        }
        let slot = match state.free.pop_first() {
            Some(slot) => slot,
            None => {
                let slab = Some(Arc::new(Slab::new(self.lock_in_memory)?));
                // The first unmapped slab's place, or a new one after the last.
                let index = state
                    .slabs
                    .iter()
                    .position(Option::is_none)
                    .unwrap_or(state.slabs.len());
                if index == state.slabs.len() {
                    state.slabs.push(slab);
                    state.used_in_slab.push(0);
                    state.slots.resize((index + 1) * SLAB_BLOCKS, SlotState::default());
                } else {
                    state.slabs[index] = slab;
                }
                let first = (index * SLAB_BLOCKS) as u32;
                state.free.extend(first + 1..first + SLAB_BLOCKS as u32);
                state.stats.slabs += 1;
                state.stats.mapped_bytes += (SLAB_BLOCKS * BLOCK_SIZE) as u64;
                first
            }
        };
        let slab_index = slot as usize / SLAB_BLOCKS;
        let slab = state.slabs[slab_index].clone().expect("a free slot's slab is mapped");
        slab.write(slot as usize % SLAB_BLOCKS, data);
        state.used_in_slab[slab_index] += 1;
        let shared = !state.by_digest.contains_key(&digest);
        if shared {
            state.by_digest.insert(digest, slot);
        }
        state.slots[slot as usize] = SlotState {
            refs: 1,
            charged: 0,
            len: data.len() as u16,
            digest: shared.then_some(digest),
        };
        state.stats.blocks += 1;
        state.stats.bytes += data.len() as u64;
        Ok(BlockRef {
            slab,
            slot,
            len: data.len() as u16,
        })
    }

    /// Gives back one reference to each of `blocks`.
    fn release(&self, blocks: &[BlockRef]) {
        let mut state = self.state.lock().unwrap();
        for block in blocks {
            let slot = &mut state.slots[block.slot as usize];
            slot.refs -= 1;
            if slot.refs > 0 {
                continue;
            }
            let digest = slot.digest.take();
            if let Some(digest) = digest {
                state.by_digest.remove(&digest);
            }
            state.stats.blocks -= 1;
            state.stats.bytes -= block.len as u64;
            let slab_index = block.slot as usize / SLAB_BLOCKS;
            state.used_in_slab[slab_index] -= 1;
            state.free.insert(block.slot);
            if state.used_in_slab[slab_index] == 0 {
                // Unmapped once the last boot image that referred to it lets its slab go.
                state.slabs[slab_index] = None;
                let first = (slab_index * SLAB_BLOCKS) as u32;
                let slots: Vec<u32> = state.free.range(first..first + SLAB_BLOCKS as u32).copied().collect();
                for slot in slots {
                    state.free.remove(&slot);
                }
                state.stats.slabs -= 1;
                state.stats.mapped_bytes -= (SLAB_BLOCKS * BLOCK_SIZE) as u64;
            }
        }
        // Slots of unmapped slabs at the end are forgotten; a new slab is mapped after the last.
        while state.slabs.last().is_some_and(Option::is_none) {
            state.slabs.pop();
            state.used_in_slab.pop();
            let len = state.slabs.len() * SLAB_BLOCKS;
            state.slots.truncate(len);
        }
    }

    /// Counts `blocks` as held by the store's cache (`add`), or no longer.
    fn charge(&self, blocks: &[BlockRef], image_bytes: u64, add: bool) {
        let mut state = self.state.lock().unwrap();
        for block in blocks {
            let slot = &mut state.slots[block.slot as usize];
            let counted = if add {
                slot.charged += 1;
                slot.charged == 1
            } else {
                slot.charged -= 1;
                slot.charged == 0
            };
            if !counted {
                continue;
            }
            let (bytes, locked) = (block.len as u64, if block.slab.locked { block.len as u64 } else { 0 });
            let stats = &mut state.stats;
            if add {
                stats.charged_bytes += bytes;
                stats.locked_bytes += locked;
            } else {
                stats.charged_bytes -= bytes;
                stats.locked_bytes -= locked;
            }
        }
        if add {
            state.stats.charged_image_bytes += image_bytes;
        } else {
            state.stats.charged_image_bytes -= image_bytes;
        }
    }
}

/// One boot image's data, in the pool.
pub struct PooledData {
    pool: Arc<BlockPool>,
    blocks: Vec<BlockRef>,
    /// Each extent's first block.
    first_block: Vec<u32>,
    len: u64,
    /// Whether the store's cache holds it ([`charge`](Self::charge)).
    charged: AtomicBool,
}

impl PooledData {
    /// Bytes of data, as the boot image holds them (without sharing).
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether every block is in a slab locked in RAM.
    pub fn is_locked(&self) -> bool {
        !self.blocks.is_empty() && self.blocks.iter().all(|b| b.slab.locked)
    }

    /// Appends bytes `from..to` of extent `extent`'s data to `out`.
    pub fn copy_to(&self, extent: usize, from: u64, to: u64, out: &mut Vec<u8>) {
        let first = self.first_block[extent] as usize;
        let mut at = from;
        while at < to {
            let block = &self.blocks[first + at as usize / BLOCK_SIZE];
            let within = at as usize % BLOCK_SIZE;
            let stop = (to - at).min((block.len as usize).saturating_sub(within) as u64) as usize;
            assert!(stop > 0, "read past the end of extent {extent}'s data");
            out.extend_from_slice(&block.bytes()[within..within + stop]);
            at += stop as u64;
        }
    }

    /// Counts this data as held by the store's cache, or no longer; idempotent.
    pub fn charge(&self, held: bool) {
        if self.charged.swap(held, Ordering::AcqRel) != held {
            self.pool.charge(&self.blocks, self.len, held);
        }
    }
}

impl Drop for PooledData {
    fn drop(&mut self) {
        self.charge(false);
        self.pool.release(&self.blocks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(fill: u8) -> Vec<u8> {
        vec![fill; BLOCK_SIZE]
    }

    fn read(data: &PooledData, extent: usize, from: u64, to: u64) -> Vec<u8> {
        let mut out = Vec::new();
        data.copy_to(extent, from, to, &mut out);
        out
    }

    #[test]
    fn equal_blocks_are_held_once_and_read_back_byte_for_byte() {
        let pool = BlockPool::new(false);
        let a_extent: Vec<u8> = [block(1), block(2), vec![3; 100]].concat();
        let b_extent: Vec<u8> = [block(2), block(9)].concat();
        let a = pool.share([a_extent.as_slice()].into_iter()).unwrap();
        let b = pool.share([b_extent.as_slice(), &[3u8; 100][..]].into_iter()).unwrap();
        // 1, 2, 3x100 and 9: block 2 and the short block held once.
        assert_eq!(pool.stats().blocks, 4);
        assert_eq!(pool.stats().bytes, 3 * BLOCK_SIZE as u64 + 100);
        assert_eq!(read(&a, 0, 0, a_extent.len() as u64), a_extent);
        assert_eq!(read(&b, 0, 0, b_extent.len() as u64), b_extent);
        assert_eq!(read(&b, 1, 0, 100), vec![3; 100]);
        // Ranges across blocks, within one, at their ends.
        assert_eq!(read(&a, 0, 4000, 8292), a_extent[4000..8292]);
        assert_eq!(read(&a, 0, 8192, 8292), vec![3; 100]);
        drop(a);
        assert_eq!(pool.stats().blocks, 3);
        assert_eq!(read(&b, 0, 0, b_extent.len() as u64), b_extent);
        drop(b);
        assert_eq!(pool.stats(), PoolStats::default());
    }

    #[test]
    fn a_short_block_is_not_a_long_one_that_starts_the_same() {
        let pool = BlockPool::new(false);
        let a = pool.share([&[5u8; 100][..]].into_iter()).unwrap();
        let b = pool.share([&[5u8; 200][..]].into_iter()).unwrap();
        assert_eq!(pool.stats().blocks, 2);
        assert_eq!(read(&a, 0, 0, 100), vec![5; 100]);
        assert_eq!(read(&b, 0, 0, 200), vec![5; 200]);
    }

    #[test]
    fn the_cache_is_charged_each_distinct_block_once() {
        let pool = BlockPool::new(false);
        let a = pool
            .share([[block(1), block(2)].concat().as_slice()].into_iter())
            .unwrap();
        let b = pool
            .share([[block(2), block(3)].concat().as_slice()].into_iter())
            .unwrap();
        a.charge(true);
        a.charge(true);
        b.charge(true);
        let stats = pool.stats();
        assert_eq!(stats.charged_bytes, 3 * BLOCK_SIZE as u64);
        assert_eq!(stats.charged_image_bytes, 4 * BLOCK_SIZE as u64);
        assert_eq!(stats.locked_bytes, 0);
        a.charge(false);
        assert_eq!(pool.stats().charged_bytes, 2 * BLOCK_SIZE as u64);
        // Dropping a charged image uncharges it.
        drop(b);
        assert_eq!(pool.stats().charged_bytes, 0);
        assert_eq!(pool.stats().charged_image_bytes, 0);
    }

    #[test]
    fn emptied_slabs_are_unmapped_and_their_slots_reused() {
        let pool = BlockPool::new(false);
        let many: Vec<u8> = (0..SLAB_BLOCKS as u32 + 10)
            .flat_map(|i| {
                let mut b = block(0);
                b[..4].copy_from_slice(&i.to_le_bytes());
                b
            })
            .collect();
        let a = pool.share([many.as_slice()].into_iter()).unwrap();
        assert_eq!(pool.stats().slabs, 2);
        let b = pool.share([block(7).as_slice()].into_iter()).unwrap();
        drop(a);
        let stats = pool.stats();
        assert_eq!((stats.slabs, stats.blocks), (1, 1));
        assert_eq!(read(&b, 0, 0, BLOCK_SIZE as u64), block(7));
        drop(b);
        assert_eq!(pool.stats(), PoolStats::default());
        let c = pool.share([block(8).as_slice()].into_iter()).unwrap();
        assert_eq!(read(&c, 0, 0, BLOCK_SIZE as u64), block(8));
        assert_eq!(pool.stats().slabs, 1);
    }

    #[test]
    fn locked_slabs_are_counted_as_locked() {
        let pool = BlockPool::new(true);
        let a = pool.share([block(1).as_slice()].into_iter()).unwrap();
        a.charge(true);
        // mlock can be refused (RLIMIT_MEMLOCK): then nothing is counted as locked.
        let locked = a.is_locked();
        assert_eq!(pool.stats().locked_bytes, if locked { BLOCK_SIZE as u64 } else { 0 });
    }
}
