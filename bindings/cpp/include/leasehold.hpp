// leasehold.hpp — header-only C++20 binding for the leasehold lease core.
//
// Two layers:
//   * leasehold::Core      — a move-only RAII owner of one `lh_client` (the sans-IO core).
//                            Inputs in, typed outputs (a std::variant) out; misuse throws
//                            leasehold::Error. Not thread-safe (like the C handle).
//   * leasehold::LockClient — a thread-safe client that runs the canonical host loop on a
//                            driver thread and executes commands on an IO pool beside it,
//                            through a leasehold::Transport (see leasehold/memory_transport.hpp
//                            and leasehold/redis_transport.hpp).
//
// Threads of a LockClient:
//   driver     — owns every call into the core (under one mutex), waits for the earliest of
//                the core's deadline / a transport result / an application call / a release
//                notification. It never calls the transport, so a hung transport cannot delay
//                loss detection.
//   io pool    — runs Transport::acquire/renew/release (ClientOptions::io_threads threads).
//   watcher    — runs Transport::watch_waiter/unwatch in order (one thread).
//   callbacks  — runs on_lost callbacks and stops the lease's stop_token (one thread). A callback
//                that throws is logged, never fatal. Callbacks never run on the application
//                thread that called acquire()/release().
//
// Time is std::chrono::steady_clock in nanoseconds; the seed comes from std::random_device.
#pragma once

#include <leasehold.h>

// Test hooks (leasehold.h, LH_TESTING) are exported only by a library built with the `testing`
// feature. Weak references (ELF) let a program that calls one link against a release library
// too; there the call throws Error(status::no_testing_feature). Elsewhere the reference is strong.
#if defined(__ELF__)
#define LEASEHOLD_TEST_HOOK __attribute__((weak))
#define LEASEHOLD_HAS_TEST_HOOK(fn) (&(fn) != nullptr)
#else
#define LEASEHOLD_TEST_HOOK
#define LEASEHOLD_HAS_TEST_HOOK(fn) true
#endif
extern "C" lh_status lh_client_debug_panic(struct lh_client* c) LEASEHOLD_TEST_HOOK;

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <signal.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace leasehold {

// ---------------------------------------------------------------------------------------------
// Status codes and errors
// ---------------------------------------------------------------------------------------------

using Status = lh_status;

// Codes raised by the C++ layer itself; they never collide with LH_ERR_* (< 1000 by contract).
namespace status {
inline constexpr Status closed = 1000;            // the LockClient was closed
inline constexpr Status invalid_argument = 1001;  // e.g. a negative wait duration
inline constexpr Status abi_mismatch = 1002;      // header and library disagree on LH_ABI_VERSION
inline constexpr Status timeout = 1003;           // a bounded wait (Lease::renew) ran out
inline constexpr Status no_testing_feature = 1004;  // a test hook, the library built without it
}  // namespace status

inline std::string_view status_name(Status code) noexcept {
  switch (code) {
    case status::closed: return "LEASEHOLD_CLOSED";
    case status::invalid_argument: return "LEASEHOLD_INVALID_ARGUMENT";
    case status::abi_mismatch: return "LEASEHOLD_ABI_MISMATCH";
    case status::timeout: return "LEASEHOLD_TIMEOUT";
    case status::no_testing_feature: return "LEASEHOLD_NO_TESTING_FEATURE";
    default: {
      const char* s = lh_status_str(code);
      return s != nullptr ? std::string_view(s) : std::string_view("LH_UNKNOWN_STATUS");
    }
  }
}

// Thrown for caller misuse (and for a poisoned handle). Faults of the service or the network are
// never errors: they become events (AcquireFailed / Lost).
class Error : public std::runtime_error {
 public:
  Error(Status code, std::string_view detail)
      : std::runtime_error(format(code, detail)), code_(code), detail_(detail) {}
  [[nodiscard]] Status code() const noexcept { return code_; }
  // The handle's detail message (lh_client_last_error) or the C++ layer's explanation.
  [[nodiscard]] const std::string& detail() const noexcept { return detail_; }

 private:
  static std::string format(Status code, std::string_view detail) {
    std::string s(status_name(code));
    if (!detail.empty()) {
      s += ": ";
      s += detail;
    }
    return s;
  }
  Status code_;
  std::string detail_;
};

namespace detail {
// The error of a test hook that the linked library lacks.
[[noreturn]] inline void no_testing_feature(std::string_view hook) {
  throw Error(status::no_testing_feature,
              "this libleasehold was built without the `testing` feature: " + std::string(hook) +
                  " is a test hook (build the library with `cargo build --release --features testing`)");
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Small value types
// ---------------------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

// Monotonic nanoseconds: the `now` every core input takes.
inline std::uint64_t now_ns() noexcept {
  auto d = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch());
  return d.count() < 0 ? 0 : static_cast<std::uint64_t>(d.count());
}

inline Clock::time_point to_time_point(std::uint64_t ns) noexcept {
  constexpr auto max_ns = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max() / 2);
  const auto clamped = ns > max_ns ? max_ns : ns;
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::nanoseconds(static_cast<std::int64_t>(clamped))));
}

enum class AcquireFailReason : std::uint32_t {
  WaitExhausted = LH_REASON_WAIT_EXHAUSTED,
  Cancelled = LH_REASON_CANCELLED,
  Unavailable = LH_REASON_UNAVAILABLE,
};
enum class LostReason : std::uint32_t {
  Rejected = LH_REASON_REJECTED,
  Expired = LH_REASON_EXPIRED,
  FailBudget = LH_REASON_FAIL_BUDGET,
};
// What Lease::release() tells the caller; ordinary outcomes, never exceptions.
enum class ReleaseOutcome : std::uint32_t {
  Released,  // ended while still valid (the service confirmed, or could not answer before the TTL ran out)
  Lost,      // the lease was lost first (Lease::lost_reason() says why); the loss signals fired
  NotOwner,  // the service refused: the lock was no longer ours (someone else may hold it now)
};
// The service's answer to a release made with Core::release_reported (ReleaseOutcomeEvent).
enum class ReleaseReply : std::uint32_t {
  Confirmed = LH_REASON_RELEASE_CONFIRMED,
  NotOwner = LH_REASON_RELEASE_NOT_OWNER,
  Unconfirmed = LH_REASON_RELEASE_UNCONFIRMED,  // no answer before the grant's TTL had certainly run out
};
// Core::release_reported's immediate disposition.
enum class Releasing : std::uint32_t {
  HolderLeft = LH_RELEASING_HOLDER_LEFT,    // other reentrant holders remain; nothing was sent
  Pending = LH_RELEASING_PENDING,           // ended Released; a ReleaseOutcomeEvent follows
  Lost = LH_RELEASING_LOST,                 // validity had run out first: ended Lost (LostEvent queued)
  NotAcquired = LH_RELEASING_NOT_ACQUIRED,  // still acquiring: ended AcquireFailed
};
enum class LeaseState : std::uint32_t {
  Acquiring = LH_STATE_ACQUIRING,
  Held = LH_STATE_HELD,
  Released = LH_STATE_RELEASED,
  Lost = LH_STATE_LOST,
  AcquireFailed = LH_STATE_ACQUIRE_FAILED,
};

inline std::string_view to_string(AcquireFailReason r) noexcept {
  switch (r) {
    case AcquireFailReason::WaitExhausted: return "wait_exhausted";
    case AcquireFailReason::Cancelled: return "cancelled";
    case AcquireFailReason::Unavailable: return "unavailable";
  }
  return "unknown";
}
inline std::string_view to_string(LostReason r) noexcept {
  switch (r) {
    case LostReason::Rejected: return "rejected";
    case LostReason::Expired: return "expired";
    case LostReason::FailBudget: return "fail_budget";
  }
  return "unknown";
}
inline std::string_view to_string(ReleaseOutcome o) noexcept {
  switch (o) {
    case ReleaseOutcome::Released: return "released";
    case ReleaseOutcome::Lost: return "lost";
    case ReleaseOutcome::NotOwner: return "not_owner";
  }
  return "unknown";
}
inline std::string_view to_string(LeaseState s) noexcept {
  switch (s) {
    case LeaseState::Acquiring: return "acquiring";
    case LeaseState::Held: return "held";
    case LeaseState::Released: return "released";
    case LeaseState::Lost: return "lost";
    case LeaseState::AcquireFailed: return "acquire_failed";
  }
  return "unknown";
}

// Core configuration; Config::defaults() asks the library (lh_config_default).
struct Config {
  std::uint32_t drift_ppm = 0;
  std::uint64_t drift_fixed_ns = 0;
  std::uint32_t renew_jitter_ppm = 0;
  // Renewal failure budget: 0 (the default) = by time, transport failures are retried with
  // backoff while validity remains and the lease is lost just before valid_until; N > 0 = lost
  // after N consecutive failed renewals.
  std::uint32_t fail_budget = 0;
  std::uint64_t request_timeout_ns = 0;
  std::uint64_t backoff_base_ns = 0;
  std::uint64_t backoff_cap_ns = 0;
  std::uint64_t max_ttl_ms = 0;
  std::uint32_t max_leases = 0;
  bool notifications = true;

  static Config defaults() {
    lh_config c{};
    lh_config_default(&c);
    return from_c(c);
  }
  static Config from_c(const lh_config& c) {
    Config r;
    r.drift_ppm = c.drift_ppm;
    r.drift_fixed_ns = c.drift_fixed_ns;
    r.renew_jitter_ppm = c.renew_jitter_ppm;
    r.fail_budget = c.fail_budget;
    r.request_timeout_ns = c.request_timeout_ns;
    r.backoff_base_ns = c.backoff_base_ns;
    r.backoff_cap_ns = c.backoff_cap_ns;
    r.max_ttl_ms = c.max_ttl_ms;
    r.max_leases = c.max_leases;
    r.notifications = c.notifications != 0;
    return r;
  }
  [[nodiscard]] lh_config to_c() const {
    lh_config c{};
    lh_config_default(&c);  // sets struct_size and any field this header does not know yet
    c.drift_ppm = drift_ppm;
    c.drift_fixed_ns = drift_fixed_ns;
    c.renew_jitter_ppm = renew_jitter_ppm;
    c.fail_budget = fail_budget;
    c.request_timeout_ns = request_timeout_ns;
    c.backoff_base_ns = backoff_base_ns;
    c.backoff_cap_ns = backoff_cap_ns;
    c.max_ttl_ms = max_ttl_ms;
    c.max_leases = max_leases;
    c.notifications = notifications ? 1u : 0u;
    return c;
  }
};

struct LeaseInfo {
  LeaseState state = LeaseState::Acquiring;
  std::uint32_t holders = 0;
  std::optional<std::uint64_t> fencing_token;  // nullopt before the first grant
  std::optional<std::uint64_t> valid_until_ns;
};

struct Counters {
  std::uint64_t live_leases = 0, pending_cleanups = 0, acquires_sent = 0, grants = 0,
                acquire_failed = 0, renewals_sent = 0, renewals_ok = 0, renewals_failed = 0,
                releases_sent = 0, lost_rejected = 0, lost_expired = 0, lost_fail_budget = 0,
                stale_results = 0, time_clamped = 0;
  // Manual renewals (Lease::renew) and the outcomes of releases that reached the service.
  std::uint64_t renewals_requested = 0, releases_confirmed = 0, releases_not_owner = 0,
                releases_unconfirmed = 0, releases_lost = 0;
};

// ---------------------------------------------------------------------------------------------
// Typed outputs (owned copies of the borrowed lh_output fields)
// ---------------------------------------------------------------------------------------------

using Bytes = std::vector<std::uint8_t>;

struct AcquireCommand {
  std::uint64_t request = 0;
  std::uint64_t lease = 0;
  std::string name;
  std::string token;  // 32 lowercase hex chars
  std::uint64_t ttl_ms = 0;
};
struct RenewCommand {
  std::uint64_t request = 0;
  std::uint64_t lease = 0;
  std::string name;
  std::string token;
  std::uint64_t ttl_ms = 0;
  Bytes backend_data;
};
struct ReleaseCommand {
  std::uint64_t request = 0;
  std::uint64_t lease = 0;
  std::string name;
  std::string token;
  Bytes backend_data;
};
struct WatchCommand {
  std::string name;
};
struct UnwatchCommand {
  std::string name;
};
struct AcquiredEvent {
  std::uint64_t lease = 0;
  std::uint64_t fencing_token = 0;
  std::uint64_t valid_until_ns = 0;
};
struct AcquireFailedEvent {
  std::uint64_t lease = 0;
  AcquireFailReason reason = AcquireFailReason::WaitExhausted;
};
struct LostEvent {
  std::uint64_t lease = 0;
  LostReason reason = LostReason::Expired;
};
struct ReleasedEvent {
  std::uint64_t lease = 0;
};
// Completes a Core::renew (automatic renewals are silent).
struct RenewedEvent {
  std::uint64_t lease = 0;
  std::uint64_t valid_until_ns = 0;
};
// The service's answer to a Core::release_reported; follows that lease's ReleasedEvent.
struct ReleaseOutcomeEvent {
  std::uint64_t lease = 0;
  ReleaseReply reply = ReleaseReply::Confirmed;
};

using Output = std::variant<AcquireCommand, RenewCommand, ReleaseCommand, WatchCommand,
                            UnwatchCommand, AcquiredEvent, AcquireFailedEvent, LostEvent,
                            ReleasedEvent, RenewedEvent, ReleaseOutcomeEvent>;

template <class... Fs>
struct overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
overloaded(Fs...) -> overloaded<Fs...>;

// Results a host feeds back.
struct Granted {
  std::uint64_t fencing_token = 0;
  std::uint64_t ttl_ms = 0;
  Bytes backend_data;
};
struct HeldByOther {
  std::optional<std::uint64_t> retry_after_ms;  // remaining TTL of the holder, if known
};
struct TransportError {
  std::string message;
};
using AcquireResult = std::variant<Granted, HeldByOther, TransportError>;
enum class RenewResult : std::uint32_t {
  Renewed = LH_RENEW_RENEWED,
  Rejected = LH_RENEW_REJECTED,
  TransportError = LH_RENEW_TRANSPORT_ERROR,
};
enum class ReleaseResult : std::uint32_t {
  Released = LH_RELEASE_RELEASED,
  NotOwner = LH_RELEASE_NOT_OWNER,
  TransportError = LH_RELEASE_TRANSPORT_ERROR,
};

// ---------------------------------------------------------------------------------------------
// Core: RAII owner of one lh_client
// ---------------------------------------------------------------------------------------------

namespace detail {
struct ClientDeleter {
  void operator()(lh_client* c) const noexcept { lh_client_free(c); }
};

// A non-NULL pointer for empty spans: the C ABI treats NULL as an error even with length 0.
inline const std::uint8_t* bytes_ptr(const void* p) noexcept {
  static const std::uint8_t empty = 0;
  return p != nullptr ? static_cast<const std::uint8_t*>(p) : &empty;
}

inline std::string copy_str(const std::uint8_t* p, std::size_t n) {
  return (p == nullptr || n == 0) ? std::string() : std::string(reinterpret_cast<const char*>(p), n);
}
inline Bytes copy_bytes(const std::uint8_t* p, std::size_t n) {
  return (p == nullptr || n == 0) ? Bytes() : Bytes(p, p + n);
}

inline std::uint64_t to_u64_ns(std::chrono::nanoseconds d, const char* what) {
  if (d.count() < 0) throw Error(status::invalid_argument, std::string(what) + " must not be negative");
  return static_cast<std::uint64_t>(d.count());
}

inline std::array<std::uint8_t, 32> os_seed() {
  std::random_device rd;  // getrandom(2) / /dev/urandom on Linux
  std::array<std::uint8_t, 32> seed{};
  for (std::size_t i = 0; i < seed.size(); i += 4) {
    const auto v = static_cast<std::uint32_t>(rd());
    for (std::size_t j = 0; j < 4; ++j) seed[i + j] = static_cast<std::uint8_t>(v >> (8 * j));
  }
  return seed;
}
}  // namespace detail

inline std::string_view library_version() noexcept { return lh_version(); }
inline std::uint32_t library_abi_version() noexcept { return lh_abi_version(); }

// A backend request (lh_poll_request), owned: run argv verbatim on `connection`
// (LH_CONNECTION_COMMANDS or LH_CONNECTION_SUBSCRIBER) and answer `id`.
struct Request {
  std::uint64_t id = 0;
  std::uint32_t connection = 0;
  std::vector<std::string> argv;
};

// An SQL request (lh_sql_poll_request), owned: run the statements in order on `connection`
// (LH_SQL_CONNECTION_COMMANDS or LH_SQL_CONNECTION_LISTENER) and answer `id`.
struct SqlParam {
  std::uint32_t kind = LH_VALUE_NIL;  // LH_VALUE_NIL/INT/TEXT/BULK or LH_PARAM_HOST_*
  std::int64_t integer = 0;           // LH_VALUE_INT
  std::string bytes;                  // LH_VALUE_TEXT / LH_VALUE_BULK
};
struct SqlStatement {
  std::string sql;
  std::vector<SqlParam> params;  // ?1.. / $1.. in order
};
struct SqlRequest {
  std::uint64_t id = 0;
  std::uint32_t connection = 0;
  std::vector<SqlStatement> statements;
};
// What the backend said about one name (lh_poll_status); advisory.
struct LockStatus {
  std::uint64_t id = 0;
  bool ok = false;
  bool held = false;
  std::uint64_t fencing_token = 0, remaining_ttl_ms = 0, last_fencing_token = 0, held_for_ms = 0;
  std::int64_t holder_pid = 0;
  std::string holder_host, error;
};
using SqlStatus = LockStatus;  // its first name, from when only SQL answered status queries

// An HTTP request of the etcd protocol (lh_http_poll_request), owned.
struct HttpRequest {
  std::uint64_t id = 0;
  std::uint32_t kind = 0;  // LH_HTTP_UNARY, LH_HTTP_WATCH or LH_HTTP_CANCEL_WATCH
  std::string method, path, body, authorization;
};

class Core {
 public:
  using LeaseId = std::uint64_t;
  using RequestId = std::uint64_t;

  // Takes ownership of a handle made elsewhere (e.g. lh_client_new_redis: a backend-attached
  // core whose poll_output() yields events only and whose commands come from poll_request()).
  static Core adopt(lh_client* handle) {
    if (handle == nullptr) throw Error(LH_ERR_NULL_ARGUMENT, "Core::adopt: NULL handle");
    Core c(handle);
    return c;
  }

  // Seeded from the OS.
  explicit Core(const Config& config = Config::defaults()) {
    const auto seed = detail::os_seed();
    init(config, seed);
  }
  // Deterministic seed (tests, replays); at least 16 bytes.
  Core(const Config& config, std::span<const std::uint8_t> seed) { init(config, seed); }

  Core(Core&&) noexcept = default;
  Core& operator=(Core&&) noexcept = default;
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;
  ~Core() = default;

  [[nodiscard]] lh_client* handle() const noexcept { return h_.get(); }

  void reseed(std::span<const std::uint8_t> seed) {
    check(lh_client_reseed(h(), detail::bytes_ptr(seed.data()), seed.size()));
  }
  void reseed() {
    const auto seed = detail::os_seed();
    reseed(seed);
  }

  LeaseId acquire(std::uint64_t now, std::string_view name, std::chrono::milliseconds ttl,
                  std::chrono::nanoseconds wait = std::chrono::nanoseconds{0}, bool reentrant = false,
                  bool auto_renew = true) {
    if (ttl.count() < 0) throw Error(LH_ERR_INVALID_TTL, "ttl must not be negative");
    lh_acquire_options o{};
    lh_acquire_options_default(&o);
    o.ttl_ms = static_cast<std::uint64_t>(ttl.count());
    o.wait_ns = detail::to_u64_ns(wait, "wait");
    o.flags = (reentrant ? LH_ACQUIRE_REENTRANT : 0u) | (auto_renew ? 0u : LH_ACQUIRE_NO_AUTO_RENEW);
    std::uint64_t id = 0;
    check(lh_acquire(h(), now, detail::bytes_ptr(name.data()), name.size(), &o, &id));
    return id;
  }
  void release(std::uint64_t now, LeaseId lease) { check(lh_release(h(), now, lease)); }
  // A release that reports: Pending is followed by a ReleaseOutcomeEvent, Lost by a LostEvent.
  Releasing release_reported(std::uint64_t now, LeaseId lease) {
    std::uint32_t r = 0;
    check(lh_release_reported(h(), now, lease, &r));
    return static_cast<Releasing>(r);
  }
  // Renews now (or joins the renewal in flight); completes as a RenewedEvent or a LostEvent.
  // A lease whose validity already ran out gets its LostEvent queued and nothing is sent.
  void renew(std::uint64_t now, LeaseId lease) { check(lh_renew(h(), now, lease)); }

  void acquire_result(std::uint64_t now, RequestId req, const AcquireResult& r) {
    std::visit(overloaded{
                   [&](const Granted& g) {
                     check(lh_acquire_result(h(), now, req, LH_ACQUIRE_GRANTED, g.fencing_token,
                                             g.ttl_ms, LH_NO_RETRY_HINT,
                                             detail::bytes_ptr(g.backend_data.data()),
                                             g.backend_data.size()));
                   },
                   [&](const HeldByOther& o) {
                     check(lh_acquire_result(h(), now, req, LH_ACQUIRE_HELD_BY_OTHER, 0, 0,
                                             o.retry_after_ms.value_or(LH_NO_RETRY_HINT),
                                             detail::bytes_ptr(nullptr), 0));
                   },
                   [&](const TransportError&) {
                     check(lh_acquire_result(h(), now, req, LH_ACQUIRE_TRANSPORT_ERROR, 0, 0,
                                             LH_NO_RETRY_HINT, detail::bytes_ptr(nullptr), 0));
                   },
               },
               r);
  }
  void renew_result(std::uint64_t now, RequestId req, RenewResult r) {
    check(lh_renew_result(h(), now, req, static_cast<std::uint32_t>(r)));
  }
  void release_result(std::uint64_t now, RequestId req, ReleaseResult r) {
    check(lh_release_result(h(), now, req, static_cast<std::uint32_t>(r)));
  }
  // A release notification for `name` (watch).
  void released(std::uint64_t now, std::string_view name) {
    check(lh_released(h(), now, detail::bytes_ptr(name.data()), name.size()));
  }
  void timeout(std::uint64_t now) { check(lh_timeout(h(), now)); }

  // Next output, or nullopt when drained.
  std::optional<Output> poll_output() {
    lh_output o{};
    check(lh_poll_output(h(), &o));
    switch (o.kind) {
      case LH_OUTPUT_NONE: return std::nullopt;
      case LH_OUTPUT_ACQUIRE:
        return AcquireCommand{o.request_id, o.lease_id, detail::copy_str(o.name, o.name_len),
                              detail::copy_str(o.token, o.token_len), o.ttl_ms};
      case LH_OUTPUT_RENEW:
        return RenewCommand{o.request_id, o.lease_id, detail::copy_str(o.name, o.name_len),
                            detail::copy_str(o.token, o.token_len), o.ttl_ms,
                            detail::copy_bytes(o.backend_data, o.backend_data_len)};
      case LH_OUTPUT_RELEASE:
        return ReleaseCommand{o.request_id, o.lease_id, detail::copy_str(o.name, o.name_len),
                              detail::copy_str(o.token, o.token_len),
                              detail::copy_bytes(o.backend_data, o.backend_data_len)};
      case LH_OUTPUT_WATCH: return WatchCommand{detail::copy_str(o.name, o.name_len)};
      case LH_OUTPUT_UNWATCH: return UnwatchCommand{detail::copy_str(o.name, o.name_len)};
      case LH_OUTPUT_ACQUIRED: return AcquiredEvent{o.lease_id, o.fencing_token, o.valid_until_ns};
      case LH_OUTPUT_ACQUIRE_FAILED:
        return AcquireFailedEvent{o.lease_id, static_cast<AcquireFailReason>(o.reason)};
      case LH_OUTPUT_LOST: return LostEvent{o.lease_id, static_cast<LostReason>(o.reason)};
      case LH_OUTPUT_RELEASED: return ReleasedEvent{o.lease_id};
      case LH_OUTPUT_RENEWED: return RenewedEvent{o.lease_id, o.valid_until_ns};
      case LH_OUTPUT_RELEASE_OUTCOME: return ReleaseOutcomeEvent{o.lease_id, static_cast<ReleaseReply>(o.reason)};
      default:
        throw Error(LH_ERR_INVALID_ENUM, "unknown output kind " + std::to_string(o.kind));
    }
  }
  // Deadline (monotonic ns) by which timeout() must be called; nullopt = none.
  [[nodiscard]] std::optional<std::uint64_t> poll_timeout() {
    std::uint64_t d = LH_NO_DEADLINE;
    check(lh_poll_timeout(h(), &d));
    if (d == LH_NO_DEADLINE) return std::nullopt;
    return d;
  }

  [[nodiscard]] LeaseState lease_state(LeaseId lease) const {
    std::uint32_t s = 0;
    check(lh_lease_state(h(), lease, &s));
    return static_cast<LeaseState>(s);
  }
  [[nodiscard]] LeaseInfo lease_info(LeaseId lease) const {
    lh_lease_info i{};
    i.struct_size = sizeof(i);
    check(lh_lease_info_get(h(), lease, &i));
    LeaseInfo r;
    r.state = static_cast<LeaseState>(i.state);
    r.holders = i.holders;
    if (i.has_token != 0) r.fencing_token = i.fencing_token;
    if (i.valid_until_ns != 0) r.valid_until_ns = i.valid_until_ns;
    return r;
  }
  // nullopt before the first grant.
  [[nodiscard]] std::optional<std::uint64_t> fencing_token(LeaseId lease) const {
    std::uint64_t v = 0;
    const auto st = lh_fencing_token(h(), lease, &v);
    if (st == LH_ERR_NOT_GRANTED) return std::nullopt;
    check(st);
    return v;
  }
  [[nodiscard]] std::optional<std::uint64_t> valid_until(LeaseId lease) const {
    std::uint64_t v = 0;
    const auto st = lh_valid_until(h(), lease, &v);
    if (st == LH_ERR_NOT_GRANTED) return std::nullopt;
    check(st);
    return v;
  }
  [[nodiscard]] bool is_held(LeaseId lease, std::uint64_t now) const {
    bool held = false;
    check(lh_is_held(h(), lease, now, &held));
    return held;
  }
  [[nodiscard]] Counters counters() const {
    lh_counters c{};
    c.struct_size = sizeof(c);
    check(lh_counters_get(h(), &c));
    return Counters{c.live_leases,   c.pending_cleanups, c.acquires_sent,   c.grants,
                    c.acquire_failed, c.renewals_sent,   c.renewals_ok,     c.renewals_failed,
                    c.releases_sent,  c.lost_rejected,   c.lost_expired,    c.lost_fail_budget,
                    c.stale_results,  c.time_clamped,     c.renewals_requested, c.releases_confirmed,
                    c.releases_not_owner, c.releases_unconfirmed, c.releases_lost};
  }

  // Test hook: panics inside the C boundary; the handle is poisoned afterwards. Needs a library
  // built with the `testing` feature (else Error(status::no_testing_feature)).
  void debug_panic() {
    if (!LEASEHOLD_HAS_TEST_HOOK(lh_client_debug_panic)) detail::no_testing_feature("lh_client_debug_panic");
    check(lh_client_debug_panic(h()));
  }

  // --- backend-attached handles (lh_client_new_redis) ---
  // Next backend request, or nullopt when drained.
  std::optional<Request> poll_request() {
    lh_request r{};
    check(lh_poll_request(h(), &r));
    if (r.id == 0) return std::nullopt;
    Request out{r.id, r.connection, {}};
    out.argv.reserve(r.argc);
    for (std::uint32_t i = 0; i < r.argc; ++i) out.argv.push_back(detail::copy_str(r.argv[i].ptr, r.argv[i].len));
    return out;
  }
  // A flat reply (pre-order values, strings as offset/len into `data`).
  void reply(std::uint64_t now, RequestId req, std::span<const lh_value> values, std::string_view data) {
    check(lh_reply(h(), now, req, values.data(), values.size(), detail::bytes_ptr(data.data()), data.size()));
  }
  void request_failed(std::uint64_t now, RequestId req) { check(lh_request_failed(h(), now, req)); }
  void pubsub_message(std::uint64_t now, std::string_view channel, std::string_view payload) {
    check(lh_pubsub_message(h(), now, detail::bytes_ptr(channel.data()), channel.size(),
                            detail::bytes_ptr(payload.data()), payload.size()));
  }
  void subscription(std::uint64_t now, std::string_view channel, bool subscribed) {
    check(lh_subscription(h(), now, detail::bytes_ptr(channel.data()), channel.size(), subscribed ? 1u : 0u));
  }

  // --- SQL handles (lh_client_new_sql) ---
  // Next SQL request, or nullopt when drained.
  std::optional<SqlRequest> sql_poll_request() {
    lh_sql_request r{};
    check(lh_sql_poll_request(h(), &r));
    if (r.id == 0) return std::nullopt;
    SqlRequest out{r.id, r.connection, {}};
    const auto* d = r.data;
    auto slice = [&](std::uint64_t off, std::uint64_t len) {
      return (d == nullptr || off + len > r.data_len) ? std::string()
                                                      : std::string(reinterpret_cast<const char*>(d) + off, len);
    };
    out.statements.reserve(r.nstatements);
    for (std::uint32_t i = 0; i < r.nstatements; ++i) {
      const auto& st = r.statements[i];
      SqlStatement s{slice(st.sql_offset, st.sql_len), {}};
      for (std::uint32_t k = 0; k < st.nparams && st.first_param + k < r.nparams; ++k) {
        const auto& v = r.params[st.first_param + k];
        SqlParam p{v.kind, v.integer, {}};
        if (v.kind == LH_VALUE_TEXT || v.kind == LH_VALUE_BULK) p.bytes = slice(v.offset, v.len);
        s.params.push_back(std::move(p));
      }
      out.statements.push_back(std::move(s));
    }
    return out;
  }
  // Every statement's rows: one LH_VALUE_ARRAY per statement, of rows, each an array of columns.
  void sql_result(std::uint64_t now, RequestId req, std::span<const lh_value> values, std::string_view data) {
    check(lh_sql_result(h(), now, req, values.data(), values.size(), detail::bytes_ptr(data.data()), data.size()));
  }
  // kind: LH_SQL_FAILURE_TRANSPORT or LH_SQL_FAILURE_DATABASE; the message is cut to fit.
  void sql_failed(std::uint64_t now, RequestId req, std::uint32_t kind, std::string_view message) {
    message = message.substr(0, std::min<std::size_t>(message.size(), LH_MAX_SQL_MESSAGE));
    check(lh_sql_failed(h(), now, req, kind, detail::bytes_ptr(message.data()), message.size()));
  }
  void sql_notification(std::uint64_t now, std::string_view channel, std::string_view payload) {
    check(lh_sql_notification(h(), now, detail::bytes_ptr(channel.data()), channel.size(),
                              detail::bytes_ptr(payload.data()), payload.size()));
  }
  void sql_connection_reset(std::uint64_t now, std::uint32_t connection) {
    check(lh_sql_connection_reset(h(), now, connection));
  }
  // Queues a status query (any backend protocol); its answer comes from poll_status() with this id.
  std::uint64_t status_request(std::uint64_t now, std::string_view name) {
    std::uint64_t id = 0;
    check(lh_status_request(h(), now, detail::bytes_ptr(name.data()), name.size(), &id));
    return id;
  }
  std::optional<LockStatus> poll_status() {
    lh_lock_status s{};
    s.struct_size = sizeof s;
    check(lh_poll_status(h(), &s));
    if (s.id == 0) return std::nullopt;
    return LockStatus{s.id, s.ok != 0, s.held != 0, s.fencing_token, s.remaining_ttl_ms, s.last_fencing_token,
                     s.held_for_ms, s.holder_pid, detail::copy_str(s.holder_host, s.holder_host_len),
                     detail::copy_str(s.error, s.error_len)};
  }
  // The first names of status_request / poll_status.
  std::uint64_t sql_status_request(std::uint64_t now, std::string_view name) { return status_request(now, name); }
  std::optional<LockStatus> sql_poll_status() { return poll_status(); }
  // The last database error or refused schema (a foreign table of the same name…); empty if none.
  [[nodiscard]] std::string sql_last_error() const {
    const std::uint8_t* p = nullptr;
    std::size_t n = 0;
    check(lh_sql_last_error(h(), &p, &n));
    return detail::copy_str(p, n);
  }

  // --- etcd handles (lh_client_new_etcd) ---
  std::optional<HttpRequest> http_poll_request() {
    lh_http_request r{};
    check(lh_http_poll_request(h(), &r));
    if (r.id == 0) return std::nullopt;
    auto cstr = [](const char* p) { return p != nullptr ? std::string(p) : std::string(); };
    return HttpRequest{r.id, r.kind, cstr(r.method), cstr(r.path), detail::copy_str(r.body, r.body_len),
                       cstr(r.authorization)};
  }
  void http_reply(std::uint64_t now, RequestId req, std::uint32_t status, std::string_view body) {
    check(lh_http_reply(h(), now, req, status, detail::bytes_ptr(body.data()), body.size()));
  }
  void http_stream_message(std::uint64_t now, RequestId req, std::string_view message) {
    check(lh_http_stream_message(h(), now, req, detail::bytes_ptr(message.data()), message.size()));
  }
  void http_failed(std::uint64_t now, RequestId req, std::string_view message) {
    message = message.substr(0, std::min<std::size_t>(message.size(), LH_MAX_HTTP_BODY));
    check(lh_http_failed(h(), now, req, detail::bytes_ptr(message.data()), message.size()));
  }
  [[nodiscard]] lh_etcd_counters etcd_counters() const {
    lh_etcd_counters c{};
    c.struct_size = sizeof c;
    check(lh_etcd_counters_get(h(), &c));
    return c;
  }
  // Queues the revoke of the client's pooled etcd leases (lh_etcd_close).
  void etcd_close(std::uint64_t now) { check(lh_etcd_close(h(), now)); }
  // The last error body, transport failure or malformed reply the etcd protocol saw.
  [[nodiscard]] std::string etcd_last_error() const {
    const std::uint8_t* p = nullptr;
    std::size_t n = 0;
    check(lh_etcd_last_error(h(), &p, &n));
    return detail::copy_str(p, n);
  }

 private:
  explicit Core(lh_client* adopted) { h_.reset(adopted); }
  void init(const Config& config, std::span<const std::uint8_t> seed) {
    if (lh_abi_version() != LH_ABI_VERSION) {
      throw Error(status::abi_mismatch, "header LH_ABI_VERSION " + std::to_string(LH_ABI_VERSION) +
                                            " but library reports " + std::to_string(lh_abi_version()));
    }
    const lh_config c = config.to_c();
    lh_client* raw = nullptr;
    const auto st = lh_client_new(&c, detail::bytes_ptr(seed.data()), seed.size(), &raw);
    if (st != LH_OK) throw Error(st, "lh_client_new failed");
    h_.reset(raw);
  }
  lh_client* h() const {
    if (!h_) throw Error(LH_ERR_NULL_ARGUMENT, "use of a moved-from leasehold::Core");
    return h_.get();
  }
  void check(lh_status st) const {
    if (st == LH_OK) return;
    const char* msg = h_ ? lh_client_last_error(h_.get()) : nullptr;
    throw Error(st, msg != nullptr ? std::string_view(msg) : std::string_view());
  }

  std::unique_ptr<lh_client, detail::ClientDeleter> h_;
};

// ---------------------------------------------------------------------------------------------
// Transport: executes commands against a lock service (called from the IO pool; may block)
// ---------------------------------------------------------------------------------------------

class Backend;

class Transport {
 public:
  using ReleasedCallback = std::function<void(std::string_view name)>;

  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  virtual ~Transport() = default;

  // An exception thrown by acquire/renew/release is a transport error for the core (logged).
  virtual AcquireResult acquire(std::string_view name, std::string_view token, std::uint64_t ttl_ms) = 0;
  virtual RenewResult renew(std::string_view name, std::string_view token, std::uint64_t ttl_ms,
                            std::span<const std::uint8_t> backend_data) = 0;
  virtual ReleaseResult release(std::string_view name, std::string_view token,
                                std::span<const std::uint8_t> backend_data) = 0;
  // The core has waiters for `name` (watch) or no more (unwatch): deliver release notifications
  // of `name` to on_released (any thread) until unwatch. A transport may deliver only the ones
  // meant for this client (Redis wakes one waiting client per release) and spurious re-checks.
  virtual void watch(std::string_view /*name*/, ReleasedCallback /*on_released*/) {}
  virtual void unwatch(std::string_view /*name*/) {}
  // watch() for the core's waiters (LockClient uses this; unwatch() ends it). on_wake returns
  // false when no waiter here takes the wake-up (the last one just won or left, and unwatch is
  // still on its way): a transport that wakes one client per release then passes it on, or it
  // is lost. Re-checks may ignore the answer. Default: watch(), ignoring the answer.
  using WakeCallback = std::function<bool(std::string_view name)>;
  virtual void watch_waiter(std::string_view name, WakeCallback on_wake) {
    ReleasedCallback cb;
    if (on_wake) cb = [f = std::move(on_wake)](std::string_view n) { static_cast<void>(f(n)); };
    watch(name, std::move(cb));
  }
  // True when watch() delivers notifications (→ Config::notifications).
  [[nodiscard]] virtual bool notifications() const { return false; }
  // Non-null: LockClient drives a backend-attached core through it and never calls
  // acquire/renew/release/watch.
  virtual Backend* backend() { return nullptr; }
  // Called once by LockClient::close() after the driver stopped: make in-flight calls return
  // promptly (they become transport errors) and stop delivering notifications.
  virtual void close() {}
};

// What a backend executor hands back to the driver (fed to the core unread).
struct BackendInput {
  enum class Kind : std::uint8_t { Reply, Failed, Message, Subscription, Apply } kind = Kind::Failed;
  std::uint64_t id = 0;             // Reply, Failed
  std::vector<lh_value> values;     // Reply
  std::string data;                 // Reply: the data buffer; Message: the payload
  std::string channel;              // Message, Subscription
  bool subscribed = false;          // Subscription
  // Apply: feeds the core directly (SQL rows, HTTP replies, …), on the driver's side of the
  // mutex. Errors other than a panic are logged and ignored (the core's timeout then applies).
  std::function<void(Core&, std::uint64_t now)> apply;

  static BackendInput applying(std::function<void(Core&, std::uint64_t now)> f) {
    BackendInput in;
    in.kind = Kind::Apply;
    in.apply = std::move(f);
    return in;
  }
};

// An executor for a core that speaks a backend protocol itself (Redis): it makes the core
// handle and runs the core's requests verbatim. LockClient uses it instead of the command
// calls when Transport::backend() returns one.
class Backend {
 public:
  using Sink = std::function<void(BackendInput)>;
  virtual ~Backend() = default;
  virtual Core make_core(const Config& config) = 0;
  // Called once before any execute(); sink may be called from any thread until close().
  virtual void start(Sink sink) = 0;
  // Queues one request; never blocks on the network.
  virtual void execute(Request /*request*/) {}
  // Takes every pending request out of the core (under the client's mutex) and queues it;
  // never blocks on the network. Default: the Redis requests (lh_poll_request) to execute().
  virtual void drain(Core& core) {
    while (auto r = core.poll_request()) execute(std::move(*r));
  }
  // drain(), by a thread that calls run_pending() as soon as it has unlocked the client and
  // then waits for the answer: the executor may leave the requests to it (no thread hop).
  virtual void drain_for_caller(Core& core) { drain(core); }
  // Runs what drain_for_caller() left on the calling thread when its connection is free, or
  // hands it to the executor's own thread. Called without the client's mutex.
  virtual void run_pending() noexcept {}
  // What the protocol last saw go wrong (a database error, a refused schema, an error body).
  [[nodiscard]] virtual std::string last_error(const Core& /*core*/) const { return {}; }
  // True when the core's protocol answers status queries (SQL, Redis, etcd): LockClient::status().
  [[nodiscard]] virtual bool answers_status() const { return false; }
  // Called once by LockClient::close() after its releases were answered: queue in the core
  // the removal of what the client keeps on the server of its own (etcd: its pooled lease);
  // the requests then go out through drain(). Default: nothing.
  virtual void closing(Core& /*core*/, std::uint64_t /*now*/) {}
};

// ---------------------------------------------------------------------------------------------
// LockClient
// ---------------------------------------------------------------------------------------------

using LogFn = std::function<void(std::string_view message)>;

struct ClientOptions {
  Config config = Config::defaults();
  std::size_t io_threads = 4;
  // close() keeps driving releases for at most this long, then abandons them (the TTL frees them).
  std::chrono::milliseconds close_timeout{5000};
  // How long Lease::release() waits for the service's answer; nullopt = the request timeout.
  // Past it the release reports Released and the core keeps retrying in the background.
  std::optional<std::chrono::milliseconds> release_timeout;
  // Transport errors and callback exceptions; default: stderr.
  LogFn log;
};

struct AcquireOptions {
  std::chrono::nanoseconds wait{0};  // acquisition budget; 0 = one attempt
  bool reentrant = false;            // in-process reentrancy on this LockClient
  // false: no automatic renewals; only Lease::renew() extends the lease, which is lost when
  // its validity ends (on_lost and stop_token still fire).
  bool auto_renew = true;
  // Called once, on the callback thread, when this lease is lost (not on release).
  std::function<void(LostReason)> on_lost;
};

class Lease;
class LockClient;

namespace detail {
struct TestAccess;  // defined by tests only

// Threads that may write to sockets (transport calls) block SIGPIPE: a peer that went away must
// become an EPIPE transport error, never kill the process.
inline void block_sigpipe_in_this_thread() noexcept {
#if defined(__unix__) || defined(__APPLE__)
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
#endif
}

class Executor {
 public:
  explicit Executor(std::size_t threads) {
    if (threads == 0) threads = 1;
    for (std::size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { run(); });
  }
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  ~Executor() { shutdown(true); }

  void post(std::function<void()> f) {
    {
      std::lock_guard g(mu_);
      if (stop_) return;
      q_.push_back(std::move(f));
    }
    cv_.notify_one();
  }
  // Stops accepting work; runs (drop_pending=false) or discards what is queued; joins.
  void shutdown(bool drop_pending) {
    {
      std::lock_guard g(mu_);
      if (stop_ && workers_.empty()) return;
      stop_ = true;
      drop_ = drop_pending;
    }
    cv_.notify_all();
    for (auto& t : workers_)
      if (t.joinable()) t.join();
    workers_.clear();
    std::lock_guard g(mu_);
    q_.clear();
  }

 private:
  void run() {
    block_sigpipe_in_this_thread();
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock l(mu_);
        cv_.wait(l, [&] { return stop_ || !q_.empty(); });
        if (q_.empty() || (stop_ && drop_)) return;
        f = std::move(q_.front());
        q_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool stop_ = false;
  bool drop_ = false;
  std::vector<std::thread> workers_;
};

struct LeaseRecord {
  LeaseRecord(std::uint64_t i, std::string n) : id(i), name(std::move(n)) {}
  std::uint64_t id;
  std::string name;
  LeaseState state = LeaseState::Acquiring;
  std::uint64_t fencing_token = 0;
  std::atomic<std::uint64_t> valid_until_ns{0};  // last known; read without the lock after release
  std::atomic<std::uint32_t> lost_code{0};       // LostReason + 1 once lost; read after release too
  std::uint64_t renewed = 0;                     // RenewedEvents seen (Lease::renew waits on it)
  std::optional<ReleaseReply> release_reply;     // the service's answer to release_reported
  std::stop_source stop;
  std::vector<std::pair<std::uint64_t, std::function<void(LostReason)>>> on_lost;
};

struct InAcquire {
  std::uint64_t request;
  AcquireResult result;
};
struct InRenew {
  std::uint64_t request;
  RenewResult result;
};
struct InRelease {
  std::uint64_t request;
  ReleaseResult result;
};
struct InReleased {
  std::string name;
};
using Input = std::variant<InAcquire, InRenew, InRelease, InReleased, BackendInput>;

class ClientState : public std::enable_shared_from_this<ClientState> {
 public:
  ClientState(std::shared_ptr<Transport> transport, ClientOptions opts)
      : transport_(std::move(transport)), opts_(std::move(opts)) {
    if (!transport_) throw Error(LH_ERR_NULL_ARGUMENT, "LockClient needs a transport");
    if (!opts_.log) {
      opts_.log = [](std::string_view m) {
        std::fprintf(stderr, "leasehold: %.*s\n", static_cast<int>(m.size()), m.data());
      };
    }
    Config cfg = opts_.config;
    backend_ = transport_->backend();
    transport_notifications_ = backend_ == nullptr && transport_->notifications();
    if (backend_ != nullptr) {
      core_.emplace(backend_->make_core(cfg));  // the protocol decides about waiting itself
    } else {
      cfg.notifications = cfg.notifications && transport_notifications_;
      core_.emplace(cfg);  // throws on an invalid config; nothing started yet
    }
    request_timeout_ = std::chrono::nanoseconds(static_cast<std::int64_t>(
        std::min<std::uint64_t>(cfg.request_timeout_ns, std::uint64_t{1} << 50)));
  }
  ClientState(const ClientState&) = delete;
  ClientState& operator=(const ClientState&) = delete;
  ~ClientState() = default;

  void start() {
    io_ = std::make_unique<Executor>(opts_.io_threads);
    watcher_ = std::make_unique<Executor>(1);
    callbacks_ = std::make_unique<Executor>(1);
    if (backend_ != nullptr) backend_->start([this](BackendInput in) { feed_backend(std::move(in)); });
    driver_ = std::thread([this] { drive(); });
  }

  std::optional<Lease> acquire(std::string_view name, std::chrono::milliseconds ttl, AcquireOptions opts);
  ReleaseOutcome release(const std::shared_ptr<LeaseRecord>& rec, std::uint64_t holder,
                         std::optional<std::chrono::nanoseconds> timeout) noexcept;
  std::uint64_t renew(const std::shared_ptr<LeaseRecord>& rec);
  bool is_held(const LeaseRecord& rec) const;
  std::uint64_t valid_until(LeaseRecord& rec) const;
  LeaseState state(const LeaseRecord& rec) const {
    std::lock_guard g(mu_);
    return rec.state;
  }
  static std::optional<LostReason> lost_reason(const LeaseRecord& rec) noexcept {
    const auto c = rec.lost_code.load();
    if (c == 0) return std::nullopt;
    return static_cast<LostReason>(c - 1);
  }
  static void set_lost_reason(LeaseRecord& rec, LostReason r) noexcept {
    rec.lost_code = static_cast<std::uint32_t>(r) + 1;
  }
  Counters counters() const {
    std::lock_guard g(mu_);
    if (!core_) throw Error(status::closed, "LockClient is closed");
    return core_->counters();
  }
  std::string last_backend_error() const {
    std::lock_guard g(mu_);
    if (!core_ || backend_ == nullptr) return {};
    return backend_->last_error(*core_);
  }
  LockStatus status(std::string_view name, std::chrono::nanoseconds timeout) {
    std::unique_lock lk(mu_);
    if (closing_ || !core_) throw Error(status::closed, "LockClient is closed");
    if (broken_) throw Error(LH_ERR_POISONED, "the core handle failed earlier");
    if (backend_ == nullptr || !backend_->answers_status())
      throw Error(LH_ERR_NO_BACKEND, "status() needs a transport with a protocol (SQL, Redis, etcd)");
    const auto id = core_->status_request(now_ns(), name);  // throws on a bad name
    try {
      drain_locked();
    } catch (const std::exception& e) {
      fail_all_locked(e.what());
    }
    poke_locked();
    const auto bound = Clock::now() + std::clamp<std::chrono::nanoseconds>(timeout, {}, std::chrono::hours(24));
    waiters_cv_.wait_until(lk, bound, [&] { return statuses_.contains(id) || closing_ || broken_; });
    auto it = statuses_.find(id);
    if (it == statuses_.end()) {
      if (closing_) throw Error(status::closed, "LockClient closed during status");
      if (broken_) throw Error(LH_ERR_POISONED, "the core handle failed");
      abandoned_statuses_.insert(id);
      throw Error(status::timeout, "no answer to the status query in time");
    }
    LockStatus out = std::move(it->second);
    statuses_.erase(it);
    return out;
  }
  void close() noexcept;

  // The callback LockClient registers with Transport::watch_waiter (tests call it directly).
  Transport::WakeCallback waiter_callback() {
    return [weak = weak_from_this()](std::string_view name) {
      const auto s = weak.lock();
      return s && s->woken(name);
    };
  }

 private:
  friend struct TestAccess;
  void log(std::string_view m) const noexcept {
    try {
      opts_.log(m);
    } catch (...) {
    }
  }
  void push_input(Input in) {
    {
      std::lock_guard g(mu_);
      if (stopping_) return;
      inputs_.push_back(std::move(in));
    }
    driver_cv_.notify_one();
  }
  // (transport thread) A wake-up for `name`: fed to the core only if it waits for the name,
  // else declined so the transport passes it on (the core would drop it: lost wake-up).
  bool woken(std::string_view name) {
    {
      std::lock_guard g(mu_);
      if (stopping_ || closing_ || broken_ || !core_ || !core_watching_.contains(name)) return false;
      inputs_.push_back(InReleased{std::string(name)});
    }
    driver_cv_.notify_one();
    return true;
  }
  // (executor thread) Fed at once under the mutex, not through the driver: a reply reaches the
  // waiting application thread with one wake-up. The driver is woken only when the core's
  // deadline moved earlier (or it is held: then it queues as usual).
  void feed_backend(BackendInput in) {
    {
      std::lock_guard g(mu_);
      if (stopping_ || broken_ || !core_) return;
      if (hold_driver_) {
        inputs_.push_back(std::move(in));
        return;
      }
      try {
        Input i = std::move(in);
        feed_locked(i);
        drain_locked();
        if (closing_) waiters_cv_.notify_all();  // close() waits for the last cleanups' answers
        if (!driver_late_locked()) return;
      } catch (const std::exception& e) {
        fail_all_locked(e.what());
      }
      dirty_ = true;
    }
    driver_cv_.notify_one();
  }
  void poke_locked() {
    dirty_ = true;
    driver_cv_.notify_one();
  }
  // After a drain on this thread: whether the core's deadline is now earlier than the driver
  // will wake up (the driver drains and re-arms whenever it runs; waking it for nothing costs a
  // context switch per request).
  bool driver_late_locked() {
    const auto d = core_->poll_timeout();
    return d && *d < driver_until_;
  }
  // The calling thread waits for its own request's answer anyway: it drains the core (taking
  // the request instead of handing it to the executor's thread) and runs it itself, unlocked.
  void send_from_this_thread(std::unique_lock<std::mutex>& lk) {
    try {
      drain_locked(true);
      wake_driver_if_late_locked();
    } catch (const std::exception& e) {
      fail_all_locked(e.what());
      poke_locked();
    }
    lk.unlock();
    backend_->run_pending();
    lk.lock();
  }

  void wake_driver_if_late_locked() {
    if (driver_late_locked()) poke_locked();
  }
  void drive() noexcept;
  void feed_locked(Input& in);
  void feed_backend_locked(std::uint64_t now, BackendInput& in);
  void drain_locked(bool for_caller = false);
  void dispatch_locked(Output& out);
  void end_record_locked(LeaseRecord& rec, LeaseState st);
  void fail_all_locked(std::string_view why);
  void release_everything_locked();

  std::shared_ptr<Transport> transport_;
  Backend* backend_ = nullptr;  // owned by transport_
  ClientOptions opts_;
  std::chrono::nanoseconds request_timeout_{0};
  bool transport_notifications_ = false;

  mutable std::mutex mu_;
  std::condition_variable driver_cv_;   // driver waits here
  std::condition_variable waiters_cv_;  // acquirers and close() wait here
  std::optional<Core> core_;            // guarded by mu_; reset at close
  std::deque<Input> inputs_;
  std::unordered_map<std::uint64_t, std::shared_ptr<LeaseRecord>> records_;
  // Released leases whose release() waits for the service's answer (ReleaseOutcomeEvent).
  std::unordered_map<std::uint64_t, std::shared_ptr<LeaseRecord>> awaiting_reply_;
  // Names the core waits for, per its Watch/Unwatch outputs as dispatched (see woken()).
  std::set<std::string, std::less<>> core_watching_;
  // Answered status queries (LockClient::status) until their caller takes them.
  std::unordered_map<std::uint64_t, LockStatus> statuses_;
  std::set<std::uint64_t> abandoned_statuses_;  // their callers gave up waiting
  std::uint64_t next_holder_ = 0;
  std::size_t active_acquires_ = 0;
  bool dirty_ = false;
  bool closing_ = false;   // no new acquires; everything being released
  bool stopping_ = false;  // the driver is asked to exit
  bool closed_ = false;    // all threads joined
  bool broken_ = false;    // the core handle failed (poisoned)
  bool hold_driver_ = false;  // test hook (TestAccess): the driver waits, as in a starved process
  // When the waiting driver wakes up by itself (ns, the core's clock); 0 while it runs.
  std::uint64_t driver_until_ = 0;

  std::thread driver_;
  std::unique_ptr<Executor> io_, watcher_, callbacks_;
  std::mutex close_mu_;  // serializes close()
};

}  // namespace detail

// A held lease. Move-only; releases in its destructor (idempotent release()).
class Lease {
 public:
  Lease(Lease&& o) noexcept
      : st_(std::move(o.st_)), rec_(std::move(o.rec_)), holder_(o.holder_), fencing_(o.fencing_),
        outcome_(o.outcome_) {}
  Lease& operator=(Lease&& o) noexcept {
    if (this != &o) {
      release(std::chrono::nanoseconds{0});
      st_ = std::move(o.st_);
      rec_ = std::move(o.rec_);
      holder_ = o.holder_;
      fencing_ = o.fencing_;
      outcome_ = o.outcome_;
    }
    return *this;
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  // Releases without waiting for the service's answer (the core still retries it).
  ~Lease() { release(std::chrono::nanoseconds{0}); }

  // Releases this holder and says how the lease ended: Released, Lost (validity ran out first,
  // e.g. after a pause: the loss signals fire and lost_reason() says why) or NotOwner (the
  // service refused). Waits for the service's answer at most ClientOptions::release_timeout
  // (default: the request timeout); past it, Released (the core keeps retrying the release in
  // the background). Idempotent: later calls return the first outcome. Never throws.
  ReleaseOutcome release() noexcept { return release_impl(std::nullopt); }
  // The same with its own bound on the wait for the service's answer (0: do not wait).
  ReleaseOutcome release(std::chrono::nanoseconds timeout) noexcept { return release_impl(timeout); }
  // Renews now (manual renewal; joins one in flight) and returns the new end of validity.
  // Waits until the service confirms or the lease is lost (the core ends it by valid_until).
  // Throws leasehold::Error: LH_ERR_LEASE_ENDED when the lease was released or lost (before
  // the call, checked locally without a network call, or while waiting), status::closed,
  // status::timeout if the driver never answered (a starved process).
  Clock::time_point renew() {
    if (!st_) {
      throw Error(LH_ERR_LEASE_ENDED, !rec_                        ? "moved-from lease"
                                      : outcome_ == ReleaseOutcome::Lost ? "the lease was lost"
                                                                         : "the lease was released");
    }
    return to_time_point(st_->renew(rec_));
  }
  // The fencing token of the grant; carry it on every protected write.
  [[nodiscard]] std::uint64_t fencing_token() const noexcept { return fencing_; }
  // Advice only: true while this handle is unreleased and the core believes the lease valid now.
  [[nodiscard]] bool is_held() const { return st_ && st_->is_held(*rec_); }
  // End of the current validity window (moves forward with each confirmed renewal).
  [[nodiscard]] Clock::time_point valid_until() const {
    if (st_) return to_time_point(st_->valid_until(*rec_));
    return to_time_point(rec_ ? rec_->valid_until_ns.load() : 0);
  }
  // Stopped when the lease is lost (and when the LockClient closes under it).
  [[nodiscard]] std::stop_token stop_token() const noexcept {
    return rec_ ? rec_->stop.get_token() : std::stop_token();
  }
  [[nodiscard]] bool lost() const { return lost_reason().has_value(); }
  // Set once the lease is lost, and stays set after release().
  [[nodiscard]] std::optional<LostReason> lost_reason() const {
    if (!rec_) return std::nullopt;
    return detail::ClientState::lost_reason(*rec_);
  }
  [[nodiscard]] const std::string& name() const noexcept {
    static const std::string empty;
    return rec_ ? rec_->name : empty;
  }
  [[nodiscard]] std::uint64_t id() const noexcept { return rec_ ? rec_->id : 0; }
  // False after release() or a move.
  [[nodiscard]] bool owns() const noexcept { return st_ != nullptr; }

 private:
  friend class detail::ClientState;
  Lease(std::shared_ptr<detail::ClientState> st, std::shared_ptr<detail::LeaseRecord> rec,
        std::uint64_t holder, std::uint64_t fencing)
      : st_(std::move(st)), rec_(std::move(rec)), holder_(holder), fencing_(fencing) {}

  ReleaseOutcome release_impl(std::optional<std::chrono::nanoseconds> timeout) noexcept {
    if (st_) {
      outcome_ = st_->release(rec_, holder_, timeout);
      st_.reset();
    }
    return outcome_.value_or(ReleaseOutcome::Released);
  }

  std::shared_ptr<detail::ClientState> st_;
  std::shared_ptr<detail::LeaseRecord> rec_;
  std::uint64_t holder_ = 0;
  std::uint64_t fencing_ = 0;
  std::optional<ReleaseOutcome> outcome_;
};

// Thread-safe lock client: one core handle, one driver thread, one transport.
class LockClient {
 public:
  explicit LockClient(std::shared_ptr<Transport> transport, ClientOptions options = {})
      : st_(std::make_shared<detail::ClientState>(std::move(transport), std::move(options))) {
    st_->start();
  }
  LockClient(const LockClient&) = delete;
  LockClient& operator=(const LockClient&) = delete;
  // Move-only; a moved-from LockClient throws Error(status::closed) from acquire()/counters().
  LockClient(LockClient&& o) noexcept = default;
  LockClient& operator=(LockClient&& o) noexcept {
    if (this != &o) {
      close();
      st_ = std::move(o.st_);
    }
    return *this;
  }
  // Closes: releases every lease (bounded by close_timeout), stops all threads.
  ~LockClient() { close(); }

  // Acquires `name` for `ttl`, waiting at most options.wait (plus one request timeout) for a
  // grant. nullopt when the wait budget ran out, the service was unavailable, or the client
  // closed meanwhile. Throws leasehold::Error on misuse (bad name/ttl, too many leases, closed).
  std::optional<Lease> acquire(std::string_view name, std::chrono::milliseconds ttl,
                               AcquireOptions options = {}) {
    const auto st = state();  // keeps the state alive until this call returns
    return st->acquire(name, ttl, std::move(options));
  }
  [[nodiscard]] Counters counters() const { return state()->counters(); }
  // What the backend protocol last saw go wrong (SQL: a database error, a refused schema such
  // as a foreign table of the same name, a failed connection; etcd: an error body or a
  // transport failure). Empty when nothing did, or for transports without a protocol.
  [[nodiscard]] std::string last_backend_error() const { return state()->last_backend_error(); }
  // What the backend says about `name` now (SQL, Redis and etcd transports; advisory: it can
  // change at once): held or not, the holder's fence and remaining TTL, the last fence ever
  // minted (SQL, Redis), and on SQLite the holder's pid and host. A failed query is
  // `ok == false` with `error`. Throws leasehold::Error: LH_ERR_NO_BACKEND for other
  // transports (the memory service), a bad name as acquire() does,
  // status::timeout without an answer within `timeout`, status::closed.
  [[nodiscard]] LockStatus status(std::string_view name, std::chrono::nanoseconds timeout = std::chrono::seconds(10)) {
    return state()->status(name, timeout);
  }
  // Idempotent. Also called by the destructor.
  void close() noexcept {
    if (st_) st_->close();
  }

 private:
  friend struct detail::TestAccess;
  std::shared_ptr<detail::ClientState> state() const {
    if (!st_) throw Error(status::closed, "use of a moved-from LockClient");
    return st_;
  }
  std::shared_ptr<detail::ClientState> st_;
};

// ---------------------------------------------------------------------------------------------
// ClientState implementation
// ---------------------------------------------------------------------------------------------

namespace detail {

inline std::optional<Lease> ClientState::acquire(std::string_view name, std::chrono::milliseconds ttl,
                                                 AcquireOptions opts) {
  if (ttl.count() < 0) throw Error(LH_ERR_INVALID_TTL, "ttl must not be negative");
  const auto wait = std::chrono::nanoseconds(static_cast<std::int64_t>(to_u64_ns(opts.wait, "wait")));

  std::unique_lock lk(mu_);
  if (closing_ || !core_) throw Error(status::closed, "LockClient is closed");
  if (broken_) throw Error(LH_ERR_POISONED, "the core handle failed earlier");
  const std::uint64_t id = core_->acquire(now_ns(), name, ttl, wait, opts.reentrant, opts.auto_renew);  // throws on misuse
  auto& slot = records_[id];
  if (!slot) slot = std::make_shared<LeaseRecord>(id, std::string(name));
  std::shared_ptr<LeaseRecord> rec = slot;
  const std::uint64_t holder = ++next_holder_;
  if (opts.on_lost) rec->on_lost.emplace_back(holder, std::move(opts.on_lost));
  ++active_acquires_;
  if (backend_ != nullptr && !hold_driver_) {
    send_from_this_thread(lk);
  } else {
    poke_locked();
  }

  // I3: terminal by the wait deadline + one request timeout. The extra slack only matters when
  // the driver itself is starved; past it we cancel.
  const auto budget = std::min<std::chrono::nanoseconds>(wait, std::chrono::hours(24 * 365));
  const auto bound = Clock::now() + budget + 2 * request_timeout_ + std::chrono::milliseconds(500);
  const bool settled = waiters_cv_.wait_until(lk, bound, [&] { return rec->state != LeaseState::Acquiring; });
  if (!settled && core_) {
    try {
      core_->release(now_ns(), id);  // cancel (or drop our reentrant share)
    } catch (const Error&) {
    }
    poke_locked();
  }
  --active_acquires_;
  if (closing_) waiters_cv_.notify_all();
  if (rec->state == LeaseState::Held) return Lease(shared_from_this(), rec, holder, rec->fencing_token);
  std::erase_if(rec->on_lost, [&](const auto& p) { return p.first == holder; });
  return std::nullopt;
}

inline ReleaseOutcome ClientState::release(const std::shared_ptr<LeaseRecord>& rec, std::uint64_t holder,
                                           std::optional<std::chrono::nanoseconds> timeout) noexcept {
  std::unique_lock lk(mu_);
  // This holder's on_lost stays registered until the core has decided: a lease whose validity
  // ran out before this call ends Lost and its callbacks fire, this holder's included.
  auto drop_callback = [&] { std::erase_if(rec->on_lost, [&](const auto& p) { return p.first == holder; }); };
  auto ended = [&] {
    drop_callback();
    return rec->state == LeaseState::Lost ? ReleaseOutcome::Lost : ReleaseOutcome::Released;
  };
  auto drain = [&] {
    try {
      drain_locked();
    } catch (const std::exception& e) {
      fail_all_locked(e.what());
    }
    poke_locked();
  };
  if (!core_ || broken_) return ended();
  if (rec->state != LeaseState::Held && rec->state != LeaseState::Acquiring) return ended();
  Releasing how = Releasing::HolderLeft;
  try {
    how = core_->release_reported(now_ns(), rec->id);
  } catch (const Error& e) {
    if (e.code() == LH_ERR_PANIC || e.code() == LH_ERR_POISONED) {
      fail_all_locked(e.what());
      return ended();
    }
    if (e.code() != LH_ERR_LEASE_ENDED && e.code() != LH_ERR_UNKNOWN_LEASE)
      log(std::string("release: ") + e.what());
    drain();  // an ended lease's event may still be queued
    return ended();
  } catch (...) {
    return ended();
  }
  if (how == Releasing::Pending) awaiting_reply_[rec->id] = rec;
  const auto wait = timeout.value_or(opts_.release_timeout ? std::chrono::nanoseconds(*opts_.release_timeout)
                                                           : request_timeout_);
  if (how == Releasing::Pending && wait.count() > 0 && backend_ != nullptr && !hold_driver_) {
    // This thread waits for the answer anyway: it sends the request itself (and this lease's
    // RELEASED or LOST event is dispatched now).
    send_from_this_thread(lk);
  } else {
    drain();  // this lease's RELEASED or LOST event, dispatched now
  }
  if (how == Releasing::Lost || rec->state == LeaseState::Lost) return ended();
  drop_callback();
  if (how != Releasing::Pending) return ReleaseOutcome::Released;

  try {
    waiters_cv_.wait_until(lk, Clock::now() + std::clamp<std::chrono::nanoseconds>(wait, {}, std::chrono::hours(24)),
                           [&] { return rec->release_reply.has_value() || closing_ || broken_; });
  } catch (...) {
  }
  awaiting_reply_.erase(rec->id);
  return rec->release_reply == ReleaseReply::NotOwner ? ReleaseOutcome::NotOwner : ReleaseOutcome::Released;
}

inline std::uint64_t ClientState::renew(const std::shared_ptr<LeaseRecord>& rec) {
  std::unique_lock lk(mu_);
  auto ended = [&]() -> Error {
    if (const auto r = lost_reason(*rec))
      return Error(LH_ERR_LEASE_ENDED, "the lease was lost (" + std::string(to_string(*r)) + ")");
    return Error(LH_ERR_LEASE_ENDED, "the lease was released");
  };
  if (closing_ || !core_) throw Error(status::closed, "LockClient is closed");
  if (broken_) throw Error(LH_ERR_POISONED, "the core handle failed earlier");
  if (rec->state != LeaseState::Held) throw ended();  // terminal: nothing is sent
  const auto seen = rec->renewed;
  const auto now = now_ns();
  const auto valid = rec->valid_until_ns.load();
  try {
    core_->renew(now, rec->id);
  } catch (const Error& e) {
    if (e.code() == LH_ERR_PANIC || e.code() == LH_ERR_POISONED) {
      fail_all_locked(e.what());
      throw;
    }
    if (e.code() != LH_ERR_LEASE_ENDED) throw;
  }
  try {
    drain_locked();  // LOST now if validity had already run out
  } catch (const std::exception& e) {
    fail_all_locked(e.what());
    throw Error(LH_ERR_POISONED, e.what());
  }
  poke_locked();
  // The core answers by valid_until at the latest; the slack only matters to a starved driver.
  const auto left = std::chrono::nanoseconds(static_cast<std::int64_t>(
      std::min<std::uint64_t>(valid > now ? valid - now : 0, std::uint64_t{1} << 50)));
  const auto bound = Clock::now() + left + 2 * request_timeout_ + std::chrono::milliseconds(500);
  waiters_cv_.wait_until(lk, bound, [&] {
    return rec->renewed != seen || rec->state != LeaseState::Held || closing_ || broken_;
  });
  if (rec->renewed != seen) return rec->valid_until_ns.load();
  if (rec->state != LeaseState::Held && rec->state != LeaseState::Acquiring) throw ended();
  if (closing_) throw Error(status::closed, "LockClient closed during renew");
  if (broken_) throw Error(LH_ERR_POISONED, "the core handle failed");
  throw Error(status::timeout, "no answer to the renewal in time");
}

inline bool ClientState::is_held(const LeaseRecord& rec) const {
  std::lock_guard g(mu_);
  if (!core_ || broken_ || rec.state != LeaseState::Held) return false;
  try {
    return core_->is_held(rec.id, now_ns());
  } catch (const Error& e) {
    if (e.code() == LH_ERR_LEASE_ENDED || e.code() == LH_ERR_UNKNOWN_LEASE) return false;
    throw;
  }
}

inline std::uint64_t ClientState::valid_until(LeaseRecord& rec) const {
  std::lock_guard g(mu_);
  if (core_ && !broken_ && rec.state == LeaseState::Held) {
    try {
      if (auto v = core_->valid_until(rec.id)) rec.valid_until_ns = *v;
    } catch (const Error&) {
    }
  }
  return rec.valid_until_ns.load();
}

inline void ClientState::end_record_locked(LeaseRecord& rec, LeaseState st) {
  rec.state = st;
  records_.erase(rec.id);
  waiters_cv_.notify_all();
}

inline void ClientState::dispatch_locked(Output& out) {
  auto find = [&](std::uint64_t id) -> std::shared_ptr<LeaseRecord> {
    auto it = records_.find(id);
    return it == records_.end() ? nullptr : it->second;
  };
  std::visit(
      overloaded{
          [&](AcquireCommand& c) {
            io_->post([this, c = std::move(c)] {
              AcquireResult r = TransportError{};
              try {
                r = transport_->acquire(c.name, c.token, c.ttl_ms);
              } catch (const std::exception& e) {
                log(std::string("acquire ") + c.name + ": " + e.what());
                r = TransportError{e.what()};
              } catch (...) {
                r = TransportError{"unknown exception"};
              }
              if (auto* te = std::get_if<TransportError>(&r); te && !te->message.empty())
                log("acquire " + c.name + ": " + te->message);
              push_input(InAcquire{c.request, std::move(r)});
            });
          },
          [&](RenewCommand& c) {
            io_->post([this, c = std::move(c)] {
              RenewResult r = RenewResult::TransportError;
              try {
                r = transport_->renew(c.name, c.token, c.ttl_ms, c.backend_data);
              } catch (const std::exception& e) {
                log(std::string("renew ") + c.name + ": " + e.what());
              } catch (...) {
              }
              push_input(InRenew{c.request, r});
            });
          },
          [&](ReleaseCommand& c) {
            io_->post([this, c = std::move(c)] {
              ReleaseResult r = ReleaseResult::TransportError;
              try {
                r = transport_->release(c.name, c.token, c.backend_data);
              } catch (const std::exception& e) {
                log(std::string("release ") + c.name + ": " + e.what());
              } catch (...) {
              }
              push_input(InRelease{c.request, r});
            });
          },
          [&](WatchCommand& c) {
            if (!transport_notifications_) return;  // nothing would be delivered
            core_watching_.insert(c.name);
            watcher_->post([this, on_wake = waiter_callback(), name = std::move(c.name)] {
              try {
                transport_->watch_waiter(name, on_wake);
              } catch (const std::exception& e) {
                log(std::string("watch ") + name + ": " + e.what());
              } catch (...) {
              }
            });
          },
          [&](UnwatchCommand& c) {
            if (!transport_notifications_) return;
            // Now, not when the watcher gets to unwatch: wake-ups arriving meanwhile are declined.
            core_watching_.erase(c.name);
            watcher_->post([this, name = std::move(c.name)] {
              try {
                transport_->unwatch(name);
              } catch (const std::exception& e) {
                log(std::string("unwatch ") + name + ": " + e.what());
              } catch (...) {
              }
            });
          },
          [&](AcquiredEvent& e) {
            if (auto rec = find(e.lease)) {
              rec->state = LeaseState::Held;
              rec->fencing_token = e.fencing_token;
              rec->valid_until_ns = e.valid_until_ns;
              waiters_cv_.notify_all();
            }
          },
          [&](AcquireFailedEvent& e) {
            if (auto rec = find(e.lease)) end_record_locked(*rec, LeaseState::AcquireFailed);
          },
          [&](LostEvent& e) {
            if (auto rec = find(e.lease)) {
              set_lost_reason(*rec, e.reason);
              auto callbacks = std::move(rec->on_lost);
              rec->on_lost.clear();
              end_record_locked(*rec, LeaseState::Lost);
              callbacks_->post([this, rec, callbacks = std::move(callbacks), reason = e.reason] {
                rec->stop.request_stop();
                for (const auto& [holder, cb] : callbacks) {
                  try {
                    cb(reason);
                  } catch (const std::exception& ex) {
                    log(std::string("on_lost callback threw: ") + ex.what());
                  } catch (...) {
                    log("on_lost callback threw");
                  }
                }
              });
            }
          },
          [&](RenewedEvent& e) {
            if (auto rec = find(e.lease)) {
              rec->valid_until_ns = e.valid_until_ns;
              ++rec->renewed;
              waiters_cv_.notify_all();
            }
          },
          [&](ReleaseOutcomeEvent& e) {
            if (auto it = awaiting_reply_.find(e.lease); it != awaiting_reply_.end()) {
              it->second->release_reply = e.reply;
              awaiting_reply_.erase(it);
              waiters_cv_.notify_all();
            }
          },
          [&](ReleasedEvent& e) {
            if (auto rec = find(e.lease)) {
              end_record_locked(*rec, LeaseState::Released);
              // Released by close() under a live handle: tell the holder's work to stop.
              if (closing_) callbacks_->post([rec] { rec->stop.request_stop(); });
            }
          },
      },
      out);
}

inline void ClientState::drain_locked(bool for_caller) {
  if (backend_ != nullptr) for_caller ? backend_->drain_for_caller(*core_) : backend_->drain(*core_);
  while (auto out = core_->poll_output()) dispatch_locked(*out);
  if (backend_ != nullptr && backend_->answers_status()) {
    bool any = false;
    while (auto st = core_->poll_status()) {
      if (abandoned_statuses_.erase(st->id) == 0) statuses_[st->id] = std::move(*st), any = true;
    }
    if (any) waiters_cv_.notify_all();
  }
}

inline void ClientState::feed_backend_locked(std::uint64_t now, BackendInput& in) {
  using K = BackendInput::Kind;
  switch (in.kind) {
    case K::Reply:
      try {
        core_->reply(now, in.id, in.values, in.data);
      } catch (const Error& e) {
        if (e.code() != LH_ERR_INVALID_REPLY) throw;
        core_->request_failed(now, in.id);  // a reply the core cannot read: a transport error
      }
      break;
    case K::Failed: core_->request_failed(now, in.id); break;
    case K::Message: core_->pubsub_message(now, in.channel, in.data); break;
    case K::Subscription: core_->subscription(now, in.channel, in.subscribed); break;
    case K::Apply:
      if (in.apply) in.apply(*core_, now);
      break;
  }
}

inline void ClientState::feed_locked(Input& in) {
  const auto now = now_ns();
  try {
    std::visit(overloaded{
                   [&](InAcquire& i) { core_->acquire_result(now, i.request, i.result); },
                   [&](InRenew& i) { core_->renew_result(now, i.request, i.result); },
                   [&](InRelease& i) { core_->release_result(now, i.request, i.result); },
                   [&](InReleased& i) { core_->released(now, i.name); },
                   [&](BackendInput& i) { feed_backend_locked(now, i); },
               },
               in);
  } catch (const Error& e) {
    if (e.code() == LH_ERR_PANIC || e.code() == LH_ERR_POISONED) throw;
    // A transport answered something the core refuses (e.g. oversized backend data): log it
    // and treat that answer as a transport error.
    log(std::string("result refused by the core: ") + e.what());
    if (auto* a = std::get_if<InAcquire>(&in)) {
      core_->acquire_result(now, a->request, TransportError{});
    }
  }
}

// The handle failed (panic → poisoned). Nothing it says can be trusted any more: every waiter
// fails, every held lease is reported lost (Expired: we can no longer vouch for it).
inline void ClientState::fail_all_locked(std::string_view why) {
  broken_ = true;
  log(std::string("core failed, client unusable: ") + std::string(why));
  auto recs = std::move(records_);
  records_.clear();
  for (auto& [id, rec] : recs) {
    if (rec->state == LeaseState::Held) {
      rec->state = LeaseState::Lost;
      set_lost_reason(*rec, LostReason::Expired);
      auto callbacks = std::move(rec->on_lost);
      rec->on_lost.clear();
      callbacks_->post([this, rec, callbacks = std::move(callbacks)] {
        rec->stop.request_stop();
        for (const auto& [holder, cb] : callbacks) {
          try {
            cb(LostReason::Expired);
          } catch (...) {
            log("on_lost callback threw");
          }
        }
      });
    } else {
      rec->state = LeaseState::AcquireFailed;
    }
  }
  waiters_cv_.notify_all();
}

inline void ClientState::drive() noexcept {
  std::unique_lock lk(mu_);
  while (!broken_) {
    try {
      if (hold_driver_ && !stopping_) {
        driver_cv_.wait(lk, [&] { return !hold_driver_ || stopping_; });
        continue;
      }
      while (!inputs_.empty()) {
        Input in = std::move(inputs_.front());
        inputs_.pop_front();
        feed_locked(in);
        drain_locked();
      }
      if (dirty_) {
        dirty_ = false;
        drain_locked();
      }
      const auto deadline = core_->poll_timeout();
      const auto now = now_ns();
      if (deadline && *deadline <= now) {
        core_->timeout(now);
        drain_locked();
        continue;
      }
      if (closing_) waiters_cv_.notify_all();  // close() watches pending_cleanups
      if (stopping_) break;
      auto ready = [&] { return !inputs_.empty() || dirty_ || stopping_; };
      driver_until_ = deadline ? *deadline : std::numeric_limits<std::uint64_t>::max();
      if (deadline) {
        driver_cv_.wait_until(lk, to_time_point(*deadline), ready);
      } else {
        driver_cv_.wait(lk, ready);
      }
      driver_until_ = 0;
    } catch (const std::exception& e) {
      fail_all_locked(e.what());
    }
  }
}

inline void ClientState::release_everything_locked() {
  if (!core_ || broken_) return;
  const auto now = now_ns();
  for (auto& [id, rec] : records_) {
    // A reentrant lease needs one release per holder; bounded by max_leases-sized refcounts.
    for (int guard = 0; guard < (1 << 22); ++guard) {
      try {
        const auto s = core_->lease_state(id);
        if (s != LeaseState::Held && s != LeaseState::Acquiring) break;
        core_->release(now, id);
      } catch (const Error&) {
        break;
      }
    }
  }
  poke_locked();
}

inline void ClientState::close() noexcept {
  std::lock_guard serial(close_mu_);
  {
    std::unique_lock lk(mu_);
    if (closed_) return;
    closing_ = true;
    release_everything_locked();
    waiters_cv_.notify_all();
    const auto deadline = Clock::now() + opts_.close_timeout;
    waiters_cv_.wait_until(lk, deadline, [&] {
      if (broken_ || !core_) return active_acquires_ == 0;
      try {
        return active_acquires_ == 0 && records_.empty() && core_->counters().pending_cleanups == 0;
      } catch (...) {
        return true;
      }
    });
    if (backend_ != nullptr && core_ && !broken_) {
      try {
        backend_->closing(*core_, now_ns());
        drain_locked();
      } catch (...) {
      }
    }
    stopping_ = true;
    driver_cv_.notify_all();
  }
  if (driver_.joinable()) driver_.join();
  try {
    transport_->close();
  } catch (...) {
  }
  io_->shutdown(true);
  watcher_->shutdown(true);
  {
    std::unique_lock lk(mu_);
    // Anything still open (the driver was stopped before its events arrived) ends now.
    for (auto& [id, rec] : records_) {
      rec->state = rec->state == LeaseState::Held ? LeaseState::Released : LeaseState::AcquireFailed;
      auto r = rec;
      callbacks_->post([r] { r->stop.request_stop(); });
    }
    records_.clear();
    awaiting_reply_.clear();
    waiters_cv_.notify_all();
    waiters_cv_.wait(lk, [&] { return active_acquires_ == 0; });
    core_.reset();
    inputs_.clear();
    closed_ = true;
  }
  callbacks_->shutdown(false);
}

}  // namespace detail
}  // namespace leasehold
