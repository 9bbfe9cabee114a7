//! What each engine command becomes: the script call (EVALSHA, with its keys and arguments)
//! a host runs verbatim on the commands connection, or nothing at all when a queued lease's
//! retry can be answered here (`queue.rs`).

use std::borrow::Cow;

use super::scripts::{KeyKind, Script, key, shard_channel};
use super::{Connection, MS, Op, RedisProtocol};
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
                let Ok(keys) = name_keys(&name) else { return };
                let hex = token.to_hex();
                let mut entry = Vec::with_capacity(self.wake.len() + 1 + hex.len());
                entry.extend_from_slice(&self.wake);
                entry.push(b'#');
                entry.extend_from_slice(&hex);
                let [lock, fence, queue] = keys;
                let mut args = vec![
                    Cow::Borrowed(&b"EVALSHA"[..]),
                    Cow::Borrowed(&self.shas[0][..]),
                    Cow::Borrowed(&b"3"[..]),
                    Cow::Owned(lock),
                    Cow::Owned(fence),
                    Cow::Owned(queue),
                    Cow::Owned(hex.to_vec()),
                    Cow::Owned(decimal(ttl_ms)),
                    Cow::Owned(entry),
                    Cow::Owned(decimal(self.opts.key_keep_ms)),
                    Cow::Owned(name.as_bytes().to_vec()),
                    Cow::Borrowed(if retry { &b"1"[..] } else { &b"0"[..] }),
                ];
                if self.opts.sharded_wake {
                    match self.shards.get(&name) {
                        Some(s) => args.push(Cow::Owned(s.channel.clone())),
                        None => args.extend(shard_channel(&name).ok().map(Cow::Owned)),
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
                let Ok(lock) = key(KeyKind::Lock, &name) else {
                    return;
                };
                let args = vec![
                    Cow::Borrowed(&b"EVALSHA"[..]),
                    Cow::Borrowed(&self.shas[1][..]),
                    Cow::Borrowed(&b"1"[..]),
                    Cow::Owned(lock),
                    Cow::Owned(token.to_hex().to_vec()),
                    Cow::Owned(decimal(ttl_ms)),
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
                let (Ok(lock), Ok(queue)) = (key(KeyKind::Lock, &name), key(KeyKind::Queue, &name))
                else {
                    return;
                };
                let mut args = vec![
                    Cow::Borrowed(&b"EVALSHA"[..]),
                    Cow::Borrowed(&self.shas[2][..]),
                    Cow::Borrowed(&b"2"[..]),
                    Cow::Owned(lock),
                    Cow::Owned(queue),
                    Cow::Owned(token.to_hex().to_vec()),
                    Cow::Owned(name.as_bytes().to_vec()),
                    Cow::Owned(decimal(self.opts.queue_max_age_ms)),
                ];
                if self.opts.sharded_wake {
                    args.extend(shard_channel(&name).ok().map(Cow::Owned));
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

fn name_keys(name: &str) -> Result<[Vec<u8>; 3], crate::Error> {
    Ok([
        key(KeyKind::Lock, name)?,
        key(KeyKind::Fence, name)?,
        key(KeyKind::Queue, name)?,
    ])
}

/// `n` in decimal, as a script argument (no formatter on the hot path).
fn decimal(mut n: u64) -> Vec<u8> {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    digits[i..].to_vec()
}

#[cfg(test)]
#[test]
fn decimal_writes_what_to_string_writes() {
    for n in [0, 7, 10, 30_000, 60_000, 1_700_000_000_000_001, u64::MAX] {
        assert_eq!(decimal(n), n.to_string().into_bytes());
    }
}
