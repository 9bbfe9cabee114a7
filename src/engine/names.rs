//! Per-name bookkeeping shared by the leases of one name in one core: the reentrant lease a
//! reentrant acquire joins (design rule 8), and the waiters' shared watch and wake queue
//! (rule 7: one watch per name, one release wakes one waiter). An entry exists only while
//! something needs it.

use std::collections::VecDeque;

use crate::engine::client::Client;
use crate::engine::phase::Watch;
use crate::types::{Command, Output};

#[derive(Debug, Default)]
pub(crate) struct NameEntry {
    /// The live reentrant lease of this name, if any.
    pub(crate) reentrant: Option<u32>,
    /// Waiting leases counted in the name's one watch.
    pub(crate) watchers: u32,
    /// Waiting leases to wake, one per release notification.
    pub(crate) queue: VecDeque<u32>,
    /// A notification came while no waiter was queued: the next refusal retries at once.
    pub(crate) pending_wake: bool,
}

impl Client {
    fn watch_of(&mut self, slot: u32) -> Watch {
        let l = self.table.lease_mut(slot);
        l.phase.tries_mut().map_or(Watch::No, |t| t.watch)
    }

    fn set_watch(&mut self, slot: u32, watch: Watch) {
        if let Some(t) = self.table.lease_mut(slot).phase.tries_mut() {
            t.watch = watch;
        }
    }

    pub(super) fn unregister_reentrant(&mut self, slot: u32) {
        let l = self.table.lease_mut(slot);
        if !l.reentrant {
            return;
        }
        let name = l.name.clone();
        if let Some(e) = self.names.get_mut(&*name) {
            if e.reentrant == Some(slot) {
                e.reentrant = None;
            }
        }
        self.gc_name(&name);
    }

    /// Joins the name's watch (the first watcher sends `Watch`).
    pub(super) fn enter_waiting(&mut self, slot: u32) {
        if self.watch_of(slot) != Watch::No {
            return;
        }
        self.set_watch(slot, Watch::Watching);
        let name = self.table.lease_mut(slot).name.clone();
        let e = self.names.entry(name.clone()).or_default();
        e.watchers += 1;
        if e.watchers == 1 {
            self.outputs
                .push_back(Output::Command(Command::Watch { name }));
        }
    }

    /// Joins the name's wake queue (a watcher only).
    pub(super) fn enqueue(&mut self, slot: u32) {
        if self.watch_of(slot) != Watch::Watching {
            return;
        }
        self.set_watch(slot, Watch::Queued);
        let name = self.table.lease_mut(slot).name.clone();
        self.names.entry(name).or_default().queue.push_back(slot);
    }

    /// The lease was taken from its name's wake queue.
    pub(super) fn left_queue(&mut self, slot: u32) {
        if self.watch_of(slot) == Watch::Queued {
            self.set_watch(slot, Watch::Watching);
        }
    }

    /// Leaves the name's wake queue, if in it (still watching).
    pub(super) fn leave_queue(&mut self, slot: u32) {
        if self.watch_of(slot) != Watch::Queued {
            return;
        }
        self.set_watch(slot, Watch::Watching);
        let name = self.table.lease_mut(slot).name.clone();
        if let Some(e) = self.names.get_mut(&*name) {
            e.queue.retain(|&s| s != slot);
        }
    }

    /// Leaves the name's queue and watch (the last watcher sends `Unwatch`).
    pub(super) fn leave_waiting(&mut self, slot: u32) {
        self.leave_queue(slot);
        if self.watch_of(slot) != Watch::Watching {
            return;
        }
        self.set_watch(slot, Watch::No);
        let name = self.table.lease_mut(slot).name.clone();
        if let Some(e) = self.names.get_mut(&*name) {
            e.watchers -= 1;
            if e.watchers == 0 {
                e.pending_wake = false;
                self.outputs
                    .push_back(Output::Command(Command::Unwatch { name: name.clone() }));
            }
        }
        self.gc_name(&name);
    }

    fn gc_name(&mut self, name: &str) {
        let empty = self
            .names
            .get(name)
            .is_some_and(|e| e.reentrant.is_none() && e.watchers == 0 && e.queue.is_empty());
        if empty {
            self.names.remove(name);
        }
    }
}
