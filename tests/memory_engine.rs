//! The lease engine against the memory service, both through the C ABI only: a small host
//! loop in Rust (what every binding's memory helper does) runs each client's commands on
//! its own connection of one `lh_memory_service` and feeds the results, release
//! notifications and deadlines back. Acquire, contention and handoff, renewal, loss after
//! a partition, a lost answer retried with the same token, and a not-owner release.
#![allow(unsafe_code)]
// The fault switches and the panic hook are test hooks: exported with the `testing` feature only.
#![cfg(feature = "testing")]

use std::mem::MaybeUninit;
use std::ptr::null_mut;

use leasehold::ffi::*;

const MS: u64 = 1_000_000;
const NAME: &str = "orders";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ev {
    kind: u32,
    reason: u32,
    lease: u64,
    fence: u64,
    at: u64,
}

struct Host {
    c: *mut lh_client,
    conn: u64,
    events: Vec<Ev>,
}

struct World {
    svc: *mut lh_memory_service,
    hosts: Vec<Host>,
    now: u64,
}

impl Drop for World {
    fn drop(&mut self) {
        // SAFETY: handles from their constructors, not used after this.
        unsafe {
            for h in &self.hosts {
                lh_client_free(h.c);
            }
            lh_memory_service_free(self.svc);
        }
    }
}

fn ok(code: u32) {
    assert_eq!(code, LH_OK, "{}", name_of(code));
}

fn name_of(code: u32) -> String {
    // SAFETY: static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(lh_status_str(code)) }
        .to_string_lossy()
        .into_owned()
}

fn copy(ptr: *const u8, len: usize) -> Vec<u8> {
    if len == 0 {
        return Vec::new();
    }
    // SAFETY: the library keeps ptr/len valid until the next call on the handle.
    unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()
}

fn fresh_result() -> lh_memory_result {
    // SAFETY: plain integers; zeroed is valid.
    let mut r: lh_memory_result = unsafe { std::mem::zeroed() };
    r.struct_size = size_of::<lh_memory_result>() as u32;
    r
}

impl World {
    fn new(clients: u8) -> Self {
        let mut mc = MaybeUninit::<lh_memory_config>::uninit();
        let mut svc = null_mut();
        let mut hosts = Vec::new();
        // SAFETY: valid out-pointers; defaults fill every field.
        unsafe {
            lh_memory_config_default(mc.as_mut_ptr());
            ok(lh_memory_service_new(mc.as_ptr(), &mut svc));
            for i in 0..clients {
                let mut cfg = MaybeUninit::<lh_config>::uninit();
                lh_config_default(cfg.as_mut_ptr());
                let seed = [i + 1; 32];
                let mut c = null_mut();
                ok(lh_client_new(cfg.as_ptr(), seed.as_ptr(), 32, &mut c));
                let mut conn = 0;
                ok(lh_memory_service_connect(svc, &mut conn));
                hosts.push(Host {
                    c,
                    conn,
                    events: Vec::new(),
                });
            }
        }
        World { svc, hosts, now: 0 }
    }

    fn acquire(&mut self, host: usize, ttl_ms: u64, wait_ns: u64) -> u64 {
        let mut o = MaybeUninit::<lh_acquire_options>::uninit();
        let mut lease = 0;
        // SAFETY: valid pointers; defaults fill every field.
        unsafe {
            lh_acquire_options_default(o.as_mut_ptr());
            let mut o = o.assume_init();
            o.ttl_ms = ttl_ms;
            o.wait_ns = wait_ns;
            let c = self.hosts[host].c;
            ok(lh_acquire(
                c,
                self.now,
                NAME.as_ptr(),
                NAME.len(),
                &o,
                &mut lease,
            ));
        }
        self.pump();
        lease
    }

    fn set_faults(&mut self, host: usize, flags: u32, drop_next: u32) {
        let f = lh_memory_faults {
            struct_size: size_of::<lh_memory_faults>() as u32,
            flags,
            drop_next_responses: drop_next,
            _reserved: 0,
        };
        // SAFETY: live handle, valid pointer.
        ok(unsafe { lh_memory_service_set_faults(self.svc, self.hosts[host].conn, &f) });
    }

    /// Runs every host's commands on the service and feeds the answers and notifications
    /// back, until nothing is left to do.
    fn pump(&mut self) {
        let (svc, now) = (self.svc, self.now);
        for _ in 0..1000 {
            let mut busy = false;
            for h in &mut self.hosts {
                while let Some(o) = poll(h.c) {
                    busy = true;
                    // SAFETY: live handles; name/token copied; out-pointers valid.
                    unsafe { run(svc, now, h, &o) };
                }
                let (mut p, mut n) = (std::ptr::null(), 0usize);
                loop {
                    // SAFETY: live handle; valid out-pointers.
                    ok(unsafe { lh_memory_service_poll_released(svc, h.conn, &mut p, &mut n) });
                    if p.is_null() {
                        break;
                    }
                    busy = true;
                    let name = copy(p, n);
                    // SAFETY: live handle; the name is a copy.
                    ok(unsafe { lh_released(h.c, now, name.as_ptr(), name.len()) });
                }
            }
            if !busy {
                return;
            }
        }
        panic!("the host loop does not settle");
    }

    /// Lets time pass to `to`, feeding every deadline on the way.
    fn advance(&mut self, to: u64) {
        for _ in 0..100_000 {
            let next = self
                .hosts
                .iter()
                .map(|h| {
                    let mut d = 0;
                    // SAFETY: live handle, valid pointer.
                    ok(unsafe { lh_poll_timeout(h.c, &mut d) });
                    d
                })
                .min()
                .unwrap_or(LH_NO_DEADLINE);
            if next > to {
                break;
            }
            self.now = self.now.max(next);
            for h in &self.hosts {
                // SAFETY: live handle.
                ok(unsafe { lh_timeout(h.c, self.now) });
            }
            self.pump();
        }
        self.now = to;
        for h in &self.hosts {
            // SAFETY: live handle.
            ok(unsafe { lh_timeout(h.c, self.now) });
        }
        self.pump();
    }

    fn event(&self, host: usize, kind: u32) -> Option<Ev> {
        self.hosts[host]
            .events
            .iter()
            .copied()
            .find(|e| e.kind == kind)
    }

    fn is_held(&self, host: usize, lease: u64) -> bool {
        let mut b = false;
        // SAFETY: live handle, valid pointer.
        ok(unsafe { lh_is_held(self.hosts[host].c, lease, self.now, &mut b) });
        b
    }

    fn status(&self) -> lh_memory_status {
        // SAFETY: plain data; zeroed is valid.
        let mut st: lh_memory_status = unsafe { std::mem::zeroed() };
        st.struct_size = size_of::<lh_memory_status>() as u32;
        // SAFETY: live handle, valid pointers.
        ok(unsafe {
            lh_memory_service_status(self.svc, self.now, NAME.as_ptr(), NAME.len(), &mut st)
        });
        st
    }
}

struct Out {
    raw: lh_output,
    name: Vec<u8>,
    token: Vec<u8>,
}

fn poll(c: *mut lh_client) -> Option<Out> {
    let mut o = MaybeUninit::<lh_output>::uninit();
    // SAFETY: live handle; written on LH_OK.
    ok(unsafe { lh_poll_output(c, o.as_mut_ptr()) });
    // SAFETY: LH_OK wrote it.
    let raw = unsafe { o.assume_init() };
    (raw.kind != LH_OUTPUT_NONE).then(|| Out {
        name: copy(raw.name, raw.name_len),
        token: copy(raw.token, raw.token_len),
        raw,
    })
}

/// Executes one output of a host against the service (what a binding's memory helper does).
///
/// # Safety
/// `svc` and `h.c` are live handles.
unsafe fn run(svc: *mut lh_memory_service, now: u64, h: &mut Host, o: &Out) {
    let (c, conn, req) = (h.c, h.conn, o.raw.request_id);
    let (name, token) = (&o.name, &o.token);
    let mut r = fresh_result();
    // SAFETY: per the caller's contract; slices valid for each call.
    unsafe {
        match o.raw.kind {
            LH_OUTPUT_ACQUIRE => {
                ok(lh_memory_service_acquire(
                    svc,
                    conn,
                    now,
                    name.as_ptr(),
                    name.len(),
                    token.as_ptr(),
                    token.len(),
                    o.raw.ttl_ms,
                    &mut r,
                ));
                ok(lh_acquire_result(
                    c,
                    now,
                    req,
                    r.engine_outcome,
                    r.fencing_token,
                    r.ttl_ms,
                    r.retry_after_ms,
                    std::ptr::null(),
                    0,
                ));
            }
            LH_OUTPUT_RENEW => {
                ok(lh_memory_service_renew(
                    svc,
                    conn,
                    now,
                    name.as_ptr(),
                    name.len(),
                    token.as_ptr(),
                    token.len(),
                    o.raw.ttl_ms,
                    &mut r,
                ));
                ok(lh_renew_result(c, now, req, r.engine_outcome));
            }
            LH_OUTPUT_RELEASE => {
                ok(lh_memory_service_release(
                    svc,
                    conn,
                    now,
                    name.as_ptr(),
                    name.len(),
                    token.as_ptr(),
                    token.len(),
                    &mut r,
                ));
                ok(lh_release_result(c, now, req, r.engine_outcome));
            }
            LH_OUTPUT_WATCH => ok(lh_memory_service_watch(
                svc,
                conn,
                name.as_ptr(),
                name.len(),
            )),
            LH_OUTPUT_UNWATCH => ok(lh_memory_service_unwatch(
                svc,
                conn,
                name.as_ptr(),
                name.len(),
            )),
            kind => h.events.push(Ev {
                kind,
                reason: o.raw.reason,
                lease: o.raw.lease_id,
                fence: o.raw.fencing_token,
                at: now,
            }),
        }
    }
}

#[test]
fn acquire_contend_and_hand_off_on_the_release_notification() {
    let mut w = World::new(2);
    let a = w.acquire(0, 3_000, 0);
    assert_eq!(
        w.event(0, LH_OUTPUT_ACQUIRED).map(|e| (e.lease, e.fence)),
        Some((a, 1))
    );
    w.now = 10 * MS;
    let b = w.acquire(1, 3_000, 10_000 * MS);
    assert!(w.event(1, LH_OUTPUT_ACQUIRED).is_none(), "A holds it");
    w.advance(100 * MS);
    assert!(w.event(1, LH_OUTPUT_ACQUIRED).is_none());
    // SAFETY: live handle.
    ok(unsafe { lh_release(w.hosts[0].c, w.now, a) });
    w.pump();
    // B is woken by the notification, not by its backoff or A's TTL running out.
    let got = w
        .event(1, LH_OUTPUT_ACQUIRED)
        .expect("B acquires after A's release");
    assert_eq!((got.lease, got.fence, got.at), (b, 2, 100 * MS));
    let st = w.status();
    assert_eq!(
        (st.held, st.fencing_token, st.holder_connection),
        (1, 2, w.hosts[1].conn)
    );
}

#[test]
fn renewals_keep_the_lease_past_its_ttl() {
    let mut w = World::new(1);
    let a = w.acquire(0, 300, 0);
    w.advance(3_000 * MS);
    assert!(w.is_held(0, a), "renewed ten times over");
    assert!(w.event(0, LH_OUTPUT_LOST).is_none());
    let st = w.status();
    assert_eq!((st.held, st.fencing_token), (1, 1));
    assert!(st.expires_at_ns > 3_000 * MS);
}

#[test]
fn a_partitioned_holder_loses_the_lease_before_another_gets_it() {
    let mut w = World::new(2);
    let a = w.acquire(0, 300, 0);
    w.set_faults(0, LH_MEMORY_PARTITIONED, 0);
    let b = w.acquire(1, 300, 5_000 * MS);
    w.advance(2_000 * MS);
    let lost = w.event(0, LH_OUTPUT_LOST).expect("A notices the loss");
    assert_eq!(lost.lease, a);
    assert!(
        lost.reason == LH_REASON_FAIL_BUDGET || lost.reason == LH_REASON_EXPIRED,
        "reason {}",
        lost.reason
    );
    let got = w
        .event(1, LH_OUTPUT_ACQUIRED)
        .expect("B takes over after A's grant expired");
    assert_eq!((got.lease, got.fence), (b, 2));
    assert!(
        lost.at <= got.at,
        "A stopped believing before B was granted"
    );
    let mut state = 0;
    // SAFETY: live handle, valid pointer.
    let code = unsafe { lh_lease_state(w.hosts[0].c, a, &mut state) };
    assert!(
        code == LH_ERR_LEASE_ENDED || (code == LH_OK && state == LH_STATE_LOST),
        "{} {state}",
        name_of(code)
    );
}

#[test]
fn a_lost_answer_is_retried_with_the_same_token_and_gets_the_same_grant() {
    let mut w = World::new(1);
    w.set_faults(0, 0, 1);
    let a = w.acquire(0, 3_000, 1_000 * MS);
    assert!(
        w.event(0, LH_OUTPUT_ACQUIRED).is_none(),
        "the first answer was lost"
    );
    w.advance(1_000 * MS);
    let got = w
        .event(0, LH_OUTPUT_ACQUIRED)
        .expect("the retry finds its own grant");
    assert_eq!((got.lease, got.fence), (a, 1));
    // SAFETY: plain integers; zeroed is valid.
    let mut k: lh_memory_stats = unsafe { std::mem::zeroed() };
    k.struct_size = size_of::<lh_memory_stats>() as u32;
    // SAFETY: live handle, valid pointer.
    ok(unsafe { lh_memory_service_stats_get(w.svc, &mut k) });
    assert_eq!(k.grants, 1, "one grant, refreshed by the retry");
}

#[test]
fn releasing_after_the_service_moved_on_is_not_owner() {
    let mut w = World::new(2);
    let a = w.acquire(0, 3_000, 0);
    // The service's clock jumps past A's TTL: B gets the lock while A still believes.
    // SAFETY: live handle.
    ok(unsafe { lh_memory_service_step_clock(w.svc, 5_000 * MS as i64) });
    w.now = 10 * MS;
    let b = w.acquire(1, 3_000, 0);
    assert_eq!(
        w.event(1, LH_OUTPUT_ACQUIRED).map(|e| (e.lease, e.fence)),
        Some((b, 2))
    );
    assert!(w.is_held(0, a), "A's own clock says it is still valid");
    let mut releasing = 0;
    // SAFETY: live handle, valid pointer.
    ok(unsafe { lh_release_reported(w.hosts[0].c, w.now, a, &mut releasing) });
    assert_eq!(releasing, LH_RELEASING_PENDING);
    w.pump();
    let out = w
        .event(0, LH_OUTPUT_RELEASE_OUTCOME)
        .expect("the service's answer");
    assert_eq!(out.reason, LH_REASON_RELEASE_NOT_OWNER);
    let st = w.status();
    assert_eq!(
        (st.held, st.fencing_token),
        (1, 2),
        "B's grant is untouched"
    );
}
