//! The in-memory reference lock service (`leasehold::service::memory`), one test per
//! behaviour, public API only: what every binding's test helpers get through the C ABI.

use leasehold::service::memory::{Faults, Limits, MemoryError, MemoryService, Reply};

const MS: u64 = 1_000_000;
const A: &[u8] = b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &[u8] = b"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn service() -> (MemoryService, u64, u64) {
    let mut s = MemoryService::default();
    let a = s.connect().unwrap();
    let b = s.connect().unwrap();
    (s, a, b)
}

fn granted(r: Reply) -> u64 {
    match r {
        Reply::Granted { fence, .. } => fence,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn one_holder_at_a_time_and_the_other_gets_the_remaining_ttl() {
    let (mut s, a, b) = service();
    assert_eq!(
        s.acquire(a, 0, "n", A, 100).unwrap(),
        Reply::Granted {
            fence: 1,
            ttl_ms: 100
        }
    );
    assert_eq!(
        s.acquire(b, 30 * MS + 1, "n", B, 100).unwrap(),
        Reply::HeldByOther {
            retry_after_ms: Some(70)
        },
        "remaining 69.999999 ms is rounded up"
    );
}

#[test]
fn acquire_is_idempotent_for_the_same_token() {
    let (mut s, a, _) = service();
    let f = granted(s.acquire(a, 0, "n", A, 100).unwrap());
    // A retry whose first answer was lost: same fence, TTL counted again from now.
    assert_eq!(granted(s.acquire(a, 90 * MS, "n", A, 100).unwrap()), f);
    assert!(s.status(189 * MS, "n").unwrap().holder.is_some());
    assert!(s.status(190 * MS, "n").unwrap().holder.is_none());
    assert_eq!(s.stats().grants, 1, "a refresh is not a new grant");
}

#[test]
fn grants_expire_on_the_service_clock() {
    let (mut s, a, b) = service();
    granted(s.acquire(a, 0, "n", A, 100).unwrap());
    assert!(matches!(
        s.acquire(b, 100 * MS - 1, "n", B, 100).unwrap(),
        Reply::HeldByOther { .. }
    ));
    granted(s.acquire(b, 100 * MS, "n", B, 100).unwrap());
}

#[test]
fn fencing_tokens_strictly_increase_per_name() {
    let (mut s, a, b) = service();
    let mut last = 0;
    for i in 0..10u64 {
        let (c, t) = if i % 2 == 0 { (a, A) } else { (b, B) };
        let f = granted(s.acquire(c, i * 10 * MS, "n", t, 5).unwrap());
        assert!(f > last, "{f} after {last}");
        last = f;
        if i % 3 == 0 {
            assert_eq!(s.release(c, i * 10 * MS, "n", t).unwrap(), Reply::Released);
        }
    }
    assert_eq!(granted(s.acquire(a, 0, "other", A, 5).unwrap()), 1);
}

#[test]
fn renew_needs_the_unexpired_grant_of_the_same_token() {
    let (mut s, a, b) = service();
    granted(s.acquire(a, 0, "n", A, 100).unwrap());
    assert_eq!(s.renew(b, 10 * MS, "n", B, 100).unwrap(), Reply::Rejected);
    assert_eq!(s.renew(a, 90 * MS, "n", A, 100).unwrap(), Reply::Renewed);
    assert!(s.status(189 * MS, "n").unwrap().holder.is_some());
    assert_eq!(s.renew(a, 190 * MS, "n", A, 100).unwrap(), Reply::Rejected);
    assert_eq!(s.renew(a, 0, "never", A, 100).unwrap(), Reply::Rejected);
    let k = s.stats();
    assert_eq!((k.renewals, k.renewals_rejected), (1, 3));
}

#[test]
fn release_by_token_is_not_owner_once_the_grant_is_gone() {
    let (mut s, a, b) = service();
    granted(s.acquire(a, 0, "n", A, 100).unwrap());
    assert_eq!(s.release(b, MS, "n", B).unwrap(), Reply::NotOwner);
    assert!(s.status(MS, "n").unwrap().holder.is_some(), "unchanged");
    // Expired, then taken by B: A's release must not delete B's grant.
    granted(s.acquire(b, 150 * MS, "n", B, 100).unwrap());
    assert_eq!(s.release(a, 151 * MS, "n", A).unwrap(), Reply::NotOwner);
    assert_eq!(s.release(b, 152 * MS, "n", B).unwrap(), Reply::Released);
    assert_eq!(s.release(b, 153 * MS, "n", B).unwrap(), Reply::NotOwner);
}

#[test]
fn a_release_notifies_every_watching_connection_once() {
    let (mut s, a, b) = service();
    let c = s.connect().unwrap();
    s.watch(b, "n").unwrap();
    s.watch(b, "n").unwrap(); // idempotent
    s.watch(c, "n").unwrap();
    s.watch(c, "other").unwrap();
    assert_eq!(s.watchers("n"), 2);
    assert_eq!(s.status(0, "n").unwrap().watchers, 2);
    assert_eq!(s.stats().watches, 3);
    granted(s.acquire(a, 0, "n", A, 100).unwrap());
    s.release(a, MS, "n", A).unwrap();
    for conn in [b, c] {
        assert_eq!(s.poll_released(conn).unwrap().as_deref(), Some("n"));
        assert_eq!(s.poll_released(conn).unwrap(), None);
    }
    assert_eq!(s.poll_released(a).unwrap(), None, "a did not watch");
    // Expiry and refused releases publish nothing; unwatch stops notifications.
    granted(s.acquire(a, 2 * MS, "n", A, 1).unwrap());
    s.release(a, 10 * MS, "n", A).unwrap();
    s.unwatch(c, "n").unwrap();
    granted(s.acquire(a, 10 * MS, "n", A, 100).unwrap());
    s.release(a, 11 * MS, "n", A).unwrap();
    assert_eq!(s.poll_released(b).unwrap().as_deref(), Some("n"));
    assert_eq!(s.poll_released(c).unwrap(), None);
    assert_eq!(s.watchers("n"), 1);
}

#[test]
fn a_partitioned_connection_loses_requests_and_notifications_while_others_carry_on() {
    let (mut s, a, b) = service();
    s.watch(a, "n").unwrap();
    let cut = Faults {
        partitioned: true,
        ..Faults::default()
    };
    s.set_faults(a, cut).unwrap();
    assert_eq!(s.acquire(a, 0, "n", A, 100).unwrap(), Reply::Dropped);
    assert!(
        s.status(0, "n").unwrap().holder.is_none(),
        "nothing applied"
    );
    granted(s.acquire(b, 0, "n", B, 100).unwrap());
    s.release(b, MS, "n", B).unwrap();
    assert_eq!(s.stats().notifications_dropped, 1);
    s.set_faults(a, Faults::default()).unwrap();
    assert_eq!(s.poll_released(a).unwrap(), None, "lost, not delayed");
    granted(s.acquire(a, 2 * MS, "n", A, 100).unwrap());
}

#[test]
fn dropped_requests_apply_nothing() {
    let (mut s, a, _) = service();
    granted(s.acquire(a, 0, "n", A, 100).unwrap());
    s.set_faults(
        a,
        Faults {
            drop_requests: true,
            ..Faults::default()
        },
    )
    .unwrap();
    assert_eq!(s.renew(a, 50 * MS, "n", A, 100).unwrap(), Reply::Dropped);
    assert_eq!(s.release(a, 50 * MS, "n", A).unwrap(), Reply::Dropped);
    let st = s.status(99 * MS, "n").unwrap();
    assert_eq!(st.holder.map(|h| h.expires_at), Some(100 * MS));
}

#[test]
fn dropped_responses_apply_then_lose_the_answer() {
    let (mut s, a, b) = service();
    s.set_faults(
        a,
        Faults {
            drop_next_responses: 1,
            ..Faults::default()
        },
    )
    .unwrap();
    assert_eq!(s.acquire(a, 0, "n", A, 100).unwrap(), Reply::Dropped);
    assert_eq!(s.faults(a).unwrap().drop_next_responses, 0, "counted down");
    // The grant happened: B is refused, and A's retry finds its own grant.
    assert!(matches!(
        s.acquire(b, MS, "n", B, 100).unwrap(),
        Reply::HeldByOther { .. }
    ));
    assert_eq!(granted(s.acquire(a, MS, "n", A, 100).unwrap()), 1);
    s.set_faults(
        a,
        Faults {
            drop_responses: true,
            ..Faults::default()
        },
    )
    .unwrap();
    assert_eq!(s.release(a, 2 * MS, "n", A).unwrap(), Reply::Dropped);
    assert!(s.status(2 * MS, "n").unwrap().holder.is_none(), "released");
}

#[test]
fn reject_switches_answer_without_looking() {
    let (mut s, a, _) = service();
    granted(s.acquire(a, 0, "n", A, 100).unwrap());
    s.set_faults(
        a,
        Faults {
            reject_acquires: true,
            reject_renewals: true,
            reject_releases: true,
            ..Faults::default()
        },
    )
    .unwrap();
    assert_eq!(
        s.acquire(a, MS, "n", A, 100).unwrap(),
        Reply::HeldByOther {
            retry_after_ms: None
        }
    );
    assert_eq!(s.renew(a, MS, "n", A, 100).unwrap(), Reply::Rejected);
    assert_eq!(s.release(a, MS, "n", A).unwrap(), Reply::NotOwner);
    assert!(s.status(MS, "n").unwrap().holder.is_some(), "still held");
}

#[test]
fn clock_steps_move_expiry_on_the_service_side_only() {
    let (mut s, a, b) = service();
    granted(s.acquire(a, 0, "n", A, 100).unwrap());
    s.step_clock(60 * MS as i64);
    assert_eq!(s.status(50 * MS, "n").unwrap().service_now, 110 * MS);
    granted(s.acquire(b, 50 * MS, "n", B, 100).unwrap());
    // A step back makes B's grant outlive what B was told.
    s.step_clock(-200 * MS as i64);
    assert_eq!(s.status(200 * MS, "n").unwrap().service_now, 60 * MS);
    assert!(s.status(300 * MS, "n").unwrap().holder.is_some());
}

#[test]
fn host_time_running_backwards_is_clamped() {
    let (mut s, a, b) = service();
    granted(s.acquire(a, 100 * MS, "n", A, 10).unwrap());
    // An older `now` is read as the latest one: the grant does not come back to life later.
    assert!(matches!(
        s.acquire(b, 0, "n", B, 10).unwrap(),
        Reply::HeldByOther {
            retry_after_ms: Some(10)
        }
    ));
    assert_eq!(s.status(0, "n").unwrap().service_now, 100 * MS);
}

#[test]
fn status_reports_holder_fence_expiry_and_age() {
    let (mut s, a, _) = service();
    let st = s.status(0, "n").unwrap();
    assert_eq!((st.holder, st.last_fence), (None, None));
    granted(s.acquire(a, 10 * MS, "n", A, 100).unwrap());
    let h = s.status(40 * MS, "n").unwrap().holder.unwrap();
    assert_eq!(h.token, A);
    assert_eq!((h.fence, h.connection), (1, a));
    assert_eq!((h.expires_at, h.remaining_ms), (110 * MS, 70));
    assert_eq!(h.held_for_ns, 30 * MS);
    s.release(a, 50 * MS, "n", A).unwrap();
    let st = s.status(50 * MS, "n").unwrap();
    assert_eq!((st.holder, st.last_fence), (None, Some(1)));
}

#[test]
fn forget_drops_the_grant_silently_and_keeps_the_fence() {
    let (mut s, a, b) = service();
    s.watch(b, "n").unwrap();
    granted(s.acquire(a, 0, "n", A, 100).unwrap());
    assert!(s.forget("n").unwrap());
    assert_eq!(s.renew(a, MS, "n", A, 100).unwrap(), Reply::Rejected);
    assert_eq!(s.poll_released(b).unwrap(), None);
    assert_eq!(granted(s.acquire(b, MS, "n", B, 100).unwrap()), 2);
}

#[test]
fn names_are_bounded_and_reclaimed_records_keep_fences_rising() {
    let limits = Limits {
        max_names: 4,
        ..Limits::default()
    };
    let mut s = MemoryService::new(limits).unwrap();
    let a = s.connect().unwrap();
    for i in 0..4 {
        granted(s.acquire(a, 0, &format!("n{i}"), A, 10).unwrap());
    }
    assert_eq!(s.acquire(a, MS, "n4", A, 10).unwrap(), Reply::Full);
    assert_eq!(s.acquire(a, 2 * MS, "n5", A, 10).unwrap(), Reply::Full);
    // Existing names keep working while full.
    assert_eq!(granted(s.acquire(a, 3 * MS, "n0", A, 10).unwrap()), 1);
    // Once they expire, their records go and new names fit; fences never repeat.
    for i in 0..20 {
        let f = granted(s.acquire(a, 20 * MS, &format!("m{i}"), A, 1).unwrap());
        assert!(f >= 1);
        s.release(a, 20 * MS, &format!("m{i}"), A).unwrap();
    }
    assert!(s.stats().names <= 4);
    assert!(s.stats().reclaimed >= 4);
    let before = s.status(30 * MS, "m19").unwrap().last_fence.unwrap();
    for i in 0..8 {
        let x = format!("x{i}");
        granted(s.acquire(a, 30 * MS, &x, A, 1).unwrap());
        s.release(a, 30 * MS, &x, A).unwrap();
    }
    assert_eq!(
        s.status(30 * MS, "m19").unwrap().last_fence,
        None,
        "reclaimed"
    );
    let after = granted(s.acquire(a, 40 * MS, "m19", A, 1).unwrap());
    assert!(after > before, "{after} after {before}");
}

#[test]
fn connections_watches_and_queued_notifications_are_bounded() {
    let limits = Limits {
        max_connections: 2,
        max_watches: 1,
        max_pending: 2,
        ..Limits::default()
    };
    let mut s = MemoryService::new(limits).unwrap();
    let a = s.connect().unwrap();
    let b = s.connect().unwrap();
    assert_eq!(
        s.connect(),
        Err(MemoryError::LimitReached("max_connections"))
    );
    s.watch(b, "n").unwrap();
    assert_eq!(
        s.watch(b, "m"),
        Err(MemoryError::LimitReached("max_watches"))
    );
    for i in 0..5 {
        granted(s.acquire(a, i * MS, "n", A, 100).unwrap());
        s.release(a, i * MS, "n", A).unwrap();
    }
    assert_eq!(s.stats().notifications, 2);
    assert_eq!(s.stats().notifications_dropped, 3);
    // A closed connection's id is never reused; its watches are gone.
    assert_eq!(s.stats().watches, 1);
    s.disconnect(b).unwrap();
    assert_eq!(s.watchers("n"), 0);
    assert_eq!(s.stats().watches, 0);
    assert_eq!(s.poll_released(b), Err(MemoryError::UnknownConnection(b)));
    let c = s.connect().unwrap();
    assert!(c > b);
}

#[test]
fn misuse_is_an_error_and_changes_nothing() {
    let (mut s, a, _) = service();
    let long = vec![b'x'; 65];
    assert!(matches!(
        s.acquire(a, 0, "", A, 100),
        Err(MemoryError::Name(_))
    ));
    assert!(matches!(
        s.acquire(a, 0, "a\0b", A, 100),
        Err(MemoryError::Name(_))
    ));
    assert!(matches!(
        s.acquire(a, 0, &"x".repeat(513), A, 100),
        Err(MemoryError::Name(_))
    ));
    assert_eq!(
        s.acquire(a, 0, "n", b"", 100),
        Err(MemoryError::InvalidToken { len: 0 })
    );
    assert_eq!(
        s.acquire(a, 0, "n", &long, 100),
        Err(MemoryError::InvalidToken { len: 65 })
    );
    assert_eq!(s.acquire(a, 0, "n", A, 0), Err(MemoryError::InvalidTtl));
    assert_eq!(
        s.acquire(99, 0, "n", A, 100),
        Err(MemoryError::UnknownConnection(99))
    );
    assert_eq!(s.stats().names, 0);
    assert!(
        MemoryService::new(Limits {
            max_names: 0,
            ..Limits::default()
        })
        .is_err()
    );
    assert!(
        MemoryService::new(Limits {
            max_pending: u32::MAX,
            ..Limits::default()
        })
        .is_err()
    );
}

#[test]
fn huge_ttls_and_times_saturate_instead_of_wrapping() {
    let (mut s, a, b) = service();
    granted(s.acquire(a, u64::MAX - 5, "n", A, u64::MAX).unwrap());
    // The expiry saturates at the end of time: 1 ns left is a 1 ms hint, then it is free.
    assert_eq!(
        s.acquire(b, u64::MAX - 1, "n", B, 1).unwrap(),
        Reply::HeldByOther {
            retry_after_ms: Some(1)
        }
    );
    granted(s.acquire(b, u64::MAX, "n", B, 1).unwrap());
    s.step_clock(i64::MAX);
    s.step_clock(i64::MIN); // offset -1
    s.step_clock(i64::MIN); // saturates at i64::MIN
    assert_eq!(s.status(0, "n").unwrap().service_now, u64::MAX - (1 << 63));
}
