//! What each engine command becomes: the script call (EVALSHA, with its keys and arguments)
//! a host runs verbatim on the commands connection, or nothing at all when a queued lease's
//! retry can be answered here (`queue.rs`).

use super::scripts::{KeyKind, Script, key_arg, key_args, keys_of, shard_channel_arg};
use super::{Arg, Connection, MS, Op, RedisProtocol};
use crate::{AcquireResult, Client, Command};

impl RedisProtocol {
    pub(super) fn on_command(&mut self, core: &mut Client, cmd: Command) {
        let now = core.now();
        match cmd {
            Command::Acquire {
                request,
                lease,
                name,
                token,
                ttl_ms,
            } => {
                // A lease's first attempt cannot have queued it: its grant leaves the queue
                // alone (the uncontended path); any later one may have.
                let retry = self.leases.contains_key(&lease);
                let epoch = self.enter(lease, &name, token);
                if let Some(q) = self.leases.get(&lease).and_then(|w| w.quiet) {
                    if self.live(&name) && q.epoch == epoch && q.until > now.saturating_add(MS) {
                        self.counters.local_refusals += 1;
                        let left = (q.until - now) / MS;
                        let _ = core.handle_acquire_result(
                            now,
                            request,
                            AcquireResult::HeldByOther {
                                retry_after_ms: Some(left),
                            },
                        );
                        return;
                    }
                }
                let Ok([lock, fence, queue]) = key_args(name.as_str()) else {
                    return;
                };
                let hex = token.to_hex();
                let mut args = vec![
                    Arg::Static(b"EVALSHA"),
                    Arg::Static(&self.shas[0]),
                    Arg::Static(b"3"),
                    lock,
                    fence,
                    queue,
                    Arg::copy(&hex),
                    Arg::decimal(ttl_ms),
                    Arg::concat(&[&self.wake, b"#", &hex]),
                    Arg::decimal(self.opts.key_keep_ms),
                    Arg::copy(name.as_bytes()),
                    Arg::Static(if retry { b"1" } else { b"0" }),
                ];
                if self.opts.sharded_wake {
                    match self.shards.get(&name) {
                        Some(s) => args.push(Arg::copy(&s.channel)),
                        None => args.extend(shard_channel_arg(&name).ok()),
                    }
                }
                let wakes = self.leases.get(&lease).map_or(0, |w| w.wakes);
                let covered = self.live(&name);
                let op = Op::Acquire {
                    req: request,
                    lease,
                    name,
                    token,
                    covered,
                    epoch,
                    wakes,
                };
                let expires = self.expiry_of(&op, now).max(
                    now.saturating_add(ttl_ms.saturating_mul(MS))
                        .saturating_add(core.config().request_timeout_ns),
                );
                self.push(
                    op,
                    Connection::Commands,
                    Some(Script::Acquire),
                    args,
                    now,
                    expires,
                );
            }
            Command::Renew {
                request,
                name,
                token,
                ttl_ms,
                ..
            } => {
                let Ok(lock) = key_arg(KeyKind::Lock, &name) else {
                    return;
                };
                let args = vec![
                    Arg::Static(b"EVALSHA"),
                    Arg::Static(&self.shas[1]),
                    Arg::Static(b"1"),
                    lock,
                    Arg::copy(&token.to_hex()),
                    Arg::decimal(ttl_ms),
                ];
                let op = Op::Renew { req: request };
                let expires =
                    now.saturating_add(core.config().request_timeout_ns.saturating_mul(2));
                self.push(
                    op,
                    Connection::Commands,
                    Some(Script::Renew),
                    args,
                    now,
                    expires,
                );
            }
            Command::Release {
                request,
                name,
                token,
                ..
            } => {
                let Ok([lock, queue]) = keys_of(name.as_str(), [KeyKind::Lock, KeyKind::Queue])
                else {
                    return;
                };
                let mut args = vec![
                    Arg::Static(b"EVALSHA"),
                    Arg::Static(&self.shas[2]),
                    Arg::Static(b"2"),
                    lock,
                    queue,
                    Arg::copy(&token.to_hex()),
                    Arg::copy(name.as_bytes()),
                    Arg::decimal(self.opts.queue_max_age_ms),
                ];
                if self.opts.sharded_wake {
                    args.extend(shard_channel_arg(&name).ok());
                }
                let op = Op::Release { req: request };
                let expires =
                    now.saturating_add(core.config().request_timeout_ns.saturating_mul(2));
                self.push(
                    op,
                    Connection::Commands,
                    Some(Script::Release),
                    args,
                    now,
                    expires,
                );
            }
            // Sharded wake: the name's channel is subscribed while it has local waiters.
            Command::Watch { name } if self.opts.sharded_wake => self.watch_name(name, now),
            Command::Unwatch { name } if self.opts.sharded_wake => self.unwatch_name(&name, now),
            // Otherwise wake-ups come through this object's queue entries and wake channel,
            // not through a subscription per name.
            Command::Watch { .. } | Command::Unwatch { .. } => {}
        }
    }
}
