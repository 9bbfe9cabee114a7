//! The core's deadline queue: a timing wheel with exact deadlines.
//!
//! A plain binary heap over every lease costs ~20 cache misses per pop at a million leases.
//! Here deadlines are bucketed by tick (`deadline >> TICK_SHIFT`, ~67 ms) into a wheel
//! covering ~4.6 min. When the cursor reaches a bucket, its entries are sorted once and then
//! consumed in order, so a pop is an index increment on memory that is already in cache, and a
//! push touches one bucket. Ticks are coarse so that renewals, spread by jitter over ~2 s,
//! land in ~30 buckets whose tails stay in cache and in the TLB (4 ms ticks meant ~500 tails,
//! one page walk per push at a million leases). The sorted run also lets the caller look a
//! few entries ahead (`upcoming`) to prefetch the records it will need next. Deadlines beyond
//! the wheel wait in an overflow heap and move into the wheel as the cursor approaches them.
//!
//! No buffer keeps the capacity of a past burst: each shrinks once it is much larger than its
//! use (`fits`), so memory follows the live load.
//!
//! Request timeouts take a shortcut: they are pushed in send order with one shared duration,
//! so their deadlines usually arrive in order and a FIFO holds them (`push_in_order`) without
//! touching the wheel; one that would break the order goes to the wheel instead.
//!
//! Entries are `(deadline, slot, version)`; the caller invalidates lazily by version, so
//! entries are never removed, only skipped when popped. A FIFO entry the caller knows is
//! stale can be marked `CANCELLED` in place (`cancel_in_order`): when it comes due it is then
//! skipped without a look at its slot, which with many leases is a cache and TLB miss.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// One scheduled deadline: `(deadline_ns, slot, version)`.
pub(crate) type Entry = (u64, u32, u32);

/// The version of a cancelled entry; callers never issue it as a real version.
pub(crate) const CANCELLED: u32 = u32::MAX;

const TICK_SHIFT: u32 = 26;
/// Drained runs' allocations kept for reuse; a steady load takes one for each it returns.
const MAX_SPARES: usize = 8;
const BUCKETS: u64 = 4096;
const MASK: u64 = BUCKETS - 1;
const WORDS: usize = (BUCKETS / 64) as usize;
// The summary bitmap is one u64: one bit per occupancy word.
const _: () = assert!(WORDS == 64);

#[derive(Debug, Default)]
pub(crate) struct Timers {
    /// The current tick's entries, sorted; `run[head..]` are still due.
    run: Vec<Entry>,
    head: usize,
    /// Entries pushed for a tick at most `cursor` after the run was sorted (rare: deadlines
    /// within ~4 ms of now, or in the past).
    late: BinaryHeap<Reverse<Entry>>,
    /// Bucket `tick & MASK` holds entries with `cursor < tick < cursor + BUCKETS`.
    /// Allocated on first use, so a core with few leases stays small.
    buckets: Vec<Vec<Entry>>,
    occupied: Vec<u64>,
    /// Bit `w` is set when `occupied[w]` is non-zero: finding the next bucket is O(1).
    summary: u64,
    /// Entries in deadline order (`push_in_order`).
    fifo: VecDeque<Entry>,
    /// Entries ever popped from `fifo`: the position of its front.
    fifo_popped: u64,
    /// Position after the last entry that joined `fifo` out of order (see `push_in_order`).
    unsorted_end: u64,
    /// Deadlines in `fifo` never decrease; entries with equal deadlines may be out of order
    /// except at the front, once this is set.
    front_run_sorted: bool,
    /// Spare buffer for the run's radix sort (its capacity is kept).
    scratch: Vec<Entry>,
    /// Emptied allocations of drained runs, for buckets that start to fill. Taken oldest
    /// first, so that each is soon reused and, if too large for its use, dropped (`fits`).
    spares: VecDeque<Vec<Entry>>,
    /// Entries with `tick >= cursor + BUCKETS`.
    overflow: BinaryHeap<Reverse<Entry>>,
    cursor: u64,
    len: usize,
    /// The global earliest entry, while `earliest_known`: a cycle peeks several times
    /// between changes, and merging the sources each time was a quarter of its cost.
    earliest: Option<Entry>,
    earliest_known: bool,
}

/// Whether a buffer of `capacity` is worth keeping for about `len` entries. Buffers never
/// shrink by themselves, so one burst (a million grants at once) would otherwise set the
/// memory of every later second.
#[inline]
fn fits(capacity: usize, len: usize) -> bool {
    capacity <= 4 * len.max(1024)
}

fn tick(e: &Entry) -> u64 {
    e.0 >> TICK_SHIFT
}

impl Timers {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn clear(&mut self) {
        self.run.clear();
        self.head = 0;
        self.late.clear();
        for b in &mut self.buckets {
            b.clear();
        }
        self.occupied.iter_mut().for_each(|w| *w = 0);
        self.summary = 0;
        self.overflow.clear();
        self.fifo.clear();
        self.front_run_sorted = true;
        self.len = 0;
        self.earliest = None;
        self.earliest_known = true;
    }

    /// Keeps the cached earliest entry right after a push.
    fn note_pushed(&mut self, e: Entry) {
        if self.earliest_known && self.earliest.is_none_or(|m| e < m) {
            self.earliest = Some(e);
        }
    }

    #[inline]
    pub(crate) fn push(&mut self, e: Entry) {
        self.note_pushed(e);
        self.len += 1;
        let t = tick(&e);
        if t <= self.cursor {
            self.late.push(Reverse(e));
        } else if t < self.cursor.saturating_add(BUCKETS) {
            self.push_bucket(t, e);
        } else {
            self.overflow.push(Reverse(e));
        }
    }

    fn push_bucket(&mut self, t: u64, e: Entry) {
        if self.buckets.is_empty() {
            self.buckets = (0..BUCKETS).map(|_| Vec::new()).collect();
            self.occupied = vec![0; WORDS];
        }
        let i = (t & MASK) as usize;
        let bucket = &mut self.buckets[i];
        if bucket.capacity() == 0 {
            if let Some(spare) = self.spares.pop_front() {
                *bucket = spare;
            }
        }
        bucket.push(e);
        if let Some(next) = bucket.spare_capacity_mut().first() {
            crate::engine::prefetch::prefetch(next);
        }
        self.occupied[i / 64] |= 1 << (i % 64);
        self.summary |= 1 << (i / 64);
    }

    /// Like `push`, for a deadline that is usually not before the last one pushed here.
    /// Returns a position hint for `cancel_in_order`.
    #[inline]
    pub(crate) fn push_in_order(&mut self, e: Entry) -> u32 {
        let position = self.fifo_popped.wrapping_add(self.fifo.len() as u64);
        match self.fifo.back() {
            Some(back) if *back <= e => {}
            Some(_) => {
                if !self.out_of_order(e, position) {
                    self.push(e);
                    return position as u32;
                }
            }
            None => self.front_run_sorted = true,
        }
        self.note_pushed(e);
        self.len += 1;
        self.fifo.push_back(e);
        position as u32
    }

    /// Whether `e`, which sorts before the FIFO's back, may still join it. Requests sent by
    /// one call share a deadline but come in any slot order. Such a tie may join the FIFO out
    /// of order (its run of equal deadlines is sorted when it reaches the front), except in
    /// the front run itself, which is kept in order. It is not before the front run, so it is
    /// never the new earliest entry either. Out of line: the common case stays small.
    #[cold]
    fn out_of_order(&mut self, e: Entry, position: u64) -> bool {
        let (Some(front), Some(back)) = (self.fifo.front(), self.fifo.back()) else {
            return false;
        };
        if e.0 == back.0 && e.0 != front.0 {
            self.unsorted_end = position + 1;
            return true;
        }
        false
    }

    /// The FIFO's least entry: its front, once the front run of equal deadlines is sorted.
    /// Cancelled entries (answered requests' timeouts, most of the FIFO) leave on the way
    /// without surfacing: nobody waits for them, and each would cost the caller a full
    /// peek-and-remove round.
    fn fifo_front(&mut self) -> Option<Entry> {
        loop {
            if !self.front_run_sorted {
                self.sort_front_run();
            }
            match self.fifo.front() {
                Some(&e) if e.2 == CANCELLED => self.pop_fifo_front(e),
                front => return front.copied(),
            }
        }
    }

    fn pop_fifo_front(&mut self, e: Entry) {
        self.len -= 1;
        self.fifo.pop_front();
        self.fifo_popped += 1;
        if !fits(self.fifo.capacity(), self.fifo.len()) {
            // Positions are logical (`fifo_popped`), so moving the entries keeps them.
            self.fifo.shrink_to(self.fifo.len() * 2);
        }
        // A new run of equal deadlines at the front may need sorting.
        if self.fifo_popped < self.unsorted_end {
            if let (Some(f), Some(g)) = (self.fifo.front(), self.fifo.get(1)) {
                if f.0 != e.0 && f.0 == g.0 {
                    self.front_run_sorted = false;
                }
            }
        }
    }

    #[cold]
    fn sort_front_run(&mut self) {
        self.front_run_sorted = true;
        let Some(deadline) = self.fifo.front().map(|f| f.0) else {
            return;
        };
        let run = || self.fifo.iter().take_while(|x| x.0 == deadline);
        // Answered requests' timeouts, all cancelled: their order cannot matter.
        if run().all(|x| x.2 == CANCELLED) {
            return;
        }
        let n = run().count();
        let (a, _) = self.fifo.as_mut_slices();
        if let Some(run) = a.get_mut(..n) {
            run.sort_unstable();
        } else {
            // The run wraps around the ring's end.
            let mut run: Vec<Entry> = self.fifo.iter().take(n).copied().collect();
            run.sort_unstable();
            for (x, y) in self.fifo.iter_mut().zip(run) {
                *x = y;
            }
        }
    }

    /// Marks `e`, which the caller knows is stale, as `CANCELLED` if it is still queued in
    /// the FIFO at `position` (returns whether it was); anything else is left alone, to be
    /// skipped by version. The entry keeps its deadline and slot, so live entries still come
    /// due in the same order (only stale entries of the same slot and deadline could sort
    /// between the two).
    #[inline]
    pub(crate) fn cancel_in_order(&mut self, position: u32, e: Entry) -> bool {
        let i = position.wrapping_sub(self.fifo_popped as u32) as usize;
        let Some(x) = self.fifo.get_mut(i).filter(|x| **x == e) else {
            return false;
        };
        let cancelled = (e.0, e.1, CANCELLED);
        *x = cancelled;
        // Still the least entry, if it was. Dropping the cache instead would load the wheel's
        // next bucket early, and entries pushed for earlier ticks would then pile up in `late`.
        if self.earliest == Some(e) {
            self.earliest = Some(cancelled);
        }
        true
    }

    /// Earliest entry (possibly stale: the caller checks versions).
    #[inline]
    pub(crate) fn peek(&mut self) -> Option<Entry> {
        if !self.earliest_known {
            let wheel = self.peek_wheel();
            self.earliest = match (wheel, self.fifo_front()) {
                (Some(w), Some(f)) => Some(w.min(f)),
                (w, f) => w.or(f),
            };
            self.earliest_known = true;
        }
        self.earliest
    }

    fn peek_wheel(&mut self) -> Option<Entry> {
        loop {
            let run = self.run.get(self.head).copied();
            let late = self.late.peek().map(|&Reverse(e)| e);
            match (run, late) {
                (Some(a), Some(b)) => return Some(a.min(b)),
                (Some(e), None) | (None, Some(e)) => return Some(e),
                (None, None) => {
                    if !self.refill() {
                        return None;
                    }
                }
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn pop(&mut self) -> Option<Entry> {
        let e = self.peek()?;
        self.remove_earliest(e);
        Some(e)
    }

    /// Removes `e`, which must be what `peek` just returned (saves a second merge of the
    /// three sources on the hot path).
    #[inline]
    pub(crate) fn remove_earliest(&mut self, e: Entry) {
        debug_assert_eq!(self.peek(), Some(e));
        self.earliest_known = false;
        if self.fifo.front() == Some(&e) {
            self.pop_fifo_front(e);
            return;
        }
        self.len -= 1;
        // A cached earliest entry may still sit in its bucket: load it first.
        self.peek_wheel();
        if self.run.get(self.head) == Some(&e) {
            self.head += 1;
        } else {
            self.pop_late();
        }
    }

    /// Out of line, so that `remove_earliest` stays small enough to inline into the caller's
    /// loop (with the shrink check inline it did not: +6% instructions per renew cycle).
    #[inline(never)]
    fn pop_late(&mut self) {
        self.late.pop();
        if !fits(self.late.capacity(), self.late.len()) {
            self.late.shrink_to(self.late.len() * 2);
        }
    }

    /// Entry `n` of what is left of the current tick's sorted run (0 = its first), if any: a
    /// hint of what comes next (it may be stale, and `late` entries are not looked at).
    pub(crate) fn upcoming(&self, n: usize) -> Option<Entry> {
        self.run.get(self.head + n).copied()
    }

    /// The `n`-th entry of the request-timeout FIFO, if any (a prefetch hint, like `upcoming`).
    pub(crate) fn upcoming_in_order(&self, n: usize) -> Option<Entry> {
        self.fifo.get(n).copied()
    }

    /// Advances the cursor to the next non-empty tick and loads its entries, sorted, into `run`.
    fn refill(&mut self) -> bool {
        let next_bucket = self.next_occupied_tick();
        let next_overflow = self.overflow.peek().map(|Reverse(e)| tick(e));
        let next = match (next_bucket, next_overflow) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => return false,
        };
        self.cursor = next;
        // Only called once the run is consumed and `late` is empty.
        let drained_len = self.run.len();
        self.run.clear();
        self.head = 0;
        if next_bucket == Some(next) {
            let i = (next & MASK) as usize;
            self.occupied[i / 64] &= !(1 << (i % 64));
            if self.occupied[i / 64] == 0 {
                self.summary &= !(1 << (i / 64));
            }
            // The drained run's allocation waits in `spares` for the next bucket to fill:
            // given to this bucket, which fills again only a wheel's turn later, every
            // bucket would keep a run's capacity (512 MB at a million leases).
            let fresh = std::mem::take(&mut self.buckets[i]);
            let drained = std::mem::replace(&mut self.run, fresh);
            let keep = drained.capacity() > 0 && fits(drained.capacity(), drained_len);
            if keep && self.spares.len() < MAX_SPARES {
                self.spares.push_back(drained);
            }
        } else if !fits(self.run.capacity(), drained_len) {
            // No bucket came in (only overflow entries): the run kept its buffer.
            self.run = Vec::new();
        }
        let horizon = self.cursor.saturating_add(BUCKETS);
        while let Some(&Reverse(e)) = self.overflow.peek() {
            let t = tick(&e);
            if t >= horizon {
                break;
            }
            self.overflow.pop();
            if !fits(self.overflow.capacity(), self.overflow.len()) {
                self.overflow.shrink_to(self.overflow.len() * 2);
            }
            if t <= self.cursor {
                self.run.push(e);
            } else {
                self.push_bucket(t, e);
            }
        }
        if !fits(self.scratch.capacity(), self.run.len()) {
            self.scratch = Vec::new();
        }
        sort_run(&mut self.run, &mut self.scratch, self.cursor);
        true
    }

    /// Tick of the first occupied bucket after the cursor, if any: at most four word lookups.
    fn next_occupied_tick(&self) -> Option<u64> {
        if self.summary == 0 {
            return None;
        }
        let start = ((self.cursor.wrapping_add(1)) & MASK) as usize;
        let (fw, fb) = (start / 64, start % 64);
        let first = |w: usize| w * 64 + self.occupied[w].trailing_zeros() as usize;
        let here = self.occupied[fw] & (!0u64 << fb);
        let later = if fw == WORDS - 1 {
            0
        } else {
            self.summary & (!0u64 << (fw + 1))
        };
        let earlier = self.summary & ((1u64 << fw) - 1);
        let wrapped = self.occupied[fw] & ((1u64 << fb) - 1);
        let bit = if here != 0 {
            fw * 64 + here.trailing_zeros() as usize
        } else if later != 0 {
            first(later.trailing_zeros() as usize)
        } else if earlier != 0 {
            first(earlier.trailing_zeros() as usize)
        } else if wrapped != 0 {
            fw * 64 + wrapped.trailing_zeros() as usize
        } else {
            return None;
        };
        let distance = (bit + BUCKETS as usize - start) % BUCKETS as usize;
        Some(self.cursor + 1 + distance as u64)
    }
}

/// Below this many entries a comparison sort beats the radix passes' fixed cost.
const RADIX_MIN: usize = 96;
const DIGIT_BITS: u32 = 8;
const DIGITS: usize = 1 << DIGIT_BITS;
/// Deadline bits (~1 µs) the counting passes leave to the final group sort: two passes
/// instead of three or four, and entries that close are rare.
const FINE_BITS: u32 = 10;
const _: () = assert!(FINE_BITS + 2 * DIGIT_BITS == TICK_SHIFT);

/// Sorts a run whose entries (nearly always) share the tick `cursor`. With jittered renewals
/// a million leases put ~6,700 entries in a tick in random order, and a comparison sort was a
/// sixth of a renew cycle. Entries of one tick differ only in the deadline's low
/// `TICK_SHIFT` bits; two stable counting passes order them by those bits above
/// `FINE_BITS`, and the few entries that then still share a key are sorted among themselves.
#[inline]
fn sort_run(run: &mut Vec<Entry>, scratch: &mut Vec<Entry>, cursor: u64) {
    if run.len() < RADIX_MIN {
        run.sort_unstable();
    } else if !run.is_sorted() {
        if run.iter().any(|e| tick(e) != cursor) {
            run.sort_unstable();
        } else {
            radix_sort(run, scratch);
        }
    }
}

/// Orders entries of one tick (see `sort_run`).
#[inline(never)]
fn radix_sort(run: &mut Vec<Entry>, scratch: &mut Vec<Entry>) {
    // Every position is written by each pass, so stale contents need no clearing.
    scratch.resize(run.len(), (0, 0, 0));
    let mut shift = FINE_BITS;
    while shift < TICK_SHIFT {
        let digit = |e: &Entry| ((e.0 >> shift) as usize) & (DIGITS - 1);
        let mut counts = [0usize; DIGITS];
        for e in run.iter() {
            counts[digit(e)] += 1;
        }
        let mut sum = 0;
        for c in counts.iter_mut() {
            let n = *c;
            *c = sum;
            sum += n;
        }
        for e in run.iter() {
            let d = digit(e);
            scratch[counts[d]] = *e;
            counts[d] += 1;
        }
        std::mem::swap(run, scratch);
        shift += DIGIT_BITS;
    }
    // Entries that share the sorted key keep their push order above; sort each such group
    // by the whole entry. (Sorting the group, not an insertion pass over the run: a million
    // leases granted together with jitter off share one deadline, in any slot order.)
    let key = |e: &Entry| e.0 >> FINE_BITS;
    let mut i = 1;
    while i < run.len() {
        let k = key(&run[i - 1]);
        if key(&run[i]) != k {
            i += 1;
            continue;
        }
        let start = i - 1;
        let end = i + run[i..].iter().take_while(|e| key(e) == k).count();
        run[start..end].sort_unstable();
        i = end + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random sequence for the model test.
    fn lcg(x: &mut u64) -> u64 {
        *x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        *x >> 11
    }

    /// Checks that `got` may come next from a queue holding `model`, and removes it if `pop`:
    /// it is the model's least entry, except that cancelled entries may be skipped over (the
    /// FIFO drops them as they reach its front; they never surface after `got`).
    fn assert_next(
        model: &mut BinaryHeap<Reverse<Entry>>,
        got: Option<Entry>,
        pop: bool,
        seed: u64,
        step: u32,
    ) {
        let mut entries: Vec<Entry> = model.drain().map(|Reverse(e)| e).collect();
        let Some(g) = got else {
            let live = entries.iter().find(|e| e.2 != CANCELLED);
            assert!(
                live.is_none(),
                "seed {seed} step {step}: empty, but {live:?} is queued"
            );
            return;
        };
        if !entries.contains(&g) {
            panic!("seed {seed} step {step}: {g:?} is not queued");
        }
        for e in entries.iter().filter(|e| **e < g) {
            assert!(
                e.2 == CANCELLED,
                "seed {seed} step {step}: {g:?} came before {e:?}"
            );
        }
        let gone = |e: &Entry| e.2 == CANCELLED && *e < g || pop && *e == g;
        entries.retain(|e| !gone(e));
        model.extend(entries.into_iter().map(Reverse));
    }

    #[test]
    fn pops_in_deadline_order_against_a_binary_heap_model() {
        let (mut cancels, mut unordered_ties) = (0, 0);
        for seed in 0..40u64 {
            let mut x = seed;
            let mut wheel = Timers::default();
            let mut model = BinaryHeap::new();
            let mut now = 0u64;
            let mut recent = Vec::new();
            for step in 0..3_000u32 {
                match lcg(&mut x) % 4 {
                    0 | 1 => {
                        // Near, mid-range and far-future deadlines, some in the past.
                        let span =
                            [1u64 << 20, 1 << 30, 1 << 36, 1 << 40][(lcg(&mut x) % 4) as usize];
                        let d = (now + lcg(&mut x) % span).saturating_sub(lcg(&mut x) % (1 << 22));
                        let e = (d, step, seed as u32);
                        wheel.push(e);
                        model.push(Reverse(e));
                    }
                    3 if lcg(&mut x) % 2 == 0 => {
                        // A request timeout: `now` plus one duration, mostly in order; the
                        // occasional earlier one must go around the FIFO.
                        // Some share a deadline, with slots out of order: ties are ordered by
                        // the whole entry.
                        let spread = if lcg(&mut x) % 2 == 0 { 4 } else { 1 << 24 };
                        let d = now
                            .saturating_add(1 << 30)
                            .saturating_sub(lcg(&mut x) % spread);
                        let e = (d, (lcg(&mut x) % 64) as u32, step);
                        recent.push((wheel.push_in_order(e), e));
                        model.push(Reverse(e));
                        // Cancel a recent one now and then, as the core does with an answered
                        // request (never one that shares deadline and slot with another
                        // entry: the core cancels only a slot's newest entry).
                        if lcg(&mut x) % 3 == 0 {
                            let (position, c) = recent[(lcg(&mut x) as usize) % recent.len()];
                            let mut entries: Vec<Entry> =
                                model.drain().map(|Reverse(e)| e).collect();
                            let alone =
                                entries.iter().filter(|o| (o.0, o.1) == (c.0, c.1)).count() == 1;
                            if alone && entries.contains(&c) && wheel.cancel_in_order(position, c) {
                                cancels += 1;
                                for o in entries.iter_mut().filter(|o| **o == c) {
                                    o.2 = CANCELLED;
                                }
                            }
                            model.extend(entries.into_iter().map(Reverse));
                        }
                    }
                    2 => {
                        let got = wheel.pop();
                        assert_next(&mut model, got, true, seed, step);
                        if let Some(e) = got {
                            now = now.max(e.0);
                        }
                    }
                    _ if lcg(&mut x) % 50 == 0 => {
                        // What the core's compaction does: clear, then push the live ones.
                        let keep: Vec<Entry> = std::mem::take(&mut model)
                            .into_iter()
                            .map(|Reverse(e)| e)
                            .filter(|e| e.1 % 2 == 0)
                            .collect();
                        wheel.clear();
                        for &e in &keep {
                            wheel.push(e);
                            model.push(Reverse(e));
                        }
                    }
                    _ => assert_next(&mut model, wheel.peek(), false, seed, step),
                }
                // Cancelled entries leave the FIFO before they are due, so the model may
                // still count some the wheel has dropped.
                let live = model.iter().filter(|Reverse(e)| e.2 != CANCELLED).count();
                assert!(
                    live <= wheel.len() && wheel.len() <= model.len(),
                    "seed {seed} step {step}: {} queued, model {live}..{}",
                    wheel.len(),
                    model.len()
                );
            }
            while !model.is_empty() {
                assert_next(&mut model, wheel.pop(), true, seed, u32::MAX);
            }
            assert_eq!(wheel.pop(), None);
            if wheel.unsorted_end > 0 {
                unordered_ties += 1;
            }
        }
        // The cases above were exercised.
        assert!(
            cancels > 100 && unordered_ties > 10,
            "{cancels} {unordered_ties}"
        );
    }

    #[test]
    fn the_run_sort_orders_like_a_comparison_sort() {
        let mut x = 7u64;
        let mut scratch = Vec::new();
        for case in 0..300u64 {
            let cursor = 1_000 + case;
            let n = (lcg(&mut x) % 1_000) as usize;
            // Few distinct deadlines in some cases, so that ties (ordered by slot and version)
            // are common; in others, many entries share the counting passes' key but not the
            // deadline; now and then an entry from an earlier tick forces the fallback.
            let spread = match case % 4 {
                0 => 16,
                1 => 1 << (FINE_BITS + 2),
                _ => 1 << TICK_SHIFT,
            };
            let mut run: Vec<Entry> = (0..n)
                .map(|_| {
                    let t = if lcg(&mut x) % 500 == 0 {
                        cursor - 1
                    } else {
                        cursor
                    };
                    let d = (t << TICK_SHIFT) | (lcg(&mut x) % spread);
                    (d, (lcg(&mut x) % 64) as u32, (lcg(&mut x) % 4) as u32)
                })
                .collect();
            let mut want = run.clone();
            want.sort_unstable();
            sort_run(&mut run, &mut scratch, cursor);
            assert_eq!(run, want, "case {case}");
        }
    }

    /// Many leases granted at one instant with jitter off share a deadline, in whatever slot
    /// order their results came: one large group of ties (sorted, not insertion-sorted).
    #[test]
    fn a_run_of_one_shared_deadline_in_reverse_slot_order_is_sorted() {
        let cursor = 77;
        let d = (cursor << TICK_SHIFT) | 12_345;
        let mut run: Vec<Entry> = (0..200_000u32).rev().map(|slot| (d, slot, 2)).collect();
        run.push((d - 1, 9, 2));
        sort_run(&mut run, &mut Vec::new(), cursor);
        assert_eq!(run[0], (d - 1, 9, 2));
        assert!(run.is_sorted());
        assert_eq!(run.len(), 200_001);
    }

    /// One burst (a million grants at once) must not set the memory of every later second.
    #[test]
    fn buffers_grown_by_a_burst_shrink_back_under_a_steady_load() {
        let mut w = Timers::default();
        let start = 5u64 << TICK_SHIFT;
        for i in 0..200_000u32 {
            w.push_in_order((start + u64::from(i), i, 0));
            w.push((start + (3 << TICK_SHIFT) + u64::from(i), i, 0));
            // Beyond the wheel: the overflow heap.
            w.push((start + ((BUCKETS + 9) << TICK_SHIFT) + u64::from(i), i, 0));
        }
        // Pushed for the current tick once its run is sorted: the `late` heap.
        assert_eq!(w.pop(), Some((start, 0, 0)));
        for i in 0..200_000u32 {
            w.push((start + 1 + u64::from(i), i, 1));
        }
        assert!(w.late.len() >= 100_000);
        let mut popped = 1;
        while w.pop().is_some() {
            popped += 1;
        }
        assert_eq!(popped, 800_000);
        // Then 300 ticks with 50 deadlines each, pushed ahead and drained tick by tick.
        let mut order = Vec::new();
        let first = w.cursor + 5;
        for t in first..first + 300 {
            for j in 0..50u64 {
                w.push(((t << TICK_SHIFT) + j * 1_000, j as u32, 0));
                w.push_in_order(((t << TICK_SHIFT) + j, j as u32, 1));
            }
            while let Some(e) = w.peek() {
                if tick(&e) + 5 > t {
                    break;
                }
                w.remove_earliest(e);
                order.push(e);
            }
        }
        assert!(order.is_sorted());
        let limit = 4 * 1024;
        assert!(w.fifo.capacity() <= limit, "fifo {}", w.fifo.capacity());
        assert!(
            w.scratch.capacity() <= limit,
            "scratch {}",
            w.scratch.capacity()
        );
        assert!(w.run.capacity() <= limit, "run {}", w.run.capacity());
        assert!(w.late.capacity() <= limit, "late {}", w.late.capacity());
        assert!(
            w.overflow.capacity() <= limit,
            "overflow {}",
            w.overflow.capacity()
        );
        for b in w.spares.iter().chain(&w.buckets) {
            assert!(b.capacity() <= limit, "bucket or spare {}", b.capacity());
        }
    }

    #[test]
    fn handles_u64_max_and_zero_deadlines() {
        let mut w = Timers::default();
        w.push((u64::MAX - 1, 1, 0));
        w.push((0, 2, 0));
        w.push((u64::MAX >> 1, 3, 0));
        assert_eq!(w.pop(), Some((0, 2, 0)));
        assert_eq!(w.pop(), Some((u64::MAX >> 1, 3, 0)));
        assert_eq!(w.pop(), Some((u64::MAX - 1, 1, 0)));
        assert_eq!(w.pop(), None);
        w.clear();
        assert_eq!(w.len(), 0);
    }
}
