//! Hosts on threads hand one lock round until one of them freezes holding it (it is never
//! driven again: no renewal, no release): the scenario "a holder frozen after handoffs is
//! taken over at its expiry", shared by the backends' tests.
// Each test file uses its own part of the support modules.
#![allow(dead_code)]

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// One grant: its fence, the host it went to, when that host saw it (monotonic ns).
#[derive(Debug, Clone, Copy)]
pub struct Grant {
    pub fence: u64,
    pub host: u8,
    pub at_ns: u64,
}

/// The grants so far and which one froze its host.
pub struct Rounds {
    hosts: u8,
    warm_up: usize,
    log: Mutex<Vec<Grant>>,
    frozen: Mutex<Option<Grant>>,
    stop: AtomicBool,
}

/// What [`Rounds::takeover`] saw.
#[derive(Debug)]
pub struct Takeover {
    pub frozen: Grant,
    pub next: Grant,
    pub handoffs: usize,
}

impl Rounds {
    pub fn new(hosts: u8, warm_up: usize) -> Self {
        Rounds {
            hosts,
            warm_up,
            log: Mutex::new(Vec::new()),
            frozen: Mutex::new(None),
            stop: AtomicBool::new(false),
        }
    }

    /// The hosts stop (the test is over).
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// A wait ran out: only a waiter behind a frozen holder may see that.
    pub fn wait_ran_out(&self, host: u8) {
        assert!(
            self.frozen.lock().unwrap().is_some(),
            "host {host}: a 10 s wait ran out before the freeze"
        );
    }

    /// Records `g`; when it is the first grant that came through a handoff after the warm-up
    /// (every host having held the lock), its host freezes here until the test ends and
    /// `true` is returned (the host's thread then returns).
    pub fn granted(&self, g: Grant) -> bool {
        let freeze = {
            let mut log = self.log.lock().unwrap();
            let mut frozen = self.frozen.lock().unwrap();
            let handed = log.last().is_some_and(|e| e.host != g.host);
            let seen: HashSet<u8> = log.iter().map(|e| e.host).collect();
            log.push(g);
            let freeze = frozen.is_none()
                && handed
                && log.len() > self.warm_up
                && seen.len() == usize::from(self.hosts);
            if freeze {
                *frozen = Some(g);
            }
            freeze
        };
        if freeze {
            while !self.stopped() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        freeze
    }

    /// Waits for the grant after the frozen one (a late one is measured too, up to TTL + 15
    /// s), stops the hosts (the caller joins them) and checks that fences only increased.
    pub fn takeover(&self, ttl_ms: u64, now_ns: impl Fn() -> u64) -> Option<Takeover> {
        const MS: u64 = 1_000_000;
        let end = now_ns() + 120_000 * MS;
        let found = loop {
            let log = self.log.lock().unwrap();
            if let Some(frozen) = *self.frozen.lock().unwrap() {
                if let Some(next) = log.iter().skip_while(|e| e.fence != frozen.fence).nth(1) {
                    let handoffs = log.windows(2).filter(|w| w[0].host != w[1].host).count();
                    break Some(Takeover {
                        frozen,
                        next: *next,
                        handoffs,
                    });
                }
                if now_ns() > frozen.at_ns + (ttl_ms + 15_000) * MS {
                    break None;
                }
            }
            assert!(now_ns() < end, "no freeze within 2 minutes");
            drop(log);
            std::thread::sleep(Duration::from_millis(5));
        };
        self.stop.store(true, Ordering::SeqCst);
        found
    }

    /// Every fence granted so far is above the one before it.
    pub fn assert_fences_increase(&self) {
        let log = self.log.lock().unwrap();
        assert!(log.windows(2).all(|w| w[0].fence < w[1].fence), "{log:?}");
    }
}

/// The takeover came at the frozen holder's expiry: a higher fence, within TTL (less the
/// time its grant took to be seen) + 1 s of that grant.
pub fn assert_taken_over_at_expiry(backend: &str, t: Option<Takeover>, ttl_ms: u64) {
    let Some(t) = t else {
        panic!("nobody took over from a holder frozen after handoffs within TTL + 15 s");
    };
    let after_ms = (t.next.at_ns - t.frozen.at_ns) / 1_000_000;
    eprintln!(
        "{backend}: host {} frozen holding fence {} after {} handoffs; host {} took over \
         {after_ms} ms after that grant (fence {})",
        t.frozen.host, t.frozen.fence, t.handoffs, t.next.host, t.next.fence
    );
    assert!(t.next.fence > t.frozen.fence);
    assert!(
        (ttl_ms - 200..ttl_ms + 1_000).contains(&after_ms),
        "{after_ms} ms"
    );
}
