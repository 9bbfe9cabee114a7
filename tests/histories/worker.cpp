// C++ workload client of the history harness (tests/histories/README.md): acquires one name in
// a loop through the binding's public API, writes through PostgresFencingGate (workload
// lock-set), releases, and appends every operation to a JSON-lines history.
//
//   worker --backend URL --name NAME --process ID --history FILE
//          [--workload lock-set|lock] [--unfenced] [--gate URL]
//          [--ttl-ms N] [--wait-ms N] [--hold-ms N] [--duration-ms N] [--ops N] [--seed N]
//          [--write-hold-ms N] [--clock-step-at-ms N --clock-step-ms N]
//
// Redis URLs open what they open for a user (leasehold::open_client: the core on the wire,
// RedisStreamExecutor moving its bytes).
//
// Exit status: 0 done (also after SIGTERM), 1 runtime error, 2 bad usage, 3 unsupported:
// a sqlite:// gate (no SQLite gate in C++), a clock step (ClientOptions has no injectable
// clock).
#include <leasehold.hpp>
#include <leasehold/etcd_transport.hpp>
#include <leasehold/open.hpp>
#include <leasehold/postgres_fencing.hpp>
#include <leasehold/postgres_transport.hpp>
#include <leasehold/sqlite_transport.hpp>

#include <fcntl.h>
#include <libpq-fe.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

constexpr std::int64_t kValueBase = 1'000'000'000;  // value = process index * kValueBase + counter
// The high-water-mark table of every worker, whatever its language (Go names it explicitly).
constexpr const char* kGateTable = "leasehold_fencing";

[[noreturn]] void die(int code, const std::string& msg) {
  std::cerr << "cpp-worker: " << msg << "\n";
  std::exit(code);
}

// CLOCK_MONOTONIC in nanoseconds: system-wide, so the histories of every process of the host
// merge on one time line.
std::int64_t mono_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Lease::valid_until() is a std::chrono::steady_clock time point; libstdc++'s steady_clock on
// Linux is clock_gettime(CLOCK_MONOTONIC) with its epoch, so its count is already this clock.
std::int64_t mono_of(leasehold::Clock::time_point t) {
  static_assert(std::is_same_v<leasehold::Clock, std::chrono::steady_clock>);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

// One history line; absent fields are null.
struct Entry {
  std::string type, f;
  std::optional<std::uint64_t> token;
  std::optional<std::int64_t> valid_until, value, read;
  std::optional<std::string> error;
  std::optional<std::int64_t> t;  // stamped at write unless set (a loss noticed earlier)
};

// Appends lines, each with one write(2) on an O_APPEND descriptor, so a process killed at any
// moment leaves whole lines.
class History {
 public:
  History(const std::string& path, std::string p, std::string name) : p_(std::move(p)), name_(std::move(name)) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) die(1, "cannot open the history " + path);
  }
  void rec(const Entry& e) {
    std::lock_guard g(mu_);
    auto num = [](const auto& v) { return v ? std::to_string(*v) : std::string("null"); };
    std::string line = "{\"p\":" + json_str(p_) + ",\"t\":" + std::to_string(e.t ? *e.t : mono_now()) +
                       ",\"type\":" + json_str(e.type) + ",\"f\":" + json_str(e.f) + ",\"name\":" + json_str(name_) +
                       ",\"token\":" + num(e.token) + ",\"valid_until\":" + num(e.valid_until) +
                       ",\"value\":" + num(e.value) + ",\"read\":" + num(e.read) +
                       ",\"error\":" + (e.error ? json_str(*e.error) : std::string("null")) + "}\n";
    if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) die(1, "writing the history failed");
  }

 private:
  std::mutex mu_;
  int fd_ = -1;
  std::string p_, name_;
};

// The highest counter this process index wrote into the history before (a worker restarted
// after SIGKILL appends and must not repeat a value).
std::int64_t last_counter(const std::string& path, std::int64_t index) {
  std::ifstream in(path);
  std::string line;
  std::int64_t last = 0;
  while (std::getline(in, line)) {
    const auto at = line.find("\"value\":");
    if (at == std::string::npos) continue;
    const char* s = line.c_str() + at + 8;
    char* end = nullptr;
    const long long v = std::strtoll(s, &end, 10);
    if (end != s && v / kValueBase == index) last = std::max<std::int64_t>(last, v % kValueBase);
  }
  return last;
}

struct Config {
  std::string backend, name, process, history, workload = "lock-set", gate;
  bool unfenced = false;
  std::int64_t ttl_ms = 1000, wait_ms = 2000, hold_ms = 20, duration_ms = 5000, ops = 0, seed = 1, index = 0;
  std::int64_t write_hold_ms = 0;  // sleep inside the write transaction, between read and insert
};

constexpr const char* kUsage =
    "usage: cpp-worker --backend URL --name NAME --process ID --history FILE\n"
    "         [--workload lock-set|lock] [--unfenced] [--gate URL]\n"
    "         [--ttl-ms N] [--wait-ms N] [--hold-ms N] [--duration-ms N] [--ops N] [--seed N]\n"
    "         [--write-hold-ms N] [--clock-step-at-ms N --clock-step-ms N (unsupported: exit 3)]\n"
    "backends: sqlite:///path, redis://host:port, redis+sentinel://host:port[,...]/MASTER,\n"
    "          redis+cluster://host:port[,...],\n"
    "          postgresql://..., etcd://host:port[,...]; gate: postgresql://...\n";

Config parse(int argc, char** argv) {
  Config c;
  std::map<std::string, std::string*> strs{{"--backend", &c.backend}, {"--name", &c.name},
                                           {"--process", &c.process}, {"--history", &c.history},
                                           {"--workload", &c.workload}, {"--gate", &c.gate}};
  std::map<std::string, std::int64_t*> nums{{"--ttl-ms", &c.ttl_ms},   {"--wait-ms", &c.wait_ms},
                                            {"--hold-ms", &c.hold_ms}, {"--duration-ms", &c.duration_ms},
                                            {"--ops", &c.ops},         {"--seed", &c.seed},
                                            {"--write-hold-ms", &c.write_hold_ms}};
  bool step = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    const auto eq = a.find('=');
    const bool inline_value = a.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) v = a.substr(eq + 1), a = a.substr(0, eq);
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (a == "--unfenced") {
      c.unfenced = true;
      continue;
    }
    const bool known = strs.count(a) || nums.count(a) || a == "--clock-step-at-ms" || a == "--clock-step-ms";
    if (!known) die(2, "unknown argument " + a);
    if (!inline_value) {
      if (i + 1 >= argc) die(2, a + " needs a value");
      v = argv[++i];
    }
    if (a.rfind("--clock-step", 0) == 0) {
      step = true;
    } else if (strs.count(a)) {
      *strs[a] = v;
    } else {
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0') die(2, a + " needs an integer, not " + v);
      *nums[a] = n;
    }
  }
  if (c.backend.empty() || c.name.empty() || c.process.empty() || c.history.empty())
    die(2, "--backend, --name, --process and --history are required");
  if (c.workload != "lock-set" && c.workload != "lock") die(2, "--workload must be lock-set or lock");
  if (c.workload == "lock-set" && c.gate.empty()) die(2, "--workload lock-set needs --gate");
  if (c.ttl_ms <= 0 || c.wait_ms < 0 || c.hold_ms < 0 || c.write_hold_ms < 0 || c.duration_ms < 0 || c.ops < 0)
    die(2, "--ttl-ms must be positive; --wait-ms, --hold-ms, --write-hold-ms, --duration-ms and --ops not negative");
  auto d = c.process.size();
  while (d > 0 && std::isdigit(static_cast<unsigned char>(c.process[d - 1]))) --d;
  if (d == c.process.size() || c.process.size() - d > 9)
    die(2, "--process " + c.process + " must end in the process index (cpp-2)");
  c.index = std::stoll(c.process.substr(d));
  if (step) die(3, "unsupported clock step: the C++ binding has no injectable clock in its public options");
  return c;
}

bool starts(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

std::shared_ptr<leasehold::Transport> transport(const std::string& url) {
  if (starts(url, "sqlite://")) return std::make_shared<leasehold::SqliteTransport>(url.substr(9));
  if (starts(url, "postgresql://") || starts(url, "postgres://"))
    return std::make_shared<leasehold::PostgresTransport>(url);
  if (starts(url, "etcd://")) {
    leasehold::EtcdOptions eo;
    eo.endpoints = leasehold::EtcdOptions::split(url);
    return std::make_shared<leasehold::EtcdTransport>(eo);
  }
  die(3, "unsupported backend " + url);
}

leasehold::LockClient client_for(const std::string& url) {
  if (starts(url, "redis://") || starts(url, "redis+sentinel://") || starts(url, "redis+cluster://"))
    return leasehold::open_client(url);
  return leasehold::LockClient(transport(url));
}

// The fenced resource on PostgreSQL: a set of values per resource, written by a
// read-modify-write in one transaction, through PostgresFencingGate unless unfenced. The
// connection is opened again after any error but a refusal (its state is then unknown).
class PgStore {
 public:
  PgStore(std::string url, bool unfenced, std::int64_t statement_timeout_ms, std::int64_t write_hold_ms)
      : url_(std::move(url)), unfenced_(unfenced), timeout_ms_(statement_timeout_ms), hold_ms_(write_hold_ms) {
    url_ += (url_.find('?') == std::string::npos ? "?" : "&") + std::string("connect_timeout=5");
    try {
      connect();
    } catch (const std::exception&) {  // a server still starting: the first write retries
    }
  }
  struct Stale {};
  // The number of values read before the insert; throws Stale when the gate refused the token,
  // anything else when the outcome is unknown.
  std::int64_t write(const std::string& resource, std::uint64_t token, std::int64_t value) {
    connect();
    std::int64_t read = 0;
    auto rmw = [&](PGconn* c) {
      const std::string v = std::to_string(value);
      const char* p1[] = {resource.c_str()};
      Result r(PQexecParams(c, "SELECT count(*) FROM lh_hist_set WHERE resource = $1", 1, nullptr, p1, nullptr, nullptr, 0));
      check(r.get(), PGRES_TUPLES_OK);
      read = std::strtoll(PQgetvalue(r.get(), 0, 0), nullptr, 10);
      if (hold_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms_));
      const char* p2[] = {resource.c_str(), v.c_str()};
      Result w(PQexecParams(c, "INSERT INTO lh_hist_set (resource, value) VALUES ($1, $2)", 2, nullptr, p2, nullptr, nullptr, 0));
      check(w.get(), PGRES_COMMAND_OK);
    };
    try {
      if (unfenced_) {
        PGconn* c = gate_->connection();
        exec(c, "BEGIN");
        try {
          rmw(c);
          exec(c, "COMMIT");
        } catch (...) {
          Result(PQexec(c, "ROLLBACK"));
          throw;
        }
      } else {
        gate_->run(resource, token, rmw);
      }
    } catch (const leasehold::StaleFencingToken&) {
      throw Stale{};
    } catch (...) {
      gate_.reset();
      throw;
    }
    return read;
  }

 private:
  struct Clear {
    void operator()(PGresult* r) const noexcept { PQclear(r); }
  };
  using Result = std::unique_ptr<PGresult, Clear>;

  static void check(PGresult* r, ExecStatusType want) {
    if (PQresultStatus(r) != want) throw std::runtime_error(PQresultErrorMessage(r));
  }
  static void exec(PGconn* c, const char* sql) {
    Result r(PQexec(c, sql));
    check(r.get(), PGRES_COMMAND_OK);
  }
  // Another worker created the table at the same moment.
  static bool benign(PGresult* r) {
    const char* st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    return st != nullptr && (std::string(st) == "23505" || std::string(st) == "42P07");
  }
  void connect() {
    if (gate_ && PQstatus(gate_->connection()) == CONNECTION_OK) return;
    gate_.reset();
    leasehold::FencingGateOptions go;
    go.table = kGateTable;
    auto gate = std::make_unique<leasehold::PostgresFencingGate>(url_, go);
    PGconn* c = gate->connection();
    // A holder stopped inside the gate's transaction keeps the row lock: bound the wait.
    exec(c, ("SET statement_timeout = " + std::to_string(timeout_ms_)).c_str());
    Result r(PQexec(c, "CREATE TABLE IF NOT EXISTS lh_hist_set (resource TEXT NOT NULL, value BIGINT NOT NULL)"));
    if (PQresultStatus(r.get()) != PGRES_COMMAND_OK && !benign(r.get())) check(r.get(), PGRES_COMMAND_OK);
    try {
      gate->ensure_schema();
    } catch (const leasehold::PostgresError& e) {
      if (e.sqlstate() != "23505" && e.sqlstate() != "42P07") throw;
    }
    gate_ = std::move(gate);
  }

  std::string url_;
  bool unfenced_;
  std::int64_t timeout_ms_, hold_ms_;
  std::unique_ptr<leasehold::PostgresFencingGate> gate_;
};

// SIGTERM / SIGINT: the loop stops at its next step; sleeps end at once.
std::atomic<bool> g_stop{false};
std::mutex g_stop_mu;
std::condition_variable g_stop_cv;

void sleep_ms(std::int64_t ms) {
  std::unique_lock lk(g_stop_mu);
  g_stop_cv.wait_for(lk, std::chrono::milliseconds(ms), [] { return g_stop.load(); });
}

// The lease's current validity, nullopt when the binding says it is not held. Called by the
// loop only, which also does the release.
std::optional<std::int64_t> validity(const leasehold::Lease& l) {
  if (!l.is_held()) return std::nullopt;
  return mono_of(l.valid_until());
}

std::string reason_name(leasehold::LostReason r) { return std::string(leasehold::to_string(r)); }

// What the loss callback and the loop share about the current lease. The callback reads the
// lease's validity under mu, and the loop releases under mu: Lease is not thread-safe against
// its own release().
struct LossSlot {
  std::mutex mu;
  std::condition_variable cv;
  leasehold::Lease* lease = nullptr;
  std::uint64_t token = 0;
  std::int64_t valid_until = 0;
  bool known = false;  // token and lease set (the grant returned)
  std::optional<std::pair<std::int64_t, std::string>> pending;  // a loss before the grant returned
  bool fired = false;
};

void record_loss(History& h, LossSlot& s, std::int64_t t, const std::string& reason) {
  if (s.lease != nullptr) s.valid_until = mono_of(s.lease->valid_until());
  h.rec({"info", "lost", s.token, s.valid_until, {}, {}, reason, t});
  s.fired = true;
  s.cv.notify_all();
}

}  // namespace

int main(int argc, char** argv) try {
  const Config c = parse(argc, argv);
  // Every thread (the client's included) inherits the mask; one thread takes the signals.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::thread([sigs] {
    int sig = 0;
    sigwait(&sigs, &sig);
    {
      std::lock_guard g(g_stop_mu);
      g_stop = true;
    }
    g_stop_cv.notify_all();
  }).detach();

  std::unique_ptr<PgStore> store;
  if (c.workload == "lock-set") {
    if (starts(c.gate, "sqlite://")) die(3, "unsupported gate " + c.gate + " (no SQLite fencing gate in C++)");
    if (!starts(c.gate, "postgresql://") && !starts(c.gate, "postgres://")) die(3, "unsupported gate " + c.gate);
    store = std::make_unique<PgStore>(c.gate, c.unfenced, 10'000 + c.ttl_ms + c.write_hold_ms, c.write_hold_ms);
  }
  std::optional<leasehold::LockClient> owned(client_for(c.backend));  // (exit 3 before a history exists)
  History h(c.history, c.process, c.name);
  std::int64_t counter = last_counter(c.history, c.index);
  std::seed_seq seq{std::uint64_t(c.seed), std::uint64_t(c.index)};
  std::mt19937_64 rng(seq);
  auto pause = [&] {
    if (c.hold_ms > 0) sleep_ms(std::uniform_int_distribution<std::int64_t>(0, c.hold_ms)(rng));
  };
  {
    leasehold::LockClient& client = *owned;
    h.rec({"info", "start", {}, {}, {}, {}, {}, {}});
    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; c.ops == 0 || i < c.ops; ++i) {
      if (g_stop || (c.duration_ms > 0 && std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(c.duration_ms)))
        break;
      auto slot = std::make_shared<LossSlot>();
      leasehold::AcquireOptions opts;
      opts.wait = std::chrono::milliseconds(c.wait_ms);
      opts.on_lost = [&h, slot](leasehold::LostReason r) {
        const auto t = mono_now();
        std::lock_guard g(slot->mu);
        if (slot->known) {
          record_loss(h, *slot, t, reason_name(r));
        } else {
          slot->pending.emplace(t, reason_name(r));
        }
      };
      h.rec({"invoke", "acquire", {}, {}, {}, {}, {}, {}});
      // Not cancelled by SIGTERM (the C++ API has no cancel but close()): bounded by --wait-ms.
      const auto before = client.last_backend_error();
      std::optional<leasehold::Lease> lease;
      try {
        lease = client.acquire(c.name, std::chrono::milliseconds(c.ttl_ms), std::move(opts));
      } catch (const std::exception& e) {
        h.rec({"info", "acquire", {}, {}, {}, {}, std::string(e.what()), {}});
        sleep_ms(10);
        continue;
      }
      if (!lease) {
        // nullopt is wait exhausted, backend unavailable or closed; a backend error seen during
        // the call makes it unknown (a grant may have happened unseen).
        const auto after = client.last_backend_error();
        if (!after.empty() && after != before) {
          h.rec({"info", "acquire", {}, {}, {}, {}, "not acquired: " + after, {}});
          sleep_ms(10);
        } else {
          h.rec({"fail", "acquire", {}, {}, {}, {}, std::string("not acquired"), {}});
        }
        continue;
      }
      const auto token = lease->fencing_token();
      {
        std::lock_guard g(slot->mu);
        slot->lease = &*lease;
        slot->token = token;
        slot->valid_until = mono_of(lease->valid_until());
        slot->known = true;
        h.rec({"ok", "acquire", token, slot->valid_until, {}, {}, {}, {}});
        if (slot->pending) record_loss(h, *slot, slot->pending->first, slot->pending->second);
      }
      pause();
      if (store && !g_stop) {
        const auto value = c.index * kValueBase + ++counter;
        h.rec({"invoke", "write", token, validity(*lease), value, {}, {}, {}});
        try {
          const auto read = store->write(c.name, token, value);
          h.rec({"ok", "write", token, {}, value, read, {}, {}});
        } catch (const PgStore::Stale&) {
          h.rec({"fail", "write", token, {}, value, {}, std::string("stale"), {}});
        } catch (const std::exception& e) {
          // Unknown outcome: the commit may have happened.
          h.rec({"info", "write", token, {}, value, {}, std::string(e.what()), {}});
        }
        pause();
      }
      h.rec({"invoke", "release", token, validity(*lease), {}, {}, {}, {}});
      leasehold::ReleaseOutcome out;
      {
        std::lock_guard g(slot->mu);
        out = lease->release();
      }
      switch (out) {
        case leasehold::ReleaseOutcome::Released: h.rec({"ok", "release", token, {}, {}, {}, {}, {}}); break;
        case leasehold::ReleaseOutcome::Lost: h.rec({"fail", "release", token, {}, {}, {}, std::string("lost"), {}}); break;
        case leasehold::ReleaseOutcome::NotOwner:
          h.rec({"fail", "release", token, {}, {}, {}, std::string("not_owner"), {}});
          break;
      }
      std::unique_lock lk(slot->mu);
      // A Lost outcome means on_lost fires (or fired): its line comes before the next op's.
      if (out == leasehold::ReleaseOutcome::Lost) slot->cv.wait_for(lk, 2s, [&] { return slot->fired; });
      slot->lease = nullptr;
    }
  }
  owned.reset();  // ~LockClient: closes the executor, joins its threads
  h.rec({"info", "stop", {}, {}, {}, {}, {}, {}});
  return 0;
} catch (const std::exception& e) {
  die(1, e.what());
}
