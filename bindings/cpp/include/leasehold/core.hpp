// leasehold/core.hpp — leasehold::Core, a move-only RAII owner of one `lh_client` (the sans-IO
// core): inputs in, typed outputs out, backend requests polled and answered; misuse throws
// leasehold::Error. Not thread-safe (like the C handle). LockClient drives one for you.
#pragma once

#include <leasehold.h>
#include <leasehold/config.hpp>
#include <leasehold/error.hpp>
#include <leasehold/lock_status.hpp>
#include <leasehold/output.hpp>
#include <leasehold/request.hpp>
#include <leasehold/types.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <variant>

extern "C" lh_status lh_client_debug_panic(struct lh_client* c) LEASEHOLD_TEST_HOOK;

namespace leasehold {

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
  // status_request / poll_status under their SQL names.
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

}  // namespace leasehold
