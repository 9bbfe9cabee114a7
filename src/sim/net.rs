//! The simulated network between client hosts and the lock service.
//!
//! Every message independently gets a fate drawn from the seeded generator:
//! delivered after a delay (with an occasional long tail, which together with
//! random delays reorders messages), delivered twice, silently lost, or — for
//! requests and replies — turned into a transport error that the host sees
//! after a delay (a reset connection: the request may or may not have reached
//! the service, exactly the ambiguity a real host faces). Partitions cut one
//! client off from the service for an interval of true time; everything sent
//! across them is lost or becomes a transport error.

use super::rng::SimRng;

/// Network fault parameters of one simulated world.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// Smallest one-way delay, ns.
    pub min_delay_ns: u64,
    /// Largest ordinary one-way delay, ns.
    pub max_delay_ns: u64,
    /// Probability (ppm) that a message takes the long tail instead.
    pub tail_ppm: u32,
    /// Largest tail delay, ns.
    pub tail_max_ns: u64,
    /// Probability (ppm) that a message is silently lost.
    pub loss_ppm: u32,
    /// Probability (ppm) that a message is delivered twice.
    pub dup_ppm: u32,
    /// Probability (ppm) that a request or reply turns into a transport error.
    pub error_ppm: u32,
}

impl NetConfig {
    /// A perfect network with a fixed delay (useful for focused tests).
    pub fn perfect(delay_ns: u64) -> Self {
        NetConfig {
            min_delay_ns: delay_ns,
            max_delay_ns: delay_ns,
            tail_ppm: 0,
            tail_max_ns: delay_ns,
            loss_ppm: 0,
            dup_ppm: 0,
            error_ppm: 0,
        }
    }
}

/// What happens to one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Arrives after each of these delays (two entries = duplicated).
    Deliver(Vec<u64>),
    /// Vanishes; the sender learns nothing.
    Lost,
    /// The sender's transport reports an error after this delay. `reached`
    /// says whether the request got through to the service anyway.
    TransportError {
        /// Delay until the host sees the error.
        after_ns: u64,
        /// Whether the service still processes the request.
        reached: bool,
    },
}

/// A half-open interval `[start, end)` of true time during which one client is
/// cut off from the service.
#[derive(Clone, Copy, Debug)]
pub struct Partition {
    /// Client index.
    pub client: usize,
    /// Start, true ns.
    pub start: u64,
    /// End, true ns.
    pub end: u64,
}

/// Delay/loss/duplication model plus the partition schedule.
#[derive(Debug)]
pub struct Network {
    cfg: NetConfig,
    partitions: Vec<Partition>,
    rng: SimRng,
    /// Messages handed to the network.
    pub sent: u64,
    /// Messages lost (including to partitions).
    pub lost: u64,
}

impl Network {
    /// A network drawing its fates from `rng`.
    pub fn new(cfg: NetConfig, partitions: Vec<Partition>, rng: SimRng) -> Self {
        Network {
            cfg,
            partitions,
            rng,
            sent: 0,
            lost: 0,
        }
    }

    /// Whether `client` is cut off from the service at true time `t`.
    pub fn partitioned(&self, client: usize, t: u64) -> bool {
        self.partitions
            .iter()
            .any(|p| p.client == client && p.start <= t && t < p.end)
    }

    fn delay(&mut self) -> u64 {
        if self.rng.chance_ppm(self.cfg.tail_ppm) {
            self.rng.range(
                self.cfg.max_delay_ns,
                self.cfg.tail_max_ns.max(self.cfg.max_delay_ns),
            )
        } else {
            self.rng.range(self.cfg.min_delay_ns, self.cfg.max_delay_ns)
        }
    }

    /// Fate of a message between `client` and the service sent at true time
    /// `now`. `can_error` is true for requests and replies (a connection
    /// reset is visible to the host) and false for notifications and watch
    /// subscriptions (fire and forget).
    pub fn fate(&mut self, client: usize, now: u64, can_error: bool, is_reply: bool) -> Fate {
        self.sent += 1;
        if self.partitioned(client, now) {
            self.lost += 1;
            if can_error && self.rng.chance_ppm(500_000) {
                let after_ns = self.delay();
                return Fate::TransportError {
                    after_ns,
                    reached: false,
                };
            }
            return Fate::Lost;
        }
        if self.rng.chance_ppm(self.cfg.loss_ppm) {
            self.lost += 1;
            return Fate::Lost;
        }
        if can_error && self.rng.chance_ppm(self.cfg.error_ppm) {
            let after_ns = self.delay();
            // A reply that errs means the request was processed; a request that
            // errs may or may not have reached the service.
            let reached = is_reply || self.rng.chance_ppm(500_000);
            return Fate::TransportError { after_ns, reached };
        }
        let first = self.delay();
        if self.rng.chance_ppm(self.cfg.dup_ppm) {
            let second = self.delay();
            Fate::Deliver(vec![first, second])
        } else {
            Fate::Deliver(vec![first])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_loses_everything_and_perfect_net_delivers() {
        let parts = vec![Partition {
            client: 1,
            start: 100,
            end: 200,
        }];
        let mut n = Network::new(NetConfig::perfect(7), parts, SimRng::new(3));
        for t in [100, 150, 199] {
            assert!(!matches!(n.fate(1, t, true, false), Fate::Deliver(_)));
        }
        assert_eq!(n.fate(1, 200, true, false), Fate::Deliver(vec![7]));
        assert_eq!(n.fate(0, 150, true, false), Fate::Deliver(vec![7]));
    }

    #[test]
    fn faults_happen_at_configured_rates() {
        let cfg = NetConfig {
            min_delay_ns: 1,
            max_delay_ns: 10,
            tail_ppm: 0,
            tail_max_ns: 10,
            loss_ppm: 100_000,
            dup_ppm: 100_000,
            error_ppm: 100_000,
        };
        let mut n = Network::new(cfg, vec![], SimRng::new(9));
        let (mut lost, mut dup, mut err) = (0, 0, 0);
        for _ in 0..10_000 {
            match n.fate(0, 0, true, false) {
                Fate::Lost => lost += 1,
                Fate::TransportError { .. } => err += 1,
                Fate::Deliver(d) if d.len() == 2 => dup += 1,
                Fate::Deliver(d) => assert!((1..=10).contains(&d[0])),
            }
        }
        for c in [lost, dup, err] {
            assert!((500..1500).contains(&c), "{lost} {dup} {err}");
        }
    }
}
