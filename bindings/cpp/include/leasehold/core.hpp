// leasehold/core.hpp — leasehold::Core, a move-only RAII owner of one `lh_client` (the sans-IO
// core with its backend's protocol): application calls in, IO requests polled (io_poll) and
// answered (answer / io_*), events out; misuse throws leasehold::Error. Not thread-safe (like
// the C handle). LockClient drives one for you.
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
#include <utility>
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

// The same for an empty list of values.
inline const lh_value* values_ptr(std::span<const lh_value> v) noexcept {
  static const lh_value none{};
  return v.data() != nullptr ? v.data() : &none;
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

// The defaults of a backend (LH_BACKEND_*), to change fields of before making a Core.
inline lh_backend_options backend_defaults(std::uint32_t kind) {
  lh_backend_options o{};
  if (const auto st = lh_backend_options_default(kind, &o); st != LH_OK)
    throw Error(st, "lh_backend_options_default: unknown backend kind " + std::to_string(kind));
  return o;
}

inline std::string_view library_version() noexcept { return lh_version(); }
inline std::uint32_t library_abi_version() noexcept { return lh_abi_version(); }

class Core {
 public:
  using LeaseId = std::uint64_t;
  using RequestId = std::uint64_t;

  // Takes ownership of a handle made elsewhere (lh_client_new).
  static Core adopt(lh_client* handle) {
    if (handle == nullptr) throw Error(LH_ERR_NULL_ARGUMENT, "Core::adopt: NULL handle");
    return Core(handle);
  }

  // On the memory service's protocol (LH_BACKEND_MEMORY), seeded from the OS.
  explicit Core(const Config& config = Config::defaults()) : Core(config, backend_defaults(LH_BACKEND_MEMORY)) {}
  // On the memory service's protocol, with a deterministic seed (tests, replays; at least 16 bytes).
  Core(const Config& config, std::span<const std::uint8_t> seed) {
    init(config, backend_defaults(LH_BACKEND_MEMORY), seed);
  }
  // On `backend`'s protocol (backend_defaults(LH_BACKEND_*) with fields changed), seeded from the OS.
  Core(const Config& config, const lh_backend_options& backend) {
    const auto seed = detail::os_seed();
    init(config, backend, seed);
  }
  Core(const Config& config, const lh_backend_options& backend, std::span<const std::uint8_t> seed) {
    init(config, backend, seed);
  }

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

  // --- the application's calls ---
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
  void release(std::uint64_t now, LeaseId lease) { check(lh_release(h(), now, lease, nullptr)); }
  // A release that reports: Pending is followed by a ReleaseOutcomeEvent, Lost by a LostEvent.
  Releasing release_reported(std::uint64_t now, LeaseId lease) {
    std::uint32_t r = 0;
    check(lh_release(h(), now, lease, &r));
    return static_cast<Releasing>(r);
  }
  // Renews now (or joins the renewal in flight); completes as a RenewedEvent or a LostEvent.
  // A lease whose validity already ran out gets its LostEvent queued and nothing is sent.
  void renew(std::uint64_t now, LeaseId lease) { check(lh_renew(h(), now, lease)); }
  void timeout(std::uint64_t now) { check(lh_timeout(h(), now)); }

  // Next event, or nullopt when drained.
  std::optional<Event> poll_event() {
    lh_event e{};
    check(lh_poll_event(h(), &e));
    return to_event(e);
  }
  // An lh_event as an Event; nullopt for LH_EVENT_NONE.
  static std::optional<Event> to_event(const lh_event& e) {
    switch (e.kind) {
      case LH_EVENT_NONE: return std::nullopt;
      case LH_EVENT_ACQUIRED: return AcquiredEvent{e.lease_id, e.fencing_token, e.valid_until_ns};
      case LH_EVENT_ACQUIRE_FAILED: return AcquireFailedEvent{e.lease_id, static_cast<AcquireFailReason>(e.reason)};
      case LH_EVENT_LOST: return LostEvent{e.lease_id, static_cast<LostReason>(e.reason)};
      case LH_EVENT_RELEASED: return ReleasedEvent{e.lease_id};
      case LH_EVENT_RENEWED: return RenewedEvent{e.lease_id, e.valid_until_ns};
      case LH_EVENT_RELEASE_OUTCOME: return ReleaseOutcomeEvent{e.lease_id, static_cast<ReleaseReply>(e.reason)};
      default: throw Error(LH_ERR_INVALID_ENUM, "unknown event kind " + std::to_string(e.kind));
    }
  }
  std::optional<Event> poll_output() { return poll_event(); }  // the earlier name
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
  // The engine's and the backend protocol's counters.
  [[nodiscard]] Counters counters() const {
    lh_counters c{};
    c.struct_size = sizeof(c);
    check(lh_counters_get(h(), &c));
    return Counters::from_c(c);
  }
  [[nodiscard]] Counters etcd_counters() const { return counters(); }  // the earlier name on etcd

  // Test hook: panics inside the C boundary; the handle is poisoned afterwards. Needs a library
  // built with the `testing` feature (else Error(status::no_testing_feature)).
  void debug_panic() {
    if (!LEASEHOLD_HAS_TEST_HOOK(lh_client_debug_panic)) detail::no_testing_feature("lh_client_debug_panic");
    check(lh_client_debug_panic(h()));
  }

  // --- the seam: requests out, answers in (every backend) ---
  // Next request, owned, or nullopt when drained.
  std::optional<IoRequest> io_poll() {
    lh_io_request r{};
    check(lh_io_poll(h(), &r));
    if (r.kind == LH_IO_NONE) return std::nullopt;
    return to_request(r);
  }
  // The drain after an input in one call (lh_drain): the next request into `request` (nullopt
  // when none is left), then up to events.size() events into `events` (`nevents` of them), then,
  // when neither is left, the next deadline. Call again while `more_requests` or `more_events`
  // is 1; only the last call's `deadline_ns` counts.
  lh_drained drain(std::optional<IoRequest>& request, std::span<lh_event> events) {
    lh_io_request r;  // (written by lh_drain)
    lh_drained d{};
    d.struct_size = sizeof d;
    check(lh_drain(h(), &r, events.empty() ? nullptr : events.data(), events.size(), &d));
    if (d.request != 0) to_request(r, request.emplace());
    return d;
  }
  // An lh_io_request (its pointers valid until the next poll) as an owned IoRequest.
  static IoRequest to_request(const lh_io_request& r) {
    IoRequest out;
    to_request(r, out);
    return out;
  }
  // The same into a fresh `out`.
  static void to_request(const lh_io_request& r, IoRequest& out) {
    out.id = r.id;
    out.kind = r.kind;
    out.connection = r.connection;
    auto slice = [&](std::uint64_t off, std::uint64_t len) {
      return (r.data == nullptr || off > r.data_len || len > r.data_len - off)
                 ? std::string()
                 : std::string(reinterpret_cast<const char*>(r.data) + off, len);
    };
    auto cstr = [](const char* p) { return p != nullptr ? std::string(p) : std::string(); };
    switch (r.kind) {
      case LH_IO_COMMAND:
        out.argv.reserve(r.argc);
        for (std::uint32_t i = 0; i < r.argc; ++i) out.argv.push_back(detail::copy_str(r.argv[i].ptr, r.argv[i].len));
        break;
      case LH_IO_SQL:
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
        break;
      case LH_IO_OPEN:
      case LH_IO_WRITE:
      case LH_IO_SHUTDOWN:
        out.stream = r.stream;
        out.deadline = r.deadline;
        out.host = cstr(r.host);
        out.unix_path = cstr(r.unix_path);
        out.server_name = cstr(r.server_name);
        out.port = r.port;
        out.tls = r.tls != 0;
        if (r.kind == LH_IO_WRITE) out.data = detail::copy_str(r.data, r.data_len);
        break;
      default:  // LH_IO_HTTP, _HTTP_WATCH, _HTTP_CANCEL
        out.method = cstr(r.method);
        out.path = cstr(r.path);
        out.body = detail::copy_str(r.data, r.data_len);
        out.authorization = cstr(r.authorization);
        break;
    }
  }
  // Values answering a COMMAND or SQL request (pre-order, strings as offset/len into `data`).
  void io_reply(std::uint64_t now, RequestId req, std::span<const lh_value> values, std::string_view data) {
    check(lh_io_reply(h(), now, req, detail::values_ptr(values), values.size(), detail::bytes_ptr(data.data()),
                      data.size()));
  }
  void io_http_reply(std::uint64_t now, RequestId req, std::uint32_t status, std::string_view body) {
    check(lh_io_http_reply(h(), now, req, status, detail::bytes_ptr(body.data()), body.size()));
  }
  void io_stream_message(std::uint64_t now, RequestId req, std::string_view message) {
    check(lh_io_stream_message(h(), now, req, detail::bytes_ptr(message.data()), message.size()));
  }
  // kind: LH_FAILURE_TRANSPORT or LH_FAILURE_DATABASE; the message is cut to fit.
  void io_failed(std::uint64_t now, RequestId req, std::uint32_t kind = LH_FAILURE_TRANSPORT,
                 std::string_view message = {}) {
    message = message.substr(0, std::min<std::size_t>(message.size(), LH_MAX_REPLY_DATA));
    check(lh_io_failed(h(), now, req, kind, detail::bytes_ptr(message.data()), message.size()));
  }
  void io_message(std::uint64_t now, std::string_view channel, std::string_view payload = {}) {
    check(lh_io_message(h(), now, detail::bytes_ptr(channel.data()), channel.size(),
                        detail::bytes_ptr(payload.data()), payload.size()));
  }
  void io_connection(std::uint64_t now, std::uint32_t connection, std::uint32_t event, std::string_view channel = {}) {
    check(lh_io_connection(h(), now, connection, event, detail::bytes_ptr(channel.data()), channel.size()));
  }
  // Streams (LH_BACKEND_REDIS_STREAM): opened, bytes read (split to the ABI's limit), ended.
  void io_opened(std::uint64_t now, std::uint64_t stream) { check(lh_io_opened(h(), now, stream)); }
  void io_received(std::uint64_t now, std::uint64_t stream, std::string_view bytes) {
    do {
      const auto part = bytes.substr(0, std::min<std::size_t>(bytes.size(), LH_MAX_REPLY_DATA));
      check(lh_io_received(h(), now, stream, detail::bytes_ptr(part.data()), part.size()));
      bytes.remove_prefix(part.size());
    } while (!bytes.empty());
  }
  void io_closed(std::uint64_t now, std::uint64_t stream, std::string_view message = {}) {
    message = message.substr(0, std::min<std::size_t>(message.size(), LH_MAX_REPLY_DATA));
    check(lh_io_closed(h(), now, stream, detail::bytes_ptr(message.data()), message.size()));
  }
  // The client is closing (etcd: revoke its pooled leases); run the requests it makes.
  void io_close(std::uint64_t now) { check(lh_io_close(h(), now)); }
  // Feeds one answer of any kind.
  void answer(std::uint64_t now, const IoAnswer& a) {
    std::visit(overloaded{
                   [&](const IoReply& r) { io_reply(now, r.id, r.values, r.data); },
                   [&](const IoHttpReply& r) { io_http_reply(now, r.id, r.status, r.body); },
                   [&](const IoStreamMessage& m) { io_stream_message(now, m.id, m.message); },
                   [&](const IoFailed& f) { io_failed(now, f.id, f.kind, f.message); },
                   [&](const IoMessage& m) { io_message(now, m.channel, m.payload); },
                   [&](const IoConnection& c) { io_connection(now, c.connection, c.event, c.channel); },
                   [&](const IoOpened& o) { io_opened(now, o.stream); },
                   [&](const IoReceived& r) { io_received(now, r.stream, r.bytes); },
                   [&](const IoClosed& c) { io_closed(now, c.stream, c.message); },
               },
               a);
  }
  // What the backend said last or the protocol found wrong in an answer; empty if nothing.
  [[nodiscard]] std::string backend_last_error() const {
    const char* m = lh_backend_last_error(h());
    return m != nullptr ? std::string(m) : std::string();
  }

  // Queues a status query; its answer comes from poll_status() with this id.
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

  // --- the earlier per-backend names of the seam's calls ---
  std::optional<IoRequest> poll_request() { return io_poll(); }
  std::optional<IoRequest> sql_poll_request() { return io_poll(); }
  std::optional<IoRequest> http_poll_request() { return io_poll(); }
  void reply(std::uint64_t now, RequestId req, std::span<const lh_value> values, std::string_view data) {
    io_reply(now, req, values, data);
  }
  void sql_result(std::uint64_t now, RequestId req, std::span<const lh_value> values, std::string_view data) {
    io_reply(now, req, values, data);
  }
  void request_failed(std::uint64_t now, RequestId req) { io_failed(now, req); }
  void sql_failed(std::uint64_t now, RequestId req, std::uint32_t kind, std::string_view message) {
    io_failed(now, req, kind, message);
  }
  void http_failed(std::uint64_t now, RequestId req, std::string_view message) { io_failed(now, req, LH_FAILURE_TRANSPORT, message); }
  void http_reply(std::uint64_t now, RequestId req, std::uint32_t status, std::string_view body) {
    io_http_reply(now, req, status, body);
  }
  void http_stream_message(std::uint64_t now, RequestId req, std::string_view message) {
    io_stream_message(now, req, message);
  }
  void pubsub_message(std::uint64_t now, std::string_view channel, std::string_view payload) {
    io_message(now, channel, payload);
  }
  void sql_notification(std::uint64_t now, std::string_view channel, std::string_view payload) {
    io_message(now, channel, payload);
  }
  void subscription(std::uint64_t now, std::string_view channel, bool subscribed) {
    io_connection(now, LH_CONNECTION_NOTIFY, subscribed ? LH_CONNECTION_SUBSCRIBED : LH_CONNECTION_UNSUBSCRIBED, channel);
  }
  void sql_connection_reset(std::uint64_t now, std::uint32_t connection) {
    io_connection(now, connection, LH_CONNECTION_REOPENED);
  }
  void etcd_close(std::uint64_t now) { io_close(now); }
  std::uint64_t sql_status_request(std::uint64_t now, std::string_view name) { return status_request(now, name); }
  std::optional<LockStatus> sql_poll_status() { return poll_status(); }
  [[nodiscard]] std::string sql_last_error() const { return backend_last_error(); }
  [[nodiscard]] std::string etcd_last_error() const { return backend_last_error(); }

 private:
  explicit Core(lh_client* adopted) { h_.reset(adopted); }
  void init(const Config& config, const lh_backend_options& backend, std::span<const std::uint8_t> seed) {
    if (lh_abi_version() != LH_ABI_VERSION) {
      throw Error(status::abi_mismatch, "header LH_ABI_VERSION " + std::to_string(LH_ABI_VERSION) +
                                            " but library reports " + std::to_string(lh_abi_version()));
    }
    const lh_config c = config.to_c();
    lh_backend_options b = backend;
    b.struct_size = sizeof b;
    lh_client* raw = nullptr;
    const auto st = lh_client_new(&c, &b, detail::bytes_ptr(seed.data()), seed.size(), &raw);
    if (st != LH_OK) {
      // No handle holds a detail yet: the core says why on the same arguments.
      std::string why(256, '\0');
      std::size_t n = 0;
      lh_client_new_check(&c, &b, detail::bytes_ptr(seed.data()), seed.size(), why.data(), why.size(), &n);
      if (n >= why.size()) {
        why.assign(n + 1, '\0');
        lh_client_new_check(&c, &b, detail::bytes_ptr(seed.data()), seed.size(), why.data(), why.size(), &n);
      }
      why.resize(std::min(n, why.size() - 1));
      throw Error(st, why.empty() ? std::string("lh_client_new failed") : "lh_client_new: " + why);
    }
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
