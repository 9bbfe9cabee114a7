//! Requests that fail before their answer: sent ones may have taken effect (a transport
//! error: an acquire then owes a cleanup release), unsent ones certainly did not
//! (`NotApplied`: nothing owed, so a client whose server is down closes at once).

use super::cluster::ASKING_ID;
use super::{RedisStream, State};
use crate::Client;
use std::collections::VecDeque;

impl RedisStream {
    /// Fails request `id` (a cluster forgets its argument vector). `sent`: its bytes may have
    /// reached a server.
    pub(super) fn fail_request(
        &mut self,
        core: &mut Client,
        now: u64,
        id: u64,
        why: &str,
        sent: bool,
    ) {
        if id == ASKING_ID {
            return;
        }
        if let Some(c) = &mut self.cluster {
            c.done(id);
        }
        if sent {
            self.proto.handle_request_failed_because(core, now, id, why);
        } else {
            self.proto.handle_request_not_sent(core, now, id, why);
        }
    }

    /// Acquires waiting for a connection that are not worth sending at `now` (a caller that
    /// gave up, a closing client, a request timeout over: `Client::acquire_send_deadline`)
    /// are dropped, answered at the core's current time, before `now` is fed: never sent,
    /// they are not taken for attempts that may have been granted, they owe no cleanup, and
    /// a server that is down does not hold them, and `close`, until the connect deadline.
    /// Whether it dropped any.
    pub(super) fn drop_abandoned(&mut self, core: &mut Client, now: u64) -> bool {
        let at = core.now();
        let mut dropped = false;
        for i in 0..self.links.len() {
            let link = &self.links[i];
            if link.waiting.is_empty() || link.sends() {
                continue;
            }
            let proto = &self.proto;
            let (gone, kept): (VecDeque<_>, _) = std::mem::take(&mut self.links[i].waiting)
                .into_iter()
                .partition(|(id, _)| proto.send_deadline(core, *id).is_some_and(|d| now >= d));
            self.links[i].waiting = kept;
            if gone.is_empty() {
                continue;
            }
            // The most telling reason: what the sentinels said, else the last close.
            let why = match (&self.links[i].state, &self.sentinel) {
                (State::Resolving { .. }, Some(d)) => d.unresolved(),
                _ if !self.last_close.is_empty() => self.last_close.clone(),
                _ => "no connection opened while the acquire waited".to_owned(),
            };
            for (id, _) in gone {
                self.fail_request(core, at, id, &why, false);
            }
            dropped = true;
        }
        dropped
    }

    /// An open that failed (the host's report, its deadline passed, or no master was named
    /// in time): the requests that waited for it fail, and the next open waits for the
    /// backoff.
    pub(super) fn open_failed(
        &mut self,
        core: &mut Client,
        now: u64,
        i: usize,
        why: &str,
        shutdown: bool,
    ) {
        let waiting: Vec<u64> = self.links[i].waiting.drain(..).map(|(id, _)| id).collect();
        for id in waiting {
            self.fail_request(core, now, id, why, false);
        }
        let had_stream = self.links[i].stream != 0;
        self.down(core, now, i, why, shutdown);
        if had_stream {
            self.master_lost(now);
        }
    }
}
