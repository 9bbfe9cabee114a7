// Tests of leasehold::Core: the RAII wrapper over lh_client on a fake clock, its requests run
// through a real MemoryService (the seam every backend shares), typed events, every bad input.
#include <leasehold.hpp>
#include <leasehold/memory_service.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

using namespace std::chrono_literals;
using leasehold::Core;
using leasehold::Error;
using leasehold::MemoryService;

namespace {

constexpr std::size_t kMaxName = LH_MAX_NAME_LEN;
constexpr std::uint64_t kMs = 1'000'000;
constexpr std::uint64_t kT0 = 1'000'000 * kMs;  // an arbitrary epoch

std::array<std::uint8_t, 32> seed(std::uint8_t v = 7) {
  std::array<std::uint8_t, 32> s{};
  s.fill(v);
  return s;
}

Core make_core(leasehold::Config cfg = leasehold::Config::defaults(), std::uint8_t s = 7) { return Core(cfg, seed(s)); }

std::vector<leasehold::Event> drain(Core& c) {
  std::vector<leasehold::Event> out;
  while (auto e = c.poll_event()) out.push_back(std::move(*e));
  return out;
}

template <class T>
std::vector<T> only(const std::vector<leasehold::Event>& v) {
  std::vector<T> r;
  for (const auto& o : v)
    if (auto* p = std::get_if<T>(&o)) r.push_back(*p);
  return r;
}

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

// One request the service answered, kept so a test can hand it back again.
struct Answered {
  std::uint64_t id = 0;
  MemoryService::Answer answer;
};

// A host on a fake clock: one core, its connection to the shared service, and the release
// notifications the service queued for it.
struct Host {
  Host(MemoryService& s, Core c) : svc(s), core(std::move(c)), released(std::make_shared<std::deque<std::string>>()) {
    conn = svc.connect(std::make_shared<MemoryService::Callback>(
        [q = released](std::string_view n) { q->emplace_back(n); }));
  }
  // Runs every request the core asks for through the service at `now` and answers it (a
  // dropped one as failed), then hands the core the notifications that arrived meanwhile.
  std::vector<Answered> run(std::uint64_t now) {
    std::vector<Answered> out;
    while (auto r = core.io_poll()) {
      EXPECT_EQ(r->kind, static_cast<std::uint32_t>(LH_IO_COMMAND));
      EXPECT_EQ(r->connection, static_cast<std::uint32_t>(LH_CONNECTION_COMMANDS));
      svc.call(conn, now, r->argv, [&](MemoryService::Answer a) {
        if (a.dropped) {
          core.io_failed(now, r->id, LH_FAILURE_TRANSPORT, "dropped");
        } else {
          core.io_reply(now, r->id, a.values, a.data);
        }
        out.push_back({r->id, std::move(a)});
      });
    }
    notify(now);
    return out;
  }
  void notify(std::uint64_t now) {
    while (!released->empty()) {
      core.io_message(now, released->front());
      released->pop_front();
    }
  }
  // Acquires `name` and runs the acquire: the lease id, granted.
  std::uint64_t grant(std::uint64_t now, std::string_view name, std::chrono::milliseconds ttl = 3000ms) {
    const auto id = core.acquire(now, name, ttl);
    EXPECT_EQ(run(now + kMs).size(), 1u);
    auto ev = only<leasehold::AcquiredEvent>(drain(core));
    EXPECT_EQ(ev.size(), 1u);
    return id;
  }

  MemoryService& svc;
  Core core;
  std::shared_ptr<std::deque<std::string>> released;
  std::uint64_t conn = 0;
};

}  // namespace

TEST(Core, VersionAndAbi) {
  EXPECT_EQ(leasehold::library_abi_version(), static_cast<std::uint32_t>(LH_ABI_VERSION));
  EXPECT_EQ(LH_ABI_VERSION, 4);
  EXPECT_FALSE(leasehold::library_version().empty());
  EXPECT_EQ(leasehold::status_name(LH_OK), "LH_OK");
  EXPECT_EQ(leasehold::status_name(LH_ERR_EMPTY_NAME), "LH_ERR_EMPTY_NAME");
  EXPECT_EQ(leasehold::status_name(LH_ERR_WRONG_ANSWER), "LH_ERR_WRONG_ANSWER");
  EXPECT_EQ(leasehold::status_name(leasehold::status::closed), "LEASEHOLD_CLOSED");
}

TEST(Core, DefaultConfigRoundTrips) {
  const auto d = leasehold::Config::defaults();
  EXPECT_GT(d.request_timeout_ns, 0u);
  EXPECT_EQ(d.fail_budget, 0u);  // the time budget
  const auto c = d.to_c();
  EXPECT_EQ(c.struct_size, sizeof(lh_config));
  EXPECT_EQ(leasehold::Config::from_c(c).max_ttl_ms, d.max_ttl_ms);
  Core os_seeded;  // seeded from the OS, on the memory protocol
  EXPECT_NE(os_seeded.handle(), nullptr);
}

TEST(Core, AcquireGrantRenewRelease) {
  MemoryService svc;
  Host h(svc, make_core());
  auto& c = h.core;
  const auto id = c.acquire(kT0, "orders", 3000ms);
  EXPECT_EQ(c.lease_state(id), leasehold::LeaseState::Acquiring);
  EXPECT_EQ(c.fencing_token(id), std::nullopt);  // LH_ERR_NOT_GRANTED → nullopt
  EXPECT_EQ(c.valid_until(id), std::nullopt);
  EXPECT_EQ(c.counters().acquires_sent, 1u);

  ASSERT_EQ(h.run(kT0 + 5 * kMs).size(), 1u);
  auto got = only<leasehold::AcquiredEvent>(drain(c));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].lease, id);
  const auto holder = svc.holder("orders", kT0 + 5 * kMs);
  ASSERT_TRUE(holder.has_value());
  EXPECT_EQ(got[0].fencing_token, holder->fencing_token);
  ASSERT_EQ(holder->token.size(), 32u);  // the core's ownership token, as the service keeps it
  EXPECT_TRUE(std::all_of(holder->token.begin(), holder->token.end(),
                          [](char ch) { return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'); }));
  // Validity counts from when the request was sent, minus drift.
  EXPECT_LE(got[0].valid_until_ns, kT0 + 3000 * kMs);
  EXPECT_GT(got[0].valid_until_ns, kT0);
  EXPECT_EQ(c.fencing_token(id), got[0].fencing_token);
  EXPECT_EQ(c.valid_until(id), got[0].valid_until_ns);
  EXPECT_TRUE(c.is_held(id, kT0 + 6 * kMs));
  EXPECT_FALSE(c.is_held(id, got[0].valid_until_ns));
  EXPECT_EQ(c.lease_state(id), leasehold::LeaseState::Held);

  // The core asks for a renewal before validity runs out.
  const auto deadline = c.poll_timeout();
  ASSERT_TRUE(deadline.has_value());
  EXPECT_LT(*deadline, got[0].valid_until_ns);
  c.timeout(*deadline);
  ASSERT_EQ(h.run(*deadline + kMs).size(), 1u);
  drain(c);
  EXPECT_GT(*c.valid_until(id), got[0].valid_until_ns);
  EXPECT_EQ(c.counters().renewals_ok, 1u);
  EXPECT_EQ(svc.holder("orders", *deadline + kMs)->token, holder->token);

  c.release(*deadline + 2 * kMs, id);
  EXPECT_EQ(only<leasehold::ReleasedEvent>(drain(c)).size(), 1u);
  EXPECT_EQ(c.counters().pending_cleanups, 1u);
  ASSERT_EQ(h.run(*deadline + 3 * kMs).size(), 1u);
  drain(c);
  EXPECT_EQ(c.counters().pending_cleanups, 0u);
  EXPECT_FALSE(svc.holder("orders", *deadline + 3 * kMs).has_value());
  const auto n = c.counters();
  EXPECT_EQ(n.backend_requests, 3u);  // acquire, renew, release
  EXPECT_EQ(n.backend_transport_failures, 0u);
  // The record is dropped once its cleanup is answered.
  EXPECT_EQ(catch_error([&] { (void)c.is_held(id, *deadline + 4 * kMs); }).code(), LH_ERR_LEASE_ENDED);
}

TEST(Core, ValidityElapsedIsLost) {
  MemoryService svc;
  Host h(svc, make_core());
  auto& c = h.core;
  const auto id = h.grant(kT0, "x");
  const auto vu = *c.valid_until(id);
  c.timeout(vu + kMs);  // renewals never answered: local loss detection
  auto lost = only<leasehold::LostEvent>(drain(c));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].lease, id);
  EXPECT_EQ(lost[0].reason, leasehold::LostReason::Expired);
  EXPECT_FALSE(c.is_held(id, vu + kMs));
}

// The paused-then-released case on a fake clock: the process slept past valid_until and its
// first act on waking is release(); the lease ends Lost (with its LostEvent), not Released.
TEST(Core, ReleaseAfterValidityRanOutIsLost) {
  MemoryService svc;
  Host h(svc, make_core());
  auto& c = h.core;
  const auto id = h.grant(kT0, "paused");
  const auto vu = *c.valid_until(id);
  EXPECT_EQ(c.release_reported(vu + 10 * kMs, id), leasehold::Releasing::Lost);
  auto out = drain(c);
  auto lost = only<leasehold::LostEvent>(out);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].reason, leasehold::LostReason::Expired);
  EXPECT_TRUE(only<leasehold::ReleasedEvent>(out).empty());
  EXPECT_TRUE(only<leasehold::ReleaseOutcomeEvent>(out).empty());
  EXPECT_EQ(c.counters().releases_lost, 1u);
  // Terminal is sticky: a second release and a renew fail and send nothing new.
  h.run(vu + 10 * kMs);  // the loss's best-effort cleanup
  EXPECT_EQ(catch_error([&] { (void)c.release_reported(vu + 11 * kMs, id); }).code(), LH_ERR_LEASE_ENDED);
  EXPECT_EQ(catch_error([&] { c.renew(vu + 11 * kMs, id); }).code(), LH_ERR_LEASE_ENDED);
  EXPECT_FALSE(c.io_poll().has_value());
}

TEST(Core, ReleaseReportedTellsTheServiceAnswer) {
  MemoryService svc;
  Host h(svc, make_core());
  auto& c = h.core;
  const auto a = h.grant(kT0, "a");
  const auto b = h.grant(kT0, "b");
  svc.drop_lock("b");  // the service forgot b (a failover): its release finds no grant
  for (auto [id, reply] : {std::tuple{a, leasehold::ReleaseReply::Confirmed},
                           std::tuple{b, leasehold::ReleaseReply::NotOwner}}) {
    EXPECT_EQ(c.release_reported(kT0 + 10 * kMs, id), leasehold::Releasing::Pending);
    EXPECT_EQ(only<leasehold::ReleasedEvent>(drain(c)).size(), 1u);
    ASSERT_EQ(h.run(kT0 + 11 * kMs).size(), 1u);
    auto outcome = only<leasehold::ReleaseOutcomeEvent>(drain(c));
    ASSERT_EQ(outcome.size(), 1u);
    EXPECT_EQ(outcome[0].lease, id);
    EXPECT_EQ(outcome[0].reply, reply);
  }
  const auto n = c.counters();
  EXPECT_EQ(n.releases_confirmed, 1u);
  EXPECT_EQ(n.releases_not_owner, 1u);
}

TEST(Core, ManualRenewAndNoAutoRenew) {
  MemoryService svc;
  Host h(svc, make_core());
  auto& c = h.core;
  const auto id = c.acquire(kT0, "manual", 3000ms, 0ns, false, /*auto_renew=*/false);
  ASSERT_EQ(h.run(kT0 + kMs).size(), 1u);
  drain(c);
  const auto vu = *c.valid_until(id);
  // No automatic renewal: the next deadline is the end of validity, and there the lease is lost.
  const auto deadline = c.poll_timeout();
  ASSERT_TRUE(deadline.has_value());
  EXPECT_GE(*deadline, vu);

  const auto t = kT0 + 1000 * kMs;
  c.renew(t, id);
  auto renew = c.io_poll();
  ASSERT_TRUE(renew.has_value());
  c.renew(t + kMs, id);  // joins the renewal in flight
  EXPECT_FALSE(c.io_poll().has_value());
  svc.call(h.conn, t + 2 * kMs, renew->argv,
           [&](MemoryService::Answer a) { c.io_reply(t + 2 * kMs, renew->id, a.values, a.data); });
  auto renewed = only<leasehold::RenewedEvent>(drain(c));
  ASSERT_GE(renewed.size(), 1u);
  EXPECT_EQ(renewed[0].lease, id);
  EXPECT_GT(renewed[0].valid_until_ns, vu);
  EXPECT_LE(renewed[0].valid_until_ns, t + 3000 * kMs);  // counted from the send time
  EXPECT_EQ(c.valid_until(id), renewed[0].valid_until_ns);
  EXPECT_GE(c.counters().renewals_requested, 1u);

  c.timeout(renewed[0].valid_until_ns + kMs);
  auto lost = only<leasehold::LostEvent>(drain(c));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].reason, leasehold::LostReason::Expired);
  EXPECT_EQ(c.counters().renewals_sent, 1u);  // only the manual one
}

TEST(Core, RejectedRenewIsLost) {
  MemoryService svc;
  Host h(svc, make_core());
  auto& c = h.core;
  const auto id = h.grant(kT0, "x");
  const auto d = *c.poll_timeout();
  EXPECT_TRUE(c.is_held(id, d));
  svc.drop_lock("x");
  c.timeout(d);
  auto answered = h.run(d + kMs);
  ASSERT_EQ(answered.size(), 1u);
  auto lost = only<leasehold::LostEvent>(drain(c));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].reason, leasehold::LostReason::Rejected);
  EXPECT_EQ(leasehold::to_string(lost[0].reason), "rejected");
  // An answer handed back twice is stale, not an error.
  const auto stale_before = c.counters().backend_stale_replies;
  c.io_reply(d + 2 * kMs, answered[0].id, answered[0].answer.values, answered[0].answer.data);
  EXPECT_EQ(c.counters().backend_stale_replies, stale_before + 1);
}

TEST(Core, HeldByOtherWithoutWaitFails) {
  MemoryService svc;
  Host a(svc, make_core(leasehold::Config::defaults(), 1)), b(svc, make_core(leasehold::Config::defaults(), 2));
  a.grant(kT0, "busy", 10000ms);
  const auto id = b.core.acquire(kT0 + kMs, "busy", 1000ms);
  ASSERT_EQ(b.run(kT0 + 2 * kMs).size(), 1u);
  auto failed = only<leasehold::AcquireFailedEvent>(drain(b.core));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].lease, id);
  EXPECT_EQ(failed[0].reason, leasehold::AcquireFailReason::WaitExhausted);
}

// A waiter watches the name; the holder's release reaches it as a message, and it acquires.
TEST(Core, ReleaseNotificationWakesTheWaiter) {
  MemoryService svc;
  Host a(svc, make_core(leasehold::Config::defaults(), 1)), b(svc, make_core(leasehold::Config::defaults(), 2));
  const auto held = a.grant(kT0, "wake", 60000ms);
  const auto old_fence = *a.core.fencing_token(held);
  const auto id = b.core.acquire(kT0 + kMs, "wake", 60000ms, 30s);
  b.run(kT0 + 2 * kMs);  // held: the waiter watches the name and waits
  EXPECT_TRUE(drain(b.core).empty());
  EXPECT_EQ(svc.subscriptions(), 1u);
  a.core.release(kT0 + 3 * kMs, held);
  a.run(kT0 + 3 * kMs);  // the service queues the release for b's connection
  ASSERT_EQ(b.released->size(), 1u);
  EXPECT_EQ(b.released->front(), "wake");
  b.notify(kT0 + 4 * kMs);
  EXPECT_EQ(b.core.counters().backend_wakeups, 1u);
  b.run(kT0 + 4 * kMs);
  auto got = only<leasehold::AcquiredEvent>(drain(b.core));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].lease, id);
  EXPECT_GT(got[0].fencing_token, old_fence);
  b.run(kT0 + 5 * kMs);  // the waiter stops watching
  EXPECT_EQ(svc.subscriptions(), 0u);
  // A message for a name nobody here waits for is counted and ignored.
  b.core.io_message(kT0 + 6 * kMs, "other");
  EXPECT_EQ(b.core.counters().backend_ignored_messages, 1u);
}

TEST(Core, StatusQueryThroughTheService) {
  MemoryService svc;
  Host h(svc, make_core());
  auto& c = h.core;
  const auto lease = h.grant(kT0, "st", 3000ms);
  const auto q = c.status_request(kT0 + 2 * kMs, "st");
  EXPECT_FALSE(c.poll_status().has_value());
  h.run(kT0 + 2 * kMs);
  auto st = c.poll_status();
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->id, q);
  EXPECT_TRUE(st->ok) << st->error;
  EXPECT_TRUE(st->held);
  EXPECT_EQ(st->fencing_token, *c.fencing_token(lease));
  EXPECT_GT(st->remaining_ttl_ms, 0u);
  EXPECT_LE(st->remaining_ttl_ms, 3000u);
  EXPECT_EQ(catch_error([&] { (void)c.status_request(kT0, ""); }).code(), LH_ERR_EMPTY_NAME);
}

TEST(Core, ReleaseWhileAcquiringCancels) {
  auto c = make_core();
  const auto id = c.acquire(kT0, "c", 1000ms, 10s);
  c.release(kT0 + kMs, id);
  auto failed = only<leasehold::AcquireFailedEvent>(drain(c));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].reason, leasehold::AcquireFailReason::Cancelled);
}

TEST(Core, ReentrantSharesTheLease) {
  MemoryService svc;
  Host h(svc, make_core());
  auto& c = h.core;
  const auto id = c.acquire(kT0, "r", 2000ms, 0ns, true);
  ASSERT_EQ(h.run(kT0 + kMs).size(), 1u);
  drain(c);
  const auto id2 = c.acquire(kT0 + 2 * kMs, "r", 2000ms, 0ns, true);
  EXPECT_EQ(id2, id);
  EXPECT_FALSE(c.io_poll().has_value());  // no network call
  EXPECT_EQ(only<leasehold::AcquiredEvent>(drain(c)).size(), 1u);
  EXPECT_EQ(c.lease_info(id).holders, 2u);
  c.release(kT0 + 3 * kMs, id);
  EXPECT_TRUE(drain(c).empty());  // only decremented
  EXPECT_FALSE(c.io_poll().has_value());
  EXPECT_EQ(c.lease_state(id), leasehold::LeaseState::Held);
  const auto info = c.lease_info(id);
  EXPECT_EQ(info.holders, 1u);
  EXPECT_EQ(info.fencing_token, c.fencing_token(id));
  EXPECT_TRUE(info.valid_until_ns.has_value());
  c.release(kT0 + 4 * kMs, id);
  EXPECT_EQ(only<leasehold::ReleasedEvent>(drain(c)).size(), 1u);
}

TEST(Core, RequestsAreOwnedCopies) {
  MemoryService svc;
  Host h(svc, make_core());
  auto& c = h.core;
  const auto id = c.acquire(kT0, "copy-me", 1000ms);
  auto r = c.io_poll();
  ASSERT_TRUE(r.has_value());
  // More calls on the handle invalidate borrowed pointers; our copy must survive them.
  c.acquire(kT0, "other-name", 1000ms);
  h.run(kT0 + kMs);
  EXPECT_FALSE(svc.holder("copy-me", kT0 + kMs).has_value());
  svc.call(h.conn, kT0 + 2 * kMs, r->argv,
           [&](MemoryService::Answer a) { c.io_reply(kT0 + 2 * kMs, r->id, a.values, a.data); });
  EXPECT_TRUE(svc.holder("copy-me", kT0 + 2 * kMs).has_value());
  EXPECT_EQ(c.lease_state(id), leasehold::LeaseState::Held);
}

// Every backend's core speaks through the same seam: its first requests have the kinds its
// executor runs, and answers of another kind are refused without a change.
TEST(Core, EveryBackendAsksThroughTheSeam) {
  const auto cfg = leasehold::Config::defaults();
  Core redis(cfg, leasehold::backend_defaults(LH_BACKEND_REDIS), seed());
  auto sub = redis.io_poll();  // the wake channel's SUBSCRIBE, on the subscriber
  ASSERT_TRUE(sub.has_value());
  EXPECT_EQ(sub->kind, static_cast<std::uint32_t>(LH_IO_COMMAND));
  EXPECT_EQ(sub->connection, static_cast<std::uint32_t>(LH_CONNECTION_NOTIFY));
  EXPECT_FALSE(sub->argv.empty());
  EXPECT_EQ(catch_error([&] { redis.io_http_reply(kT0, sub->id, 200, "{}"); }).code(), LH_ERR_WRONG_ANSWER);

  Core sqlite(cfg, leasehold::backend_defaults(LH_BACKEND_SQLITE), seed());
  sqlite.acquire(kT0, "s", 1000ms);
  auto sql = sqlite.io_poll();
  ASSERT_TRUE(sql.has_value());
  EXPECT_EQ(sql->kind, static_cast<std::uint32_t>(LH_IO_SQL));
  EXPECT_FALSE(sql->statements.empty());
  EXPECT_FALSE(sql->statements[0].sql.empty());

  auto eo = leasehold::backend_defaults(LH_BACKEND_ETCD);
  Core etcd(cfg, eo, seed());
  etcd.acquire(kT0, "e", 3000ms);
  auto http = etcd.io_poll();
  ASSERT_TRUE(http.has_value());
  EXPECT_EQ(http->kind, static_cast<std::uint32_t>(LH_IO_HTTP));
  EXPECT_EQ(http->method, "POST");
  EXPECT_FALSE(http->path.empty());
  EXPECT_FALSE(http->body.empty());
  EXPECT_EQ(catch_error([&] { etcd.io_reply(kT0, http->id, {}, {}); }).code(), LH_ERR_WRONG_ANSWER);
  EXPECT_EQ(catch_error([&] { etcd.io_message(kT0, "ch", "p"); }).code(), LH_ERR_WRONG_ANSWER);
  // Unchanged: the right kind is still taken.
  EXPECT_NO_THROW(etcd.io_failed(kT0 + kMs, http->id, LH_FAILURE_TRANSPORT, "no member answered"));
  EXPECT_EQ(etcd.counters().backend_transport_failures, 1u);
  EXPECT_NE(etcd.backend_last_error().find("no member answered"), std::string::npos) << etcd.backend_last_error();
  EXPECT_NO_THROW(etcd.io_close(kT0 + 2 * kMs));
}

TEST(Core, MovedFromCoreThrows) {
  auto a = make_core();
  Core b = std::move(a);
  EXPECT_NE(b.handle(), nullptr);
  EXPECT_EQ(a.handle(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(catch_error([&] { a.acquire(kT0, "x", 1000ms); }).code(), LH_ERR_NULL_ARGUMENT);
  Core c = make_core();
  c = std::move(b);  // frees c's old handle
  EXPECT_NE(c.handle(), nullptr);
}

// ---- every bad input: an Error with the right code and a message, state unchanged ----------

TEST(CoreBadInput, Names) {
  auto c = make_core();
  auto e = catch_error([&] { c.acquire(kT0, "", 1000ms); });
  EXPECT_EQ(e.code(), LH_ERR_EMPTY_NAME);
  EXPECT_NE(std::string(e.what()).find("LH_ERR_EMPTY_NAME"), std::string::npos);
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, std::string_view(), 1000ms); }).code(), LH_ERR_EMPTY_NAME);
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, std::string(kMaxName + 1, 'n'), 1000ms); }).code(),
            LH_ERR_NAME_TOO_LONG);
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, std::string_view("a\0b", 3), 1000ms); }).code(), LH_ERR_NAME_HAS_NUL);
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, "\xff\xfe", 1000ms); }).code(), LH_ERR_INVALID_UTF8);
  EXPECT_EQ(c.counters().acquires_sent, 0u);
  EXPECT_FALSE(c.io_poll().has_value());
  // The longest valid name works.
  EXPECT_NO_THROW(c.acquire(kT0, std::string(kMaxName, 'n'), 1000ms));
}

TEST(CoreBadInput, Ttls) {
  auto cfg = leasehold::Config::defaults();
  auto c = make_core(cfg);
  auto e = catch_error([&] { c.acquire(kT0, "t", 0ms); });
  EXPECT_EQ(e.code(), LH_ERR_INVALID_TTL);
  EXPECT_FALSE(e.detail().empty());
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, "t", 1ms); }).code(), LH_ERR_INVALID_TTL);  // shorter than drift
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, "t", -5ms); }).code(), LH_ERR_INVALID_TTL);
  EXPECT_EQ(catch_error([&] {
              c.acquire(kT0, "t", std::chrono::milliseconds(static_cast<std::int64_t>(cfg.max_ttl_ms) + 1));
            }).code(),
            LH_ERR_INVALID_TTL);
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, "t", 1000ms, -1ns); }).code(), leasehold::status::invalid_argument);
  EXPECT_EQ(c.counters().live_leases, 0u);
}

TEST(CoreBadInput, SeedConfigAndBackend) {
  std::array<std::uint8_t, 8> short_seed{};
  EXPECT_EQ(catch_error([&] { Core c(leasehold::Config::defaults(), short_seed); }).code(), LH_ERR_SEED_TOO_SHORT);
  EXPECT_EQ(catch_error([&] { Core c(leasehold::Config::defaults(), std::span<const std::uint8_t>()); }).code(),
            LH_ERR_SEED_TOO_SHORT);
  auto cfg = leasehold::Config::defaults();
  cfg.max_leases = 0;
  EXPECT_EQ(catch_error([&] { Core c(cfg, seed()); }).code(), LH_ERR_INVALID_CONFIG);
  cfg = leasehold::Config::defaults();
  cfg.backoff_base_ns = 0;
  EXPECT_EQ(catch_error([&] { Core c(cfg, seed()); }).code(), LH_ERR_INVALID_CONFIG);
  cfg = leasehold::Config::defaults();
  cfg.request_timeout_ns = 0;
  const auto refused = catch_error([&] { Core c(cfg, seed()); });
  EXPECT_EQ(refused.code(), LH_ERR_INVALID_CONFIG);
  // The core's reason (lh_client_new_check), not only the status.
  EXPECT_NE(refused.detail().find("request_timeout"), std::string::npos) << refused.detail();
  // An unknown backend kind, and credentials that are not UTF-8.
  EXPECT_EQ(catch_error([] { (void)leasehold::backend_defaults(99); }).code(), LH_ERR_INVALID_ENUM);
  auto bad = leasehold::backend_defaults(LH_BACKEND_MEMORY);
  bad.kind = 99;
  EXPECT_EQ(catch_error([&] { Core c(leasehold::Config::defaults(), bad, seed()); }).code(), LH_ERR_INVALID_ENUM);
  auto etcd = leasehold::backend_defaults(LH_BACKEND_ETCD);
  const std::uint8_t not_utf8[] = {0xff, 0xfe};
  etcd.etcd_user = not_utf8;
  etcd.etcd_user_len = sizeof not_utf8;
  EXPECT_EQ(catch_error([&] { Core c(leasehold::Config::defaults(), etcd, seed()); }).code(), LH_ERR_INVALID_UTF8);
  auto c = make_core();
  EXPECT_EQ(catch_error([&] { c.reseed(short_seed); }).code(), LH_ERR_SEED_TOO_SHORT);
  EXPECT_NO_THROW(c.reseed());
}

TEST(CoreBadInput, LeaseIds) {
  MemoryService svc;
  Host h(svc, make_core());
  auto& c = h.core;
  EXPECT_EQ(catch_error([&] { c.release(kT0, 12345); }).code(), LH_ERR_UNKNOWN_LEASE);
  EXPECT_EQ(catch_error([&] { (void)c.lease_state(12345); }).code(), LH_ERR_UNKNOWN_LEASE);
  EXPECT_EQ(catch_error([&] { (void)c.is_held(12345, kT0); }).code(), LH_ERR_UNKNOWN_LEASE);
  EXPECT_EQ(catch_error([&] { (void)c.fencing_token(12345); }).code(), LH_ERR_UNKNOWN_LEASE);
  const auto id = h.grant(kT0, "ended");
  c.release(kT0 + 2 * kMs, id);
  EXPECT_EQ(catch_error([&] { c.release(kT0 + 3 * kMs, id); }).code(), LH_ERR_LEASE_ENDED);
  h.run(kT0 + 4 * kMs);
  drain(c);
  EXPECT_EQ(catch_error([&] { c.release(kT0 + 5 * kMs, id); }).code(), LH_ERR_LEASE_ENDED);
}

TEST(CoreBadInput, TooManyLeases) {
  auto cfg = leasehold::Config::defaults();
  cfg.max_leases = 2;
  auto c = make_core(cfg);
  c.acquire(kT0, "a", 1000ms);
  c.acquire(kT0, "b", 1000ms);
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, "c", 1000ms); }).code(), LH_ERR_TOO_MANY_LEASES);
}

// Malformed, oversized and wrong-kind answers are refused and change nothing; the real answer
// still works afterwards, and an answer for an unknown id is counted as stale.
TEST(CoreBadInput, AnswersAndEnums) {
  MemoryService svc;
  Host h(svc, make_core());
  auto& c = h.core;
  const auto lease = c.acquire(kT0, "e", 1000ms);
  auto r = c.io_poll();
  ASSERT_TRUE(r.has_value());
  lh_value array{};
  array.kind = LH_VALUE_ARRAY;
  array.len = 5;  // promises five elements, has none
  EXPECT_EQ(catch_error([&] { c.io_reply(kT0 + kMs, r->id, std::span(&array, 1), {}); }).code(), LH_ERR_INVALID_REPLY);
  lh_value bulk{};
  bulk.kind = LH_VALUE_BULK;
  bulk.offset = 2;
  bulk.len = 10;  // past the data
  EXPECT_EQ(catch_error([&] { c.io_reply(kT0 + kMs, r->id, std::span(&bulk, 1), "abc"); }).code(), LH_ERR_INVALID_REPLY);
  lh_value odd{};
  odd.kind = 77;
  EXPECT_EQ(catch_error([&] { c.io_reply(kT0 + kMs, r->id, std::span(&odd, 1), {}); }).code(), LH_ERR_INVALID_REPLY);
  const std::string huge(LH_MAX_REPLY_DATA + 1, 'x');
  lh_value big{};
  big.kind = LH_VALUE_BULK;
  big.len = huge.size();
  EXPECT_EQ(catch_error([&] { c.io_reply(kT0 + kMs, r->id, std::span(&big, 1), huge); }).code(), LH_ERR_INVALID_REPLY);
  EXPECT_EQ(catch_error([&] { c.io_message(kT0 + kMs, huge); }).code(), LH_ERR_INVALID_REPLY);
  // Answers of kinds a memory handle does not have.
  EXPECT_EQ(catch_error([&] { c.io_http_reply(kT0 + kMs, r->id, 200, "{}"); }).code(), LH_ERR_WRONG_ANSWER);
  EXPECT_EQ(catch_error([&] { c.answer(kT0 + kMs, leasehold::IoStreamMessage{r->id, "{}"}); }).code(),
            LH_ERR_WRONG_ANSWER);
  // Unknown enum values.
  EXPECT_EQ(catch_error([&] { c.io_failed(kT0 + kMs, r->id, 99, "x"); }).code(), LH_ERR_INVALID_ENUM);
  EXPECT_EQ(catch_error([&] { c.io_connection(kT0 + kMs, LH_CONNECTION_COMMANDS, 99); }).code(), LH_ERR_INVALID_ENUM);
  EXPECT_EQ(catch_error([&] { c.io_connection(kT0 + kMs, 99, LH_CONNECTION_REOPENED); }).code(), LH_ERR_INVALID_ENUM);
  EXPECT_EQ(c.lease_state(lease), leasehold::LeaseState::Acquiring);
  EXPECT_EQ(c.counters().backend_transport_failures, 0u);
  // State unchanged: the real answer, through the variant, still works.
  svc.call(h.conn, kT0 + 2 * kMs, r->argv, [&](MemoryService::Answer a) {
    c.answer(kT0 + 2 * kMs, leasehold::IoReply{r->id, std::move(a.values), std::move(a.data)});
  });
  EXPECT_EQ(only<leasehold::AcquiredEvent>(drain(c)).size(), 1u);
  // Unknown request ids are stale, not errors.
  const auto stale = c.counters().backend_stale_replies;
  c.io_failed(kT0 + 3 * kMs, 987654);
  lh_value one{};
  one.kind = LH_VALUE_INT;
  c.io_reply(kT0 + 3 * kMs, 987655, std::span(&one, 1), {});
  EXPECT_EQ(catch_error([&] { c.io_reply(kT0 + 3 * kMs, 987656, {}, {}); }).code(), LH_ERR_INVALID_REPLY);  // no value
  EXPECT_EQ(c.counters().backend_stale_replies, stale + 2);
}

TEST(CoreBadInput, PanicPoisonsTheHandle) {
  auto c = make_core();
  auto e = catch_error([&] { c.debug_panic(); });
  EXPECT_EQ(e.code(), LH_ERR_PANIC);
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, "x", 1000ms); }).code(), LH_ERR_POISONED);
  EXPECT_EQ(catch_error([&] { (void)c.poll_event(); }).code(), LH_ERR_POISONED);
  EXPECT_EQ(catch_error([&] { (void)c.io_poll(); }).code(), LH_ERR_POISONED);
  EXPECT_EQ(catch_error([&] { (void)c.counters(); }).code(), LH_ERR_POISONED);
  EXPECT_EQ(c.backend_last_error(), "");
}
