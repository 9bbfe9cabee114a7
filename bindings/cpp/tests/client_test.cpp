// Tests of leasehold::LockClient driven against MemoryService through MemoryExecutor (with faults).
// No timing assertions: waits are bounded only so that a broken build fails instead of hanging.
#include <leasehold.hpp>
#include <leasehold/memory_executor.hpp>

#include <gtest/gtest.h>

#include "child_process.hpp"

#include <atomic>
#include <condition_variable>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using leasehold::AcquireOptions;
using leasehold::ClientOptions;
using leasehold::Error;
using leasehold::Lease;
using leasehold::LockClient;
using leasehold::LostReason;
using leasehold::MemoryService;
using leasehold::MemoryExecutor;

namespace {

// Upper bound for "eventually": only reached when something is broken.
constexpr auto kPatience = 60s;

template <class P>
bool eventually(P pred, std::chrono::milliseconds limit = kPatience) {
  const auto end = leasehold::Clock::now() + limit;
  while (!pred()) {
    if (leasehold::Clock::now() > end) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

ClientOptions quiet(std::chrono::milliseconds request_timeout = 500ms) {
  ClientOptions o;
  o.config.request_timeout_ns = static_cast<std::uint64_t>(std::chrono::nanoseconds(request_timeout).count());
  o.close_timeout = 10s;
  o.log = [](std::string_view) {};
  return o;
}

struct World {
  std::shared_ptr<MemoryService> service = std::make_shared<MemoryService>();
  std::shared_ptr<MemoryExecutor> transport(bool notifications = true) {
    return std::make_shared<MemoryExecutor>(service, notifications);
  }
};

template <class F>
Error catch_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected leasehold::Error";
  return Error(0, "none");
}

AcquireOptions wait_for(std::chrono::nanoseconds w) {
  AcquireOptions o;
  o.wait = w;
  return o;
}

}  // namespace

TEST(LockClient, Lifecycle) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet());
  std::uint64_t first_fence = 0;
  {
    auto lease = client.acquire("jobs", 5s);
    ASSERT_TRUE(lease.has_value());
    EXPECT_TRUE(lease->owns());
    EXPECT_TRUE(lease->is_held());
    EXPECT_FALSE(lease->lost());
    EXPECT_EQ(lease->name(), "jobs");
    EXPECT_GT(lease->fencing_token(), 0u);
    EXPECT_GT(lease->valid_until(), leasehold::Clock::now());
    EXPECT_FALSE(lease->stop_token().stop_requested());
    auto holder = w.service->holder("jobs");
    ASSERT_TRUE(holder.has_value());
    EXPECT_EQ(holder->fencing_token, lease->fencing_token());
    first_fence = lease->fencing_token();

    lease->release();
    EXPECT_FALSE(lease->owns());
    EXPECT_FALSE(lease->is_held());
    lease->release();  // idempotent
  }
  EXPECT_TRUE(eventually([&] { return !w.service->holder("jobs"); }));
  auto again = client.acquire("jobs", 5s);
  ASSERT_TRUE(again.has_value());
  EXPECT_GT(again->fencing_token(), first_fence);
  EXPECT_FALSE(again->stop_token().stop_requested());  // released, never lost
}

TEST(LockClient, LeaseDestructorReleases) {
  World w;
  LockClient a(w.transport(), quiet());
  LockClient b(w.transport(), quiet());
  {
    auto lease = a.acquire("d", 30s);
    ASSERT_TRUE(lease.has_value());
    EXPECT_FALSE(b.acquire("d", 30s).has_value());  // held by a (wait 0: one attempt)
  }
  EXPECT_TRUE(eventually([&] { return !w.service->holder("d"); }));
  auto lb = b.acquire("d", 30s);
  ASSERT_TRUE(lb.has_value());
  EXPECT_TRUE(eventually([&] { return a.counters().pending_cleanups == 0; }));
}

TEST(LockClient, MoveOnlyLease) {
  World w;
  LockClient client(w.transport(), quiet());
  auto l1 = client.acquire("m1", 5s);
  auto l2 = client.acquire("m2", 5s);
  ASSERT_TRUE(l1 && l2);
  static_assert(!std::is_copy_constructible_v<Lease> && std::is_nothrow_move_constructible_v<Lease>);
  Lease moved = std::move(*l1);
  EXPECT_FALSE(l1->owns());  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(moved.owns());
  EXPECT_EQ(moved.name(), "m1");
  moved = std::move(*l2);  // releases m1
  EXPECT_EQ(moved.name(), "m2");
  EXPECT_TRUE(eventually([&] { return !w.service->holder("m1"); }));
  EXPECT_TRUE(w.service->holder("m2").has_value());
}

class Renewal : public ::testing::TestWithParam<int> {};

TEST_P(Renewal, KeepsTheLeaseAcrossRenewals) {
  const auto ttl = std::chrono::milliseconds(GetParam());
  World w;
  LockClient client(w.transport(), quiet(2s));
  std::atomic<int> lost{0};
  AcquireOptions o;
  o.on_lost = [&](LostReason) { ++lost; };
  auto lease = client.acquire("renew", ttl, std::move(o));
  ASSERT_TRUE(lease.has_value());
  const auto first_valid = lease->valid_until();
  // Wait for three confirmed renewals (≈ one TTL); fail, not hang, if they never come.
  ASSERT_TRUE(eventually([&] { return client.counters().renewals_ok >= 3 || lease->lost(); }));
  EXPECT_FALSE(lease->lost()) << "lost: " << leasehold::to_string(lease->lost_reason().value_or(LostReason::Expired));
  EXPECT_EQ(lost.load(), 0);
  EXPECT_TRUE(lease->is_held());
  EXPECT_GT(lease->valid_until(), first_valid);
  auto holder = w.service->holder("renew");
  ASSERT_TRUE(holder.has_value());  // still ours on the service, past the original TTL
  EXPECT_EQ(holder->fencing_token, lease->fencing_token());
  EXPECT_EQ(w.service->grants(), 1u);
}

// Small enough to renew many times, large enough that a loaded 2-core CI box under TSan does
// not starve the driver past a renewal's slack (~2/3 of the TTL).
INSTANTIATE_TEST_SUITE_P(Ttls, Renewal, ::testing::Values(250, 500, 1000, 2000, 4000));

TEST(LockClient, LossDetectedWhileTransportHangs) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet(2s));
  std::atomic<int> calls{0};
  std::atomic<int> reason{0};
  AcquireOptions o;
  o.on_lost = [&](LostReason r) {
    reason = static_cast<int>(r);
    ++calls;
  };
  auto lease = client.acquire("hang", 600ms, std::move(o));
  ASSERT_TRUE(lease.has_value());
  std::atomic<bool> stopped_cb{false};
  std::stop_callback on_stop(lease->stop_token(), [&] { stopped_cb = true; });

  t->set_hang(true);  // every renew from now on blocks forever
  ASSERT_TRUE(eventually([&] { return lease->stop_token().stop_requested(); }));
  // A renew is stuck in the transport (and stays stuck): detection did not wait for it.
  EXPECT_TRUE(eventually([&] { return t->hung() >= 1; }));
  EXPECT_TRUE(eventually([&] { return calls.load() == 1; }));
  EXPECT_TRUE(stopped_cb.load());
  EXPECT_TRUE(lease->lost());
  const auto r = *lease->lost_reason();
  EXPECT_TRUE(r == LostReason::Expired || r == LostReason::FailBudget) << leasehold::to_string(r);
  EXPECT_EQ(reason.load(), static_cast<int>(r));
  EXPECT_FALSE(lease->is_held());
  // Expired is declared at valid_until; FailBudget (the time budget) just before it.
  if (r == LostReason::Expired) {
    EXPECT_LE(lease->valid_until(), leasehold::Clock::now());
  }
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Lost);  // nothing sent for a lost lease
  t->set_hang(false);
  EXPECT_EQ(calls.load(), 1);
}

TEST(LockClient, LossWhenRenewRejected) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet());
  std::atomic<int> calls{0};
  AcquireOptions o;
  o.on_lost = [&](LostReason r) {
    EXPECT_EQ(r, LostReason::Rejected);
    ++calls;
  };
  auto lease = client.acquire("rej", 600ms, std::move(o));
  ASSERT_TRUE(lease.has_value());
  w.service->drop_lock("rej");  // the service forgot us (failover)
  ASSERT_TRUE(eventually([&] { return lease->lost(); }));
  EXPECT_EQ(lease->lost_reason(), LostReason::Rejected);
  EXPECT_TRUE(eventually([&] { return calls.load() == 1; }));
  EXPECT_TRUE(lease->stop_token().stop_requested());

  auto l2 = client.acquire("rej2", 600ms);
  ASSERT_TRUE(l2.has_value());
  t->set_reject(true);
  EXPECT_TRUE(eventually([&] { return l2->lost(); }));
  EXPECT_EQ(l2->lost_reason(), LostReason::Rejected);
  EXPECT_GE(client.counters().lost_rejected, 2u);
}

TEST(LockClient, LossWhenPartitioned) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet());
  auto lease = client.acquire("part", 600ms);
  ASSERT_TRUE(lease.has_value());
  t->set_partition(true);
  ASSERT_TRUE(eventually([&] { return lease->lost(); }));
  const auto r = *lease->lost_reason();
  EXPECT_TRUE(r == LostReason::Expired || r == LostReason::FailBudget) << leasehold::to_string(r);
  EXPECT_FALSE(lease->is_held());
}

TEST(LockClient, OnLostExceptionIsLoggedNotFatal) {
  World w;
  std::atomic<int> logged{0};
  auto opts = quiet();
  opts.log = [&](std::string_view m) {
    if (m.find("on_lost") != std::string_view::npos) ++logged;
  };
  LockClient client(w.transport(), opts);
  AcquireOptions o;
  o.on_lost = [](LostReason) { throw std::runtime_error("boom"); };
  auto lease = client.acquire("throws", 600ms, std::move(o));
  ASSERT_TRUE(lease.has_value());
  w.service->drop_lock("throws");
  ASSERT_TRUE(eventually([&] { return logged.load() == 1; }));
  auto next = client.acquire("after", 5s);  // the driver is alive
  EXPECT_TRUE(next.has_value());
}

TEST(LockClient, BoundedWaitWhenHeldByOther) {
  World w;
  LockClient a(w.transport(), quiet());
  LockClient b(w.transport(), quiet());
  auto held = a.acquire("bw", 30s);
  ASSERT_TRUE(held.has_value());
  EXPECT_FALSE(b.acquire("bw", 30s).has_value());                // one attempt
  EXPECT_FALSE(b.acquire("bw", 30s, wait_for(300ms)).has_value());  // budget runs out first
  EXPECT_GE(b.counters().acquire_failed, 2u);
  EXPECT_EQ(w.service->holder("bw")->fencing_token, held->fencing_token());
}

TEST(LockClient, BoundedWaitWhenTransportHangs) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet(200ms));
  t->set_hang(true);
  EXPECT_FALSE(client.acquire("hung", 5s, wait_for(300ms)).has_value());
  EXPECT_FALSE(client.acquire("hung", 5s).has_value());
  EXPECT_TRUE(eventually([&] { return t->hung() >= 1; }));
  t->set_hang(false);  // hung calls fail without being executed
  EXPECT_TRUE(eventually([&] { return !w.service->holder("hung"); }));
}

TEST(LockClient, BoundedWaitWhenPartitioned) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet(200ms));
  t->set_partition(true);
  EXPECT_FALSE(client.acquire("p", 5s, wait_for(300ms)).has_value());
  t->set_partition(false);
  EXPECT_TRUE(client.acquire("p", 5s, wait_for(5s)).has_value());
}

TEST(LockClient, WaiterIsWokenByRelease) {
  World w;
  LockClient a(w.transport(), quiet());
  LockClient b(w.transport(), quiet());
  auto held = a.acquire("wake", 60s);  // would only expire after the waiter's budget
  ASSERT_TRUE(held.has_value());
  std::optional<Lease> got;
  std::thread waiter([&] { got = b.acquire("wake", 60s, wait_for(30s)); });
  ASSERT_TRUE(eventually([&] { return w.service->subscriptions() >= 1; }));  // b watches "wake"
  const auto old_fence = held->fencing_token();
  held.reset();  // release → notification → b retries
  waiter.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_GT(got->fencing_token(), old_fence);
  got.reset();
  EXPECT_TRUE(eventually([&] { return w.service->subscriptions() == 0; }));  // unwatched
}

TEST(LockClient, DuplicateRepliesLostAcquireIsIdempotent) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet(200ms));
  t->set_drop(true);  // grants are executed, replies lost
  std::optional<Lease> got;
  std::thread th([&] { got = client.acquire("idem", 10s, wait_for(30s)); });
  ASSERT_TRUE(eventually([&] { return w.service->holder("idem").has_value(); }));
  t->set_drop(false);
  th.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(w.service->grants(), 1u);  // the retry found its own grant
  EXPECT_EQ(got->fencing_token(), w.service->holder("idem")->fencing_token);
}

TEST(LockClient, Reentrant) {
  World w;
  LockClient client(w.transport(), quiet());
  AcquireOptions r;
  r.reentrant = true;
  auto a = client.acquire("re", 5s, r);
  auto b = client.acquire("re", 5s, r);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->id(), b->id());
  EXPECT_EQ(a->fencing_token(), b->fencing_token());
  EXPECT_EQ(w.service->grants(), 1u);
  EXPECT_FALSE(client.acquire("re", 5s).has_value());  // non-reentrant: a different lease, held
  a.reset();
  EXPECT_TRUE(b->is_held());
  EXPECT_TRUE(w.service->holder("re").has_value());
  b.reset();
  EXPECT_TRUE(eventually([&] { return !w.service->holder("re"); }));
}

TEST(LockClient, DestroyWhileAcquiring) {
  World w;
  LockClient a(w.transport(), quiet());
  auto held = a.acquire("dwa", 60s);
  ASSERT_TRUE(held.has_value());
  auto b = std::make_unique<LockClient>(w.transport(), quiet());
  std::optional<Lease> got;
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    got = b->acquire("dwa", 60s, wait_for(60s));
    returned = true;
  });
  ASSERT_TRUE(eventually([&] { return w.service->subscriptions() >= 1; }));
  b.reset();  // destroy while the waiter is inside acquire()
  waiter.join();
  EXPECT_TRUE(returned.load());
  EXPECT_FALSE(got.has_value());
  EXPECT_EQ(w.service->subscriptions(), 0u);
  held.reset();
  EXPECT_TRUE(eventually([&] { return !w.service->holder("dwa"); }));
  LockClient c(w.transport(), quiet());
  EXPECT_TRUE(c.acquire("dwa", 5s).has_value());  // nothing leaked by b
}

TEST(LockClient, DestroyWhileAcquiringOverHungTransport) {
  World w;
  auto t = w.transport();
  auto opts = quiet(5s);
  opts.close_timeout = 200ms;
  auto client = std::make_unique<LockClient>(t, opts);
  t->set_hang(true);
  std::optional<Lease> got;
  std::thread waiter([&] { got = client->acquire("dh", 5s, wait_for(60s)); });
  ASSERT_TRUE(eventually([&] { return t->hung() >= 1; }));
  client.reset();  // close() must not wait for the hung call forever
  waiter.join();
  EXPECT_FALSE(got.has_value());
  EXPECT_EQ(t->hung(), 0u);  // close() unblocked it
  EXPECT_FALSE(w.service->holder("dh").has_value());
}

TEST(LockClient, DestroyClientWhileHeld) {
  World w;
  auto client = std::make_unique<LockClient>(w.transport(), quiet());
  auto lease = client->acquire("dch", 60s);
  ASSERT_TRUE(lease.has_value());
  std::atomic<bool> stopped{false};
  std::stop_callback cb(lease->stop_token(), [&] { stopped = true; });
  client.reset();  // releases every lease on the way out
  EXPECT_FALSE(w.service->holder("dch").has_value());
  EXPECT_TRUE(stopped.load());
  EXPECT_FALSE(lease->is_held());
  EXPECT_FALSE(lease->lost());
  lease->release();  // harmless after the client is gone
  lease.reset();
}

TEST(LockClient, MoveOnlyClient) {
  World w;
  static_assert(!std::is_copy_constructible_v<LockClient> && std::is_nothrow_move_constructible_v<LockClient>);
  LockClient a(w.transport(), quiet());
  auto lease = a.acquire("mc", 30s);
  ASSERT_TRUE(lease.has_value());
  LockClient b = std::move(a);
  EXPECT_EQ(catch_error([&] { (void)a.acquire("x", 1s); }).code(), leasehold::status::closed);  // NOLINT
  EXPECT_TRUE(lease->is_held());  // the lease belongs to the state, which moved to b
  LockClient c(w.transport(), quiet());
  c = std::move(b);  // closes c's own state, takes b's
  EXPECT_TRUE(lease->is_held());
  EXPECT_TRUE(c.acquire("mc2", 5s).has_value());
}

TEST(LockClient, CloseIsIdempotentAndFinal) {
  World w;
  LockClient client(w.transport(), quiet());
  client.close();
  client.close();
  EXPECT_EQ(catch_error([&] { (void)client.acquire("x", 1s); }).code(), leasehold::status::closed);
  EXPECT_EQ(catch_error([&] { (void)client.counters(); }).code(), leasehold::status::closed);
}

TEST(LockClient, ManyThreadsAcquireAndRelease) {
  World w;
  constexpr int kClients = 2, kThreads = 4, kIters = 25;
  const std::vector<std::string> names{"n0", "n1", "n2"};
  std::vector<std::unique_ptr<LockClient>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(std::make_unique<LockClient>(w.transport(), quiet(2s)));

  std::mutex mu;
  std::map<std::string, std::uint64_t> last_fence;
  std::map<std::string, int> inside;
  std::atomic<int> violations{0}, acquired{0}, failed{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, c, t] {
        for (int i = 0; i < kIters; ++i) {
          const auto& name = names[static_cast<std::size_t>(i + t) % names.size()];
          auto lease = clients[static_cast<std::size_t>(c)]->acquire(name, 10s, wait_for(60s));
          if (!lease) {
            ++failed;
            continue;
          }
          ++acquired;
          {
            std::lock_guard g(mu);
            if (++inside[name] != 1) ++violations;
            if (lease->fencing_token() <= last_fence[name]) ++violations;
            last_fence[name] = lease->fencing_token();
          }
          std::this_thread::yield();
          {
            std::lock_guard g(mu);
            --inside[name];
          }
          lease->release();
        }
      });
    }
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(acquired.load(), kClients * kThreads * kIters);
  for (auto& c : clients) EXPECT_TRUE(eventually([&] { return c->counters().pending_cleanups == 0; }));
  clients.clear();
  for (const auto& n : names) EXPECT_FALSE(w.service->holder(n).has_value());
}

TEST(LockClient, PollingWithoutNotifications) {
  World w;
  LockClient a(w.transport(false), quiet());
  LockClient b(w.transport(false), quiet());
  auto held = a.acquire("poll", 60s);
  ASSERT_TRUE(held.has_value());
  std::optional<Lease> got;
  std::thread waiter([&] { got = b.acquire("poll", 5s, wait_for(30s)); });
  ASSERT_TRUE(eventually([&] { return b.counters().acquires_sent >= 2; }));  // it asks again by itself
  held.reset();
  waiter.join();
  EXPECT_TRUE(got.has_value());
  EXPECT_EQ(b.counters().backend_wakeups, 0u);  // no notification reached it
}

// An executor that misbehaves in ways a real one might: it throws, answers garbage the core
// cannot read, answers a well-formed value of the wrong shape, or answers with the wrong kind.
class MisbehavingExecutor final : public leasehold::Executor {
 public:
  enum class Mode { Throw, ThrowNonStd, Malformed, Oversized, Garbage, WrongKind };
  explicit MisbehavingExecutor(Mode m) : mode_(m) {}
  ~MisbehavingExecutor() override { close(); }
  [[nodiscard]] lh_backend_options backend_options() const override {
    return leasehold::backend_defaults(LH_BACKEND_MEMORY);
  }
  void start(Sink sink) override {
    sink_ = std::move(sink);
    worker_ = std::thread([this] {
      std::unique_lock l(mu_);
      for (;;) {
        cv_.wait(l, [&] { return closed_ || !ids_.empty(); });
        if (closed_) return;
        const auto id = ids_.front();
        ids_.erase(ids_.begin());
        l.unlock();
        sink_(answer(id));
        l.lock();
      }
    });
  }
  void execute(leasehold::IoRequest r) override {
    ++calls;
    if (mode_ == Mode::Throw) throw std::runtime_error("connection reset by peer");
    if (mode_ == Mode::ThrowNonStd) throw 42;
    if (mode_ == Mode::WrongKind) {
      sink_(leasehold::IoHttpReply{r.id, 200, "{}"});  // from inside execute(): queued for the driver
      return;
    }
    std::lock_guard g(mu_);
    ids_.push_back(r.id);
    cv_.notify_one();
  }
  void close() override {
    {
      std::lock_guard g(mu_);
      closed_ = true;
    }
    cv_.notify_one();
    if (worker_.joinable()) worker_.join();
  }
  std::atomic<int> calls{0};

 private:
  leasehold::IoAnswer answer(std::uint64_t id) const {
    lh_value v{};
    switch (mode_) {
      case Mode::Malformed:
        v.kind = LH_VALUE_ARRAY, v.len = 3;  // elements promised, none given
        return leasehold::IoReply{id, {v}, {}};
      case Mode::Oversized:
        v.kind = LH_VALUE_BULK, v.len = LH_MAX_REPLY_DATA + 1;
        return leasehold::IoReply{id, {v}, std::string(LH_MAX_REPLY_DATA + 1, 'g')};
      default:
        v.kind = LH_VALUE_INT, v.integer = 7;  // readable, but no answer of the memory protocol
        return leasehold::IoReply{id, {v}, {}};
    }
  }
  Mode mode_;
  Sink sink_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::uint64_t> ids_;
  bool closed_ = false;
  std::thread worker_;
};

TEST(LockClient, ExecutorFaultsAreNeverGrants) {
  using M = MisbehavingExecutor::Mode;
  for (auto mode : {M::Throw, M::ThrowNonStd, M::Malformed, M::Oversized, M::Garbage, M::WrongKind}) {
    SCOPED_TRACE(static_cast<int>(mode));
    auto t = std::make_shared<MisbehavingExecutor>(mode);
    std::atomic<int> logged{0};
    auto opts = quiet(200ms);
    opts.log = [&](std::string_view) { ++logged; };
    {
      LockClient client(t, opts);
      EXPECT_FALSE(client.acquire("bad", 1s, wait_for(300ms)).has_value());
      EXPECT_GE(t->calls.load(), 1);
      const auto n = client.counters();
      EXPECT_EQ(n.grants, 0u);
      EXPECT_GE(n.acquire_failed, 1u);
      // Each is a transport error or a garbage answer for the engine, never a grant.
      EXPECT_GE(n.backend_transport_failures + n.backend_garbage_replies, 1u);
      if (mode == M::Garbage) {
        EXPECT_GE(n.backend_garbage_replies, 1u);
        EXPECT_FALSE(client.last_backend_error().empty());
      } else {
        EXPECT_GE(logged.load(), 1);  // the executor's fault or the refused answer was logged
      }
    }
  }
}

// The memory service answers status queries like every backend.
TEST(LockClient, StatusOnTheMemoryService) {
  World w;
  LockClient a(w.transport(), quiet());
  auto lease = a.acquire("st", 30s);
  ASSERT_TRUE(lease.has_value());
  const auto st = a.status("st");
  EXPECT_TRUE(st.ok) << st.error;
  EXPECT_TRUE(st.held);
  EXPECT_EQ(st.fencing_token, lease->fencing_token());
  EXPECT_GT(st.remaining_ttl_ms, 0u);
  lease->release();
  const auto free = a.status("st");
  EXPECT_TRUE(free.ok) << free.error;
  EXPECT_FALSE(free.held);
  EXPECT_EQ(free.last_fencing_token, lease->fencing_token());
  EXPECT_EQ(catch_error([&] { (void)a.status(""); }).code(), LH_ERR_EMPTY_NAME);
}

// A status query whose caller gave up is answered later and dropped; the queries after it get
// their own answers.
TEST(LockClient, StatusAnsweredAfterItsCallerGaveUp) {
  World w;
  auto t = w.transport();
  LockClient a(t, quiet());
  auto lease = a.acquire("st-late", 30s);
  ASSERT_TRUE(lease.has_value());
  t->set_hang(true);
  EXPECT_EQ(catch_error([&] { (void)a.status("st-late", 50ms); }).code(), leasehold::status::timeout);
  EXPECT_TRUE(eventually([&] { return t->hung() >= 1; }));
  t->set_hang(false);  // the hung query fails now, with nobody waiting for it
  for (int i = 0; i < 3; ++i) {
    const auto st = a.status("st-late");
    EXPECT_TRUE(st.ok) << st.error;
    EXPECT_TRUE(st.held);
    EXPECT_EQ(st.fencing_token, lease->fencing_token());
  }
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
}

// ---- every bad input ----------------------------------------------------------------------

// --- renew, auto_renew, release outcomes, the failure budget -----------------------------------

TEST(LockClient, PausedThenReleasedEndsLost) {
  leasehold_test::pause_then_release({LEASEHOLD_PAUSE_WORKER, "memory"}, "paused", 300ms, 700ms, 3);
}

struct leasehold::detail::TestAccess {
  // Holds the driver (it handles no deadline, result or call) as a starved or paused one would.
  static void hold_driver(LockClient& c, bool on) {
    const auto st = c.state();
    {
      std::lock_guard g(st->mu_);
      st->hold_driver_ = on;
    }
    st->driver_cv_.notify_all();
  }
};

// The paused-then-released case with the driver held past the lease's validity (the core's
// expiry check has not run) when release() is called: it must end Lost, not Released.
TEST(LockClient, ReleaseAfterValidityRanOutUnnoticedEndsLost) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet());
  std::atomic<int> calls{0};
  std::atomic<int> reason{-1};
  AcquireOptions o;
  o.on_lost = [&](LostReason r) {
    reason = static_cast<int>(r);
    ++calls;
  };
  auto lease = client.acquire("starved", 300ms, std::move(o));
  ASSERT_TRUE(lease.has_value());
  leasehold::detail::TestAccess::hold_driver(client, true);
  const auto valid_until = lease->valid_until();  // final: no renewal result is handled from now on
  while (leasehold::Clock::now() <= valid_until + 50ms) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(lease->stop_token().stop_requested());  // nobody noticed yet
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Lost);
  EXPECT_EQ(lease->lost_reason(), LostReason::Expired);
  EXPECT_TRUE(lease->lost());
  EXPECT_TRUE(eventually([&] { return calls.load() == 1 && lease->stop_token().stop_requested(); }));
  EXPECT_EQ(reason.load(), static_cast<int>(LostReason::Expired));
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Lost);  // idempotent
  EXPECT_EQ(client.counters().releases_lost, 1u);
  leasehold::detail::TestAccess::hold_driver(client, false);
  auto next = client.acquire("starved", 5s, wait_for(10s));  // the driver runs again
  EXPECT_TRUE(next.has_value());
  EXPECT_EQ(calls.load(), 1);  // exactly once
}

TEST(LockClient, ManualRenewExtendsValidity) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet(2s));
  AcquireOptions o;
  o.auto_renew = false;
  auto lease = client.acquire("manual", 5s, std::move(o));
  ASSERT_TRUE(lease.has_value());
  const auto before = lease->valid_until();
  const auto expires_before = w.service->holder("manual")->expires;
  std::this_thread::sleep_for(20ms);
  const auto after = lease->renew();
  EXPECT_GT(after, before);
  EXPECT_EQ(lease->valid_until(), after);
  EXPECT_GT(w.service->holder("manual")->expires, expires_before);  // the service extended it too
  const auto n = client.counters();
  EXPECT_EQ(n.renewals_sent, 1u);
  EXPECT_EQ(n.renewals_requested, 1u);
  EXPECT_EQ(n.renewals_ok, 1u);
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
}

TEST(LockClient, RenewAfterReleaseOrLossFailsFastAndSendsNothing) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet());
  auto released = client.acquire("r1", 30s);
  ASSERT_TRUE(released.has_value());
  EXPECT_EQ(released->release(), leasehold::ReleaseOutcome::Released);  // waits for the service's answer
  const auto calls = t->calls();
  EXPECT_EQ(catch_error([&] { (void)released->renew(); }).code(), LH_ERR_LEASE_ENDED);
  EXPECT_EQ(t->calls(), calls);

  AcquireOptions o;
  o.auto_renew = false;
  auto lost = client.acquire("r2", 300ms, std::move(o));
  ASSERT_TRUE(lost.has_value());
  ASSERT_TRUE(eventually([&] { return lost->lost(); }));
  // The loss sends its one best-effort cleanup release; after that, nothing more.
  ASSERT_TRUE(eventually([&] { return client.counters().pending_cleanups == 0; }));
  const auto before = t->calls();
  const auto requested = client.counters().renewals_requested;
  const auto e = catch_error([&] { (void)lost->renew(); });
  EXPECT_EQ(e.code(), LH_ERR_LEASE_ENDED);
  EXPECT_NE(std::string(e.what()).find("lost"), std::string::npos) << e.what();
  EXPECT_EQ(t->calls(), before);
  EXPECT_EQ(client.counters().renewals_requested, requested);
  EXPECT_EQ(lost->release(), leasehold::ReleaseOutcome::Lost);
  EXPECT_EQ(catch_error([&] { (void)lost->renew(); }).code(), LH_ERR_LEASE_ENDED);  // after release too
  EXPECT_EQ(t->calls(), before);
}

TEST(LockClient, AutoRenewOffIsLostAtValidityEnd) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet());
  std::atomic<int> calls{0};
  AcquireOptions o;
  o.auto_renew = false;
  o.on_lost = [&](LostReason) { ++calls; };
  auto lease = client.acquire("noauto", 400ms, std::move(o));
  ASSERT_TRUE(lease.has_value());
  ASSERT_TRUE(eventually([&] { return lease->stop_token().stop_requested(); }));
  EXPECT_EQ(lease->lost_reason(), LostReason::Expired);
  EXPECT_TRUE(eventually([&] { return calls.load() == 1; }));
  EXPECT_EQ(client.counters().renewals_sent, 0u);
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Lost);
  EXPECT_EQ(calls.load(), 1);
}

TEST(LockClient, AutoRenewOffKeptAliveByManualRenewals) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet(2s));
  std::atomic<int> calls{0};
  AcquireOptions o;
  o.auto_renew = false;
  o.on_lost = [&](LostReason) { ++calls; };
  const auto ttl = 1000ms;
  auto lease = client.acquire("kept", ttl, std::move(o));
  ASSERT_TRUE(lease.has_value());
  const auto first_valid = lease->valid_until();
  int renewals = 0;
  while (leasehold::Clock::now() < first_valid + ttl) {  // well past the first validity
    std::this_thread::sleep_for(200ms);
    ASSERT_NO_THROW((void)lease->renew());
    ++renewals;
  }
  EXPECT_TRUE(lease->is_held());
  EXPECT_FALSE(lease->lost());
  EXPECT_EQ(client.counters().renewals_sent, static_cast<std::uint64_t>(renewals));  // only the manual ones
  // Left alone, it is lost at its validity end.
  ASSERT_TRUE(eventually([&] { return lease->lost(); }));
  EXPECT_EQ(lease->lost_reason(), LostReason::Expired);
  EXPECT_TRUE(eventually([&] { return calls.load() == 1; }));
}

TEST(LockClient, ReleaseOutcomes) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet(2s));
  LockClient other(w.transport(), quiet());
  auto clean = client.acquire("clean", 30s);
  ASSERT_TRUE(clean.has_value());
  EXPECT_EQ(clean->release(), leasehold::ReleaseOutcome::Released);
  EXPECT_EQ(clean->release(), leasehold::ReleaseOutcome::Released);  // idempotent
  EXPECT_FALSE(w.service->holder("clean").has_value());

  std::atomic<int> lost_calls{0};
  AcquireOptions o;
  o.on_lost = [&](LostReason) { ++lost_calls; };
  auto stolen = client.acquire("stolen", 30s, std::move(o));
  ASSERT_TRUE(stolen.has_value());
  w.service->drop_lock("stolen");  // forgotten by the service (a failover) ...
  auto thief = other.acquire("stolen", 30s);  // ... and taken by someone else
  ASSERT_TRUE(thief.has_value());
  EXPECT_EQ(stolen->release(), leasehold::ReleaseOutcome::NotOwner);
  EXPECT_EQ(stolen->release(), leasehold::ReleaseOutcome::NotOwner);  // idempotent
  EXPECT_FALSE(stolen->lost());
  EXPECT_EQ(w.service->holder("stolen")->fencing_token, thief->fencing_token());  // untouched

  const auto n = client.counters();
  EXPECT_EQ(n.releases_confirmed, 1u);
  EXPECT_EQ(n.releases_not_owner, 1u);
  EXPECT_EQ(n.releases_lost, 0u);
  EXPECT_EQ(lost_calls.load(), 0);

  // A reentrant holder that leaves while another remains sends nothing.
  AcquireOptions r;
  r.reentrant = true;
  auto outer = client.acquire("re", 30s, r);
  auto inner = client.acquire("re", 30s, r);
  ASSERT_TRUE(outer && inner);
  const auto releases = client.counters().releases_sent;
  const auto calls = t->calls();
  EXPECT_EQ(inner->release(), leasehold::ReleaseOutcome::Released);
  EXPECT_EQ(client.counters().releases_sent, releases);
  EXPECT_EQ(t->calls(), calls);
  EXPECT_TRUE(outer->is_held());
  EXPECT_EQ(outer->release(), leasehold::ReleaseOutcome::Released);
  EXPECT_FALSE(w.service->holder("re").has_value());
}

TEST(LockClient, ReleaseWaitIsBoundedWhenTheServiceIsUnreachable) {
  World w;
  auto t = w.transport();
  auto opts = quiet();
  opts.release_timeout = 200ms;
  LockClient client(t, opts);
  auto lease = client.acquire("slow", 30s);
  ASSERT_TRUE(lease.has_value());
  t->set_hang(true);
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);  // no answer yet: still released here
  EXPECT_FALSE(lease->is_held());
  EXPECT_TRUE(eventually([&] { return t->hung() >= 1; }));
  t->set_hang(false);  // the core retries the release until the service answers
  EXPECT_TRUE(eventually([&] { return !w.service->holder("slow"); }));
  EXPECT_TRUE(eventually([&] { return client.counters().releases_confirmed == 1; }));
}

// The time budget (fail_budget = 0, the default): renewals failing in transport are retried
// while validity remains, so a short outage costs nothing.
TEST(LockClient, LongLeaseSurvivesAShortOutage) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet());
  std::atomic<int> calls{0};
  AcquireOptions o;
  o.on_lost = [&](LostReason) { ++calls; };
  auto lease = client.acquire("outage", 30s, std::move(o));
  ASSERT_TRUE(lease.has_value());
  const auto before = lease->valid_until();
  t->set_partition(true);
  std::optional<leasehold::Clock::time_point> renewed;
  std::thread renewer([&] { renewed = lease->renew(); });  // renews now, into the outage
  ASSERT_TRUE(eventually([&] { return client.counters().renewals_failed >= 3; }));  // more than a count budget of 3
  std::this_thread::sleep_for(3s);
  t->set_partition(false);
  renewer.join();
  ASSERT_TRUE(renewed.has_value());
  EXPECT_GT(*renewed, before);
  EXPECT_FALSE(lease->lost());
  EXPECT_TRUE(lease->is_held());
  EXPECT_EQ(calls.load(), 0);
  EXPECT_FALSE(lease->stop_token().stop_requested());
  EXPECT_EQ(w.service->holder("outage")->fencing_token, lease->fencing_token());
}

// The count budget (fail_budget = N): N consecutive failures lose the lease, however long it
// still was valid.
TEST(LockClient, CountBudgetLosesALongLeaseInAShortOutage) {
  World w;
  auto t = w.transport();
  auto opts = quiet();
  opts.config.fail_budget = 3;
  LockClient client(t, opts);
  auto lease = client.acquire("counted", 30s);
  ASSERT_TRUE(lease.has_value());
  t->set_partition(true);
  const auto e = catch_error([&] { (void)lease->renew(); });
  EXPECT_EQ(e.code(), LH_ERR_LEASE_ENDED);
  EXPECT_EQ(lease->lost_reason(), LostReason::FailBudget);
  EXPECT_TRUE(eventually([&] { return lease->stop_token().stop_requested(); }));
  EXPECT_EQ(client.counters().renewals_failed, 3u);
}

// Unreachable for good: lost before validity ends (FailBudget, declared ahead of valid_until;
// Expired would mean at or after it), with its signals.
TEST(LockClient, UnreachableServiceLosesTheLeaseBeforeValidityEnds) {
  World w;
  auto t = w.transport();
  LockClient client(t, quiet());
  std::atomic<int> calls{0};
  std::atomic<int> reason{-1};
  AcquireOptions o;
  o.on_lost = [&](LostReason r) {
    reason = static_cast<int>(r);
    ++calls;
  };
  auto lease = client.acquire("gone", 3s, std::move(o));
  ASSERT_TRUE(lease.has_value());
  t->set_partition(true);
  ASSERT_TRUE(eventually([&] { return lease->stop_token().stop_requested(); }));
  EXPECT_EQ(lease->lost_reason(), LostReason::FailBudget);
  EXPECT_TRUE(eventually([&] { return calls.load() == 1; }));
  EXPECT_EQ(reason.load(), static_cast<int>(LostReason::FailBudget));
  EXPECT_GE(client.counters().renewals_failed, 2u);
  EXPECT_EQ(client.counters().lost_fail_budget, 1u);
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Lost);
  EXPECT_EQ(calls.load(), 1);
}

TEST(LockClientBadInput, Names) {
  World w;
  LockClient client(w.transport(), quiet());
  EXPECT_EQ(catch_error([&] { (void)client.acquire("", 1s); }).code(), LH_ERR_EMPTY_NAME);
  EXPECT_EQ(catch_error([&] { (void)client.acquire(std::string(513, 'x'), 1s); }).code(), LH_ERR_NAME_TOO_LONG);
  EXPECT_EQ(catch_error([&] { (void)client.acquire(std::string_view("a\0b", 3), 1s); }).code(), LH_ERR_NAME_HAS_NUL);
  EXPECT_EQ(catch_error([&] { (void)client.acquire("\xc3\x28", 1s); }).code(), LH_ERR_INVALID_UTF8);
  EXPECT_TRUE(client.acquire("\xc3\xa9t\xc3\xa9", 1s).has_value());  // valid UTF-8 works
}

TEST(LockClientBadInput, TtlsAndWaits) {
  World w;
  LockClient client(w.transport(), quiet());
  EXPECT_EQ(catch_error([&] { (void)client.acquire("t", 0ms); }).code(), LH_ERR_INVALID_TTL);
  EXPECT_EQ(catch_error([&] { (void)client.acquire("t", -1ms); }).code(), LH_ERR_INVALID_TTL);
  EXPECT_EQ(catch_error([&] { (void)client.acquire("t", std::chrono::hours(24 * 365)); }).code(), LH_ERR_INVALID_TTL);
  EXPECT_EQ(catch_error([&] { (void)client.acquire("t", 1s, wait_for(-1ms)); }).code(),
            leasehold::status::invalid_argument);
  EXPECT_EQ(client.counters().acquires_sent, 0u);  // nothing reached the network
}

TEST(LockClientBadInput, ConfigTransportAndLimits) {
  World w;
  EXPECT_EQ(catch_error([&] { LockClient c(nullptr, quiet()); }).code(), LH_ERR_NULL_ARGUMENT);
  auto bad = quiet();
  bad.config.max_leases = 0;
  EXPECT_EQ(catch_error([&] { LockClient c(w.transport(), bad); }).code(), LH_ERR_INVALID_CONFIG);
  auto small = quiet();
  small.config.max_leases = 1;
  LockClient client(w.transport(), small);
  auto one = client.acquire("one", 5s);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(catch_error([&] { (void)client.acquire("two", 5s); }).code(), LH_ERR_TOO_MANY_LEASES);
  EXPECT_TRUE(one->is_held());  // state unchanged
}
