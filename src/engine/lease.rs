//! One lease's record: what it is (name, token, TTL), where it is in its lifecycle (`Phase`),
//! and the ownership data of the grant a renewal or release must target.

use std::sync::Arc;

use crate::engine::phase::Phase;
use crate::types::{LockName, Token};

/// Superseded acquire attempts remembered per lease (to release a late grant of a dead lease).
const MAX_SUPERSEDED: usize = 16;

/// A lease record. With its name inline it fits its table slot beside the timer bookkeeping.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) name: LockName,
    pub(crate) token: Token,
    /// Backend data and superseded attempts, which most leases never have.
    pub(crate) cold: Option<Box<Cold>>,
    /// The TTL renewals ask for: the one requested, then the one granted.
    pub(crate) ttl_ms: u64,
    /// End of validity; meaningful once granted (`Phase::granted`).
    pub(crate) valid_until: u64,
    pub(crate) phase: Phase,
    /// Reentrant holders; 0 once the lease ended.
    pub(crate) holders: u32,
    /// Joinable by a reentrant acquire of its name (`AcquireOptions::reentrant`).
    pub(crate) reentrant: bool,
    /// Renewed on a cadence (`AcquireOptions::auto_renew`); else only when asked.
    pub(crate) auto_renew: bool,
}

/// The rarely used part of a lease, boxed so the record stays within its slot.
#[derive(Debug, Default)]
pub(crate) struct Cold {
    /// Opaque ownership data from the grant (an etcd lease id, say), echoed in renew/release.
    backend_data: Option<Arc<[u8]>>,
    /// Fencing token of the grant `backend_data` came from.
    backend_fence: u64,
    /// Acquire attempts that timed out while still possibly in flight.
    superseded: Vec<u64>,
}

impl Lease {
    pub(crate) fn backend_data(&self) -> Option<Arc<[u8]>> {
        self.cold.as_ref().and_then(|c| c.backend_data.clone())
    }

    pub(crate) fn set_backend_data(&mut self, data: Option<Arc<[u8]>>, fence: u64) {
        if data.is_some() || self.cold.is_some() {
            let c = self.cold.get_or_insert_with(Default::default);
            c.backend_data = data;
            c.backend_fence = fence;
        }
    }

    /// Takes the ownership data of a grant we may have to release, unless it cannot be the
    /// grant the service holds now. A grant with a lower fence than the live grant, or than
    /// data already taken, is already gone at the service: replies can arrive out of order.
    /// A newer grant replaces older data even when it carries none, since a release echoing
    /// the older grant's data would miss the newer grant.
    pub(crate) fn adopt_backend_data(&mut self, data: &[u8], fence: u64, live_fence: u64) {
        let older_than_live = self.phase.granted() && fence < live_fence;
        let held = self
            .cold
            .as_ref()
            .map(|c| (c.backend_data.is_some(), c.backend_fence));
        let older_than_held = held.is_some_and(|(_, f)| fence < f);
        if older_than_live || older_than_held {
            return;
        }
        if !data.is_empty() {
            self.set_backend_data(Some(Arc::from(data)), fence);
        } else if held.is_some_and(|(has, f)| has && fence > f) {
            self.set_backend_data(None, fence);
        }
    }

    /// Remembers a timed-out acquire attempt that the service may still apply, so a late
    /// grant is recognised (and released if the lease has ended by then).
    pub(crate) fn supersede(&mut self, req: u64) {
        let list = &mut self.cold.get_or_insert_with(Default::default).superseded;
        list.push(req);
        if list.len() > MAX_SUPERSEDED {
            list.remove(0);
        }
    }

    /// Whether `req` is one of the superseded attempts.
    pub(crate) fn is_superseded(&self, req: u64) -> bool {
        self.cold
            .as_ref()
            .is_some_and(|c| c.superseded.contains(&req))
    }

    /// A superseded attempt was answered: it no longer needs waiting for.
    pub(crate) fn forget_superseded(&mut self, req: u64) {
        if let Some(c) = self.cold.as_mut() {
            c.superseded.retain(|&r| r != req);
        }
    }

    pub(crate) fn superseded_pending(&self) -> bool {
        self.cold.as_ref().is_some_and(|c| !c.superseded.is_empty())
    }
}
