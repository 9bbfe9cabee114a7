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
//! (`service::table`), so the simulator checks the core against the same
//! semantics the bindings' tests run on.
//!
//! It also keeps a history of every grant so the simulator can check what the
//! core reports against what the service actually decided, and it records
//! protocol violations by the client (a renew/release echoing backend data the
//! service never handed to that token). A renew/release whose backend data
//! differs from the token's live grant is reported separately
//! ([`LockService::take_echo_mismatch`]): whether that is the client's fault
//! depends on whether it could have known the live grant's data, which only
//! the simulator (which saw what was delivered) can judge.

use std::collections::{BTreeSet, HashMap};

use crate::service::table::{Acquired, LockTable};

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

/// What a release did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReleaseOutcome {
    /// The token held the name and no longer does.
    pub released: bool,
    /// Watchers to notify of the release.
    pub watchers: Vec<usize>,
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
    watchers: HashMap<String, BTreeSet<usize>>,
    history: HashMap<OwnerToken, GrantHistory>,
    fault: ServiceFault,
    retry_hints: bool,
    fence_stride: u64,
    violations: Vec<String>,
    echo_mismatch: Option<EchoMismatch>,
    grants: u64,
    grant_cap_ms: Option<u64>,
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
/// of a grant: `grant:<n>` for the service's `n`th grant.
fn mint(fault: ServiceFault, stride: u64, grants: &mut u64, last: u64) -> (u64, Vec<u8>) {
    let fence = match fault {
        ServiceFault::DecreasingFence if last > 2 => last - 2,
        _ => last + stride,
    };
    *grants += 1;
    let mut data = b"grant:".to_vec();
    data.extend_from_slice(&grants.to_le_bytes());
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
            watchers: HashMap::new(),
            history: HashMap::new(),
            fault,
            retry_hints,
            fence_stride: fence_stride.max(1),
            violations: Vec::new(),
            echo_mismatch: None,
            grants: 0,
            grant_cap_ms: None,
        }
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
        let ttl_ms = self.grant_cap_ms.map_or(ttl_ms, |c| ttl_ms.min(c));
        let ttl_ns = ttl_ms.saturating_mul(1_000_000);
        let ignore_holder = self.fault == ServiceFault::IgnoreHolder;
        let mut granted = None;
        let (fault, stride, grants) = (self.fault, self.fence_stride, &mut self.grants);
        let decided = self
            .table
            .acquire(now, name, &token, ttl_ns, ignore_holder, |last| {
                let (fence, data) = mint(fault, stride, grants, last);
                granted = Some(data.clone());
                (fence, token, data)
            });
        match decided {
            Acquired::Refreshed { fence } => {
                // Idempotent: the same owner asking again (a retry whose
                // first answer was lost) keeps its fencing token.
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
                AcquireReply::HeldByOther { retry_after_ms }
            }
            Acquired::Granted { fence } => {
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
        out
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
        let out = s.release(170 * MS, "n", A, None);
        assert_eq!((out.released, out.watchers), (false, vec![]));
        let out = s.release(170 * MS, "n", B, None);
        assert_eq!((out.released, out.watchers), (true, vec![3]));
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
