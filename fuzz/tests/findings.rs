//! API-level regression tests of what the fuzzers found (F1, F2: see fuzz/README.md,
//! "Findings"); the core's own copies are in its tests.

use leasehold::{AcquireOptions, AcquireResult, Client, Command, Config, Error, Output};

fn drain(c: &mut Client) -> Vec<Output> {
    std::iter::from_fn(|| c.poll_output()).collect()
}

/// F1: an error leaves the core exactly as before the call. `release()` of a lease whose
/// acquire timed out at this very `now` must not both fail and change state.
#[test]

fn f1_release_error_changes_nothing() {
    let mut c = Client::new(Config::default(), &[7u8; 32]).unwrap();
    let l = c.acquire(0, "a", AcquireOptions::new(30_000)).unwrap();
    drain(&mut c);
    let before = c.counters();
    match c.release(3_000_000_000, l) {
        Ok(()) => {} // fine: the release took effect
        Err(e) => {
            assert_eq!(e, Error::LeaseEnded(l));
            assert_eq!(c.counters(), before, "error with side effects");
            assert!(drain(&mut c).is_empty(), "error with outputs");
        }
    }
}

/// F1 (acquire): `TooManyLeases` must not be returned after the call ran due timers.
#[test]

fn f1_acquire_error_changes_nothing() {
    let cfg = Config {
        max_leases: 1,
        ..Config::default()
    };
    let mut c = Client::new(cfg, &[7u8; 32]).unwrap();
    c.acquire(0, "a", AcquireOptions::new(30_000)).unwrap();
    drain(&mut c);
    let before = c.counters();
    if let Err(e) = c.acquire(3_000_000_000, "b", AcquireOptions::new(30_000)) {
        assert_eq!(e, Error::TooManyLeases);
        assert_eq!(c.now(), 0, "error moved time");
        assert_eq!(c.counters(), before, "error with side effects");
        assert!(drain(&mut c).is_empty(), "error with outputs");
    }
}

/// F2: the cleanup release of a grant the core did not accept echoes that grant's backend
/// data (an etcd lease id, say), or the backend cannot release it.
#[test]

fn f2_cleanup_release_echoes_backend_data() {
    let cfg = Config {
        request_timeout_ns: 5_000_000_000,
        ..Config::default()
    };
    let mut c = Client::new(cfg, &[7u8; 32]).unwrap();
    c.acquire(0, "a", AcquireOptions::new(3_000)).unwrap();
    let Some(Output::Command(Command::Acquire { request, .. })) = c.poll_output() else {
        panic!("no acquire command")
    };
    c.handle_acquire_result(
        3_000_000_000,
        request,
        AcquireResult::Granted {
            fencing_token: 1,
            ttl_ms: 3_000,
            backend_data: b"etcd-lease-42",
        },
    )
    .unwrap();
    let release = drain(&mut c).into_iter().find_map(|o| match o {
        Output::Command(Command::Release { backend_data, .. }) => Some(backend_data),
        _ => None,
    });
    let data = release.expect("a cleanup release of the stale grant");
    assert_eq!(data.as_deref(), Some(&b"etcd-lease-42"[..]));
}
