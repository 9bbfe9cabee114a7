//! Per-name bookkeeping shared by the leases of one name in one core: the reentrant lease a
//! reentrant acquire joins (design rule 8), and the waiters' shared watch and wake queue
//! (rule 7: one watch per name, one release wakes one waiter). An entry exists only while
//! something needs it.

use std::collections::{HashMap, VecDeque};

use crate::engine::hash::KeyedState;
use crate::types::LockName;

#[derive(Debug, Default)]
struct NameEntry {
    /// The live reentrant lease of this name, if any.
    reentrant: Option<u32>,
    /// Waiting leases counted in the name's one watch.
    watchers: u32,
    /// Waiting leases to wake, one per release notification.
    queue: VecDeque<u32>,
    /// A notification came while no waiter was queued: the next refusal retries at once.
    pending_wake: bool,
}

/// The names this core's leases use, by lease slot.
#[derive(Debug)]
pub(crate) struct Names {
    map: HashMap<LockName, NameEntry, KeyedState>,
}

impl Names {
    pub(crate) fn new(hasher: KeyedState) -> Self {
        Self {
            map: HashMap::with_hasher(hasher),
        }
    }

    /// The live reentrant lease of `name`, if any.
    pub(crate) fn reentrant(&self, name: &str) -> Option<u32> {
        self.map.get(name).and_then(|e| e.reentrant)
    }

    pub(crate) fn set_reentrant(&mut self, name: LockName, slot: u32) {
        self.map.entry(name).or_default().reentrant = Some(slot);
    }

    /// The reentrant lease `slot` of `name` ended.
    pub(crate) fn clear_reentrant(&mut self, name: &str, slot: u32) {
        if let Some(e) = self.map.get_mut(name) {
            if e.reentrant == Some(slot) {
                e.reentrant = None;
            }
        }
        self.gc(name);
    }

    /// Counts one more watcher of `name`; true for the first (a `Watch` is due).
    pub(crate) fn add_watcher(&mut self, name: &LockName) -> bool {
        let e = self.map.entry(name.clone()).or_default();
        e.watchers += 1;
        e.watchers == 1
    }

    /// Counts one watcher less; true for the last (an `Unwatch` is due).
    pub(crate) fn remove_watcher(&mut self, name: &str) -> bool {
        let mut last = false;
        if let Some(e) = self.map.get_mut(name) {
            e.watchers -= 1;
            if e.watchers == 0 {
                e.pending_wake = false;
                last = true;
            }
        }
        self.gc(name);
        last
    }

    pub(crate) fn enqueue(&mut self, name: &LockName, slot: u32) {
        self.map
            .entry(name.clone())
            .or_default()
            .queue
            .push_back(slot);
    }

    pub(crate) fn dequeue(&mut self, name: &str, slot: u32) {
        if let Some(e) = self.map.get_mut(name) {
            e.queue.retain(|&s| s != slot);
        }
    }

    /// Takes a wake-up that came while nobody was queued.
    pub(crate) fn take_pending_wake(&mut self, name: &str) -> bool {
        self.map
            .get_mut(name)
            .is_some_and(|e| std::mem::take(&mut e.pending_wake))
    }

    /// A release of `name` was seen: the queued waiter to wake, if any; with none queued but
    /// some watching, the next refusal retries at once.
    pub(crate) fn wake_one(&mut self, name: &str) -> Option<u32> {
        let e = self.map.get_mut(name)?;
        let first = e.queue.pop_front();
        if first.is_none() && e.watchers > 0 {
            e.pending_wake = true;
        }
        first
    }

    fn gc(&mut self, name: &str) {
        let empty = self
            .map
            .get(name)
            .is_some_and(|e| e.reentrant.is_none() && e.watchers == 0 && e.queue.is_empty());
        if empty {
            self.map.remove(name);
        }
    }
}
