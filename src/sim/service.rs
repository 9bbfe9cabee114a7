//! The reference lock service the simulated clients talk to.
//!
//! It has the semantics every real backend must have (docs/design.md §6, the Redis
//! scripts): one holder per name, identified by the client's ownership token;
//! expiry after the granted TTL on the *service's* clock; a fencing token per
//! name that strictly increases across grants and is never forgotten; an
//! idempotent acquire (the same token asking again keeps its fencing token and
//! refreshes the TTL); renew and release that check ownership first; and a
//! release notification to every watcher of the name on an explicit release
//! (expiry publishes nothing, as with Redis key expiry).
//! The holder records are the shared [`LockTable`] of the memory service
//! (`backend::memory`), so the simulator checks the core against the same
//! semantics the bindings' tests run on.
//!
//! With direct grants enabled ([`LockService::set_direct_grants`], Redis protocol 3), a
//! refused acquire queues its token in a FIFO wait queue of the name (one entry per token,
//! which keeps its place when refused again but takes the newer attempt's tag and TTL), a
//! granted acquire removes the token's entry, and a successful release grants the lock at
//! once to the oldest entry whose client can be reached ([`DirectGrant`]), exactly as an
//! acquire would grant it (next fence, expiry at the service's now + the entry's TTL).
//! Entries of unreachable clients are dropped without a grant, as the real service skips a
//! lease whose channel has no subscriber; entries expire, and the queue of a name is capped.
//!
//! It also keeps a history of every grant so the simulator can check what the
//! core reports against what the service actually decided, and it records
//! protocol violations by the client (a renew/release echoing backend data the
//! service never handed to that token). A renew/release whose backend data
//! differs from the token's live grant is reported separately
//! ([`LockService::take_echo_mismatch`]): whether that is the client's fault
//! depends on whether it could have known the live grant's data, which only
//! the simulator (which saw what was delivered) can judge.

use std::collections::{BTreeSet, HashMap, VecDeque};

use crate::backend::memory::{Acquired, LockTable};

/// A client's ownership token, in the lowercase hex form a backend stores.
pub type OwnerToken = [u8; 32];

/// Deliberate service bugs, used only to prove that the oracles can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceFault {
    /// A correct service.
    None,
    /// Grants even while someone else holds the name (breaks I5).
    IgnoreHolder,
    /// Hands out fencing tokens that go down (breaks I4).
    DecreasingFence,
    /// A direct grant expires after half the TTL its notice announces (breaks I5).
    ShortDirectGrant,
}

/// What an acquire produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireReply {
    /// The token holds the name.
    Granted {
        /// Fencing token of this grant.
        fence: u64,
        /// TTL granted, in ms.
        ttl_ms: u64,
        /// Backend ownership bytes the client must echo on renew/release.
        backend_data: Vec<u8>,
    },
    /// Someone else holds it; `retry_after_ms` is their remaining TTL if the
    /// service is configured to tell.
    HeldByOther {
        /// Remaining TTL of the holder.
        retry_after_ms: Option<u64>,
    },
}

/// Holders and fences live in the shared [`LockTable`] (never reclaimed here, so a name's
/// fence is never forgotten); a grant keeps the backend data handed out with it.
type Table = LockTable<OwnerToken, Vec<u8>>;

/// One queued lease (Redis protocol 3: a `wake#token` entry and its grants field).
#[derive(Clone, Debug)]
struct Waiting {
    client: usize,
    token: OwnerToken,
    ttl_ms: u64,
    /// Request id of the latest refused attempt that (re)queued this entry.
    tag: u64,
    /// Service time after which the entry is dropped unserved.
    expires_at: u64,
}

/// How long a queue entry outlives the holder's remaining time, service ns (the Redis
/// scripts keep a queue key alive the holder's remaining time plus a minute; simulated
/// worlds live a few seconds).
pub(crate) const WAIT_KEEP_NS: u64 = 1_000_000_000;

/// Most entries one name's queue holds; a refusal beyond it is not queued.
pub(crate) const MAX_QUEUE: usize = 64;

/// Most entries one release pops looking for a reachable client (as the Redis script).
pub(crate) const MAX_POPS_PER_RELEASE: usize = 16;

/// A grant a release made directly to a queued lease; the caller publishes the notice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectGrant {
    /// Client that queued the entry (the notice's addressee).
    pub client: usize,
    /// Token granted.
    pub token: OwnerToken,
    /// Request id of the attempt that queued it last.
    pub tag: u64,
    /// Fencing token of the grant.
    pub fence: u64,
    /// TTL granted, ms (counted from the release at the service).
    pub ttl_ms: u64,
}

/// What a release did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReleaseOutcome {
    /// The token held the name and no longer does.
    pub released: bool,
    /// Watchers to notify of the release.
    pub watchers: Vec<usize>,
    /// The direct grant made to a queued lease, if any.
    pub grant: Option<DirectGrant>,
    /// Entries dropped because their client was unreachable (no grant made).
    pub unreachable: Vec<usize>,
}

/// Everything the service ever granted to one token (for the oracles).
#[derive(Clone, Debug, Default)]
pub struct GrantHistory {
    /// Name the token was used for.
    pub name: String,
    /// Fencing tokens granted to this token, in order.
    pub fences: Vec<u64>,
    /// Backend data handed out with the latest grant.
    pub backend_data: Vec<u8>,
}

/// The in-memory reference lock service. Times are readings of the service's
/// own clock in ns.
#[derive(Debug)]
pub struct LockService {
    table: Table,
    /// Refused attempts waiting for a direct grant per name, oldest first.
    queues: HashMap<String, VecDeque<Waiting>>,
    watchers: HashMap<String, BTreeSet<usize>>,
    history: HashMap<OwnerToken, GrantHistory>,
    fault: ServiceFault,
    retry_hints: bool,
    fence_stride: u64,
    violations: Vec<String>,
    echo_mismatch: Option<EchoMismatch>,
    grants: u64,
    grant_cap_ms: Option<u64>,
    direct_grants: bool,
}

/// A renew/release for a live grant carried other backend data than the grant's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EchoMismatch {
    /// "renew" or "release".
    pub what: &'static str,
    /// The token.
    pub token: OwnerToken,
    /// Data the command carried.
    pub sent: Vec<u8>,
    /// Data of the live grant.
    pub live: Vec<u8>,
}

/// Ceil-divides ns into whole ms.
fn ms_ceil(ns: u64) -> u64 {
    ns.div_ceil(1_000_000)
}

/// The next fence after `last` (or a lower one, under `DecreasingFence`) and the backend data
/// of a grant: `grant:<n>` for the service's `n`th grant, none for a direct grant (the notice
/// carries none, so an idempotent re-grant of it returns none either).
fn mint(
    fault: ServiceFault,
    stride: u64,
    grants: &mut u64,
    last: u64,
    with_data: bool,
) -> (u64, Vec<u8>) {
    let fence = match fault {
        ServiceFault::DecreasingFence if last > 2 => last - 2,
        _ => last + stride,
    };
    *grants += 1;
    let data = if with_data {
        let mut d = b"grant:".to_vec();
        d.extend_from_slice(&grants.to_le_bytes());
        d
    } else {
        Vec::new()
    };
    (fence, data)
}

impl LockService {
    /// A service. `retry_hints` decides whether held-by-other replies carry
    /// the holder's remaining TTL; `fence_stride` (≥ 1) is the gap between
    /// successive fencing tokens (real backends may skip, e.g. Redis uses
    /// server time in µs).
    pub fn new(fault: ServiceFault, retry_hints: bool, fence_stride: u64) -> Self {
        LockService {
            table: Table::new(),
            queues: HashMap::new(),
            watchers: HashMap::new(),
            history: HashMap::new(),
            fault,
            retry_hints,
            fence_stride: fence_stride.max(1),
            violations: Vec::new(),
            echo_mismatch: None,
            grants: 0,
            grant_cap_ms: None,
            direct_grants: false,
        }
    }

    /// Queues refused attempts and grants directly on release (Redis protocol 3).
    pub fn set_direct_grants(&mut self, on: bool) {
        self.direct_grants = on;
    }

    /// Grants at most `cap` ms whatever is asked (services may cap TTLs; the
    /// core must then count validity from the granted TTL).
    pub fn set_grant_cap(&mut self, cap: Option<u64>) {
        self.grant_cap_ms = cap;
    }

    /// Acquire `name` for `token` at service time `now` for `ttl_ms` (or the
    /// cap, if lower).
    pub fn acquire(
        &mut self,
        now: u64,
        name: &str,
        token: OwnerToken,
        ttl_ms: u64,
    ) -> AcquireReply {
        self.acquire_queued(now, name, token, ttl_ms, usize::MAX, 0)
    }

    /// [`LockService::acquire`] by `client`'s attempt `tag`: with direct grants on, a refusal
    /// queues the token (or refreshes its entry's tag and TTL in place) and a grant removes
    /// the token's entry.
    pub fn acquire_queued(
        &mut self,
        now: u64,
        name: &str,
        token: OwnerToken,
        ttl_ms: u64,
        client: usize,
        tag: u64,
    ) -> AcquireReply {
        let ttl_ms = self.grant_cap_ms.map_or(ttl_ms, |c| ttl_ms.min(c));
        let ttl_ns = ttl_ms.saturating_mul(1_000_000);
        let direct = self.direct_grants;
        let queue = self.queues.entry(name.to_owned()).or_default();
        if direct {
            queue.retain(|w| now < w.expires_at);
        }
        let ignore_holder = self.fault == ServiceFault::IgnoreHolder;
        let mut granted = None;
        let (fault, stride, grants) = (self.fault, self.fence_stride, &mut self.grants);
        let decided = self
            .table
            .acquire(now, name, &token, ttl_ns, ignore_holder, |last| {
                let (fence, data) = mint(fault, stride, grants, last, true);
                granted = Some(data.clone());
                (fence, token, data)
            });
        match decided {
            Acquired::Refreshed { fence } => {
                // Idempotent: the same owner asking again (a retry whose
                // first answer was lost) keeps its fencing token.
                queue.retain(|w| w.token != token);
                let backend_data = self
                    .table
                    .live(now, name)
                    .map(|g| g.data.clone())
                    .unwrap_or_default();
                AcquireReply::Granted {
                    fence,
                    ttl_ms,
                    backend_data,
                }
            }
            Acquired::HeldByOther { remaining_ns } => {
                let retry_after_ms = self.retry_hints.then(|| ms_ceil(remaining_ns));
                if direct {
                    let expires_at = now.saturating_add(remaining_ns + WAIT_KEEP_NS);
                    if let Some(w) = queue.iter_mut().find(|w| w.token == token) {
                        // A retry keeps its place; the grant answers the newer attempt.
                        w.tag = tag;
                        w.ttl_ms = ttl_ms;
                        w.client = client;
                        w.expires_at = expires_at;
                    } else if queue.len() < MAX_QUEUE {
                        queue.push_back(Waiting {
                            client,
                            token,
                            ttl_ms,
                            tag,
                            expires_at,
                        });
                    }
                }
                AcquireReply::HeldByOther { retry_after_ms }
            }
            Acquired::Granted { fence } => {
                queue.retain(|w| w.token != token);
                let backend_data = granted.unwrap_or_default();
                self.record(name, token, fence, &backend_data);
                AcquireReply::Granted {
                    fence,
                    ttl_ms,
                    backend_data,
                }
            }
        }
    }

    /// Records a grant in the history (and a token used for two names as a violation).
    fn record(&mut self, name: &str, token: OwnerToken, fence: u64, backend_data: &[u8]) {
        let hist = self.history.entry(token).or_default();
        if hist.name.is_empty() {
            hist.name = name.to_owned();
        } else if hist.name != name {
            self.violations.push(format!(
                "token {} used for two names: {:?} and {:?}",
                String::from_utf8_lossy(&token),
                hist.name,
                name
            ));
        }
        hist.fences.push(fence);
        hist.backend_data.clear();
        hist.backend_data.extend_from_slice(backend_data);
    }

    /// A renew or release must carry the backend data of the grant it acts on.
    /// Only checked while `token` is the live holder: otherwise the service
    /// refuses the command anyway, whatever data it carries.
    fn check_echo(
        &mut self,
        what: &'static str,
        now: u64,
        name: &str,
        token: &OwnerToken,
        sent: Option<&[u8]>,
    ) {
        let Some(sent) = sent else {
            return;
        };
        let live = self.table.live(now, name).filter(|h| h.token == *token);
        if let Some(h) = live {
            if sent != h.data.as_slice() {
                self.echo_mismatch = Some(EchoMismatch {
                    what,
                    token: *token,
                    sent: sent.to_vec(),
                    live: h.data.clone(),
                });
            }
        } else if !self.history.contains_key(token) {
            let msg = format!(
                "{what} for token {} carries backend data {:?} that was never granted",
                String::from_utf8_lossy(token),
                String::from_utf8_lossy(sent)
            );
            self.violations.push(msg);
        }
    }

    /// Extends the TTL if `token` holds `name` and has not expired.
    pub fn renew(
        &mut self,
        now: u64,
        name: &str,
        token: OwnerToken,
        ttl_ms: u64,
        backend_data: Option<&[u8]>,
    ) -> bool {
        self.check_echo("renew", now, name, &token, backend_data);
        self.table
            .renew(now, name, &token, ttl_ms.saturating_mul(1_000_000))
    }

    /// Deletes the lock if `token` holds it; returns whether it did and the
    /// watchers to notify.
    pub fn release(
        &mut self,
        now: u64,
        name: &str,
        token: OwnerToken,
        backend_data: Option<&[u8]>,
    ) -> (bool, Vec<usize>) {
        let out = self.release_granting(now, name, token, backend_data, |_| false);
        (out.released, out.watchers)
    }

    /// [`LockService::release`]; with direct grants on, a successful release then grants the
    /// lock to the oldest unexpired queue entry whose client is `reachable` (a PUBLISH that
    /// reaches a subscriber), dropping the entries before it (at most
    /// `MAX_POPS_PER_RELEASE` entries are popped).
    pub fn release_granting(
        &mut self,
        now: u64,
        name: &str,
        token: OwnerToken,
        backend_data: Option<&[u8]>,
        reachable: impl Fn(usize) -> bool,
    ) -> ReleaseOutcome {
        self.check_echo("release", now, name, &token, backend_data);
        let mut out = ReleaseOutcome::default();
        if !self.table.release(now, name, &token) {
            return out;
        }
        out.released = true;
        out.watchers = self
            .watchers
            .get(name)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        if !self.direct_grants {
            return out;
        }
        let Some(queue) = self.queues.get_mut(name) else {
            return out;
        };
        let mut next = None;
        for _ in 0..MAX_POPS_PER_RELEASE {
            let Some(w) = queue.pop_front() else {
                break;
            };
            if now >= w.expires_at {
                continue;
            }
            if reachable(w.client) {
                next = Some(w);
                break;
            }
            // The real service asks the channel first (PUBSUB NUMSUB) and grants nothing to a
            // lease nobody listens for: no fence, no grant to undo.
            out.unreachable.push(w.client);
        }
        if let Some(w) = next {
            let mut ttl_ns = w.ttl_ms.saturating_mul(1_000_000);
            if self.fault == ServiceFault::ShortDirectGrant {
                ttl_ns /= 2;
            }
            let (fault, stride, grants) = (self.fault, self.fence_stride, &mut self.grants);
            let fence = self.table.grant(now, name, ttl_ns, |last| {
                let (fence, data) = mint(fault, stride, grants, last, false);
                (fence, w.token, data)
            });
            self.record(name, w.token, fence, &[]);
            out.grant = Some(DirectGrant {
                client: w.client,
                token: w.token,
                tag: w.tag,
                fence,
                ttl_ms: w.ttl_ms,
            });
        }
        out
    }

    /// Removes `token`'s queue entry (a lease that stopped waiting); whether there was one.
    pub fn dequeue(&mut self, name: &str, token: &OwnerToken) -> bool {
        let Some(queue) = self.queues.get_mut(name) else {
            return false;
        };
        let before = queue.len();
        queue.retain(|w| w.token != *token);
        queue.len() != before
    }

    /// Entries queued for `name` (unexpired or not yet pruned).
    pub fn queued(&self, name: &str) -> usize {
        self.queues.get(name).map_or(0, VecDeque::len)
    }

    /// Subscribes `client` to release notifications of `name`.
    pub fn watch(&mut self, client: usize, name: &str) {
        self.watchers
            .entry(name.to_owned())
            .or_default()
            .insert(client);
    }

    /// Unsubscribes `client` from `name`.
    pub fn unwatch(&mut self, client: usize, name: &str) {
        if let Some(s) = self.watchers.get_mut(name) {
            s.remove(&client);
        }
    }

    /// The unexpired holder of `name` at service time `now`: (token, fence).
    pub fn holder(&self, now: u64, name: &str) -> Option<(OwnerToken, u64)> {
        self.table.live(now, name).map(|h| (h.token, h.fence))
    }

    /// Everything granted to `token`.
    pub fn history(&self, token: &OwnerToken) -> Option<&GrantHistory> {
        self.history.get(token)
    }

    /// The mismatch found by the last renew/release, if any.
    pub fn take_echo_mismatch(&mut self) -> Option<EchoMismatch> {
        self.echo_mismatch.take()
    }

    /// Protocol violations by clients observed so far.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// Number of fresh grants (not counting idempotent re-grants).
    pub fn grants(&self) -> u64 {
        self.grants
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: OwnerToken = [b'a'; 32];
    const B: OwnerToken = [b'b'; 32];
    const MS: u64 = 1_000_000;

    #[test]
    fn exclusive_idempotent_expiring_and_fenced() {
        let mut s = LockService::new(ServiceFault::None, true, 1);
        let AcquireReply::Granted {
            fence: f1,
            backend_data,
            ..
        } = s.acquire(0, "n", A, 100)
        else {
            panic!("first acquire must be granted")
        };
        assert_eq!(
            s.acquire(10 * MS, "n", B, 100),
            AcquireReply::HeldByOther {
                retry_after_ms: Some(90)
            }
        );
        // idempotent: same token, same fence, TTL refreshed from now
        let again = s.acquire(50 * MS, "n", A, 100);
        assert!(matches!(again, AcquireReply::Granted { fence, .. } if fence == f1));
        assert!(s.holder(149 * MS, "n").is_some());
        assert!(s.holder(150 * MS, "n").is_none());
        assert!(s.renew(60 * MS, "n", A, 100, Some(&backend_data)));
        assert!(!s.renew(60 * MS, "n", B, 100, None));
        let AcquireReply::Granted { fence: f2, .. } = s.acquire(161 * MS, "n", B, 100) else {
            panic!("expired lock must be granted to the next owner")
        };
        assert!(f2 > f1);
        assert!(
            !s.renew(170 * MS, "n", A, 100, None),
            "old owner cannot renew"
        );
        s.watch(3, "n");
        assert_eq!(s.release(170 * MS, "n", A, None), (false, vec![]));
        assert_eq!(s.release(170 * MS, "n", B, None), (true, vec![3]));
        assert!(s.violations().is_empty());
        s.renew(170 * MS, "n", B, 1, Some(b"forged"));
        assert_eq!(
            s.violations().len(),
            0,
            "B no longer holds: nothing to check"
        );
        s.acquire(200 * MS, "n", A, 100);
        assert!(s.take_echo_mismatch().is_none());
        s.renew(210 * MS, "n", A, 100, Some(b"forged"));
        let m = s.take_echo_mismatch().expect("wrong data for a live grant");
        assert_eq!(m.sent, b"forged");
        assert!(s.violations().is_empty());
        s.release(220 * MS, "n", [b'c'; 32], Some(b"invented"));
        assert_eq!(s.violations().len(), 1, "data never granted to that token");
    }

    #[test]
    fn direct_grant_serves_the_oldest_reachable_entry() {
        const C: OwnerToken = [b'c'; 32];
        const D: OwnerToken = [b'd'; 32];
        let mut s = LockService::new(ServiceFault::None, true, 1);
        s.set_direct_grants(true);
        let granted = |r: AcquireReply| matches!(r, AcquireReply::Granted { .. });
        assert!(granted(s.acquire_queued(0, "n", A, 100, 0, 1)));
        assert!(!granted(s.acquire_queued(MS, "n", B, 100, 1, 10)));
        assert!(!granted(s.acquire_queued(2 * MS, "n", C, 50, 2, 20)));
        assert!(!granted(s.acquire_queued(3 * MS, "n", D, 100, 3, 30)));
        // B asks again: it keeps its place, the entry takes the newer tag and TTL.
        assert!(!granted(s.acquire_queued(4 * MS, "n", B, 80, 1, 11)));
        assert_eq!(s.queued("n"), 3);
        // A release by someone else grants nothing.
        let out = s.release_granting(5 * MS, "n", C, None, |_| true);
        assert_eq!(out, ReleaseOutcome::default());
        // B's client is unreachable: its entry is dropped; C (the next) gets the lock.
        let out = s.release_granting(6 * MS, "n", A, None, |c| c != 1);
        assert!(out.released);
        assert_eq!(out.unreachable, vec![1]);
        let g = out.grant.expect("a direct grant");
        assert_eq!((g.client, g.token, g.tag, g.ttl_ms), (2, C, 20, 50));
        assert_eq!(s.holder(6 * MS, "n"), Some((C, g.fence)));
        assert_eq!(g.fence, 2, "the skipped lease spent no fence");
        assert!(s.history(&C).is_some_and(|h| h.fences == vec![g.fence]));
        // Expiry counts from the grant; an ACQUIRE by the granted token is idempotent.
        assert!(s.holder(56 * MS, "n").is_none());
        let again = s.acquire_queued(10 * MS, "n", C, 50, 2, 21);
        assert_eq!(
            again,
            AcquireReply::Granted {
                fence: g.fence,
                ttl_ms: 50,
                backend_data: Vec::new()
            }
        );
        // D stops waiting; the next release grants to nobody.
        assert!(s.dequeue("n", &D));
        assert_eq!(s.queued("n"), 0);
        let out = s.release_granting(11 * MS, "n", C, None, |_| true);
        assert!(out.released && out.grant.is_none());
        // A granted acquire removes its token's entry; entries expire unserved.
        assert!(granted(s.acquire_queued(12 * MS, "n", A, 100, 0, 2)));
        assert!(!granted(s.acquire_queued(13 * MS, "n", B, 100, 1, 12)));
        assert!(granted(s.acquire_queued(200 * MS, "n", B, 100, 1, 13)));
        assert_eq!(s.queued("n"), 0);
        assert!(!granted(s.acquire_queued(201 * MS, "n", D, 100, 3, 31)));
        let late = 201 * MS + 100 * MS + WAIT_KEEP_NS;
        assert!(granted(s.acquire_queued(late, "n", B, 100, 1, 14)));
        let out = s.release_granting(late + 1, "n", B, None, |_| true);
        assert!(out.released && out.grant.is_none(), "{out:?}");
        assert!(s.violations().is_empty());
    }

    #[test]
    fn without_direct_grants_nothing_is_queued() {
        let mut s = LockService::new(ServiceFault::None, true, 1);
        s.acquire_queued(0, "n", A, 100, 0, 1);
        s.acquire_queued(MS, "n", B, 100, 1, 2);
        assert_eq!(s.queued("n"), 0);
        let out = s.release_granting(2 * MS, "n", A, None, |_| true);
        assert!(out.released && out.grant.is_none());
    }

    #[test]
    fn faults_break_what_they_say() {
        let mut s = LockService::new(ServiceFault::IgnoreHolder, false, 1);
        s.acquire(0, "n", A, 100);
        assert!(matches!(
            s.acquire(1, "n", B, 100),
            AcquireReply::Granted { .. }
        ));
        let mut s = LockService::new(ServiceFault::DecreasingFence, false, 1);
        let mut last = 0;
        let mut went_down = false;
        for i in 0..6u8 {
            let tok = [b'0' + i; 32];
            if let AcquireReply::Granted { fence, .. } =
                s.acquire(u64::from(i) * 200 * MS, "n", tok, 100)
            {
                went_down |= fence < last;
                last = fence;
            }
        }
        assert!(went_down);
    }
}
