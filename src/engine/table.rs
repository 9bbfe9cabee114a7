//! The lease table: where lease records live, how a `LeaseId` or a `RequestId` finds one, and
//! the per-record timer bookkeeping. The rest of the engine sees leases by slot number and
//! never the layout below.
//!
//! A record is one `Slot`: the lease and its timer bookkeeping, exactly two cache lines
//! (64-byte aligned), so a renewal at a million leases reaches one page and two lines at a
//! random address, not two pages and three lines (with `Timing` in an array of its own the
//! renew cycle at a million leases measured ~10% slower). What a renewal never reads (the
//! fence) sits in an array beside the slots.
//!
//! Ids are never reused: the low bits of a `LeaseId` address the slot, the high bits count the
//! slot's records (its generation); a request id likewise counts the slot's requests. A slot
//! is retired rather than freed once either count nears its end. Freed slots wait in a free
//! list for the next lease.

use crate::engine::lease::Lease;
use crate::engine::phase::NEVER;
use crate::engine::prefetch::prefetch;
use crate::engine::timers::{CANCELLED, Timers};
use crate::error::Error;
use crate::types::LeaseId;

/// Low bits of a `LeaseId` address the slot, high bits count reuses of that slot.
const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
/// A slot whose generation reaches this is retired, so no id is ever reused.
const MAX_GEN: u32 = u32::MAX;
/// A `RequestId` is `(n << SLOT_BITS) | slot`, where `n` counts the slot's requests from 1.
/// The slot is enough to find the lease, so results need no lookup table, and the count makes
/// ids unique for ever: a slot is retired once half of its 2^40 ids are used, and a single
/// lease would need to renew every 3 ms for 50 years to use the other half.
const REQUEST_LIMIT: u64 = 1 << (64 - SLOT_BITS);

/// One record: see the module header.
#[derive(Debug)]
#[repr(C, align(64))]
struct Slot {
    lease: Option<Lease>,
    timing: Timing,
    generation: u32,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 128);

/// Timer bookkeeping of a slot. It outlives the slot's records: versions and request counts
/// must never repeat.
#[derive(Debug, Clone, Copy)]
struct Timing {
    /// Deadline of the slot's live timer entry, `NEVER` if none.
    scheduled: u64,
    /// Requests issued from this slot, over all its records (see `REQUEST_LIMIT`).
    requests: u64,
    /// Entries carrying another version are stale. Bumped when the record is freed too.
    version: u32,
    /// Where the live entry sits in the request-timeout FIFO, if it went there: an answered
    /// request cancels its timeout in place (see `Timers::cancel_in_order`).
    fifo_position: u32,
}

/// The next version of a slot's timer entries. Versions stay even, so never `CANCELLED`.
fn next_version(v: u32) -> u32 {
    const _: () = assert!(CANCELLED % 2 == 1);
    v.wrapping_add(2)
}

/// The lease records of one `Client`.
#[derive(Debug, Default)]
pub(crate) struct Table {
    slots: Vec<Slot>,
    /// Fencing token of each slot's grant (meaningful once the lease was granted).
    fences: Vec<u64>,
    free: Vec<u32>,
    live: u32,
}

impl Table {
    /// Records in use.
    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    pub(crate) fn id_of(&self, slot: u32) -> LeaseId {
        LeaseId((u64::from(self.slots[slot as usize].generation) << SLOT_BITS) | u64::from(slot))
    }

    /// The slot of a live lease; `LeaseEnded` once its record is gone, `UnknownLease` for an
    /// id this table never issued.
    pub(crate) fn resolve(&self, lease: LeaseId) -> Result<u32, Error> {
        let slot = (lease.0 & SLOT_MASK) as usize;
        let generation = lease.0 >> SLOT_BITS;
        let Some(s) = self.slots.get(slot) else {
            return Err(Error::UnknownLease(lease));
        };
        let current = u64::from(s.generation);
        if generation == 0 || generation > current {
            return Err(Error::UnknownLease(lease));
        }
        if generation < current || s.lease.is_none() {
            return Err(Error::LeaseEnded(lease));
        }
        Ok(slot as u32)
    }

    /// The record of a live lease, by id.
    pub(crate) fn find(&self, lease: LeaseId) -> Result<(u32, &Lease), Error> {
        let slot = self.resolve(lease)?;
        let l = self.get(slot).ok_or(Error::LeaseEnded(lease))?;
        Ok((slot, l))
    }

    pub(crate) fn get(&self, slot: u32) -> Option<&Lease> {
        self.slots.get(slot as usize)?.lease.as_ref()
    }

    /// Only called with slots known to hold a record.
    pub(crate) fn lease_mut(&mut self, slot: u32) -> &mut Lease {
        match self.slots[slot as usize].lease.as_mut() {
            Some(l) => l,
            None => unreachable!("slot {slot} has no lease record"),
        }
    }

    pub(crate) fn fence(&self, slot: u32) -> u64 {
        self.fences[slot as usize]
    }

    pub(crate) fn set_fence(&mut self, slot: u32, fence: u64) {
        self.fences[slot as usize] = fence;
    }

    /// Stores a new lease; its fence starts at 0.
    pub(crate) fn insert(&mut self, lease: Lease) -> Result<u32, Error> {
        let slot = if let Some(slot) = self.free.pop() {
            let s = &mut self.slots[slot as usize];
            s.generation += 1;
            s.lease = Some(lease);
            self.fences[slot as usize] = 0;
            slot
        } else {
            let slot = u32::try_from(self.slots.len()).map_err(|_| Error::TooManyLeases)?;
            if u64::from(slot) > SLOT_MASK {
                return Err(Error::TooManyLeases);
            }
            self.slots.push(Slot {
                lease: Some(lease),
                timing: Timing {
                    scheduled: NEVER,
                    requests: 0,
                    version: 0,
                    fifo_position: 0,
                },
                generation: 1,
            });
            self.fences.push(0);
            slot
        };
        self.live += 1;
        Ok(slot)
    }

    /// Drops a record; its id then resolves to `LeaseEnded` and its timer entries are stale.
    pub(crate) fn remove(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        s.lease = None;
        let t = &mut s.timing;
        t.version = next_version(t.version);
        t.scheduled = NEVER;
        let ids_left = t.requests < REQUEST_LIMIT / 2;
        self.live -= 1;
        if s.generation < MAX_GEN && ids_left {
            self.free.push(slot);
        }
    }

    /// A new request id for the slot's lease. It stays the slot's newest until the next.
    pub(crate) fn mint_request(&mut self, slot: u32) -> u64 {
        let t = &mut self.slots[slot as usize].timing;
        // Saturates instead of spilling into the slot bits (see `REQUEST_LIMIT`).
        t.requests = (t.requests + 1).min(REQUEST_LIMIT - 1);
        (t.requests << SLOT_BITS) | u64::from(slot)
    }

    /// The slot's newest request id (the one in flight, if its lease has one).
    pub(crate) fn newest_request(&self, slot: u32) -> u64 {
        (self.slots[slot as usize].timing.requests << SLOT_BITS) | u64::from(slot)
    }

    /// The slot a request id was minted for, and whether it is that slot's newest request.
    pub(crate) fn request_slot(&self, req: u64) -> Option<(u32, bool)> {
        let slot = (req & SLOT_MASK) as u32;
        let s = self.slots.get(slot as usize)?;
        let newest = s.timing.requests != 0 && s.timing.requests == req >> SLOT_BITS;
        Some((slot, newest))
    }

    /// Freeing a record bumps its version, so a matching version implies a live record.
    /// A cancelled entry is known stale without a look at its slot.
    pub(crate) fn timer_is_current(&self, slot: u32, version: u32) -> bool {
        version != CANCELLED && self.slots[slot as usize].timing.version == version
    }

    /// The slot's timer entry was taken from the queue.
    pub(crate) fn timer_fired(&mut self, slot: u32) {
        self.slots[slot as usize].timing.scheduled = NEVER;
    }

    /// Makes `deadline` the slot's one live timer entry (`NEVER`: none). Request timeouts
    /// (`in_order`) go to the timers' FIFO.
    pub(crate) fn schedule(
        &mut self,
        slot: u32,
        deadline: u64,
        in_order: bool,
        timers: &mut Timers,
    ) {
        let t = &mut self.slots[slot as usize].timing;
        if deadline == t.scheduled {
            return;
        }
        let old = (t.scheduled, slot, t.version);
        let old_position = t.fifo_position;
        t.scheduled = deadline;
        t.version = next_version(t.version);
        let version = t.version;
        if old.0 != NEVER {
            // Usually an answered request's timeout.
            let _ = timers.cancel_in_order(old_position, old);
        }
        if deadline == NEVER {
            return;
        }
        let entry = (deadline, slot, version);
        if in_order {
            // Request timeouts are send time plus one duration: nearly always in order.
            let position = timers.push_in_order(entry);
            self.slots[slot as usize].timing.fifo_position = position;
        } else {
            timers.push(entry);
        }
        self.maybe_compact(timers);
    }

    /// Stale timer entries are dropped lazily; rebuild when they dominate, so the queue stays
    /// O(live leases) whatever the input sequence (I7).
    fn maybe_compact(&self, timers: &mut Timers) {
        let live = self.live as usize;
        if timers.len() <= 4 * live + 64 {
            return;
        }
        timers.clear();
        // Freeing a record resets its `scheduled`, so a deadline here means a live record.
        for (i, t) in self.slots.iter().map(|s| &s.timing).enumerate() {
            if t.scheduled != NEVER {
                timers.push((t.scheduled, i as u32, t.version));
            }
        }
    }

    /// Software pipelining over the sorted timer run: start loading the records of the
    /// timers two and three ahead (names are inside them), so that with many leases a cycle
    /// does not wait on memory. Only a hint: nothing depends on it.
    pub(crate) fn prefetch_upcoming(&self, timers: &Timers) {
        for k in 2..4 {
            if let Some((_, slot, _)) = timers.upcoming(k) {
                if let Some(s) = self.slots.get(slot as usize) {
                    prefetch(&s.lease);
                    prefetch(&s.generation);
                }
            }
        }
        if let Some((_, slot, version)) = timers.upcoming_in_order(2) {
            if version != CANCELLED {
                if let Some(s) = self.slots.get(slot as usize) {
                    prefetch(&s.timing);
                }
            }
        }
    }
}
