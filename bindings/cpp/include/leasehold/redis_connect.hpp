// leasehold/redis_connect.hpp — the connections of the Redis executor (redis_executor.hpp):
// its options (host and port or a unix socket, password / ACL user, DB, timeouts) and how a
// connection is opened: AUTH and SELECT, or, with Redis Sentinel, the master the sentinels name.
//
// hiredis has no Sentinel support: every (re)connect asks the sentinels for the master
// (SENTINEL get-master-addr-by-name, the first that answers) and checks that the server there
// says it is one (ROLE). No TLS: hiredis's is a separate library (hiredis_ssl) not used here.
#pragma once

#include <leasehold.hpp>
#include <leasehold/detail/hiredis.hpp>
#include <leasehold/redis_protocol.hpp>  // RedisProtocolOptions

#include <hiredis/hiredis.h>

#include <charconv>
#include <tuple>

namespace leasehold {

// A sentinel's address (RedisOptions::sentinels).
struct SentinelAddress {
  std::string host;
  int port = 26379;
};

struct RedisOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string unix_socket;  // non-empty: connect to this path instead of host:port
  std::string username;     // ACL user (AUTH username password); empty: AUTH password
  std::string password;     // empty: no AUTH
  int db = 0;               // SELECT db on each connection when non-zero
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds command_timeout{2000};  // bounds every reply on the commands connection
  std::size_t max_idle_connections = 8;             // ignored: one pipelined commands connection
  std::optional<RedisProtocolOptions> protocol;     // the core's Redis options; nullopt: defaults
  LogFn log;                                        // connection errors; default: stderr
  // Redis Sentinel: non-empty, host/port are ignored and each connection goes to the master the
  // first answering sentinel names `sentinel_master`. The credentials above are the servers'.
  std::vector<SentinelAddress> sentinels;
  std::string sentinel_master;
  std::string sentinel_username;  // the sentinels' ACL user / password, if they require one
  std::string sentinel_password;
};

namespace detail {

// Opens connections as RedisOptions say (checked on construction: std::invalid_argument).
class RedisConnector {
  using Ctx = RedisCtx;
  using Reply = RedisReply;

 public:
  explicit RedisConnector(RedisOptions options) : opts_(std::move(options)) {
    if (!opts_.sentinels.empty() && opts_.sentinel_master.empty())
      throw std::invalid_argument("RedisOptions::sentinels needs sentinel_master");
    for (const auto& a : opts_.sentinels)
      if (a.host.empty() || a.port <= 0 || a.port > 65535) throw std::invalid_argument("bad sentinel address");
    if (!opts_.log) opts_.log = [](std::string_view m) { std::fprintf(stderr, "leasehold redis: %.*s\n", int(m.size()), m.data()); };
  }
  [[nodiscard]] const RedisOptions& options() const noexcept { return opts_; }
  bool sentinel() const noexcept { return !opts_.sentinels.empty(); }
  void log(const std::string& m) const noexcept try { opts_.log(m); } catch (...) {}
  // (Sentinel) A connection reached the master at addr: true when it is not the one reached
  // before (a connection to an older one must leave it).
  bool reached(const std::string& addr) {
    std::lock_guard g(mu_);
    if (addr.empty() || addr == master_) return false;
    master_ = addr;
    return true;
  }
  // The master a connection reached last ("" before any).
  [[nodiscard]] std::string master() const {
    std::lock_guard g(mu_);
    return master_;
  }

  // A connection with AUTH and SELECT done, or null (logged). With sentinels, to the master they
  // name, checked with ROLE; *addr says where.
  Ctx connect(std::string* addr = nullptr) const {
    std::string host = opts_.host;
    int port = opts_.port;
    if (sentinel()) {
      auto m = ask_sentinels();
      if (!m) return nullptr;
      std::tie(host, port) = *m;
    }
    Ctx c(opts_.unix_socket.empty() || sentinel()
              ? redisConnectWithTimeout(host.c_str(), port, tv(opts_.connect_timeout))
              : redisConnectUnixWithTimeout(opts_.unix_socket.c_str(), tv(opts_.connect_timeout)));
    if (!c || c->err) return log(std::string("connect: ") + (c ? c->errstr : "out of memory")), nullptr;
    redisSetTimeout(c.get(), tv(opts_.command_timeout));
    std::vector<std::vector<std::string>> setup;
    if (!opts_.password.empty()) setup.push_back(auth(opts_.username, opts_.password));
    if (opts_.db != 0) setup.push_back({"SELECT", std::to_string(opts_.db)});
    if (!setup.empty() && !run(c.get(), setup)) return nullptr;
    if (sentinel()) {
      // A sentinel may still name a master it has not seen demoted yet.
      Reply r = run(c.get(), {{"ROLE"}});
      if (!r) return nullptr;
      if (r->type != REDIS_REPLY_ARRAY || r->elements == 0 || r->element[0]->type != REDIS_REPLY_STRING ||
          std::string_view(r->element[0]->str, r->element[0]->len) != "master")
        return log(host + ":" + std::to_string(port) + " named by the sentinels is not a master"), nullptr;
    }
    if (addr) *addr = host + ":" + std::to_string(port);
    return c;
  }

 private:
  static timeval tv(std::chrono::milliseconds ms) {
    return timeval{static_cast<time_t>(ms.count() / 1000), static_cast<suseconds_t>(ms.count() % 1000 * 1000)};
  }
  // Runs the commands in order on c; the last reply, or null on a failure or an error reply
  // (logged).
  Reply run(redisContext* c, const std::vector<std::vector<std::string>>& cmds) const {
    Reply r;
    for (const auto& cmd : cmds) {
      void* raw = nullptr;
      if (redis_append(c, cmd) != REDIS_OK || redisGetReply(c, &raw) != REDIS_OK || raw == nullptr)
        return log(cmd[0] + ": " + (c->err ? c->errstr : "no reply")), nullptr;
      r.reset(static_cast<redisReply*>(raw));
      if (r->type == REDIS_REPLY_ERROR) return log(cmd[0] + ": " + std::string(r->str, r->len)), nullptr;
    }
    return r;
  }
  static std::vector<std::string> auth(const std::string& user, const std::string& password) {
    return user.empty() ? std::vector<std::string>{"AUTH", password} : std::vector<std::string>{"AUTH", user, password};
  }

  // The master's host and port as the first sentinel that knows it says, or nullopt (logged).
  std::optional<std::pair<std::string, int>> ask_sentinels() const {
    for (const auto& a : opts_.sentinels) {
      Ctx c(redisConnectWithTimeout(a.host.c_str(), a.port, tv(opts_.connect_timeout)));
      if (!c || c->err) continue;
      redisSetTimeout(c.get(), tv(opts_.command_timeout));
      std::vector<std::vector<std::string>> cmds;
      if (!opts_.sentinel_password.empty()) cmds.push_back(auth(opts_.sentinel_username, opts_.sentinel_password));
      cmds.push_back({"SENTINEL", "get-master-addr-by-name", opts_.sentinel_master});
      Reply r = run(c.get(), cmds);
      if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
          r->element[1]->type != REDIS_REPLY_STRING)
        continue;  // a nil reply: this sentinel does not know the name
      const std::string port(r->element[1]->str, r->element[1]->len);
      int p = 0;
      const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
      if (ec != std::errc{} || end != port.data() + port.size() || p <= 0 || p > 65535) continue;
      return std::pair{std::string(r->element[0]->str, r->element[0]->len), p};
    }
    log("no sentinel named a master for " + opts_.sentinel_master);
    return std::nullopt;
  }

  RedisOptions opts_;
  mutable std::mutex mu_;
  std::string master_;  // guarded by mu_
};

}  // namespace detail
}  // namespace leasehold
