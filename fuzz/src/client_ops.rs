//! `client_ops`: a seed, a configuration and a sequence of host inputs applied to one
//! `leasehold::Client`, with an oracle that checks docs/design.md §4 I1–I4 and I7 after every input.
//!
//! The harness plays the host. It keeps a model of every lease, request and ownership token
//! it has seen, a small reference lock service (`Op::Serve` answers every outstanding command
//! the way a correct service would, so short inputs still reach renewals, waits and losses),
//! and checks every drained output against the model. Any broken rule panics with
//! `invariant <name> violated: …`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use arbitrary::Arbitrary;

use crate::{Seq, SmallBytes};
use leasehold::{
    AcquireFailReason, AcquireOptions, AcquireResult, Client, Command, Config, Counters, Error,
    Event, LeaseId, LeaseState, LostReason, MAX_BACKEND_DATA_LEN, MAX_NAME_LEN, MIN_SEED_LEN,
    Output, ReleaseResult, RenewResult, RequestId,
};

/// Errors leave the core exactly as before the call (src/error.rs). `false` tolerates the two
/// cases of finding F1 (`TooManyLeases` from `acquire` and `LeaseEnded` from `release` after
/// the call's `now` had run due timers; see fuzz/README.md).
pub const STRICT_ERRORS: bool = true;

/// Host time never exceeds 2^62 ns (146 years): near `u64::MAX` every deadline saturates
/// into the core's "never" sentinel, which is not a state a monotonic clock reaches.
pub const TIME_CAP: u64 = 1 << 62;

/// Operations per input; longer inputs are truncated so one execution stays fast.
pub const MAX_OPS: usize = 400;
/// Outputs one drain may yield before I7 (bounded output queue) is considered broken.
const DRAIN_BASE: usize = 64;
const DRAIN_PER_LEASE: usize = 8;

/// A `RequestId` is `(n << 24) | slot` (src/engine/table.rs); a grant notice is matched to the
/// record in its request's slot.
const SLOT_MASK: u64 = (1 << 24) - 1;
/// Acquire request ids remembered for grant notices.
const ACQUIRE_LOG: usize = 64;

const NAMES: [&str; 3] = ["a", "b", "lock/c"];
const TTLS_MS: [u64; 8] = [100, 1_000, 3_000, 10_000, 30_000, 60_000, 5, 604_800_000];

/// The fuzz input.
#[derive(Arbitrary, Debug, Clone)]
pub struct Input {
    pub seed: SeedChoice,
    pub config: ConfigChoice,
    pub ops: Seq<HostOp>,
}

#[derive(Arbitrary, Debug, Clone)]
pub enum SeedChoice {
    /// 32 bytes of one value: a valid seed.
    Fixed(u8),
    /// Arbitrary bytes; shorter than `MIN_SEED_LEN` must be refused (then padded).
    Bytes(SmallBytes),
}

#[derive(Arbitrary, Debug, Clone)]
pub enum ConfigChoice {
    Default,
    NoNotifications,
    /// Plausible values: small budgets and tables so limits are reached.
    Tweaked {
        drift_ppm: u16,
        drift_fixed_us: u16,
        renew_jitter_ppm: u32,
        request_timeout_ms: u16,
        fail_budget: u8,
        backoff_base_us: u16,
        backoff_cap_ms: u16,
        max_ttl_ms: u32,
        max_leases: u8,
        notifications: bool,
    },
    /// Any values at all: `Client::new` must refuse the invalid ones with `InvalidConfig`.
    Raw {
        drift_ppm: u32,
        drift_fixed_ns: u64,
        renew_jitter_ppm: u32,
        request_timeout_ns: u64,
        fail_budget: u32,
        backoff_base_ns: u64,
        backoff_cap_ns: u64,
        max_ttl_ms: u64,
        max_leases: u32,
        notifications: bool,
    },
}

#[derive(Arbitrary, Debug, Clone)]
pub enum NameChoice {
    /// One of a few shared names, so leases contend.
    Pool(u8),
    /// Anything: empty, NUL bytes, multi-byte characters.
    Str(SmallBytes),
    /// A name of a chosen length around `MAX_NAME_LEN`.
    Long(u16),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum TtlChoice {
    Typical(u8),
    Ms(u16),
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum WaitChoice {
    None,
    Ms(u16),
    Secs(u16),
    Forever,
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Step {
    Zero,
    Ns(u16),
    Ms(u16),
    Secs(u16),
    Days(u8),
    Huge,
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum LeaseChoice {
    /// The n-th lease issued so far (modulo).
    Issued(u8),
    /// Any id: usually never issued.
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum ReqChoice {
    /// The n-th unanswered request of the matching kind (falls back to an unknown id).
    Outstanding(u8),
    /// The n-th request ever seen, whatever its kind or state (stale, wrong kind, duplicate).
    Seen(u8),
    /// Any id.
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum FenceChoice {
    /// What a correct service would give: the next fence of the name (same fence for the
    /// current holder's token).
    Next,
    /// Anything (the name is then excluded from the I4 check: the service is broken).
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum GrantTtl {
    AsRequested,
    Ms(u16),
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone)]
pub enum DataChoice {
    Empty,
    Bytes(SmallBytes),
    /// A buffer of this length (above `MAX_BACKEND_DATA_LEN` must be refused).
    Len(u16),
}

#[derive(Arbitrary, Debug, Clone)]
pub enum AcquireOutcome {
    Granted {
        fence: FenceChoice,
        ttl: GrantTtl,
        data: DataChoice,
    },
    HeldByOther {
        retry_after_ms: Option<u64>,
    },
    TransportError,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum RenewOutcome {
    Renewed,
    Rejected,
    TransportError,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum ReleaseOutcome {
    Released,
    NotOwner,
    TransportError,
}

#[derive(Arbitrary, Debug, Clone)]
pub enum Op {
    Acquire {
        name: NameChoice,
        ttl: TtlChoice,
        wait: WaitChoice,
        reentrant: bool,
    },
    Release {
        lease: LeaseChoice,
    },
    AcquireResult {
        req: ReqChoice,
        outcome: AcquireOutcome,
    },
    RenewResult {
        req: ReqChoice,
        outcome: RenewOutcome,
    },
    ReleaseResult {
        req: ReqChoice,
        outcome: ReleaseOutcome,
    },
    /// A release notification (watch) for a name.
    Notify {
        name: NameChoice,
    },
    /// Host time moves forward; `fire` calls `handle_timeout` at the new time.
    Advance {
        step: Step,
        fire: bool,
    },
    /// Host time moves backwards (the core must clamp).
    Rewind {
        step: Step,
    },
    /// `handle_timeout` at the current host time (early and spurious calls are no-ops).
    Timeout,
    /// Jump to the core's deadline and fire it, as a host loop does.
    FireDeadline,
    /// The reference service answers every outstanding command (and delivers notifications).
    Serve {
        rounds: u8,
        drop_some: bool,
    },
    Reseed {
        seed: SmallBytes,
    },
}

/// One op of an input (a wrapper, so that inputs and tests keep one type of op).
#[derive(Clone)]
pub struct HostOp(pub Op);

impl<'a> Arbitrary<'a> for HostOp {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(HostOp(Op::arbitrary(u)?))
    }

    fn size_hint(depth: usize) -> (usize, Option<usize>) {
        Op::size_hint(depth)
    }
}

impl std::fmt::Debug for HostOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<Op> for HostOp {
    fn from(op: Op) -> Self {
        HostOp(op)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Terminal {
    Released,
    Lost(LostReason),
    AcquireFailed(AcquireFailReason),
}

impl Terminal {
    fn state(self) -> LeaseState {
        match self {
            Terminal::Released => LeaseState::Released,
            Terminal::Lost(_) => LeaseState::Lost,
            Terminal::AcquireFailed(_) => LeaseState::AcquireFailed,
        }
    }
}

#[derive(Debug)]
struct LeaseModel {
    id: LeaseId,
    name: String,
    ttl_ms: u64,
    wait_ns: u64,
    reentrant: bool,
    started_at: u64,
    holders: u32,
    acquired: bool,
    terminal: Option<Terminal>,
    ended_at: Option<u64>,
    token: Option<[u8; 32]>,
    /// Upper bound of `valid_until` from the confirmed grants and renewals (I1).
    vu_bound: Option<u64>,
    fence: Option<u64>,
    /// Backend data a renew/release may echo: none (before any accepted grant) or the last
    /// accepted grant's, plus that of any later grant the service applied for this token (a
    /// late grant replaces the record the service holds, so its cleanup release may echo the
    /// newer data; one sent before the late grant was processed echoes the older).
    data_ok: Vec<Vec<u8>>,
    /// The fencing token of a grant fed during the current op (checked against `Acquired`).
    expected_fence: Option<u64>,
    /// The record slot its requests carry (low bits of every request id; grant notices).
    slot: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Acquire,
    Renew,
    Release,
}

#[derive(Debug, Clone)]
struct ReqModel {
    kind: Kind,
    lease: LeaseId,
    name: String,
    token: [u8; 32],
    ttl_ms: u64,
    t_sent: u64,
    answered: bool,
}

#[derive(Debug, Default)]
struct TokenModel {
    lease: u64,
    /// A grant for this token was accepted by the core.
    granted: bool,
    /// Core time of the last grant/renewal confirmation fed for this token, and its TTL.
    last_confirm: u64,
    confirm_ttl_ns: u64,
    release_sent: bool,
    /// The service rejected it (renew Rejected / release NotOwner): nothing left to clean up.
    disowned: bool,
    /// A grant arrived after the lease had ended (must be released at once).
    late_grant_at: Option<u64>,
}

#[derive(Debug, Default, Clone)]
struct NameService {
    holder: Option<[u8; 32]>,
    expires: u64,
    fence: u64,
}

/// What the op being applied allows the drained outputs to contain.
#[derive(Default)]
struct OpCtx {
    /// The lease `release()` was called on (its `Released`/`AcquireFailed{Cancelled}` may follow).
    releasing: Option<LeaseId>,
    /// The reentrant lease `acquire()` joined (it may re-emit `Acquired`).
    rejoined: Option<LeaseId>,
    /// Leases that got a terminal event in this drain.
    ended: Vec<LeaseId>,
    /// Outputs drained.
    outputs: usize,
    events: usize,
}

pub struct Harness {
    /// A grant without backend data (a notice, or a `Granted` with none) was fed, for a
    /// request the model may not attribute (forged ids, superseded attempts): the core keeps
    /// the newest grant's data by fence, so a cleanup release may then echo none.
    dataless_grant_fed: bool,
    client: Client,
    cfg: Config,
    host_now: u64,
    core_now: u64,
    leases: Vec<LeaseModel>,
    by_id: HashMap<u64, usize>,
    requests: BTreeMap<u64, ReqModel>,
    tokens: HashMap<[u8; 32], TokenModel>,
    watched: BTreeSet<String>,
    service: HashMap<String, NameService>,
    /// Names whose grants were given raw fences (I4 not applicable).
    tainted: BTreeSet<String>,
    /// Last fence a grant-caused `Acquired` reported per name, with its lease (I4).
    last_fence: HashMap<String, (u64, u64)>,
    prev: Counters,
    seeds: Vec<Vec<u8>>,
    /// Release notifications the reference service still has to deliver.
    notifications: Vec<String>,
    /// The latest Acquire request ids, oldest first (grant notices name them).
    acquire_log: Vec<u64>,
    /// Behaviours reached (bit set), for corpus selection.
    pub features: u64,
    /// `LEASEHOLD_FUZZ_TRACE=1` prints every op and output (debugging a finding).
    trace: bool,
    /// See [`STRICT_ERRORS`].
    pub strict_errors: bool,
}

fn violated(inv: &str, msg: std::fmt::Arguments<'_>) -> ! {
    panic!("invariant {inv} violated: {msg}")
}

macro_rules! check {
    ($cond:expr, $inv:expr, $($fmt:tt)+) => {
        if !$cond {
            violated($inv, format_args!($($fmt)+));
        }
    };
}

fn name_of(choice: &NameChoice) -> String {
    match choice {
        NameChoice::Pool(i) => NAMES[usize::from(*i) % NAMES.len()].to_owned(),
        NameChoice::Str(s) => s.lossy(),
        NameChoice::Long(n) => {
            // Lengths cluster around the limit; a multi-byte char keeps it UTF-8.
            let len = usize::from(*n) % (MAX_NAME_LEN + 64);
            let mut s = "é".repeat(len / 2);
            if len % 2 == 1 {
                s.push('x');
            }
            s
        }
    }
}

fn name_valid(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN && !name.contains('\0')
}

fn ttl_of(choice: TtlChoice) -> u64 {
    match choice {
        TtlChoice::Typical(i) => TTLS_MS[usize::from(i) % TTLS_MS.len()],
        TtlChoice::Ms(ms) => u64::from(ms),
        TtlChoice::Raw(v) => v,
    }
}

fn wait_of(choice: WaitChoice) -> u64 {
    match choice {
        WaitChoice::None => 0,
        WaitChoice::Ms(ms) => u64::from(ms) * 1_000_000,
        WaitChoice::Secs(s) => u64::from(s) * 1_000_000_000,
        WaitChoice::Forever => u64::MAX,
        WaitChoice::Raw(v) => v,
    }
}

fn step_of(step: Step) -> u64 {
    match step {
        Step::Zero => 0,
        Step::Ns(n) => u64::from(n),
        Step::Ms(n) => u64::from(n) * 1_000_000,
        Step::Secs(n) => u64::from(n) * 1_000_000_000,
        Step::Days(n) => u64::from(n) * 86_400_000_000_000,
        Step::Huge => TIME_CAP / 2,
        Step::Raw(v) => v,
    }
}

fn data_of(choice: &DataChoice) -> Vec<u8> {
    match choice {
        DataChoice::Empty => Vec::new(),
        DataChoice::Bytes(b) => b.0.clone(),
        DataChoice::Len(n) => vec![0xA5; usize::from(*n) % (2 * MAX_BACKEND_DATA_LEN + 2)],
    }
}

pub fn config_of(choice: &ConfigChoice) -> Config {
    let mut cfg = Config::default();
    match *choice {
        ConfigChoice::Default => {}
        ConfigChoice::NoNotifications => cfg.notifications = false,
        ConfigChoice::Tweaked {
            drift_ppm,
            drift_fixed_us,
            renew_jitter_ppm,
            request_timeout_ms,
            fail_budget,
            backoff_base_us,
            backoff_cap_ms,
            max_ttl_ms,
            max_leases,
            notifications,
        } => {
            cfg.drift_ppm = u32::from(drift_ppm);
            cfg.drift_fixed_ns = u64::from(drift_fixed_us) * 1_000;
            cfg.renew_jitter_ppm = renew_jitter_ppm % 500_001;
            cfg.request_timeout_ns = (u64::from(request_timeout_ms) + 1) * 1_000_000;
            cfg.fail_budget = u32::from(fail_budget % 8); // 0 is the time budget
            cfg.backoff_base_ns = (u64::from(backoff_base_us) + 1) * 1_000;
            cfg.backoff_cap_ns = cfg.backoff_base_ns + u64::from(backoff_cap_ms) * 1_000_000;
            cfg.max_ttl_ms = u64::from(max_ttl_ms).max(1);
            cfg.max_leases = u32::from(max_leases % 16) + 1;
            cfg.notifications = notifications;
        }
        ConfigChoice::Raw {
            drift_ppm,
            drift_fixed_ns,
            renew_jitter_ppm,
            request_timeout_ns,
            fail_budget,
            backoff_base_ns,
            backoff_cap_ns,
            max_ttl_ms,
            max_leases,
            notifications,
        } => {
            cfg = Config {
                drift_ppm,
                drift_fixed_ns,
                renew_jitter_ppm,
                request_timeout_ns,
                fail_budget,
                backoff_base_ns,
                backoff_cap_ns,
                max_ttl_ms,
                max_leases,
                notifications,
            };
        }
    }
    cfg
}

fn seed_of(choice: &SeedChoice) -> Vec<u8> {
    match choice {
        SeedChoice::Fixed(b) => vec![*b; 32],
        SeedChoice::Bytes(v) => v.0.clone(),
    }
}

fn pad_seed(mut seed: Vec<u8>) -> Vec<u8> {
    while seed.len() < MIN_SEED_LEN {
        seed.push(0x5a ^ seed.len() as u8);
    }
    seed
}

/// Runs one input; panics if an invariant breaks. Returns the behaviours reached (a bit set
/// used to pick a small, varied seed corpus).
pub fn run(input: &Input) -> u64 {
    run_with(input, STRICT_ERRORS)
}

/// [`run`] with an explicit error strictness (see [`STRICT_ERRORS`]).
pub fn run_with(input: &Input, strict_errors: bool) -> u64 {
    let Some(mut h) = Harness::new(input) else {
        return 0;
    };
    h.strict_errors = strict_errors;
    for op in input.ops.0.iter().take(MAX_OPS) {
        h.apply(&op.0);
    }
    h.quiesce();
    let c = h.client.counters();
    let counters = [
        c.renewals_ok,
        c.renewals_failed,
        c.lost_rejected,
        c.lost_expired,
        c.lost_fail_budget,
        c.stale_results,
        c.time_clamped,
        c.acquire_failed,
    ];
    for (i, v) in counters.iter().enumerate() {
        if *v > 0 {
            h.features |= 1 << (40 + i);
        }
    }
    h.features
}

impl Harness {
    pub fn new(input: &Input) -> Option<Harness> {
        let mut cfg = config_of(&input.config);
        let seed = seed_of(&input.seed);
        let first = Client::new(cfg, &seed);
        let client = match first {
            Ok(c) => {
                check!(
                    seed.len() >= MIN_SEED_LEN,
                    "seed",
                    "Client::new accepted a {}-byte seed",
                    seed.len()
                );
                c
            }
            Err(Error::SeedTooShort { len }) => {
                check!(
                    seed.len() < MIN_SEED_LEN && len == seed.len(),
                    "seed",
                    "SeedTooShort{{len: {len}}} for a {}-byte seed",
                    seed.len()
                );
                Client::new(cfg, &pad_seed(seed.clone())).ok()?
            }
            Err(Error::InvalidConfig(_)) => {
                cfg = Config::default();
                Client::new(cfg, &pad_seed(seed.clone())).expect("default config is valid")
            }
            Err(e) => violated("errors", format_args!("Client::new returned {e:?}")),
        };
        let prev = client.counters();
        Some(Harness {
            dataless_grant_fed: false,
            client,
            cfg,
            host_now: 0,
            core_now: 0,
            leases: Vec::new(),
            by_id: HashMap::new(),
            requests: BTreeMap::new(),
            tokens: HashMap::new(),
            watched: BTreeSet::new(),
            service: HashMap::new(),
            tainted: BTreeSet::new(),
            last_fence: HashMap::new(),
            prev,
            seeds: vec![pad_seed(seed)],
            notifications: Vec::new(),
            acquire_log: Vec::new(),
            features: 0,
            trace: std::env::var_os("LEASEHOLD_FUZZ_TRACE").is_some(),
            strict_errors: STRICT_ERRORS,
        })
    }

    fn touch(&mut self, now: u64) {
        self.core_now = self.core_now.max(now);
    }

    /// True when an input at `now` runs no timer: every input first runs the timers due at
    /// its `now`, and a deadline may already be due (a late grant schedules a past renew).
    fn quiet(&mut self, now: u64) -> bool {
        self.client
            .poll_timeout()
            .is_none_or(|d| d > self.core_now.max(now))
    }

    /// For calls that may fail before or after taking their `now` into account.
    fn touch_if_recorded(&mut self, now: u64) {
        if now > self.core_now && self.client.now() == now {
            self.core_now = now;
        }
    }

    fn lease_idx(&self, id: LeaseId) -> Option<usize> {
        self.by_id.get(&id.0).copied()
    }

    fn pick_lease(&self, c: LeaseChoice) -> LeaseId {
        match c {
            LeaseChoice::Issued(i) if !self.leases.is_empty() => {
                self.leases[usize::from(i) % self.leases.len()].id
            }
            LeaseChoice::Issued(i) => LeaseId(u64::from(i)),
            LeaseChoice::Raw(v) => LeaseId(v),
        }
    }

    fn pick_req(&self, c: ReqChoice, kind: Kind) -> u64 {
        match c {
            ReqChoice::Outstanding(i) => {
                let open: Vec<u64> = self
                    .requests
                    .iter()
                    .filter(|(_, r)| r.kind == kind && !r.answered)
                    .map(|(id, _)| *id)
                    .collect();
                if open.is_empty() {
                    u64::MAX - u64::from(i)
                } else {
                    open[usize::from(i) % open.len()]
                }
            }
            ReqChoice::Seen(i) if !self.requests.is_empty() => *self
                .requests
                .keys()
                .nth(usize::from(i) % self.requests.len())
                .expect("index in range"),
            ReqChoice::Seen(i) => u64::from(i),
            ReqChoice::Raw(v) => v,
        }
    }

    /// Applies one op and checks everything.
    pub fn apply(&mut self, op: &Op) {
        if self.trace {
            eprintln!("op @host {} core {}: {op:?}", self.host_now, self.core_now);
        }
        match op {
            Op::Acquire {
                name,
                ttl,
                wait,
                reentrant,
            } => {
                let name = name_of(name);
                self.acquire(&name, ttl_of(*ttl), wait_of(*wait), *reentrant);
            }
            Op::Release { lease } => {
                let id = self.pick_lease(*lease);
                self.release(id);
            }
            Op::AcquireResult { req, outcome } => {
                let r = self.pick_req(*req, Kind::Acquire);
                self.acquire_result(r, outcome);
            }
            Op::RenewResult { req, outcome } => {
                let r = self.pick_req(*req, Kind::Renew);
                let res = match outcome {
                    RenewOutcome::Renewed => RenewResult::Renewed,
                    RenewOutcome::Rejected => RenewResult::Rejected,
                    RenewOutcome::TransportError => RenewResult::TransportError,
                };
                self.renew_result(r, res);
            }
            Op::ReleaseResult { req, outcome } => {
                let r = self.pick_req(*req, Kind::Release);
                let res = match outcome {
                    ReleaseOutcome::Released => ReleaseResult::Released,
                    ReleaseOutcome::NotOwner => ReleaseResult::NotOwner,
                    ReleaseOutcome::TransportError => ReleaseResult::TransportError,
                };
                self.release_result(r, res);
            }
            Op::Notify { name } => {
                let name = name_of(name);
                self.notify(&name);
            }
            Op::Advance { step, fire } => {
                self.host_now = self.host_now.saturating_add(step_of(*step)).min(TIME_CAP);
                if *fire {
                    self.timeout(self.host_now);
                }
            }
            Op::Rewind { step } => {
                self.host_now = self.host_now.saturating_sub(step_of(*step));
            }
            Op::Timeout => self.timeout(self.host_now),
            Op::FireDeadline => {
                if let Some(d) = self.client.poll_timeout() {
                    self.host_now = self.host_now.max(d.min(TIME_CAP));
                }
                self.timeout(self.host_now);
            }
            Op::Serve { rounds, drop_some } => {
                for _ in 0..=(rounds % 4) {
                    self.serve(*drop_some, false);
                }
            }
            Op::Reseed { seed } => {
                let seed = &seed.0;
                let before = self.client.counters();
                match self.client.reseed(seed) {
                    Ok(()) => {
                        check!(
                            seed.len() >= MIN_SEED_LEN,
                            "seed",
                            "reseed accepted short seed"
                        );
                        self.seeds.push(seed.clone());
                    }
                    Err(Error::SeedTooShort { len }) => {
                        check!(
                            seed.len() < MIN_SEED_LEN && len == seed.len(),
                            "seed",
                            "SeedTooShort for {} bytes",
                            seed.len()
                        );
                    }
                    Err(e) => violated("errors", format_args!("reseed returned {e:?}")),
                }
                check!(
                    self.client.counters() == before,
                    "errors",
                    "reseed changed counters"
                );
                let mut ctx = OpCtx::default();
                self.drain(&mut ctx);
                check!(ctx.outputs == 0, "errors", "reseed produced outputs");
            }
        }
        self.check_all();
    }

    // ----- inputs ---------------------------------------------------------------------------

    fn acquire(&mut self, name: &str, ttl_ms: u64, wait_ns: u64, reentrant: bool) {
        let now = self.host_now;
        let before = self.client.counters();
        let opts = AcquireOptions {
            ttl_ms,
            wait_ns,
            reentrant,
            auto_renew: true,
        };
        let joinable: Option<LeaseId> = if reentrant {
            self.leases
                .iter()
                .find(|l| l.reentrant && l.terminal.is_none() && l.name == name)
                .map(|l| l.id)
        } else {
            None
        };
        let quiet = self.quiet(now);
        let res = self.client.acquire(now, name, opts);
        match res {
            Ok(id) => {
                self.touch(now);
                check!(
                    name_valid(name),
                    "errors",
                    "acquire accepted invalid name {name:?}"
                );
                check!(
                    ttl_ms > 0 && ttl_ms <= self.cfg.max_ttl_ms,
                    "errors",
                    "acquire accepted ttl {ttl_ms} (max {})",
                    self.cfg.max_ttl_ms
                );
                let mut ctx = OpCtx::default();
                if let Some(idx) = self.lease_idx(id) {
                    // Joined an existing reentrant lease.
                    let l = &mut self.leases[idx];
                    check!(
                        reentrant && l.reentrant && l.terminal.is_none() && l.name == name,
                        "reentrancy",
                        "acquire returned existing lease {id} ({l:?}) for {name:?} reentrant={reentrant}"
                    );
                    l.holders += 1;
                    ctx.rejoined = Some(id);
                    self.drain(&mut ctx);
                    check!(
                        !quiet || self.client.counters().acquires_sent == before.acquires_sent,
                        "reentrancy",
                        "reentrant join sent an acquire"
                    );
                } else {
                    self.leases.push(LeaseModel {
                        id,
                        name: name.to_owned(),
                        ttl_ms,
                        wait_ns,
                        reentrant,
                        started_at: self.core_now,
                        holders: 1,
                        acquired: false,
                        terminal: None,
                        ended_at: None,
                        token: None,
                        vu_bound: None,
                        fence: None,
                        data_ok: vec![Vec::new()],
                        expected_fence: None,
                        slot: None,
                    });
                    self.by_id.insert(id.0, self.leases.len() - 1);
                    self.drain(&mut ctx);
                    if let Some(j) = joinable {
                        check!(
                            ctx.ended.contains(&j),
                            "reentrancy",
                            "reentrant acquire of {name:?} made new lease {id} while {j} is live"
                        );
                    }
                }
            }
            Err(e) => {
                self.features |= 1
                    << match &e {
                        Error::EmptyName => 20,
                        Error::NameTooLong { .. } => 21,
                        Error::NameHasNul => 22,
                        Error::InvalidTtl { .. } => 23,
                        Error::TooManyLeases => 24,
                        _ => 25,
                    };
                match &e {
                    Error::EmptyName => check!(name.is_empty(), "errors", "EmptyName for {name:?}"),
                    Error::NameTooLong { len } => check!(
                        *len == name.len() && *len > MAX_NAME_LEN,
                        "errors",
                        "NameTooLong{{{len}}} for {} bytes",
                        name.len()
                    ),
                    Error::NameHasNul => {
                        check!(name.contains('\0'), "errors", "NameHasNul for {name:?}")
                    }
                    Error::InvalidTtl { ttl_ms: t, .. } => {
                        check!(
                            *t == ttl_ms,
                            "errors",
                            "InvalidTtl names {t}, asked {ttl_ms}"
                        )
                    }
                    Error::TooManyLeases => check!(
                        before.live_leases >= u64::from(self.cfg.max_leases),
                        "errors",
                        "TooManyLeases with {} live records (max {})",
                        before.live_leases,
                        self.cfg.max_leases
                    ),
                    other => violated("errors", format_args!("acquire returned {other:?}")),
                }
                if name_valid(name) {
                    check!(
                        !matches!(
                            e,
                            Error::EmptyName | Error::NameTooLong { .. } | Error::NameHasNul
                        ),
                        "errors",
                        "valid name {name:?} refused: {e:?}"
                    );
                }
                if matches!(e, Error::TooManyLeases) && !self.strict_errors {
                    // Checked after the call's `now` ran the due timers.
                    self.touch_if_recorded(now);
                    let mut ctx = OpCtx::default();
                    self.drain(&mut ctx);
                } else {
                    self.expect_unchanged(&before, "acquire error");
                }
            }
        }
    }

    /// After a refused call: no outputs, no counter changes (time may be clamped).
    fn expect_unchanged(&mut self, before: &Counters, what: &str) {
        let mut after = self.client.counters();
        after.time_clamped = before.time_clamped;
        check!(
            after == *before,
            "errors",
            "{what} changed counters: {before:?} -> {after:?}"
        );
        let mut ctx = OpCtx::default();
        self.drain(&mut ctx);
        check!(
            ctx.outputs == 0,
            "errors",
            "{what} produced {} outputs",
            ctx.outputs
        );
    }

    fn release(&mut self, id: LeaseId) {
        let now = self.host_now;
        let before = self.client.counters();
        let res = self.client.release(now, id);
        let idx = self.lease_idx(id);
        match (res, idx) {
            (Err(Error::UnknownLease(x)), None) => {
                check!(x == id, "errors", "UnknownLease({x}) for {id}");
                self.expect_unchanged(&before, "release of unknown lease");
            }
            (Err(e), None) => violated(
                "errors",
                format_args!("release of never-issued {id} returned {e:?}"),
            ),
            (Ok(()), None) => violated(
                "errors",
                format_args!("release of never-issued {id} succeeded"),
            ),
            (Err(Error::LeaseEnded(x)), Some(i)) => {
                check!(x == id, "errors", "LeaseEnded({x}) for {id}");
                if self.strict_errors {
                    self.expect_unchanged(&before, "release of ended lease");
                    check!(
                        self.leases[i].terminal.is_some(),
                        "errors",
                        "release of live lease {id} returned LeaseEnded"
                    );
                } else {
                    // The call's `now` may run due timers first (the lease may end then).
                    let was_live = self.leases[i].terminal.is_none();
                    self.touch_if_recorded(now);
                    let mut ctx = OpCtx::default();
                    self.drain(&mut ctx);
                    check!(
                        !was_live || ctx.ended.contains(&id),
                        "errors",
                        "release of live lease {id} returned LeaseEnded"
                    );
                }
            }
            (Err(e), Some(_)) => violated("errors", format_args!("release of {id} returned {e:?}")),
            (Ok(()), Some(i)) => {
                self.touch(now);
                let was = self.leases[i].terminal;
                check!(
                    was.is_none(),
                    "I2",
                    "release of ended lease {id} ({:?}) returned Ok",
                    was
                );
                let holders = self.leases[i].holders;
                let mut ctx = OpCtx {
                    releasing: Some(id),
                    ..OpCtx::default()
                };
                self.drain(&mut ctx);
                let l = &mut self.leases[i];
                if holders > 1 {
                    l.holders -= 1;
                    check!(
                        !ctx.ended.contains(&id) || l.terminal != Some(Terminal::Released),
                        "reentrancy",
                        "release with {holders} holders ended lease {id}"
                    );
                } else {
                    check!(
                        l.terminal.is_some(),
                        "I2",
                        "release of {id} (last holder) emitted no terminal event"
                    );
                }
            }
        }
    }

    fn acquire_result(&mut self, r: u64, outcome: &AcquireOutcome) {
        let now = self.host_now;
        let data;
        let mut fed_fence = None;
        let mut granted_ttl = 0;
        let req = self.requests.get(&r).cloned();
        let res = match outcome {
            AcquireOutcome::Granted {
                fence,
                ttl,
                data: d,
            } => {
                data = data_of(d);
                let asked = req.as_ref().map_or(1_000, |q| q.ttl_ms);
                granted_ttl = match ttl {
                    GrantTtl::AsRequested => asked,
                    GrantTtl::Ms(ms) => u64::from(*ms),
                    GrantTtl::Raw(v) => *v,
                };
                let f = match (fence, &req) {
                    (FenceChoice::Next, Some(q)) if q.kind == Kind::Acquire => {
                        let svc = self.service.entry(q.name.clone()).or_default();
                        if svc.holder != Some(q.token) {
                            svc.fence += 1;
                            svc.holder = Some(q.token);
                        }
                        svc.expires = now.saturating_add(granted_ttl.saturating_mul(1_000_000));
                        svc.fence
                    }
                    (FenceChoice::Next, _) => 1,
                    (FenceChoice::Raw(v), q) => {
                        if let Some(q) = q {
                            self.tainted.insert(q.name.clone());
                        }
                        *v
                    }
                };
                fed_fence = Some(f);
                AcquireResult::Granted {
                    fencing_token: f,
                    ttl_ms: granted_ttl,
                    backend_data: &data,
                }
            }
            AcquireOutcome::HeldByOther { retry_after_ms } => AcquireResult::HeldByOther {
                retry_after_ms: *retry_after_ms,
            },
            AcquireOutcome::TransportError => AcquireResult::TransportError,
        };
        let data_len = match res {
            AcquireResult::Granted { backend_data, .. } => backend_data.len(),
            _ => 0,
        };
        self.feed_result(
            r,
            Kind::Acquire,
            |c| c.handle_acquire_result(now, RequestId(r), res),
            data_len,
            fed_fence,
            granted_ttl,
            outcome_data(&res),
        );
    }

    fn renew_result(&mut self, r: u64, res: RenewResult) {
        let now = self.host_now;
        if let Some(q) = self.requests.get(&r).cloned()
            && q.kind == Kind::Renew
            && !q.answered
        {
            let svc = self.service.entry(q.name.clone()).or_default();
            match res {
                RenewResult::Renewed => {
                    svc.holder = Some(q.token);
                    svc.expires = now.saturating_add(q.ttl_ms.saturating_mul(1_000_000));
                }
                RenewResult::Rejected => {
                    if svc.holder == Some(q.token) {
                        svc.holder = None;
                    }
                }
                RenewResult::TransportError => {}
            }
        }
        self.feed_result(
            r,
            Kind::Renew,
            |c| c.handle_renew_result(now, RequestId(r), res),
            0,
            None,
            0,
            None,
        );
    }

    fn release_result(&mut self, r: u64, res: ReleaseResult) {
        let now = self.host_now;
        if let Some(q) = self.requests.get(&r).cloned()
            && q.kind == Kind::Release
            && !q.answered
            && res == ReleaseResult::Released
        {
            let svc = self.service.entry(q.name.clone()).or_default();
            if svc.holder == Some(q.token) {
                svc.holder = None;
            }
        }
        self.feed_result(
            r,
            Kind::Release,
            |c| c.handle_release_result(now, RequestId(r), res),
            0,
            None,
            0,
            None,
        );
    }

    /// Feeds one result and checks stale handling, errors and the model updates.
    #[allow(clippy::too_many_arguments)]
    fn feed_result(
        &mut self,
        r: u64,
        kind: Kind,
        call: impl FnOnce(&mut Client) -> Result<(), Error>,
        data_len: usize,
        fed_fence: Option<u64>,
        granted_ttl_ms: u64,
        grant_data: Option<Vec<u8>>,
    ) {
        let now = self.host_now;
        let before = self.client.counters();
        let req = self.requests.get(&r).cloned();
        let definitely_stale = match &req {
            None => true,
            Some(q) => q.kind != kind || q.answered,
        };
        let quiet = self.quiet(now);
        // Remember the fed fence so the `Acquired` it causes can be checked (I4).
        let lease_idx = req.as_ref().and_then(|q| self.lease_idx(q.lease));
        if let (Some(f), Some(i), false) = (fed_fence, lease_idx, definitely_stale) {
            self.leases[i].expected_fence = Some(f);
        }
        let res = call(&mut self.client);
        if grant_data.as_ref().is_some_and(|d| d.is_empty()) {
            self.dataless_grant_fed = true;
        }
        match res {
            Ok(()) => {}
            Err(Error::BackendDataTooLong { len }) => {
                check!(
                    len == data_len && data_len > MAX_BACKEND_DATA_LEN,
                    "errors",
                    "BackendDataTooLong{{{len}}} for {data_len} bytes"
                );
                if let Some(i) = lease_idx {
                    self.leases[i].expected_fence = None;
                }
                self.expect_unchanged(&before, "refused result");
                return;
            }
            Err(e) => violated(
                "errors",
                format_args!("result for request {r} returned {e:?}"),
            ),
        }
        check!(
            data_len <= MAX_BACKEND_DATA_LEN,
            "errors",
            "accepted {data_len} bytes of backend data"
        );
        // Any grant the service applied for this lease's token may be echoed from now on,
        // a duplicate or superseded answer's too: the core keeps the newest grant's data for
        // its cleanup release, whichever answer brought it.
        if let (Some(i), Some(d)) = (lease_idx, &grant_data) {
            let ok = &mut self.leases[i].data_ok;
            if !ok.contains(d) {
                ok.push(d.clone());
            }
        }
        self.touch(now);
        if definitely_stale {
            let after = self.client.counters();
            check!(
                after.stale_results == before.stale_results + 1,
                "I2",
                "stale result for {r} ({req:?}) counted {} -> {}",
                before.stale_results,
                after.stale_results
            );
        }
        // Bookkeeping for grants before draining: the token now exists on the service.
        let mut newly_granted_token = None;
        if let (Some(q), false) = (&req, definitely_stale)
            && q.kind == Kind::Acquire
            && let Some(ttl) = fed_fence.map(|_| granted_ttl_ms)
        {
            newly_granted_token = Some((q.token, ttl));
        }
        if let (Some(q), Some(i), false) = (&req, lease_idx, definitely_stale) {
            // Model the confirmation for I1 (valid_until bound) and the leak check.
            let l = &mut self.leases[i];
            match kind {
                Kind::Acquire if fed_fence.is_some() && l.terminal.is_none() => {
                    let ttl = granted_ttl_ms.min(q.ttl_ms);
                    let bound = vu_bound(&self.cfg, q.t_sent, ttl);
                    l.vu_bound = Some(l.vu_bound.map_or(bound, |b| b.max(bound)));
                }
                _ => {}
            }
        }
        let mut ctx = OpCtx::default();
        self.drain(&mut ctx);
        if let Some(i) = lease_idx {
            self.leases[i].expected_fence = None;
        }
        if definitely_stale {
            // Every input first runs the timers due at its `now`; at an unchanged time none
            // are due, so a stale result must change nothing at all.
            if quiet {
                check!(
                    ctx.outputs == 0,
                    "I2",
                    "stale result for {r} ({req:?}) produced {} outputs",
                    ctx.outputs
                );
            }
            return;
        }
        let q = req.expect("not stale");
        if let Some(x) = self.requests.get_mut(&r) {
            x.answered = true;
        }
        let after = self.client.counters();
        let counted_stale = after.stale_results > before.stale_results;
        match kind {
            Kind::Acquire => {
                if let Some((tok, ttl)) = newly_granted_token {
                    let accepted = after.grants > before.grants;
                    if let (true, Some(i), Some(d)) = (accepted, lease_idx, grant_data) {
                        self.leases[i].data_ok = vec![d];
                    }
                    let ended = lease_idx.and_then(|i| self.leases[i].terminal).is_some();
                    let t = self.tokens.entry(tok).or_default();
                    if accepted || counted_stale || ended {
                        // The service now holds a grant for this token either way.
                        t.granted = true;
                        t.last_confirm = self.core_now;
                        t.confirm_ttl_ns = ttl.min(q.ttl_ms).saturating_mul(1_000_000);
                        if !accepted {
                            t.late_grant_at = Some(self.core_now);
                        }
                    }
                }
            }
            Kind::Renew => {
                if after.renewals_ok > before.renewals_ok {
                    if let Some(i) = lease_idx {
                        let l = &mut self.leases[i];
                        let bound = vu_bound(&self.cfg, q.t_sent, q.ttl_ms);
                        l.vu_bound = Some(l.vu_bound.map_or(bound, |b| b.max(bound)));
                    }
                    let t = self.tokens.entry(q.token).or_default();
                    t.last_confirm = self.core_now;
                    t.confirm_ttl_ns = q.ttl_ms.saturating_mul(1_000_000);
                }
            }
            Kind::Release => {}
        }
    }

    fn notify(&mut self, name: &str) {
        let now = self.host_now;
        let before = self.client.counters();
        match self.client.handle_released(now, name) {
            Ok(()) => {
                self.touch(now);
                let mut ctx = OpCtx::default();
                self.drain(&mut ctx);
            }
            Err(e) => {
                check!(
                    !name_valid(name)
                        && matches!(
                            e,
                            Error::EmptyName | Error::NameTooLong { .. } | Error::NameHasNul
                        ),
                    "errors",
                    "handle_released({name:?}) returned {e:?}"
                );
                self.expect_unchanged(&before, "handle_released error");
            }
        }
    }

    fn timeout(&mut self, now: u64) {
        self.client.handle_timeout(now);
        self.touch(now);
        let mut ctx = OpCtx::default();
        self.drain(&mut ctx);
        // I7 (no busy loop): after firing, the next deadline lies in the future; a few
        // immediate re-fires are tolerated, an endless chain is not.
        let mut spins = 0;
        while let Some(d) = self.client.poll_timeout() {
            if d > self.core_now {
                break;
            }
            spins += 1;
            check!(
                spins <= 4,
                "I7",
                "deadline {d} stays due at {} after {spins} handle_timeout calls",
                self.core_now
            );
            self.client.handle_timeout(self.core_now);
            let mut ctx = OpCtx::default();
            self.drain(&mut ctx);
        }
        self.check_deadlines_met();
    }

    /// I3: after the core handled its timers at `core_now`, nothing is overdue.
    fn check_deadlines_met(&self) {
        let now = self.core_now;
        let rt = self.cfg.request_timeout_ns;
        for l in self.leases.iter().filter(|l| l.terminal.is_none()) {
            if l.acquired {
                if let Ok(Some(v)) = self.client.valid_until(l.id) {
                    check!(
                        now < v,
                        "I3",
                        "lease {} still Held at {now} >= valid_until {v}",
                        l.id
                    );
                }
            } else {
                let limit = l.started_at.saturating_add(l.wait_ns).saturating_add(rt);
                // An unbounded wait (or one that saturates u64) has no deadline to miss.
                check!(
                    limit == u64::MAX || now < limit,
                    "I3",
                    "lease {} still Acquiring at {now}, past wait deadline + request timeout {limit}",
                    l.id
                );
            }
        }
    }

    // ----- reference service ----------------------------------------------------------------

    /// Answers every outstanding command as a correct service would. With `drop_some`, every
    /// third request is left unanswered (it must time out inside the core).
    fn serve(&mut self, drop_some: bool, quiescing: bool) {
        let open: Vec<(u64, ReqModel)> = self
            .requests
            .iter()
            .filter(|(_, r)| !r.answered)
            .map(|(k, r)| (*k, r.clone()))
            .collect();
        for (n, (id, q)) in open.into_iter().enumerate() {
            if drop_some && n % 3 == 2 {
                continue;
            }
            let now = self.host_now;
            match q.kind {
                Kind::Acquire => {
                    let svc = self.service.entry(q.name.clone()).or_default().clone();
                    let free = svc.holder.is_none() || svc.expires <= now;
                    if quiescing || !(free || svc.holder == Some(q.token)) {
                        let remaining = svc.expires.saturating_sub(now) / 1_000_000;
                        self.acquire_result(
                            id,
                            &AcquireOutcome::HeldByOther {
                                retry_after_ms: Some(remaining),
                            },
                        );
                    } else {
                        self.acquire_result(
                            id,
                            &AcquireOutcome::Granted {
                                fence: FenceChoice::Next,
                                ttl: GrantTtl::AsRequested,
                                data: DataChoice::Empty,
                            },
                        );
                    }
                }
                Kind::Renew => {
                    let svc = self.service.entry(q.name.clone()).or_default().clone();
                    let ok = svc.holder == Some(q.token) && svc.expires > now;
                    self.renew_result(
                        id,
                        if ok {
                            RenewResult::Renewed
                        } else {
                            RenewResult::Rejected
                        },
                    );
                }
                Kind::Release => {
                    let svc = self.service.entry(q.name.clone()).or_default().clone();
                    let ok = svc.holder == Some(q.token) && svc.expires > now;
                    self.release_result(
                        id,
                        if ok {
                            ReleaseResult::Released
                        } else {
                            ReleaseResult::NotOwner
                        },
                    );
                    if ok {
                        self.notifications.push(q.name.clone());
                    }
                }
            }
            self.check_all();
        }
        for name in std::mem::take(&mut self.notifications) {
            if self.watched.contains(&name) {
                self.notify(&name);
                self.check_all();
            }
        }
    }

    // ----- draining and the oracle ----------------------------------------------------------

    /// Runs one fabricated output through the oracle as if the core had emitted it (tests
    /// use it to show that the checks fire).
    #[doc(hidden)]
    pub fn inject_output(&mut self, out: Output) {
        let mut ctx = OpCtx::default();
        match out {
            Output::Command(c) => self.on_command(c),
            Output::Event(e) => self.on_event(e, &mut ctx),
        }
    }

    /// Ids of the leases issued so far.
    #[doc(hidden)]
    pub fn lease_ids(&self) -> Vec<LeaseId> {
        self.leases.iter().map(|l| l.id).collect()
    }

    fn drain(&mut self, ctx: &mut OpCtx) {
        // O(lease records): ended leases whose cleanup release is pending are records too.
        let live = self
            .leases
            .iter()
            .filter(|l| l.terminal.is_none())
            .count()
            .max(self.client.counters().live_leases as usize);
        let bound = DRAIN_BASE + DRAIN_PER_LEASE * (live + 1);
        while let Some(out) = self.client.poll_output() {
            if self.trace {
                eprintln!("   -> {out:?}");
            }
            ctx.outputs += 1;
            check!(
                ctx.outputs <= bound,
                "I7",
                "more than {bound} outputs in one drain ({live} lease records)"
            );
            match out {
                Output::Command(c) => {
                    self.features |= 1
                        << match c {
                            Command::Acquire { .. } => 0,
                            Command::Renew { .. } => 1,
                            Command::Release { .. } => 2,
                            Command::Watch { .. } => 3,
                            Command::Unwatch { .. } => 4,
                        };
                    self.on_command(c)
                }
                Output::Event(e) => {
                    self.features |= 1
                        << match e {
                            Event::Acquired { .. } => 8,
                            Event::AcquireFailed { reason, .. } => 8 + reason as u32,
                            Event::Lost { reason, .. } => 8 + reason as u32,
                            Event::Released { .. } => 15,
                            // Never asked for here (see `on_event`).
                            Event::Renewed { .. } | Event::ReleaseOutcome { .. } => 16,
                        };
                    ctx.events += 1;
                    self.on_event(e, ctx);
                }
            }
        }
    }

    fn on_command(&mut self, c: Command) {
        let now = self.core_now;
        let (request, lease, name, token, ttl_ms, kind, data) = match c {
            Command::Watch { name } => {
                check!(
                    self.watched.insert(name.to_string()),
                    "watch",
                    "Watch({name}) while already watched"
                );
                return;
            }
            Command::Unwatch { name } => {
                check!(
                    self.watched.remove(&*name),
                    "watch",
                    "Unwatch({name}) while not watched"
                );
                return;
            }
            Command::Acquire {
                request,
                lease,
                name,
                token,
                ttl_ms,
            } => (request, lease, name, token, ttl_ms, Kind::Acquire, None),
            Command::Renew {
                request,
                lease,
                name,
                token,
                ttl_ms,
                backend_data,
            } => (
                request,
                lease,
                name,
                token,
                ttl_ms,
                Kind::Renew,
                Some(backend_data),
            ),
            Command::Release {
                request,
                lease,
                name,
                token,
                backend_data,
            } => (
                request,
                lease,
                name,
                token,
                0,
                Kind::Release,
                Some(backend_data),
            ),
        };
        let tok = token.to_hex();
        check!(
            !self.requests.contains_key(&request.0),
            "ids",
            "request id {request} reused"
        );
        let Some(i) = self.lease_idx(lease) else {
            violated("ids", format_args!("command for unknown lease {lease}"));
        };
        let seeds_distinct = {
            let mut s = self.seeds.clone();
            s.sort();
            s.dedup();
            s.len() == self.seeds.len()
        };
        if kind == Kind::Acquire {
            self.acquire_log.push(request.0);
            if self.acquire_log.len() > ACQUIRE_LOG {
                self.acquire_log.remove(0);
            }
        }
        let l = &mut self.leases[i];
        check!(
            *name == l.name,
            "commands",
            "command name {name:?} for lease {l:?}"
        );
        l.slot.get_or_insert(request.0 & SLOT_MASK);
        match l.token {
            None => {
                check!(
                    kind == Kind::Acquire,
                    "commands",
                    "{kind:?} before any acquire of lease {lease}"
                );
                l.token = Some(tok);
                let prior = self.tokens.get(&tok).map(|t| t.lease);
                if seeds_distinct {
                    check!(
                        prior.is_none(),
                        "tokens",
                        "token {token} of lease {lease} already used by lease {prior:?}"
                    );
                }
                self.tokens.entry(tok).or_default().lease = lease.0;
            }
            Some(t) => check!(
                t == tok,
                "tokens",
                "lease {lease} changed token (rule 9) in a {kind:?}"
            ),
        }
        match kind {
            Kind::Acquire => {
                check!(
                    l.terminal.is_none() && !l.acquired,
                    "I2",
                    "Acquire command for lease {lease} in state {:?} acquired={}",
                    l.terminal,
                    l.acquired
                );
                check!(
                    ttl_ms == l.ttl_ms,
                    "commands",
                    "Acquire ttl {ttl_ms} != {}",
                    l.ttl_ms
                );
            }
            Kind::Renew => {
                check!(
                    l.terminal.is_none() && l.acquired,
                    "I2",
                    "Renew command for lease {lease}: terminal={:?} acquired={}",
                    l.terminal,
                    l.acquired
                );
                check!(
                    ttl_ms <= l.ttl_ms && ttl_ms > 0,
                    "commands",
                    "Renew ttl {ttl_ms}, asked {}",
                    l.ttl_ms
                );
            }
            Kind::Release => {
                self.tokens.entry(tok).or_default().release_sent = true;
            }
        }
        if let (Some(d), false) = (data, l.data_ok.is_empty()) {
            let got: &[u8] = d.as_deref().unwrap_or(&[]);
            check!(
                l.data_ok.iter().any(|x| x.as_slice() == got)
                    || (got.is_empty() && self.dataless_grant_fed),
                "commands",
                "{kind:?} for {lease} echoes backend data {got:?}, grants had {:?}",
                l.data_ok
            );
        }
        self.requests.insert(
            request.0,
            ReqModel {
                kind,
                lease,
                name: name.to_string(),
                token: tok,
                ttl_ms,
                t_sent: now,
                answered: false,
            },
        );
    }

    fn on_event(&mut self, e: Event, ctx: &mut OpCtx) {
        let lease = match e {
            Event::Acquired { lease, .. }
            | Event::AcquireFailed { lease, .. }
            | Event::Lost { lease, .. }
            | Event::Released { lease } => lease,
            // This harness never calls `renew` or `release_reported` (the simulator and the
            // ffi target do), so these reports must never appear.
            Event::Renewed { .. } | Event::ReleaseOutcome { .. } => {
                violated("contract", format_args!("unasked-for report {e:?}"))
            }
        };
        let Some(i) = self.lease_idx(lease) else {
            violated("ids", format_args!("event {e:?} for unknown lease"));
        };
        let now = self.core_now;
        let l = &mut self.leases[i];
        check!(
            l.terminal.is_none(),
            "I2",
            "event {e:?} after terminal {:?}",
            l.terminal
        );
        let terminal = match e {
            Event::Acquired {
                fencing_token,
                valid_until,
                ..
            } => {
                if let Some(f) = l.expected_fence.take() {
                    check!(
                        fencing_token == f,
                        "I4",
                        "Acquired({lease}) reports fence {fencing_token}, grant had {f}"
                    );
                    // I4 across leases of one name, when the service behaved.
                    if !self.tainted.contains(&l.name) {
                        if let Some((pl, pf)) = self.last_fence.get(&l.name) {
                            check!(
                                f > *pf || (*pl == lease.0 && f == *pf),
                                "I4",
                                "fence {f} of {lease} after {pf} of lease {pl} on {:?}",
                                l.name
                            );
                        }
                        self.last_fence.insert(l.name.clone(), (lease.0, f));
                    }
                } else {
                    check!(
                        ctx.rejoined == Some(lease) && l.acquired,
                        "I2",
                        "Acquired({lease}) without a grant or reentrant join"
                    );
                    check!(
                        l.fence == Some(fencing_token),
                        "I4",
                        "re-emitted Acquired({lease}) fence {fencing_token} != {:?}",
                        l.fence
                    );
                }
                if let Some(b) = l.vu_bound {
                    check!(
                        valid_until <= b,
                        "I1",
                        "Acquired({lease}) valid_until {valid_until} > bound {b}"
                    );
                }
                l.acquired = true;
                l.fence = Some(fencing_token);
                None
            }
            Event::AcquireFailed { reason, .. } => {
                check!(!l.acquired, "I2", "AcquireFailed for held lease {lease}");
                if reason == AcquireFailReason::Cancelled {
                    check!(
                        ctx.releasing == Some(lease),
                        "I2",
                        "AcquireFailed(Cancelled) for {lease} without release()"
                    );
                }
                Some(Terminal::AcquireFailed(reason))
            }
            Event::Lost { reason, .. } => {
                check!(l.acquired, "I2", "Lost for never-acquired lease {lease}");
                if reason == LostReason::Rejected
                    && let Some(t) = l.token
                {
                    self.tokens.entry(t).or_default().disowned = true;
                }
                Some(Terminal::Lost(reason))
            }
            Event::Released { .. } => {
                check!(
                    ctx.releasing == Some(lease),
                    "I2",
                    "Released({lease}) without release()"
                );
                check!(
                    l.acquired,
                    "I2",
                    "Released for never-acquired lease {lease}"
                );
                Some(Terminal::Released)
            }
            Event::Renewed { .. } | Event::ReleaseOutcome { .. } => None,
        };
        if let Some(t) = terminal {
            l.terminal = Some(t);
            l.ended_at = Some(now);
            ctx.ended.push(lease);
        }
    }

    /// Checks every getter of every lease against the model, plus the deadline and counters.
    pub fn check_all(&mut self) {
        let now = self.core_now;
        check!(
            self.client.now() == now,
            "time",
            "client.now() {} != max input time {now}",
            self.client.now()
        );
        let c = self.client.counters();
        let p = self.prev;
        let mono = [
            (p.acquires_sent, c.acquires_sent),
            (p.grants, c.grants),
            (p.acquire_failed, c.acquire_failed),
            (p.renewals_sent, c.renewals_sent),
            (p.renewals_ok, c.renewals_ok),
            (p.renewals_failed, c.renewals_failed),
            (p.releases_sent, c.releases_sent),
            (p.lost_rejected, c.lost_rejected),
            (p.lost_expired, c.lost_expired),
            (p.lost_fail_budget, c.lost_fail_budget),
            (p.stale_results, c.stale_results),
            (p.time_clamped, c.time_clamped),
        ];
        check!(
            mono.iter().all(|(a, b)| a <= b),
            "counters",
            "a counter decreased: {p:?} -> {c:?}"
        );
        self.prev = c;
        let live = self.leases.iter().filter(|l| l.terminal.is_none()).count() as u64;
        check!(
            c.live_leases >= live && c.live_leases <= self.leases.len() as u64,
            "I7",
            "live_leases {} outside [{live}, {}]",
            c.live_leases,
            self.leases.len()
        );
        check!(
            c.live_leases <= u64::from(self.cfg.max_leases),
            "I7",
            "live_leases {} > max_leases {}",
            c.live_leases,
            self.cfg.max_leases
        );
        check!(
            c.pending_cleanups <= c.live_leases,
            "I7",
            "pending_cleanups {} > lease records {}",
            c.pending_cleanups,
            c.live_leases
        );

        let deadline = self.client.poll_timeout();
        let rt = self.cfg.request_timeout_ns;
        for l in &self.leases {
            let st = self.client.lease_state(l.id);
            match (l.terminal, st) {
                (Some(t), Ok(s)) => check!(
                    s == t.state(),
                    "I2",
                    "lease {} ended {t:?} but state is {s:?}",
                    l.id
                ),
                (Some(_), Err(Error::LeaseEnded(x))) if x == l.id => continue,
                (None, Ok(s)) => {
                    let want = if l.acquired {
                        LeaseState::Held
                    } else {
                        LeaseState::Acquiring
                    };
                    check!(
                        s == want,
                        "I2",
                        "lease {} state {s:?}, model {want:?}",
                        l.id
                    );
                }
                (t, st) => violated(
                    "I2",
                    format_args!("lease {} (model {t:?}) lease_state {st:?}", l.id),
                ),
            }
            let info = self.client.lease_info(l.id).expect("record exists");
            check!(
                *info.name == l.name,
                "getters",
                "lease_info name {:?}",
                info.name
            );
            check!(
                self.client.fencing_token(l.id) == Ok(info.fencing_token)
                    && self.client.valid_until(l.id) == Ok(info.valid_until),
                "getters",
                "getters disagree with lease_info for {}",
                l.id
            );
            if l.terminal.is_none() {
                check!(
                    info.holders == l.holders,
                    "reentrancy",
                    "lease {} holders {} != model {}",
                    l.id,
                    info.holders,
                    l.holders
                );
            }
            if l.acquired {
                check!(
                    info.fencing_token == l.fence,
                    "I4",
                    "lease {} fencing_token {:?} != Acquired {:?}",
                    l.id,
                    info.fencing_token,
                    l.fence
                );
            }
            // I1.
            let held_now = self.client.is_held(l.id, now).expect("record exists");
            match info.valid_until {
                Some(v) => {
                    if let (Some(b), None) = (l.vu_bound, l.terminal) {
                        check!(v <= b, "I1", "lease {} valid_until {v} > bound {b}", l.id);
                    }
                    check!(
                        !self.client.is_held(l.id, v.max(now)).expect("record"),
                        "I1",
                        "lease {} is_held at valid_until {v}",
                        l.id
                    );
                    check!(
                        !held_now || now < v,
                        "I1",
                        "lease {} held at {now} >= {v}",
                        l.id
                    );
                    if l.terminal.is_none() && l.acquired {
                        check!(
                            deadline.unwrap_or(u64::MAX) <= v.max(now),
                            "I3",
                            "held lease {} valid until {v} but deadline {deadline:?}",
                            l.id
                        );
                    }
                }
                None => check!(!held_now, "I1", "lease {} held without valid_until", l.id),
            }
            check!(
                !held_now || (l.terminal.is_none() && l.acquired),
                "I1",
                "lease {} is_held in model state {:?}/{}",
                l.id,
                l.terminal,
                l.acquired
            );
            check!(
                !self.client.is_held(l.id, u64::MAX).expect("record"),
                "I1",
                "lease {} held forever",
                l.id
            );
            if l.terminal.is_none() && !l.acquired {
                let limit = l.started_at.saturating_add(l.wait_ns).saturating_add(rt);
                check!(
                    deadline.unwrap_or(u64::MAX) <= limit.max(now),
                    "I3",
                    "acquiring lease {} must end by {limit} but deadline is {deadline:?}",
                    l.id
                );
            }
        }
        // Ids never issued are unknown.
        for probe in [0u64, u64::MAX, 1 << 40] {
            if !self.by_id.contains_key(&probe) {
                check!(
                    self.client.lease_state(LeaseId(probe))
                        == Err(Error::UnknownLease(LeaseId(probe))),
                    "ids",
                    "never-issued lease {probe} is not UnknownLease"
                );
            }
        }
        // Watches only while someone waits on the name.
        for name in &self.watched {
            check!(
                self.leases
                    .iter()
                    .any(|l| l.terminal.is_none() && !l.acquired && &l.name == name),
                "watch",
                "{name:?} watched with no acquiring lease"
            );
        }
    }

    /// Releases everything, then lets a correct service answer until the core is idle.
    /// Checks that every lease ended, every granted token was released (rule 6) and the
    /// tables emptied (I7).
    pub fn quiesce(&mut self) {
        for i in 0..self.leases.len() {
            let mut guard = 0;
            while self.leases[i].terminal.is_none() {
                guard += 1;
                check!(guard < 1_000, "I2", "lease never ends under release()");
                let id = self.leases[i].id;
                self.release(id);
                self.check_all();
            }
        }
        let mut rounds = 0;
        loop {
            rounds += 1;
            check!(
                rounds < 500,
                "I7",
                "core not idle after {rounds} quiesce rounds: {:?}, deadline {:?}",
                self.client.counters(),
                self.client.poll_timeout()
            );
            let open = self.requests.values().any(|r| !r.answered);
            if open {
                self.serve(false, true);
                continue;
            }
            match self.client.poll_timeout() {
                Some(d) => {
                    self.host_now = self.host_now.max(d);
                    self.timeout(self.host_now);
                    self.check_all();
                }
                None => break,
            }
        }
        let c = self.client.counters();
        check!(
            c.pending_cleanups == 0 && c.live_leases == 0,
            "I7",
            "idle core keeps records: {c:?}"
        );
        check!(
            self.watched.is_empty(),
            "watch",
            "idle core watches {:?}",
            self.watched
        );
        for (tok, t) in &self.tokens {
            if !t.granted || t.release_sent || t.disowned {
                continue;
            }
            let ended = self
                .lease_idx(LeaseId(t.lease))
                .and_then(|i| self.leases[i].ended_at)
                .unwrap_or(0)
                .max(t.late_grant_at.unwrap_or(0));
            check!(
                ended >= t.last_confirm.saturating_add(t.confirm_ttl_ns),
                "rule6",
                "granted token {} of lease {} never released (ended {ended}, confirmed {} + {})",
                String::from_utf8_lossy(tok),
                t.lease,
                t.last_confirm,
                t.confirm_ttl_ns
            );
        }
    }
}

fn outcome_data(r: &AcquireResult<'_>) -> Option<Vec<u8>> {
    match r {
        AcquireResult::Granted { backend_data, .. } => Some(backend_data.to_vec()),
        _ => None,
    }
}

/// `t_sent + ttl − drift` (I1); a grant shorter than its drift is valid until `t_sent` at most.
fn vu_bound(cfg: &Config, t_sent: u64, ttl_ms: u64) -> u64 {
    let ttl_ns = ttl_ms.saturating_mul(1_000_000);
    let drift = cfg.drift_ns(ttl_ns);
    if ttl_ns > drift {
        t_sent.saturating_add(ttl_ns - drift)
    } else {
        t_sent
    }
}
