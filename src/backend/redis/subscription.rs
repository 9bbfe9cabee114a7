//! The subscription that carries wake-ups to this client.
//!
//! The first request is `SUBSCRIBE wake` on the subscriber connection. Until the host
//! confirms it ([`RedisProtocol::handle_subscription`], or the confirmation as the reply), a
//! wake-up may be lost, so no retry is answered locally. When the subscription takes effect —
//! first or again after the host reports it lost — every name with local waiters is checked
//! once (one real ACQUIRE), because a release in the gap reached nobody. A SUBSCRIBE that
//! fails is sent again after a backoff (50 ms doubling to 2 s).
//!
//! # Sharded wake (Redis Cluster)
//!
//! With [`super::RedisOptions::sharded_wake`] there is no client channel: a name's notices go
//! to its shard channel `lh:{NAME}:wake` (SPUBLISH, in the slot of the name's keys), which
//! this object SSUBSCRIBEs while the engine watches the name (its first waiter to its last)
//! and re-checks once the subscription takes effect. Every waiting client hears every notice;
//! only one naming a lease of this object acts, so a release still wakes one lease.

use super::scripts::{self, shard_channel, shard_channel_name};
use super::{Arg, Connection, MS, NEVER, Op, RedisProtocol, Value, describe};
use crate::{Client, LockName};

/// A name whose shard channel this client wants (sharded wake): it has leases waiting on it.
#[derive(Debug)]
pub(super) struct Shard {
    pub(super) channel: Vec<u8>,
    /// The SSUBSCRIBE took effect and was not lost since.
    pub(super) live: bool,
    /// The SSUBSCRIBE in flight, if any.
    pub(super) subscribing: Option<u64>,
}

/// The wake channel named by `random`: `lh:wake:` and its hex digits.
pub(super) fn wake_channel(random: &[u8; scripts::WAKE_RANDOM_LEN]) -> Vec<u8> {
    let mut ch = scripts::WAKE_CHANNEL_PREFIX.as_bytes().to_vec();
    let start = ch.len();
    ch.resize(start + 2 * random.len(), 0);
    crate::types::write_lower_hex(random, &mut ch[start..]);
    ch
}

impl RedisProtocol {
    /// Switches to a new wake channel (after `fork()`, so parent and child never share one):
    /// unsubscribes the old one, subscribes the new one, and re-checks on confirmation.
    pub fn set_wake_random(&mut self, now: u64, wake_random: [u8; scripts::WAKE_RANDOM_LEN]) {
        let old = std::mem::replace(&mut self.wake, wake_channel(&wake_random));
        if self.opts.sharded_wake {
            // The wake id only names queue entries here; the channels are per name.
            self.bump_all();
            return;
        }
        self.push(
            Op::Leave,
            Connection::Subscriber,
            None,
            vec![Arg::Static(b"UNSUBSCRIBE"), Arg::from(old)],
            now,
            now.saturating_add(60_000 * MS),
        );
        self.subscribed = false;
        self.bump_all();
        self.send_subscribe(now);
    }

    /// The wake channel this object subscribes.
    pub fn wake_channel(&self) -> &[u8] {
        &self.wake
    }

    /// Whether the subscription is in effect (sharded wake: every wanted name's).
    pub fn is_subscribed(&self) -> bool {
        if self.opts.sharded_wake {
            self.shards.values().all(|s| s.live)
        } else {
            self.subscribed
        }
    }

    /// The names whose shard channel is wanted (sharded wake), with whether it is live.
    pub fn watched_names(&self) -> impl Iterator<Item = (&str, bool)> {
        self.shards.iter().map(|(n, s)| (&**n, s.live))
    }

    /// Whether a release of `name` would reach this client now.
    pub(super) fn live(&self, name: &str) -> bool {
        if self.opts.sharded_wake {
            self.shards.get(name).is_some_and(|s| s.live)
        } else {
            self.subscribed
        }
    }

    /// A subscription confirmation (`subscribed`) or its loss / an unsubscribe confirmation
    /// (`!subscribed`) for `channel`. Taking effect re-checks every waiting name; a loss
    /// re-subscribes (the host runs the SUBSCRIBE once its connection is back).
    pub fn handle_subscription(
        &mut self,
        core: &mut Client,
        now: u64,
        channel: &[u8],
        subscribed: bool,
    ) {
        core.handle_timeout(now);
        let now = core.now();
        if self.opts.sharded_wake {
            self.shard_subscription(core, now, channel, subscribed);
        } else if channel != self.wake.as_slice() {
            self.counters.ignored_messages += 1;
        } else if subscribed {
            if let Some(id) = self.subscribe_id() {
                self.out.take(id);
            }
            self.subscribe_pending = false;
            self.on_subscribed(core);
        } else if self.subscribed {
            // A live subscription was lost: subscribe again at once (a second SUBSCRIBE is
            // harmless, a missing one is not).
            self.counters.subscriber_losses += 1;
            self.subscribed = false;
            self.bump_all();
            self.resubscribe_at = NEVER;
            self.send_subscribe(now);
        } else {
            // Lost before it took effect (a SUBSCRIBE sent on a connection that then dropped):
            // the connection keeps failing, so back off, or a host that reports the loss from
            // inside the failed send loops as fast as it can (a master down in a failover).
            if let Some(id) = self.subscribe_id() {
                self.out.take(id);
            }
            self.subscribe_failed(now);
        }
        self.pump(core);
    }

    /// The reply to SUBSCRIBE: its confirmation, or anything else (a failure: back off).
    pub(super) fn on_subscribe_reply(&mut self, core: &mut Client, now: u64, reply: &Value<'_>) {
        let confirmed = matches!(reply, Value::Array(items)
            if items.len() == 3
                && matches!(&items[0], Value::Bulk(k) | Value::Status(k) if k.eq_ignore_ascii_case(b"subscribe"))
                && matches!(&items[1], Value::Bulk(c) if *c == self.wake.as_slice()));
        if confirmed {
            self.subscribe_pending = false;
            self.on_subscribed(core);
        } else {
            self.note_error("unexpected reply to SUBSCRIBE", describe(reply).as_bytes());
            self.counters.garbage_replies += 1;
            self.subscribe_failed(now);
        }
    }

    /// The reply to a name's SSUBSCRIBE (sharded wake).
    pub(super) fn on_shard_subscribe_reply(
        &mut self,
        core: &mut Client,
        now: u64,
        id: u64,
        name: &LockName,
        reply: &Value<'_>,
    ) {
        let confirmed = matches!(reply, Value::Array(items)
            if items.len() == 3
                && matches!(&items[0], Value::Bulk(k) | Value::Status(k) if k.eq_ignore_ascii_case(b"ssubscribe"))
                && matches!(&items[1], Value::Bulk(c) if shard_channel_name(c) == Some(&**name)));
        if confirmed {
            self.on_shard_subscribed(core, name, Some(id));
        } else {
            self.note_error("unexpected reply to SSUBSCRIBE", describe(reply).as_bytes());
            self.counters.garbage_replies += 1;
            self.shard_failed(name, id, now);
        }
    }

    /// Sends the (S)SUBSCRIBEs whose backoff is over.
    pub(super) fn resubscribe_if_due(&mut self, now: u64) {
        if self.resubscribe_at <= now {
            self.resubscribe_at = NEVER;
            if self.opts.sharded_wake {
                let due: Vec<LockName> = self
                    .shards
                    .iter()
                    .filter(|(_, s)| !s.live && s.subscribing.is_none())
                    .map(|(n, _)| n.clone())
                    .collect();
                for name in due {
                    self.send_shard_subscribe(&name, now);
                }
            } else {
                self.send_subscribe(now);
            }
        }
    }

    /// The engine watches `name` (its first local waiter): with sharded wake, its channel is
    /// subscribed while it has local waiters.
    pub(super) fn watch_name(&mut self, name: LockName, now: u64) {
        if !self.shards.contains_key(&name) {
            let Ok(channel) = shard_channel(&name) else {
                return;
            };
            self.shards.insert(
                name.clone(),
                Shard {
                    channel,
                    live: false,
                    subscribing: None,
                },
            );
            self.send_shard_subscribe(&name, now);
        }
    }

    /// The engine stops watching `name` (its last local waiter is gone): SUNSUBSCRIBE.
    pub(super) fn unwatch_name(&mut self, name: &LockName, now: u64) {
        if let Some(s) = self.shards.remove(name) {
            if let Some(id) = s.subscribing {
                self.out.take(id);
            }
            self.push(
                Op::Leave,
                Connection::Subscriber,
                None,
                vec![Arg::Static(b"SUNSUBSCRIBE"), Arg::from(s.channel)],
                now,
                now.saturating_add(60_000 * MS),
            );
        }
    }

    fn on_subscribed(&mut self, core: &mut Client) {
        if self.subscribed {
            self.counters.ignored_messages += 1;
            return;
        }
        self.subscribed = true;
        self.sub_failures = 0;
        self.resubscribe_at = NEVER;
        self.counters.subscriptions += 1;
        // A release while we were not listening reached nobody: check every waiting name.
        let names: Vec<LockName> = self.names.keys().cloned().collect();
        for name in names {
            self.wake_name(core, &name);
        }
    }

    /// A name's SSUBSCRIBE took effect (sharded wake): a release just before reached nobody
    /// here, so the name is checked once.
    pub(super) fn on_shard_subscribed(&mut self, core: &mut Client, name: &str, id: Option<u64>) {
        let Some(s) = self.shards.get_mut(name) else {
            self.counters.ignored_messages += 1;
            return;
        };
        if id.is_some() && s.subscribing != id {
            // The confirmation of an SSUBSCRIBE this name no longer waits for.
            self.counters.ignored_messages += 1;
            return;
        }
        if let Some(old) = s.subscribing.take() {
            self.out.take(old);
        }
        if s.live {
            self.counters.ignored_messages += 1;
            return;
        }
        s.live = true;
        self.sub_failures = 0;
        self.counters.subscriptions += 1;
        self.wake_name(core, name);
    }

    /// A shard channel's confirmation or loss (sharded wake). Channels of names nobody waits
    /// for here (an SSUBSCRIBE overtaken by the name's SUNSUBSCRIBE, foreign channels) are
    /// ignored; a lost one is subscribed again.
    pub(super) fn shard_subscription(
        &mut self,
        core: &mut Client,
        now: u64,
        channel: &[u8],
        on: bool,
    ) {
        let Some(name) = shard_channel_name(channel)
            .filter(|n| self.shards.contains_key(*n))
            .map(LockName::from)
        else {
            self.counters.ignored_messages += 1;
            return;
        };
        if on {
            self.on_shard_subscribed(core, &name, None);
            return;
        }
        // Lost (the node failed, the slot moved) or never confirmed: subscribe again. Until
        // then a release may reach nobody, so no refusal of the name is trusted. (An
        // unsubscribe confirmation comes this way too, so "never confirmed" cannot be told
        // from a SUNSUBSCRIBE answered while a new SSUBSCRIBE is on its way: no backoff here.)
        if let Some(s) = self.shards.get_mut(&name) {
            if s.live {
                self.counters.subscriber_losses += 1;
            }
            s.live = false;
        }
        self.bump(&name);
        self.send_shard_subscribe(&name, now);
    }

    pub(super) fn shard_failed(&mut self, name: &str, id: u64, now: u64) {
        let Some(s) = self.shards.get_mut(name) else {
            return;
        };
        if s.subscribing == Some(id) {
            s.subscribing = None;
        }
        s.live = false;
        self.bump(name);
        self.sub_failures = self.sub_failures.saturating_add(1);
        let backoff = (50 * MS)
            .saturating_mul(1 << self.sub_failures.min(5))
            .min(2_000 * MS);
        self.resubscribe_at = self.resubscribe_at.min(now.saturating_add(backoff));
    }

    pub(super) fn send_shard_subscribe(&mut self, name: &LockName, now: u64) {
        let Some(channel) = self.shards.get(name).map(|s| s.channel.clone()) else {
            return;
        };
        if let Some(old) = self.shards.get_mut(name).and_then(|s| s.subscribing.take()) {
            self.out.take(old);
        }
        let id = self.push(
            Op::ShardSubscribe { name: name.clone() },
            Connection::Subscriber,
            None,
            vec![Arg::Static(b"SSUBSCRIBE"), Arg::from(channel)],
            now,
            NEVER,
        );
        if let Some(s) = self.shards.get_mut(name) {
            s.subscribing = Some(id);
        }
    }

    pub(super) fn subscribe_failed(&mut self, now: u64) {
        self.subscribed = false;
        self.subscribe_pending = false;
        self.bump_all();
        self.sub_failures = self.sub_failures.saturating_add(1);
        let backoff = (50 * MS)
            .saturating_mul(1 << self.sub_failures.min(5))
            .min(2_000 * MS);
        self.resubscribe_at = now.saturating_add(backoff);
    }

    pub(super) fn subscribe_id(&self) -> Option<u64> {
        self.out
            .pending()
            .find(|(_, p)| matches!(p.op, Op::Subscribe))
            .map(|(id, _)| id)
    }

    pub(super) fn send_subscribe(&mut self, now: u64) {
        if let Some(id) = self.subscribe_id() {
            self.out.take(id);
        }
        self.subscribe_pending = true;
        let args = vec![Arg::Static(b"SUBSCRIBE"), Arg::copy(&self.wake)];
        self.push(
            Op::Subscribe,
            Connection::Subscriber,
            None,
            args,
            now,
            NEVER,
        );
    }
}
