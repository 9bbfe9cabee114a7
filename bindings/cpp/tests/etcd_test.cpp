// EtcdExecutor on a real 3-member etcd cluster, started once for this binary
// (scripts/etcd-test-cluster.sh: free loopback ports, members stopped by pid) and shared by its
// tests: a waiter woken by its watch, processes contending, a member killed while they do, and
// bad input (no member reachable, a wrong password on a cluster with authentication). Under
// CI=true a missing etcd is a failure, never a skip.
#include <leasehold.hpp>
#include <leasehold/etcd_executor.hpp>

#include <gtest/gtest.h>

#include "server_test_util.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <filesystem>
#include <set>

using namespace std::chrono_literals;
using leasehold::ClientOptions;
using leasehold::EtcdOptions;
using leasehold::EtcdExecutor;
using leasehold::LockClient;
using namespace leasehold_test;

namespace {

struct Cluster {
  std::string dir, urls, error;
  int members = 0;
  bool start(int n) {
    members = n;
    if (sh("bash " + script("ensure-etcd.sh") + " >/dev/null 2>&1").first != 0) {
      error = "etcd is not installed (scripts/ensure-etcd.sh failed)";
      return false;
    }
    dir = temp_dir("etcd");
    auto [rc, out] = sh("bash " + script("etcd-test-cluster.sh") + " start " + dir + " " + std::to_string(n) + " 2>&1");
    if (rc != 0) {
      error = "etcd-test-cluster.sh start: " + out;
      return false;
    }
    urls = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
    return true;
  }
  void run(const std::string& what, int member) {
    sh("bash " + script("etcd-test-cluster.sh") + " " + what + " " + dir + " " + std::to_string(member) + " >/dev/null 2>&1");
  }
  [[nodiscard]] std::vector<std::string> endpoints() const { return EtcdOptions::split(urls); }
  ~Cluster() {
    if (dir.empty()) return;
    // Throw-away data: SIGKILL the members by their pids, all at once (a graceful stop takes
    // seconds).
    std::string cmd;
    for (int i = 1; i <= members; ++i)
      cmd += "bash " + script("etcd-test-cluster.sh") + " kill " + dir + " " + std::to_string(i) + " >/dev/null 2>&1 & ";
    sh(cmd + "wait");
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};
Cluster* g_etcd = nullptr;

// One POST with libcurl (the tests' own requests to the cluster): status and body.
std::pair<long, std::string> post(const std::string& url, const std::string& body) {
  CURL* e = curl_easy_init();
  std::string out;
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 5000L);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, +[](char* p, std::size_t s, std::size_t n, void* u) {
    static_cast<std::string*>(u)->append(p, s * n);
    return s * n;
  });
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &out);
  long code = 0;
  if (curl_easy_perform(e) == CURLE_OK) curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(e);
  return {code, out};
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class Etcd : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::signal(SIGPIPE, SIG_IGN);
    if (g_etcd == nullptr) {
      g_etcd = new Cluster();
      g_etcd->start(3);
    }
  }
  static void TearDownTestSuite() {
    delete g_etcd;
    g_etcd = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(g_etcd, nullptr);
    if (g_etcd->urls.empty()) {
      if (ci()) FAIL() << "CI=true and no etcd: " << g_etcd->error;
      GTEST_SKIP() << g_etcd->error;
    }
  }
  static std::shared_ptr<EtcdExecutor> transport(std::vector<std::string> endpoints, std::string user = {},
                                                  std::string password = {}) {
    EtcdOptions o;
    o.endpoints = std::move(endpoints);
    o.user = std::move(user);
    o.password = std::move(password);
    o.allow_insecure_auth = true;  // the test cluster speaks http:// on loopback
    o.log = [](std::string_view) {};
    return std::make_shared<EtcdExecutor>(o);
  }
  static ClientOptions quiet(bool failing = false) {
    ClientOptions o;
    o.close_timeout = failing ? 500ms : 5s;
    if (failing) o.config.request_timeout_ns = 1'000'000'000;
    o.log = [](std::string_view) {};
    return o;
  }
};

TEST_F(Etcd, LifecycleAndAWaiterWokenByItsWatch) {
  auto tb = transport(g_etcd->endpoints());
  LockClient a(transport(g_etcd->endpoints()), quiet());
  LockClient b(tb, quiet());
  auto held = a.acquire("life", 30s);
  ASSERT_TRUE(held.has_value()) << a.last_backend_error();
  EXPECT_GT(held->fencing_token(), 0u);
  EXPECT_FALSE(b.acquire("life", 5s).has_value());
  std::optional<leasehold::Lease> got;
  std::thread waiter([&] {
    leasehold::AcquireOptions o;
    o.wait = 20s;
    got = b.acquire("life", 5s, std::move(o));
  });
  // The waiter watches its predecessor's key; the release deletes it and wakes the waiter long
  // before its own retry at the holder's TTL (30 s).
  ASSERT_TRUE(eventually([&] { return tb->open_watches() == 1; }, 10s));
  const auto t0 = leasehold::Clock::now();
  const auto old = held->fencing_token();
  EXPECT_EQ(held->release(), leasehold::ReleaseOutcome::Released);
  waiter.join();
  ASSERT_TRUE(got.has_value()) << b.last_backend_error();
  EXPECT_LT(leasehold::Clock::now() - t0, 5s);
  EXPECT_GT(got->fencing_token(), old);
  // Status from a client that holds nothing: the owner key's revision and its time left.
  const auto st = a.status("life");
  ASSERT_TRUE(st.ok) << st.error;
  EXPECT_TRUE(st.held);
  EXPECT_EQ(st.fencing_token, got->fencing_token());
  EXPECT_GT(st.remaining_ttl_ms, 0u);
  EXPECT_LE(st.remaining_ttl_ms, 5000u);
  EXPECT_TRUE(eventually([&] { return tb->open_watches() == 0; }, 10s));
}

// The cluster's lease ids (the gateway's LeaseLeases).
std::set<std::string> lease_ids(const std::string& url) {
  const auto [code, body] = post(url + "/v3/lease/leases", "{}");
  std::set<std::string> ids;
  static const std::string tag = "\"ID\":\"";
  for (auto at = body.find(tag); at != std::string::npos; at = body.find(tag, at + 1)) {
    const auto from = at + tag.size();
    ids.insert(body.substr(from, body.find('"', from) - from));
  }
  return ids;
}

// A client's locks share one etcd lease; close() revokes it.
TEST_F(Etcd, LocksShareOnePooledLeaseThatCloseRevokes) {
  const auto url = g_etcd->endpoints().front();
  const auto before = lease_ids(url);
  LockClient a(transport(g_etcd->endpoints()), quiet());
  {
    auto x = a.acquire("pool-x", 10s);
    auto y = a.acquire("pool-y", 10s);
    ASSERT_TRUE(x.has_value() && y.has_value()) << a.last_backend_error();
    std::size_t fresh = 0;
    for (const auto& id : lease_ids(url)) fresh += before.count(id) == 0 ? 1 : 0;
    EXPECT_EQ(fresh, 1u);
  }
  a.close();
  for (const auto& id : lease_ids(url)) EXPECT_EQ(before.count(id), 1u) << "lease " << id << " outlived close()";
}

// Keep-alives renew the etcd lease past its TTL; a manual renewal is confirmed too.
TEST_F(Etcd, KeepAlivesRenewTheLease) {
  LockClient a(transport(g_etcd->endpoints()), quiet());
  auto lease = a.acquire("renewed", 2s);
  ASSERT_TRUE(lease.has_value()) << a.last_backend_error();
  ASSERT_TRUE(eventually([&] { return a.counters().renewals_ok >= 3 || lease->lost(); }, 20s));
  EXPECT_FALSE(lease->lost()) << a.last_backend_error();
  const auto before = lease->valid_until();
  EXPECT_GT(lease->renew(), before);
  LockClient b(transport(g_etcd->endpoints()), quiet());
  EXPECT_FALSE(b.acquire("renewed", 2s).has_value());  // still ours, well past the first TTL
}

// Worker processes contend for one name: one holder at a time, fences (create revisions)
// strictly increasing in grant order.
TEST_F(Etcd, ProcessesContendFencesStrictlyIncrease) {
  const auto log = g_etcd->dir + "/contend.log";
  constexpr int kWorkers = 3, kIters = 10;
  const auto done = contend({LEASEHOLD_PAUSE_WORKER, "etcd", g_etcd->urls}, kWorkers,
                            "contend contend " + std::to_string(kIters) + " 5000 30000 " + log, 120s);
  for (auto n : done) EXPECT_EQ(n, kIters);
  const auto entries = read_log(log);
  EXPECT_EQ(entries.size(), 2u * kWorkers * kIters);
  check_log(entries, true);
}

// A JSON string field's value ("…"), as etcd's gateway writes it.
std::string field(const std::string& json, const std::string& name) {
  const auto at = json.find("\"" + name + "\":\"");
  if (at == std::string::npos) return {};
  const auto from = at + name.size() + 4;
  return json.substr(from, json.find('"', from) - from);
}

// The leader's member number (1-based), 0 if unknown.
int leader() {
  const auto urls = g_etcd->endpoints();
  for (std::size_t i = 0; i < urls.size(); ++i) {
    const auto [code, body] = post(urls[i] + "/v3/maintenance/status", "{}");
    if (code == 200 && !field(body, "leader").empty() && field(body, "leader") == field(body, "member_id"))
      return static_cast<int>(i) + 1;
  }
  return 0;
}

// The leader is killed while processes contend: requests to it fail over to the others,
// acquisitions go on after the election, one holder at a time, fences strictly increasing; the
// member comes back.
TEST_F(Etcd, LeaderKilledDuringContention) {
  const auto log = g_etcd->dir + "/killed.log";
  constexpr int kWorkers = 3, kIters = 40;
  int killed = 0;
  const auto done = contend({LEASEHOLD_PAUSE_WORKER, "etcd", g_etcd->urls}, kWorkers,
                            "contend killed " + std::to_string(kIters) + " 5000 30000 " + log, 120s, [&] {
                              killed = leader();
                              if (killed == 0) killed = 1;
                              std::this_thread::sleep_for(50ms);
                              g_etcd->run("kill", killed);
                            });
  ASSERT_GT(killed, 0);
  EXPECT_EQ(leader() == killed, false);
  for (auto n : done) EXPECT_EQ(n, kIters);
  const auto entries = read_log(log);
  EXPECT_EQ(entries.size(), 2u * kWorkers * kIters);
  check_log(entries, true);
  g_etcd->run("restart", killed);
  const auto back = g_etcd->endpoints()[static_cast<std::size_t>(killed - 1)];
  EXPECT_TRUE(eventually([&] { return post(back + "/v3/kv/range", R"({"key":"AA=="})").first == 200; }, 30s));
}

// The member every client starts at is stopped (SIGSTOP) while processes contend: requests to
// it time out and fail over, a watch it holds goes silent and its waiter wakes by its own retry
// at the holder's TTL; one holder at a time, fences strictly increasing.
TEST_F(Etcd, MemberStoppedDuringContention) {
  const auto pid = std::stoi(sh("bash " + script("etcd-test-cluster.sh") + " pid " + g_etcd->dir + " 1").second);
  struct Continue {
    int pid;
    ~Continue() { ::kill(pid, SIGCONT); }
  } resume{pid};
  const auto log = g_etcd->dir + "/stopped.log";
  constexpr int kWorkers = 3, kIters = 6;
  const auto done = contend({LEASEHOLD_PAUSE_WORKER, "etcd", g_etcd->urls}, kWorkers,
                            "contend stopped " + std::to_string(kIters) + " 1500 30000 " + log, 120s,
                            [&] { ASSERT_EQ(::kill(pid, SIGSTOP), 0); });
  for (auto n : done) EXPECT_EQ(n, kIters);
  const auto entries = read_log(log);
  EXPECT_EQ(entries.size(), 2u * kWorkers * kIters);
  check_log(entries, true);
}

// A holder stopped (SIGSTOP) past its TTL: its etcd lease expires, another process takes the
// lock with a higher fence (the create revision), and the resumed holder learns it lost the
// lock: its release ends Lost, once, with its signals.
TEST_F(Etcd, PausedHolderIsTakenOverAndLearnsItLost) {
  auto worker = Child::spawn({LEASEHOLD_PAUSE_WORKER, "etcd", g_etcd->urls}, true, "");
  ASSERT_GT(worker.pid, 0);
  worker.write_line("acquire paused 1000");
  const auto held = worker.read_line(30s);
  ASSERT_TRUE(held && held->rfind("held ", 0) == 0) << held.value_or("<nothing>");
  const auto old = std::stoull(held->substr(5));
  ASSERT_EQ(::kill(worker.pid, SIGSTOP), 0);
  LockClient taker(transport(g_etcd->endpoints()), quiet());
  leasehold::AcquireOptions o;
  o.wait = 20s;
  auto lease = taker.acquire("paused", 5s, std::move(o));
  ASSERT_TRUE(lease.has_value()) << taker.last_backend_error();
  EXPECT_GT(lease->fencing_token(), old);
  worker.write_line("release");
  ASSERT_EQ(::kill(worker.pid, SIGCONT), 0);
  const auto report = worker.read_line(30s);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->rfind("outcome=lost lost=1 reason=", 0), 0u) << *report;
  EXPECT_NE(report->find("callbacks=1 stop=1"), std::string::npos) << *report;
  worker.write_line("quit");
  EXPECT_EQ(worker.wait_exit(30s), 0);
  worker.stop();
  EXPECT_TRUE(lease->is_held());
}

TEST_F(Etcd, NoMemberReachableIsAClearErrorNeverAGrant) {
  EtcdOptions o;
  o.endpoints = {"http://127.0.0.1:" + std::to_string(free_port()), "http://127.0.0.1:" + std::to_string(free_port())};
  auto mu = std::make_shared<std::mutex>();
  auto logs = std::make_shared<std::vector<std::string>>();
  o.log = [mu, logs](std::string_view m) {
    std::lock_guard g(*mu);
    logs->emplace_back(m);
  };
  LockClient c(std::make_shared<EtcdExecutor>(o), quiet(true));
  leasehold::AcquireOptions wait;
  wait.wait = 1500ms;
  EXPECT_FALSE(c.acquire("n", 5s, std::move(wait)).has_value());
  // What libcurl saw, not a vaguer "no reply".
  EXPECT_NE(c.last_backend_error().find("Couldn't connect"), std::string::npos) << c.last_backend_error();
  EXPECT_EQ(c.counters().grants, 0u);
  c.close();
  std::lock_guard g(*mu);
  ASSERT_GE(logs->size(), 2u);  // both members tried
  EXPECT_NE(logs->front().find(o.endpoints[0]), std::string::npos) << logs->front();
  EXPECT_NE(logs->back().find("onnect"), std::string::npos) << logs->back();
}

// A server that answers every request with 200 and a body that is not etcd's: the core reads
// it as garbage, never a grant.
TEST_F(Etcd, GarbageRepliesAreAClearErrorNeverAGrant) {
  const auto listener = leasehold_test::listen_loopback();
  const int fd = listener.first, port = listener.second;
  ASSERT_GE(fd, 0);
  std::atomic<bool> stop{false};
  std::atomic<int> served{0};
  std::thread server([&] {
    while (!stop) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) continue;
      char buf[8192];
      std::string req;
      while (req.find("\r\n\r\n") == std::string::npos) {
        const auto n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        req.append(buf, static_cast<std::size_t>(n));
      }
      static const char reply[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 17\r\n"
                                  "Connection: close\r\n\r\n{\"ID\":[1,2,3],\"x\"";
      [[maybe_unused]] auto w = ::send(c, reply, sizeof reply - 1, MSG_NOSIGNAL);
      ++served;
      ::close(c);
    }
  });
  {
    LockClient c(transport({"http://127.0.0.1:" + std::to_string(port)}), quiet(true));
    EXPECT_FALSE(c.acquire("n", 5s).has_value());
    EXPECT_NE(c.last_backend_error().find("malformed reply"), std::string::npos) << c.last_backend_error();
    EXPECT_EQ(c.counters().grants, 0u);
  }
  stop = true;
  server.join();
  ::close(fd);
  EXPECT_GE(served.load(), 1);
}

// A user and password go to http:// endpoints (etcd:// included) only with allow_insecure_auth;
// an endpoint holding credentials is refused. The errors name the endpoint, never the password.
TEST(EtcdCredentials, ClearTextAuthNeedsAnOptInAndEndpointsHoldNoCredentials) {
  const auto make = [](std::vector<std::string> endpoints, bool opt_in, std::string user = "root") {
    EtcdOptions o;
    o.endpoints = std::move(endpoints);
    o.user = std::move(user);
    o.password = "S3CRET";
    o.allow_insecure_auth = opt_in;
    o.log = [](std::string_view) {};
    return std::make_shared<EtcdExecutor>(o);
  };
  for (const auto& endpoints : {std::vector<std::string>{"http://127.0.0.1:2379"}, EtcdOptions::split("etcd://127.0.0.1:2379"),
                                std::vector<std::string>{"https://127.0.0.1:2379", "http://127.0.0.1:2380"}}) {
    try {
      make(endpoints, false);
      ADD_FAILURE() << "credentials accepted for " << endpoints.back();
    } catch (const leasehold::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("allow_insecure_auth"), std::string::npos) << what;
      EXPECT_NE(what.find("http://127.0.0.1"), std::string::npos) << what;
      EXPECT_EQ(what.find("S3CRET"), std::string::npos) << what;
    }
    EXPECT_NO_THROW(make(endpoints, true));
    EXPECT_NO_THROW(make(endpoints, false, ""));  // no authentication: nothing to protect
  }
  EXPECT_NO_THROW(make({"https://127.0.0.1:2379"}, false));
  for (const auto& endpoint : {"http://root:S3CRET@127.0.0.1:2379", "https://root:S3CRET@127.0.0.1:2379/"}) {
    try {
      make({"https://127.0.0.1:2379", endpoint}, true);
      ADD_FAILURE() << "an endpoint with credentials was accepted";
    } catch (const leasehold::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("endpoint 2 holds credentials"), std::string::npos) << what;
      EXPECT_EQ(what.find("S3CRET"), std::string::npos) << what;
    }
  }
}

// A cluster with authentication: a wrong password is a clear error and never a grant; the
// right one works.
TEST_F(Etcd, WrongPasswordGrantsNothing) {
  Cluster auth;
  ASSERT_TRUE(auth.start(1)) << auth.error;
  const auto url = auth.endpoints().front();
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v3/auth/user/add", R"({"name":"root","password":"rootpw"})"},
           {"/v3/auth/role/add", R"({"name":"root"})"},
           {"/v3/auth/user/grant", R"({"user":"root","role":"root"})"},
           {"/v3/auth/enable", "{}"}}) {
    const auto [code, reply] = post(url + path, body);
    ASSERT_EQ(code, 200) << path << ": " << reply;
  }
  {
    LockClient wrong(transport(auth.endpoints(), "root", "nope"), quiet(true));
    EXPECT_FALSE(wrong.acquire("guarded", 3s).has_value());
    EXPECT_NE(wrong.last_backend_error().find("authentication failed"), std::string::npos) << wrong.last_backend_error();
    EXPECT_EQ(wrong.counters().grants, 0u);
  }
  LockClient right(transport(auth.endpoints(), "root", "rootpw"), quiet());
  auto lease = right.acquire("guarded", 3s);
  ASSERT_TRUE(lease.has_value()) << right.last_backend_error();
  EXPECT_GT(lease->fencing_token(), 0u);
}

}  // namespace
