//! The shared block pool: each distinct block of the loaded boot images' data, held once.
//!
//! The boot images of related images (one release's variants, a snapshot and the image it was
//! taken from, an image and its rebuild) read many of the same blocks. A boot image loaded into
//! the pool is cut into blocks of [`BLOCK_SIZE`] from the start of each of its extents (extents
//! start on a block of their base file, so equal files give equal blocks wherever they sit); a
//! block is found by a hash of its bytes (SipHash with a key of this process's own, so nobody
//! can make blocks collide on purpose) and compared with them byte for byte before it is shared,
//! so two boot images share a block only when their bytes are equal: sharing never changes a
//! byte a guest reads. Each boot image was verified against its own base file before its data
//! comes here. Boot images whose block size is below [`BLOCK_SIZE`] keep their own memory.
//!
//! Blocks live in slabs, anonymous mappings of [`SLAB_BLOCKS`] blocks (2 MiB), locked in RAM with
//! `mlock` when the store locks boot images. A block's slot is written once, when it is taken and
//! before any boot image refers to it, and given back when the last boot image that refers to it
//! is dropped; a slab whose slots are all free is unmapped. Slabs are mapped, and a boot image's
//! blocks taken, outside the pool's lock or in short turns of it: a load never holds up the
//! others, nor the reads, which take no lock.
//!
//! The store's memory budget counts what its cache holds ([`PooledData::charge`]): each distinct
//! block once, however many cached boot images refer to it, as the whole slot it takes.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use log::warn;
use memmap2::{MmapOptions, MmapRaw};

/// Bytes of one block of the pool (the page size, and the boot images' usual block size).
pub const BLOCK_SIZE: usize = 4096;
/// Blocks of one slab (2 MiB).
pub const SLAB_BLOCKS: usize = 512;
const SLAB_BYTES: u64 = (SLAB_BLOCKS * BLOCK_SIZE) as u64;
/// Blocks a load takes in one turn of the pool's lock.
const BLOCKS_PER_TURN: usize = 1024;

/// An anonymous mapping holding [`SLAB_BLOCKS`] blocks.
struct Slab {
    map: MmapRaw,
    locked: bool,
}

impl Slab {
    /// The bytes of block `index`.
    fn block(&self, index: usize) -> &[u8] {
        assert!(index < SLAB_BLOCKS);
        // SAFETY: the block lies within the mapping, which lives as long as self. A block's
        // bytes are written only by `write`, while its slot is free: no boot image refers to it,
        // so no slice of it exists (see `write`).
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(index * BLOCK_SIZE), BLOCK_SIZE) }
    }

    /// Writes block `index`.
    ///
    /// # Safety
    /// The caller has just taken the block's slot from the free slots, under the pool's lock:
    /// no [`BlockRef`] refers to it, so no slice of its bytes exists.
    unsafe fn write(&self, index: usize, data: &[u8]) {
        assert!(index < SLAB_BLOCKS && data.len() <= BLOCK_SIZE);
        // SAFETY: in bounds as asserted; nothing reads these bytes meanwhile (the caller's
        // promise), and other blocks' bytes are not touched.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.map.as_mut_ptr().add(index * BLOCK_SIZE), data.len())
        };
    }
}

/// A block of a boot image's data: its slab, its slot, and how many of its bytes are data
/// (fewer than [`BLOCK_SIZE`] only for the last block of an extent). Not `Clone`: each is one
/// reference the pool counts.
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
    /// Bytes of data it holds.
    len: u16,
    /// Its hash, if it is the block others with its bytes are found by.
    digest: Option<u64>,
}

#[derive(Default)]
struct PoolState {
    slabs: Vec<Option<Arc<Slab>>>,
    slots: Vec<SlotState>,
    used_in_slab: Vec<u32>,
    /// Free slots of mapped slabs, lowest first (so slabs empty out and are unmapped).
    free: BTreeSet<u32>,
    by_digest: HashMap<u64, u32>,
    stats: PoolStats,
}

impl PoolState {
    /// Adds a slab mapped by [`BlockPool::map_slab`]: in the place of the first one unmapped,
    /// or after the last.
    fn add_slab(&mut self, slab: Slab) -> usize {
        let index = self.slabs.iter().position(Option::is_none).unwrap_or(self.slabs.len());
        if index == self.slabs.len() {
            self.slabs.push(None);
            self.used_in_slab.push(0);
            self.slots.resize((index + 1) * SLAB_BLOCKS, SlotState::default());
        }
        if slab.locked {
            self.stats.locked_bytes += SLAB_BYTES;
        }
        self.slabs[index] = Some(Arc::new(slab));
        let first = (index * SLAB_BLOCKS) as u32;
        self.free.extend(first..first + SLAB_BLOCKS as u32);
        self.stats.slabs += 1;
        self.stats.mapped_bytes += SLAB_BYTES;
        index
    }

    fn unmap_slab(&mut self, index: usize) {
        // Unmapped once the last boot image that referred to it lets it go.
        if let Some(slab) = self.slabs[index].take() {
            if slab.locked {
                self.stats.locked_bytes -= SLAB_BYTES;
            }
        }
        let first = (index * SLAB_BLOCKS) as u32;
        let slots: Vec<u32> = self.free.range(first..first + SLAB_BLOCKS as u32).copied().collect();
        for slot in slots {
            self.free.remove(&slot);
        }
        self.stats.slabs -= 1;
        self.stats.mapped_bytes -= SLAB_BYTES;
        while self.slabs.last().is_some_and(Option::is_none) {
            self.slabs.pop();
            self.used_in_slab.pop();
            self.slots.truncate(self.slabs.len() * SLAB_BLOCKS);
        }
    }
}

/// What the pool holds. Blocks count as the slots they take ([`BLOCK_SIZE`] each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// Distinct blocks held, and the bytes their slots take.
    pub blocks: u64,
    pub bytes: u64,
    /// Bytes of the blocks the store's cache holds, each once.
    pub charged_bytes: u64,
    /// Bytes of data of the boot images the store's cache holds, each its own: what they would
    /// take without sharing.
    pub charged_image_bytes: u64,
    /// Slabs mapped, the bytes they take, and of those the bytes locked in RAM.
    pub slabs: u64,
    pub mapped_bytes: u64,
    pub locked_bytes: u64,
}

/// The pool of blocks that loaded boot images share.
pub struct BlockPool {
    state: Mutex<PoolState>,
    hasher: RandomState,
    lock_in_memory: bool,
    /// Whether a slab could not be locked (said once).
    lock_failed: AtomicBool,
}

impl BlockPool {
    pub fn new(lock_in_memory: bool) -> Arc<BlockPool> {
        Arc::new(BlockPool {
            state: Mutex::default(),
            hasher: RandomState::new(),
            lock_in_memory,
            lock_failed: AtomicBool::new(false),
        })
    }

    /// The pool's state; a panic elsewhere while it was held leaves it consistent (every
    /// change to it is complete before anything that can panic), so it is used on.
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    fn map_slab(&self) -> io::Result<Slab> {
        let map = MmapRaw::from(MmapOptions::new().len(SLAB_BLOCKS * BLOCK_SIZE).map_anon()?);
        let locked = self.lock_in_memory
            && match map.lock() {
                Ok(()) => true,
                Err(e) => {
                    if !self.lock_failed.swap(true, Ordering::Relaxed) {
                        warn!("could not lock the block pool in RAM ({e}); what could not be locked stays in ordinary memory");
                    }
                    false
                }
            };
        Ok(Slab { map, locked })
    }

    /// Puts the data of one boot image's extents in the pool: `extents` are its extents' data,
    /// in the image's index order.
    pub fn share<'a>(self: &Arc<Self>, extents: impl Iterator<Item = &'a [u8]>) -> io::Result<PooledData> {
        let mut pooled = PooledData {
            pool: self.clone(),
            blocks: Vec::new(),
            first_block: Vec::new(),
            len: 0,
            locked: self.lock_in_memory,
            charged: false.into(),
        };
        let mut pending: Vec<(&[u8], u64)> = Vec::with_capacity(BLOCKS_PER_TURN);
        // On failure, dropping what was taken gives it back.
        for data in extents {
            pooled.first_block.push((pooled.blocks.len() + pending.len()) as u32);
            pooled.len += data.len() as u64;
            for block in data.chunks(BLOCK_SIZE) {
                // Hashed outside the pool's lock.
                pending.push((block, self.hasher.hash_one(block)));
                if pending.len() == BLOCKS_PER_TURN {
                    self.take_all(&mut pending, &mut pooled)?;
                }
            }
        }
        self.take_all(&mut pending, &mut pooled)?;
        Ok(pooled)
    }

    /// Takes a block for each of `pending` in one turn of the lock, mapping the slabs they may
    /// need before it.
    fn take_all(&self, pending: &mut Vec<(&[u8], u64)>, pooled: &mut PooledData) -> io::Result<()> {
        let mut added = Vec::new();
        let mut state = loop {
            let state = self.lock();
            let new = pending
                .iter()
                .filter(|(_, digest)| !state.by_digest.contains_key(digest))
                .count();
            let short = new.saturating_sub(state.free.len());
            if short == 0 {
                break state;
            }
            drop(state);
            let slabs = (0..short.div_ceil(SLAB_BLOCKS))
                .map(|_| self.map_slab())
                .collect::<io::Result<Vec<_>>>()?;
            let mut state = self.lock();
            for slab in slabs {
                added.push(state.add_slab(slab));
            }
        };
        for (data, digest) in pending.drain(..) {
            let block = take(self, &mut state, data, digest)?;
            pooled.locked &= block.slab.locked;
            pooled.blocks.push(block);
        }
        // A slab mapped for this turn that no block took (loads at once took the same blocks
        // first) would stay mapped, empty: nothing frees a block of it.
        for index in added {
            if state.slabs.get(index).is_some_and(Option::is_some) && state.used_in_slab[index] == 0 {
                state.unmap_slab(index);
            }
        }
        Ok(())
    }
}

/// A reference to a block holding `data`: the pool's if it has one, else one in a free slot.
fn take(pool: &BlockPool, state: &mut PoolState, data: &[u8], digest: u64) -> io::Result<BlockRef> {
    if let Some(&slot) = state.by_digest.get(&digest) {
        let slab = state.slabs[slot as usize / SLAB_BLOCKS]
            .clone()
            .expect("a used slot's slab is mapped");
        let stored = slab.block(slot as usize % SLAB_BLOCKS);
        if state.slots[slot as usize].len as usize == data.len() && stored[..data.len()] == *data {
            state.slots[slot as usize].refs += 1;
            return Ok(BlockRef {
                slab,
                slot,
                len: data.len() as u16,
            });
        }
        // Two contents with one hash: kept apart, never shared.
    }
    if state.free.is_empty() {
        // More new blocks than the turn planned for (two contents with one hash): rare enough
        // to map under the lock.
        let slab = pool.map_slab()?;
        state.add_slab(slab);
    }
    let slot = state.free.pop_first().expect("a slab was just mapped");
    let slab_index = slot as usize / SLAB_BLOCKS;
    let slab = state.slabs[slab_index].clone().expect("a free slot's slab is mapped");
    // SAFETY: the slot has just left the free slots, under the pool's lock: nothing refers to it.
    unsafe { slab.write(slot as usize % SLAB_BLOCKS, data) };
    state.used_in_slab[slab_index] += 1;
    let findable = !state.by_digest.contains_key(&digest);
    if findable {
        state.by_digest.insert(digest, slot);
    }
    state.slots[slot as usize] = SlotState {
        refs: 1,
        charged: 0,
        len: data.len() as u16,
        digest: findable.then_some(digest),
    };
    state.stats.blocks += 1;
    state.stats.bytes += BLOCK_SIZE as u64;
    Ok(BlockRef {
        slab,
        slot,
        len: data.len() as u16,
    })
}

/// One boot image's data, in the pool.
pub struct PooledData {
    pool: Arc<BlockPool>,
    blocks: Vec<BlockRef>,
    /// Each extent's first block.
    first_block: Vec<u32>,
    len: u64,
    /// Whether every block is in a slab locked in RAM.
    locked: bool,
    /// Whether the store's cache holds it ([`charge`](Self::charge)); changed under the
    /// pool's lock.
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
        self.locked && !self.blocks.is_empty()
    }

    /// Appends bytes `from..to` of extent `extent`'s data to `out`.
    pub fn copy_to(&self, extent: usize, from: u64, to: u64, out: &mut Vec<u8>) {
        let first = self.first_block[extent] as usize;
        let end = self
            .first_block
            .get(extent + 1)
            .map_or(self.blocks.len(), |&b| b as usize);
        let mut at = from;
        while at < to {
            let index = first + at as usize / BLOCK_SIZE;
            assert!(index < end, "read past the end of extent {extent}'s data");
            let block = &self.blocks[index];
            let within = at as usize % BLOCK_SIZE;
            let stop = (to - at).min((block.len as usize).saturating_sub(within) as u64) as usize;
            assert!(stop > 0, "read past the end of extent {extent}'s data");
            out.extend_from_slice(&block.bytes()[within..within + stop]);
            at += stop as u64;
        }
    }

    /// Counts this data as held by the store's cache, or no longer; idempotent.
    pub fn charge(&self, held: bool) {
        let mut state = self.pool.lock();
        self.charge_locked(&mut state, held);
    }

    fn charge_locked(&self, state: &mut PoolState, held: bool) {
        if self.charged.swap(held, Ordering::Relaxed) == held {
            return;
        }
        for block in &self.blocks {
            let slot = &mut state.slots[block.slot as usize];
            let counted = if held {
                slot.charged += 1;
                slot.charged == 1
            } else {
                slot.charged -= 1;
                slot.charged == 0
            };
            if counted && held {
                state.stats.charged_bytes += BLOCK_SIZE as u64;
            } else if counted {
                state.stats.charged_bytes -= BLOCK_SIZE as u64;
            }
        }
        if held {
            state.stats.charged_image_bytes += self.len;
        } else {
            state.stats.charged_image_bytes -= self.len;
        }
    }
}

impl Drop for PooledData {
    fn drop(&mut self) {
        let mut state = self.pool.lock();
        // Uncharged before its slots are given back (a freed slot may be taken at once).
        self.charge_locked(&mut state, false);
        for block in &self.blocks {
            let slot = &mut state.slots[block.slot as usize];
            slot.refs -= 1;
            if slot.refs > 0 {
                continue;
            }
            if let Some(digest) = slot.digest.take() {
                state.by_digest.remove(&digest);
            }
            state.stats.blocks -= 1;
            state.stats.bytes -= BLOCK_SIZE as u64;
            let slab_index = block.slot as usize / SLAB_BLOCKS;
            state.used_in_slab[slab_index] -= 1;
            state.free.insert(block.slot);
            if state.used_in_slab[slab_index] == 0 {
                state.unmap_slab(slab_index);
            }
        }
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
        // Each takes a whole slot.
        assert_eq!(pool.stats().bytes, 4 * BLOCK_SIZE as u64);
        assert_eq!(read(&a, 0, 0, a_extent.len() as u64), a_extent);
        assert_eq!(read(&b, 0, 0, b_extent.len() as u64), b_extent);
        assert_eq!(read(&b, 1, 0, 100), vec![3; 100]);
        // Ranges across blocks, within one, at their ends.
        assert_eq!(read(&a, 0, 4000, 8292), a_extent[4000..8292]);
        assert_eq!(read(&a, 0, 8192, 8292), vec![3; 100]);
        assert_eq!(read(&a, 0, 0, 8192), a_extent[..8192]);
        assert_eq!(read(&a, 0, 4096, 4097), vec![2]);
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
    fn a_slab_emptied_between_others_is_mapped_again_in_its_place() {
        let pool = BlockPool::new(false);
        let slab_of = |seed: u8| -> Vec<u8> {
            (0..SLAB_BLOCKS as u32)
                .flat_map(|i| {
                    let mut b = block(seed);
                    b[..4].copy_from_slice(&i.to_le_bytes());
                    b
                })
                .collect()
        };
        let (one, two, three) = (slab_of(1), slab_of(2), slab_of(3));
        let a = pool.share([one.as_slice()].into_iter()).unwrap();
        let b = pool.share([two.as_slice()].into_iter()).unwrap();
        let c = pool.share([three.as_slice()].into_iter()).unwrap();
        assert_eq!(pool.stats().slabs, 3);
        drop(b);
        assert_eq!(pool.stats().slabs, 2);
        let d = pool.share([slab_of(4).as_slice()].into_iter()).unwrap();
        assert_eq!(pool.stats().slabs, 3);
        assert_eq!(read(&a, 0, 0, one.len() as u64), one);
        assert_eq!(read(&c, 0, 0, three.len() as u64), three);
        assert_eq!(read(&d, 0, 0, SLAB_BYTES), slab_of(4));
    }

    #[test]
    fn loads_and_drops_at_once_keep_every_image_its_bytes() {
        let pool = BlockPool::new(false);
        // Four images, each half common blocks and half its own, shared and dropped over and
        // over from four threads.
        let images: Vec<Vec<u8>> = (0..4u8)
            .map(|n| {
                (0..2048u32)
                    .flat_map(|i| {
                        let mut b = block(if i % 2 == 0 { 0 } else { n + 1 });
                        b[..4].copy_from_slice(&i.to_le_bytes());
                        b
                    })
                    .collect()
            })
            .collect();
        std::thread::scope(|scope| {
            for data in &images {
                let pool = &pool;
                scope.spawn(move || {
                    for _ in 0..5 {
                        let pooled = pool.share([data.as_slice()].into_iter()).unwrap();
                        pooled.charge(true);
                        assert_eq!(read(&pooled, 0, 0, data.len() as u64), *data);
                    }
                });
            }
        });
        assert_eq!(pool.stats(), PoolStats::default());
    }

    #[test]
    fn locked_slabs_are_counted_as_locked() {
        let pool = BlockPool::new(true);
        let a = pool.share([block(1).as_slice()].into_iter()).unwrap();
        a.charge(true);
        // mlock can be refused (RLIMIT_MEMLOCK): then nothing is counted as locked.
        let locked = a.is_locked();
        assert_eq!(pool.stats().locked_bytes, if locked { SLAB_BYTES } else { 0 });
        drop(a);
        assert_eq!(pool.stats(), PoolStats::default());
    }
}
