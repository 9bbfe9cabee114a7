//! The lock table: the semantics every lock service must have, as plain record keeping.
//!
//! [`LockTable`] is shared by the reference service ([`super::memory`]) and the simulator's
//! service (`sim::service`), so the simulator checks the core against the same rules the
//! bindings' tests run on: one holder per name, identified by its ownership token; expiry
//! after the granted TTL on the *service's* clock; an idempotent acquire (the same token
//! asking again keeps its fencing token and gets its TTL refreshed); renew and release that
//! check ownership first; fencing tokens that strictly increase per name, even across names
//! reclaimed to bound memory (their fences raise a floor).

use std::borrow::Borrow;
use std::collections::HashMap;

/// One live or expired grant of a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant<T, D> {
    /// Ownership token of the holder.
    pub token: T,
    /// Fencing token of this grant.
    pub fence: u64,
    /// Service time (ns) at which the grant expires unless renewed.
    pub expires_at: u64,
    /// Service time (ns) of the grant (an idempotent re-acquire keeps it).
    pub granted_at: u64,
    /// What the owner of the table keeps per grant (backend data, who acquired it).
    pub data: D,
}

#[derive(Clone, Debug)]
struct Row<T, D> {
    holder: Option<Grant<T, D>>,
    /// Highest fencing token issued for this name while the row lived.
    last_fence: u64,
}

/// What [`LockTable::acquire`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// A new grant under a new fencing token.
    Granted {
        /// Its fencing token.
        fence: u64,
    },
    /// The token already held the name: same fencing token, TTL counted again from now.
    Refreshed {
        /// The grant's fencing token.
        fence: u64,
    },
    /// Another token holds the name.
    HeldByOther {
        /// The holder's remaining time, ns.
        remaining_ns: u64,
    },
}

/// Lock records by name, times in service ns. `T` is the ownership token type, `D` what the
/// caller keeps per grant. Deterministic: no clock, no randomness, no iteration-order effects.
#[derive(Clone, Debug)]
pub struct LockTable<T, D> {
    rows: HashMap<String, Row<T, D>>,
    /// Highest fence of any reclaimed row: new rows start above it.
    fence_floor: u64,
}

impl<T, D> Default for LockTable<T, D> {
    fn default() -> Self {
        LockTable {
            rows: HashMap::new(),
            fence_floor: 0,
        }
    }
}

impl<T, D> LockTable<T, D> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The unexpired grant of `name` at `now`.
    pub fn live(&self, now: u64, name: &str) -> Option<&Grant<T, D>> {
        self.rows
            .get(name)
            .and_then(|r| r.holder.as_ref())
            .filter(|g| now < g.expires_at)
    }

    /// The unexpired grant of `name` at `now`, mutably.
    pub fn live_mut(&mut self, now: u64, name: &str) -> Option<&mut Grant<T, D>> {
        self.rows
            .get_mut(name)
            .and_then(|r| r.holder.as_mut())
            .filter(|g| now < g.expires_at)
    }

    /// Acquire `name` for `token` for `ttl_ns`: refreshed if `token` holds it, refused while
    /// another token does (unless `ignore_holder`, a deliberate bug for oracle tests), else
    /// granted by [`LockTable::grant`] with `make`.
    pub fn acquire<Q>(
        &mut self,
        now: u64,
        name: &str,
        token: &Q,
        ttl_ns: u64,
        ignore_holder: bool,
        make: impl FnOnce(u64) -> (u64, T, D),
    ) -> Acquired
    where
        T: Borrow<Q>,
        Q: PartialEq + ?Sized,
    {
        if let Some(g) = self.live_mut(now, name) {
            if g.token.borrow() == token {
                // Idempotent: a retry whose first answer was lost keeps its fencing token.
                g.expires_at = now.saturating_add(ttl_ns);
                return Acquired::Refreshed { fence: g.fence };
            }
            if !ignore_holder {
                return Acquired::HeldByOther {
                    remaining_ns: g.expires_at - now,
                };
            }
        }
        Acquired::Granted {
            fence: self.grant(now, name, ttl_ns, make),
        }
    }

    /// Makes a new holder of `name` whatever holds it now. `make` gets the name's last fence
    /// and returns (fence, token, data); the name's last fence becomes the larger of the two.
    pub fn grant(
        &mut self,
        now: u64,
        name: &str,
        ttl_ns: u64,
        make: impl FnOnce(u64) -> (u64, T, D),
    ) -> u64 {
        let floor = self.fence_floor;
        let row = match self.rows.get_mut(name) {
            Some(r) => r,
            None => self.rows.entry(name.to_owned()).or_insert(Row {
                holder: None,
                last_fence: floor,
            }),
        };
        let (fence, token, data) = make(row.last_fence);
        row.last_fence = row.last_fence.max(fence);
        row.holder = Some(Grant {
            token,
            fence,
            expires_at: now.saturating_add(ttl_ns),
            granted_at: now,
            data,
        });
        fence
    }

    /// Extends the grant to `now + ttl_ns` if `token` holds `name` unexpired.
    pub fn renew<Q>(&mut self, now: u64, name: &str, token: &Q, ttl_ns: u64) -> bool
    where
        T: Borrow<Q>,
        Q: PartialEq + ?Sized,
    {
        match self.live_mut(now, name) {
            Some(g) if g.token.borrow() == token => {
                g.expires_at = now.saturating_add(ttl_ns);
                true
            }
            _ => false,
        }
    }

    /// Deletes the grant if `token` holds `name` unexpired; the fence is kept.
    pub fn release<Q>(&mut self, now: u64, name: &str, token: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: PartialEq + ?Sized,
    {
        let owned = self
            .live(now, name)
            .is_some_and(|g| g.token.borrow() == token);
        if owned {
            if let Some(r) = self.rows.get_mut(name) {
                r.holder = None;
            }
        }
        owned
    }

    /// Drops the grant of `name` whoever holds it (a failover that lost the key); the fence
    /// is kept. Whether there was one, live or not.
    pub fn forget(&mut self, name: &str) -> bool {
        self.rows
            .get_mut(name)
            .and_then(|r| r.holder.take())
            .is_some()
    }

    /// Highest fence issued for `name` while its record lived (`None`: never, or reclaimed).
    pub fn last_fence(&self, name: &str) -> Option<u64> {
        self.rows.get(name).map(|r| r.last_fence)
    }

    /// Whether `name` has a record (live, expired or free).
    pub fn contains(&self, name: &str) -> bool {
        self.rows.contains_key(name)
    }

    /// Names with a record.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when no name has a record.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Removes every record without an unexpired holder at `now`, raising the fence floor to
    /// their fences; returns how many went and the earliest expiry among those kept.
    pub fn reclaim(&mut self, now: u64) -> (usize, Option<u64>) {
        let before = self.rows.len();
        let mut floor = self.fence_floor;
        let mut earliest: Option<u64> = None;
        self.rows.retain(|_, r| match &r.holder {
            Some(g) if now < g.expires_at => {
                earliest = Some(earliest.map_or(g.expires_at, |e| e.min(g.expires_at)));
                true
            }
            _ => {
                floor = floor.max(r.last_fence);
                false
            }
        });
        self.fence_floor = floor;
        (before - self.rows.len(), earliest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn make(token: u8) -> impl FnOnce(u64) -> (u64, u8, ()) {
        move |last| (last + 1, token, ())
    }

    #[test]
    fn table_grants_refreshes_refuses_and_expires() {
        let mut t = LockTable::<u8, ()>::new();
        assert_eq!(
            t.acquire(0, "n", &1, 100 * MS, false, make(1)),
            Acquired::Granted { fence: 1 }
        );
        assert_eq!(
            t.acquire(10 * MS, "n", &2, 100 * MS, false, make(2)),
            Acquired::HeldByOther {
                remaining_ns: 90 * MS
            }
        );
        assert_eq!(
            t.acquire(50 * MS, "n", &1, 100 * MS, false, make(1)),
            Acquired::Refreshed { fence: 1 }
        );
        assert!(t.live(149 * MS, "n").is_some());
        assert!(t.live(150 * MS, "n").is_none());
        assert!(
            !t.renew(150 * MS, "n", &1, MS),
            "expired grants are not renewed"
        );
        assert_eq!(
            t.acquire(150 * MS, "n", &2, 100 * MS, false, make(2)),
            Acquired::Granted { fence: 2 }
        );
        assert!(!t.release(160 * MS, "n", &1));
        assert!(t.release(160 * MS, "n", &2));
        assert_eq!(t.last_fence("n"), Some(2));
    }

    #[test]
    fn reclaimed_names_still_get_higher_fences() {
        let mut t = LockTable::<u8, ()>::new();
        for f in 1..=3 {
            t.acquire(0, "a", &f, MS, false, make(f));
            t.release(0, "a", &f);
        }
        t.acquire(0, "b", &9, 10 * MS, false, make(9));
        assert_eq!(t.reclaim(5 * MS), (1, Some(10 * MS)));
        assert_eq!(t.last_fence("a"), None);
        assert_eq!(
            t.acquire(5 * MS, "a", &4, MS, false, make(4)),
            Acquired::Granted { fence: 4 }
        );
    }
}
