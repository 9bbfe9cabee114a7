//! A lease's part in its name's bookkeeping (`engine::names`): its place in the shared watch
//! and wake queue, kept in its acquiring phase (`Watch`), and its reentrant registration.

use super::Client;
use crate::engine::phase::Watch;
use crate::types::{Command, Output};

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
        if l.reentrant {
            let name = l.name.clone();
            self.names.clear_reentrant(&name, slot);
        }
    }

    /// Joins the name's watch (the first watcher sends `Watch`).
    pub(super) fn enter_waiting(&mut self, slot: u32) {
        if self.watch_of(slot) != Watch::No {
            return;
        }
        self.set_watch(slot, Watch::Watching);
        let name = self.table.lease_mut(slot).name.clone();
        if self.names.add_watcher(&name) {
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
        self.names.enqueue(&name, slot);
    }

    /// The lease was taken from its name's wake queue (`Names::wake_one`).
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
        self.names.dequeue(&name, slot);
    }

    /// Leaves the name's queue and watch (the last watcher sends `Unwatch`).
    pub(super) fn leave_waiting(&mut self, slot: u32) {
        self.leave_queue(slot);
        if self.watch_of(slot) != Watch::Watching {
            return;
        }
        self.set_watch(slot, Watch::No);
        let name = self.table.lease_mut(slot).name.clone();
        if self.names.remove_watcher(&name) {
            self.outputs
                .push_back(Output::Command(Command::Unwatch { name }));
        }
    }
}
