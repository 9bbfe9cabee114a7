//! The bookkeeping every backend protocol shares: the requests it has handed out and not yet
//! seen answered, the order they go out in, the application events and status answers waiting
//! to be polled, and the last error.
//!
//! A protocol (Redis, SQL, etcd) decides what a request says and what its answer means; this
//! module owns only the plumbing around that, written once so the three cannot drift:
//! - ids are allocated here, start at 1 and are never reused;
//! - a request is *pending* from [`Outbox::push`] until its answer takes it
//!   ([`Outbox::take`]); the host polls pending requests in the order they were pushed
//!   ([`Outbox::next_ready`]), and one dropped before it was polled is skipped;
//! - a request may carry an expiry: once it has passed, [`Outbox::pop_expired`] hands it back
//!   so its protocol can fail whoever waits for it, and a host that never answers cannot grow
//!   the table;
//! - the engine's events for the application and finished status queries queue here until
//!   the host polls them;
//! - `last_error` is one bounded string, cut on a character boundary.
//!
//! `P` is the protocol's own record of a request (its operation and the request's payload).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use super::StatusAnswer;
use crate::{Client, Event};

/// The hasher of tables keyed by values this process chose (request ids, lease ids, random
/// tokens): a fast mix, since no outsider picks the keys that go in.
pub(crate) type IdHash = crate::engine::hash::KeyedState;

/// An [`IdHash`] (its key is fixed: the keys' values are ours, not an adversary's).
pub(crate) fn id_hash() -> IdHash {
    IdHash::new(0x243f_6a88_85a3_08d3)
}

/// A time that never comes (no expiry, no deadline).
pub(crate) const NEVER: u64 = u64::MAX;
/// One millisecond in nanoseconds.
pub(crate) const MS: u64 = 1_000_000;

/// Pending requests, their order and expiry, the event and status queues and the last error
/// of one protocol object. See the module docs.
#[derive(Debug)]
pub(crate) struct Outbox<P> {
    next_id: u64,
    pending: HashMap<u64, P, IdHash>,
    expiry: BinaryHeap<Reverse<(u64, u64)>>,
    queue: VecDeque<u64>,
    events: VecDeque<Event>,
    statuses: VecDeque<StatusAnswer>,
    last_error: String,
}

impl<P> Default for Outbox<P> {
    fn default() -> Self {
        Self {
            next_id: 0,
            pending: HashMap::with_hasher(id_hash()),
            expiry: BinaryHeap::new(),
            queue: VecDeque::new(),
            events: VecDeque::new(),
            statuses: VecDeque::new(),
            last_error: String::new(),
        }
    }
}

impl<P> Outbox<P> {
    /// A fresh id that no request of this object has had or will have.
    pub(crate) fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Makes `request` pending under a fresh id and queues it for the host; `expires` (if
    /// not [`NEVER`]) is when [`Self::pop_expired`] gives it up.
    pub(crate) fn push(&mut self, request: P, expires: u64) -> u64 {
        let id = self.next_id();
        self.pending.insert(id, request);
        if expires != NEVER {
            self.expiry.push(Reverse((expires, id)));
        }
        self.queue.push_back(id);
        id
    }

    /// The next queued request that is still pending, taken off the queue (it stays pending).
    pub(crate) fn next_ready(&mut self) -> Option<(u64, &P)> {
        while let Some(id) = self.queue.pop_front() {
            if self.pending.contains_key(&id) {
                return Some((id, &self.pending[&id]));
            }
        }
        None
    }

    /// Takes pending request `id` (its answer came, or it is dropped); `None` if unknown or
    /// already taken.
    pub(crate) fn take(&mut self, id: u64) -> Option<P> {
        self.pending.remove(&id)
    }

    /// Pending request `id`.
    pub(crate) fn get(&self, id: u64) -> Option<&P> {
        self.pending.get(&id)
    }

    /// Pending request `id`, to amend.
    pub(crate) fn get_mut(&mut self, id: u64) -> Option<&mut P> {
        self.pending.get_mut(&id)
    }

    /// Every pending request.
    pub(crate) fn pending(&self) -> impl Iterator<Item = (u64, &P)> {
        self.pending.iter().map(|(id, p)| (*id, p))
    }

    /// The next pending request whose expiry is at or before `now`, taken; `None` when no
    /// more are due. Expiries of requests already answered are dropped on the way.
    pub(crate) fn pop_expired(&mut self, now: u64) -> Option<(u64, P)> {
        while let Some(Reverse((at, id))) = self.expiry.peek().copied() {
            if at > now {
                return None;
            }
            self.expiry.pop();
            if let Some(p) = self.pending.remove(&id) {
                return Some((id, p));
            }
        }
        None
    }

    /// The earliest expiry still recorded (possibly of a request answered since).
    /// Entries of requests already answered are dropped on the way, so an answered request
    /// never makes the host wake for nothing.
    pub(crate) fn next_expiry(&mut self) -> Option<u64> {
        while let Some(Reverse((at, id))) = self.expiry.peek() {
            if self.pending.contains_key(id) {
                return Some(*at);
            }
            self.expiry.pop();
        }
        None
    }

    /// Whether [`Self::next_ready`] would give a request, taking nothing.
    pub(crate) fn has_ready(&self) -> bool {
        self.queue.iter().any(|id| self.pending.contains_key(id))
    }

    /// Whether the protocol that owns this outbox has a request for the host, taking and
    /// moving nothing: the engine has output to pump into one, or one is queued. (`lh_drain`
    /// ends a drain on it; a protocol with requests of its own adds them.)
    pub(crate) fn has_request(&self, core: &Client) -> bool {
        core.has_output() || self.has_ready()
    }

    /// Whether nothing is queued for the host (ids of dropped requests count as queued).
    pub(crate) fn queue_is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Takes `id` off the queue without dropping it (it was handed to the host another way).
    pub(crate) fn unqueue(&mut self, id: u64) {
        self.queue.retain(|&o| o != id);
    }

    /// Empties the queue, oldest first (the requests stay pending).
    pub(crate) fn drain_queue(&mut self) -> Vec<u64> {
        self.queue.drain(..).collect()
    }

    /// Queues an event for the application.
    pub(crate) fn push_event(&mut self, event: Event) {
        self.events.push_back(event);
    }

    /// The next event for the application.
    pub(crate) fn pop_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Queues a finished status query.
    pub(crate) fn answer_status(&mut self, answer: StatusAnswer) {
        self.statuses.push_back(answer);
    }

    /// The next finished status query.
    pub(crate) fn pop_status(&mut self) -> Option<StatusAnswer> {
        self.statuses.pop_front()
    }

    /// The last error noted ("" if none).
    pub(crate) fn last_error(&self) -> &str {
        &self.last_error
    }

    /// Replaces the last error with `text`, cut to at most `max` bytes on a character
    /// boundary.
    pub(crate) fn note_error(&mut self, text: &str, max: usize) {
        let mut end = text.len().min(max);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.last_error = text[..end].to_owned();
    }

    /// Replaces the last error with `text` as it is (already bounded by the caller).
    pub(crate) fn set_last_error(&mut self, text: String) {
        self.last_error = text;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_fresh_and_requests_go_out_in_order_skipping_dropped_ones() {
        let mut o = Outbox::<&str>::default();
        let a = o.push("a", NEVER);
        let status = o.next_id();
        let b = o.push("b", NEVER);
        let c = o.push("c", NEVER);
        assert!(a < status && status < b && b < c);
        assert_eq!(o.take(b), Some("b"));
        assert_eq!(o.next_ready(), Some((a, &"a")));
        assert_eq!(o.next_ready(), Some((c, &"c")));
        assert_eq!(o.next_ready(), None);
        // Polled requests stay pending until their answer takes them.
        assert_eq!(o.take(a), Some("a"));
        assert_eq!(o.take(a), None);
    }

    #[test]
    fn expired_requests_come_back_once_and_answered_ones_never() {
        let mut o = Outbox::<u8>::default();
        let early = o.push(1, 10);
        let answered = o.push(2, 5);
        let late = o.push(3, 20);
        let forever = o.push(4, NEVER);
        assert_eq!(o.take(answered), Some(2));
        // The answered request no longer sets a deadline.
        assert_eq!(o.next_expiry(), Some(10));
        assert_eq!(o.pop_expired(9), None);
        assert_eq!(o.pop_expired(10), Some((early, 1)));
        assert_eq!(o.pop_expired(10), None);
        assert_eq!(o.pop_expired(u64::MAX - 1), Some((late, 3)));
        assert_eq!(o.pop_expired(u64::MAX - 1), None);
        assert_eq!(o.get(forever), Some(&4));
    }

    #[test]
    fn last_error_is_cut_on_a_character_boundary() {
        let mut o = Outbox::<()>::default();
        o.note_error("ab\u{e9}cd", 3);
        assert_eq!(o.last_error(), "ab");
        o.note_error("short", 512);
        assert_eq!(o.last_error(), "short");
    }
}
