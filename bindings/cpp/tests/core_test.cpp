// Tests of leasehold::Core: the RAII wrapper over lh_client, typed outputs, every bad input.
#include <leasehold.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <tuple>
#include <vector>

using namespace std::chrono_literals;
using leasehold::Core;
using leasehold::Error;

namespace {

constexpr std::size_t kMaxName = LH_MAX_NAME_LEN;
constexpr std::size_t kMaxBackendData = LH_MAX_BACKEND_DATA_LEN;
constexpr std::uint64_t kMs = 1'000'000;
constexpr std::uint64_t kT0 = 1'000'000 * kMs;  // an arbitrary epoch

std::array<std::uint8_t, 32> seed(std::uint8_t v = 7) {
  std::array<std::uint8_t, 32> s{};
  s.fill(v);
  return s;
}

Core make_core(leasehold::Config cfg = leasehold::Config::defaults()) { return Core(cfg, seed()); }

std::vector<leasehold::Output> drain(Core& c) {
  std::vector<leasehold::Output> out;
  while (auto o = c.poll_output()) out.push_back(std::move(*o));
  return out;
}

template <class T>
std::vector<T> only(const std::vector<leasehold::Output>& v) {
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

// Acquire `name` and answer the acquire command with a grant; returns the lease id.
std::uint64_t grant(Core& c, std::uint64_t now, std::string_view name, std::uint64_t fence,
                    std::chrono::milliseconds ttl = 3000ms) {
  const auto id = c.acquire(now, name, ttl);
  auto cmds = only<leasehold::AcquireCommand>(drain(c));
  EXPECT_EQ(cmds.size(), 1u);
  if (cmds.empty()) return id;
  c.acquire_result(now + kMs, cmds[0].request,
                   leasehold::Granted{fence, static_cast<std::uint64_t>(ttl.count()), {}});
  auto ev = only<leasehold::AcquiredEvent>(drain(c));
  EXPECT_EQ(ev.size(), 1u);
  return id;
}

}  // namespace

TEST(Core, VersionAndAbi) {
  EXPECT_EQ(leasehold::library_abi_version(), static_cast<std::uint32_t>(LH_ABI_VERSION));
  EXPECT_FALSE(leasehold::library_version().empty());
  EXPECT_EQ(leasehold::status_name(LH_OK), "LH_OK");
  EXPECT_EQ(leasehold::status_name(LH_ERR_EMPTY_NAME), "LH_ERR_EMPTY_NAME");
  EXPECT_EQ(leasehold::status_name(leasehold::status::closed), "LEASEHOLD_CLOSED");
}

TEST(Core, DefaultConfigRoundTrips) {
  const auto d = leasehold::Config::defaults();
  EXPECT_GT(d.request_timeout_ns, 0u);
  EXPECT_EQ(d.fail_budget, 0u);  // the time budget
  const auto c = d.to_c();
  EXPECT_EQ(c.struct_size, sizeof(lh_config));
  EXPECT_EQ(leasehold::Config::from_c(c).max_ttl_ms, d.max_ttl_ms);
  Core os_seeded;  // seeded from the OS
  EXPECT_NE(os_seeded.handle(), nullptr);
}

TEST(Core, AcquireGrantRenewRelease) {
  auto c = make_core();
  const auto id = c.acquire(kT0, "orders", 3000ms);
  EXPECT_EQ(c.lease_state(id), leasehold::LeaseState::Acquiring);
  EXPECT_EQ(c.fencing_token(id), std::nullopt);  // LH_ERR_NOT_GRANTED → nullopt
  EXPECT_EQ(c.valid_until(id), std::nullopt);

  auto out = drain(c);
  auto acq = only<leasehold::AcquireCommand>(out);
  ASSERT_EQ(acq.size(), 1u);
  EXPECT_EQ(acq[0].lease, id);
  EXPECT_EQ(acq[0].name, "orders");
  EXPECT_EQ(acq[0].ttl_ms, 3000u);
  ASSERT_EQ(acq[0].token.size(), 32u);
  EXPECT_TRUE(std::all_of(acq[0].token.begin(), acq[0].token.end(),
                          [](char ch) { return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'); }));

  c.acquire_result(kT0 + 5 * kMs, acq[0].request, leasehold::Granted{41, 3000, {}});
  out = drain(c);
  auto got = only<leasehold::AcquiredEvent>(out);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].lease, id);
  EXPECT_EQ(got[0].fencing_token, 41u);
  // Validity counts from when the request was sent, minus drift.
  EXPECT_LE(got[0].valid_until_ns, kT0 + 3000 * kMs);
  EXPECT_GT(got[0].valid_until_ns, kT0);
  EXPECT_EQ(c.fencing_token(id), 41u);
  EXPECT_EQ(c.valid_until(id), got[0].valid_until_ns);
  EXPECT_TRUE(c.is_held(id, kT0 + 6 * kMs));
  EXPECT_FALSE(c.is_held(id, got[0].valid_until_ns));
  EXPECT_EQ(c.lease_state(id), leasehold::LeaseState::Held);

  // The core asks for a renewal before validity runs out.
  const auto deadline = c.poll_timeout();
  ASSERT_TRUE(deadline.has_value());
  EXPECT_LT(*deadline, got[0].valid_until_ns);
  c.timeout(*deadline);
  auto renews = only<leasehold::RenewCommand>(drain(c));
  ASSERT_EQ(renews.size(), 1u);
  EXPECT_EQ(renews[0].lease, id);
  EXPECT_EQ(renews[0].token, acq[0].token);
  c.renew_result(*deadline + kMs, renews[0].request, leasehold::RenewResult::Renewed);
  drain(c);
  EXPECT_GT(*c.valid_until(id), got[0].valid_until_ns);
  EXPECT_EQ(c.counters().renewals_ok, 1u);

  c.release(*deadline + 2 * kMs, id);
  out = drain(c);
  EXPECT_EQ(only<leasehold::ReleasedEvent>(out).size(), 1u);
  auto rel = only<leasehold::ReleaseCommand>(out);
  ASSERT_EQ(rel.size(), 1u);
  EXPECT_EQ(rel[0].token, acq[0].token);
  EXPECT_EQ(c.counters().pending_cleanups, 1u);
  c.release_result(*deadline + 3 * kMs, rel[0].request, leasehold::ReleaseResult::Released);
  drain(c);
  EXPECT_EQ(c.counters().pending_cleanups, 0u);
  // The record is dropped once its cleanup is answered.
  EXPECT_EQ(catch_error([&] { (void)c.is_held(id, *deadline + 4 * kMs); }).code(), LH_ERR_LEASE_ENDED);
}

TEST(Core, ValidityElapsedIsLost) {
  auto c = make_core();
  const auto id = grant(c, kT0, "x", 1);
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
  auto c = make_core();
  const auto id = grant(c, kT0, "paused", 1);
  const auto vu = *c.valid_until(id);
  EXPECT_EQ(c.release_reported(vu + 10 * kMs, id), leasehold::Releasing::Lost);
  auto out = drain(c);
  auto lost = only<leasehold::LostEvent>(out);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].reason, leasehold::LostReason::Expired);
  EXPECT_TRUE(only<leasehold::ReleasedEvent>(out).empty());
  EXPECT_TRUE(only<leasehold::ReleaseOutcomeEvent>(out).empty());
  EXPECT_EQ(c.counters().releases_lost, 1u);
  // Terminal is sticky: a second release and a renew fail and send nothing.
  EXPECT_EQ(catch_error([&] { (void)c.release_reported(vu + 11 * kMs, id); }).code(), LH_ERR_LEASE_ENDED);
  EXPECT_EQ(catch_error([&] { c.renew(vu + 11 * kMs, id); }).code(), LH_ERR_LEASE_ENDED);
  EXPECT_TRUE(only<leasehold::RenewCommand>(drain(c)).empty());
}

TEST(Core, ReleaseReportedTellsTheServiceAnswer) {
  auto c = make_core();
  const auto a = grant(c, kT0, "a", 1);
  const auto b = grant(c, kT0, "b", 2);
  for (auto [id, answer, reply] :
       {std::tuple{a, leasehold::ReleaseResult::Released, leasehold::ReleaseReply::Confirmed},
        std::tuple{b, leasehold::ReleaseResult::NotOwner, leasehold::ReleaseReply::NotOwner}}) {
    EXPECT_EQ(c.release_reported(kT0 + 10 * kMs, id), leasehold::Releasing::Pending);
    auto out = drain(c);
    EXPECT_EQ(only<leasehold::ReleasedEvent>(out).size(), 1u);
    auto rel = only<leasehold::ReleaseCommand>(out);
    ASSERT_EQ(rel.size(), 1u);
    c.release_result(kT0 + 11 * kMs, rel[0].request, answer);
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
  auto c = make_core();
  const auto id = c.acquire(kT0, "manual", 3000ms, 0ns, false, /*auto_renew=*/false);
  auto acq = only<leasehold::AcquireCommand>(drain(c));
  ASSERT_EQ(acq.size(), 1u);
  c.acquire_result(kT0 + kMs, acq[0].request, leasehold::Granted{5, 3000, {}});
  drain(c);
  const auto vu = *c.valid_until(id);
  // No automatic renewal: the next deadline is the end of validity, and there the lease is lost.
  const auto deadline = c.poll_timeout();
  ASSERT_TRUE(deadline.has_value());
  EXPECT_GE(*deadline, vu);

  const auto t = kT0 + 1000 * kMs;
  c.renew(t, id);
  auto renews = only<leasehold::RenewCommand>(drain(c));
  ASSERT_EQ(renews.size(), 1u);
  c.renew(t + kMs, id);  // joins the renewal in flight
  EXPECT_TRUE(only<leasehold::RenewCommand>(drain(c)).empty());
  c.renew_result(t + 2 * kMs, renews[0].request, leasehold::RenewResult::Renewed);
  auto renewed = only<leasehold::RenewedEvent>(drain(c));
  ASSERT_GE(renewed.size(), 1u);
  EXPECT_EQ(renewed[0].lease, id);
  EXPECT_GT(renewed[0].valid_until_ns, vu);
  EXPECT_LE(renewed[0].valid_until_ns, t + 3000 * kMs);  // counted from the send time
  EXPECT_EQ(c.valid_until(id), renewed[0].valid_until_ns);
  EXPECT_GE(c.counters().renewals_requested, 1u);

  c.timeout(renewed[0].valid_until_ns + kMs);
  auto out = drain(c);
  EXPECT_TRUE(only<leasehold::RenewCommand>(out).empty());
  auto lost = only<leasehold::LostEvent>(out);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].reason, leasehold::LostReason::Expired);
}

TEST(Core, RejectedRenewIsLost) {
  auto c = make_core();
  const auto id = grant(c, kT0, "x", 1);
  const auto d = *c.poll_timeout();
  EXPECT_TRUE(c.is_held(id, d));
  c.timeout(d);
  auto renews = only<leasehold::RenewCommand>(drain(c));
  ASSERT_EQ(renews.size(), 1u);
  c.renew_result(d + kMs, renews[0].request, leasehold::RenewResult::Rejected);
  auto lost = only<leasehold::LostEvent>(drain(c));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].reason, leasehold::LostReason::Rejected);
  EXPECT_EQ(leasehold::to_string(lost[0].reason), "rejected");
  // Stale results are ignored, not errors.
  const auto stale_before = c.counters().stale_results;
  c.renew_result(d + 2 * kMs, renews[0].request, leasehold::RenewResult::Renewed);
  EXPECT_EQ(c.counters().stale_results, stale_before + 1);
}

TEST(Core, HeldByOtherWithoutWaitFails) {
  auto c = make_core();
  const auto id = c.acquire(kT0, "busy", 1000ms);
  auto acq = only<leasehold::AcquireCommand>(drain(c));
  ASSERT_EQ(acq.size(), 1u);
  c.acquire_result(kT0 + kMs, acq[0].request, leasehold::HeldByOther{500});
  auto failed = only<leasehold::AcquireFailedEvent>(drain(c));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].lease, id);
  EXPECT_EQ(failed[0].reason, leasehold::AcquireFailReason::WaitExhausted);
}

TEST(Core, ReleaseWhileAcquiringCancels) {
  auto c = make_core();
  const auto id = c.acquire(kT0, "c", 1000ms, 10s);
  drain(c);
  c.release(kT0 + kMs, id);
  auto failed = only<leasehold::AcquireFailedEvent>(drain(c));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].reason, leasehold::AcquireFailReason::Cancelled);
}

TEST(Core, ReentrantSharesTheLease) {
  auto c = make_core();
  const auto id = c.acquire(kT0, "r", 2000ms, 0ns, true);
  auto acq = only<leasehold::AcquireCommand>(drain(c));
  ASSERT_EQ(acq.size(), 1u);
  c.acquire_result(kT0 + kMs, acq[0].request, leasehold::Granted{9, 2000, {}});
  drain(c);
  const auto id2 = c.acquire(kT0 + 2 * kMs, "r", 2000ms, 0ns, true);
  EXPECT_EQ(id2, id);
  auto out = drain(c);
  EXPECT_TRUE(only<leasehold::AcquireCommand>(out).empty());  // no network call
  EXPECT_EQ(only<leasehold::AcquiredEvent>(out).size(), 1u);
  EXPECT_EQ(c.lease_info(id).holders, 2u);
  c.release(kT0 + 3 * kMs, id);
  EXPECT_TRUE(drain(c).empty());  // only decremented
  EXPECT_EQ(c.lease_state(id), leasehold::LeaseState::Held);
  const auto info = c.lease_info(id);
  EXPECT_EQ(info.holders, 1u);
  EXPECT_EQ(info.fencing_token, 9u);
  EXPECT_TRUE(info.valid_until_ns.has_value());
  c.release(kT0 + 4 * kMs, id);
  EXPECT_EQ(only<leasehold::ReleasedEvent>(drain(c)).size(), 1u);
}

TEST(Core, OutputsAreOwnedCopies) {
  auto c = make_core();
  c.acquire(kT0, "copy-me", 1000ms);
  auto o = c.poll_output();
  ASSERT_TRUE(o.has_value());
  // More calls on the handle invalidate borrowed pointers; our copy must survive them.
  c.acquire(kT0, "other-name", 1000ms);
  drain(c);
  auto* cmd = std::get_if<leasehold::AcquireCommand>(&*o);
  ASSERT_NE(cmd, nullptr);
  EXPECT_EQ(cmd->name, "copy-me");
  EXPECT_EQ(cmd->token.size(), 32u);
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
  const auto before = c.counters();
  auto e = catch_error([&] { c.acquire(kT0, "", 1000ms); });
  EXPECT_EQ(e.code(), LH_ERR_EMPTY_NAME);
  EXPECT_NE(std::string(e.what()).find("LH_ERR_EMPTY_NAME"), std::string::npos);
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, std::string_view(), 1000ms); }).code(), LH_ERR_EMPTY_NAME);
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, std::string(kMaxName + 1, 'n'), 1000ms); }).code(),
            LH_ERR_NAME_TOO_LONG);
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, std::string_view("a\0b", 3), 1000ms); }).code(), LH_ERR_NAME_HAS_NUL);
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, "\xff\xfe", 1000ms); }).code(), LH_ERR_INVALID_UTF8);
  EXPECT_EQ(catch_error([&] { c.released(kT0, ""); }).code(), LH_ERR_EMPTY_NAME);
  // The longest valid name works.
  EXPECT_NO_THROW(c.acquire(kT0, std::string(kMaxName, 'n'), 1000ms));
  EXPECT_EQ(before.acquires_sent, 0u);
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

TEST(CoreBadInput, SeedAndConfig) {
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
  EXPECT_EQ(catch_error([&] { Core c(cfg, seed()); }).code(), LH_ERR_INVALID_CONFIG);
  auto c = make_core();
  EXPECT_EQ(catch_error([&] { c.reseed(short_seed); }).code(), LH_ERR_SEED_TOO_SHORT);
  EXPECT_NO_THROW(c.reseed());
}

TEST(CoreBadInput, LeaseIds) {
  auto c = make_core();
  EXPECT_EQ(catch_error([&] { c.release(kT0, 12345); }).code(), LH_ERR_UNKNOWN_LEASE);
  EXPECT_EQ(catch_error([&] { (void)c.lease_state(12345); }).code(), LH_ERR_UNKNOWN_LEASE);
  EXPECT_EQ(catch_error([&] { (void)c.is_held(12345, kT0); }).code(), LH_ERR_UNKNOWN_LEASE);
  EXPECT_EQ(catch_error([&] { (void)c.fencing_token(12345); }).code(), LH_ERR_UNKNOWN_LEASE);
  const auto id = grant(c, kT0, "ended", 3);
  c.release(kT0 + 2 * kMs, id);
  auto rel = only<leasehold::ReleaseCommand>(drain(c));
  ASSERT_EQ(rel.size(), 1u);
  EXPECT_EQ(catch_error([&] { c.release(kT0 + 3 * kMs, id); }).code(), LH_ERR_LEASE_ENDED);
  c.release_result(kT0 + 4 * kMs, rel[0].request, leasehold::ReleaseResult::Released);
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

TEST(CoreBadInput, ResultsAndEnums) {
  auto c = make_core();
  c.acquire(kT0, "e", 1000ms);
  auto acq = only<leasehold::AcquireCommand>(drain(c));
  ASSERT_EQ(acq.size(), 1u);
  // Unknown enum values (only reachable by casting) are rejected by the ABI.
  EXPECT_EQ(catch_error([&] { c.renew_result(kT0, 1, static_cast<leasehold::RenewResult>(99)); }).code(),
            LH_ERR_INVALID_ENUM);
  EXPECT_EQ(catch_error([&] { c.release_result(kT0, 1, static_cast<leasehold::ReleaseResult>(0)); }).code(),
            LH_ERR_INVALID_ENUM);
  // Oversized backend data.
  leasehold::Granted g{5, 1000, leasehold::Bytes(kMaxBackendData + 1, 0xab)};
  EXPECT_EQ(catch_error([&] { c.acquire_result(kT0 + kMs, acq[0].request, g); }).code(),
            LH_ERR_BACKEND_DATA_TOO_LONG);
  // State unchanged: the real answer still works.
  c.acquire_result(kT0 + kMs, acq[0].request, leasehold::Granted{5, 1000, leasehold::Bytes{1, 2, 3}});
  EXPECT_EQ(only<leasehold::AcquiredEvent>(drain(c)).size(), 1u);
  // Unknown request ids are stale, not errors.
  const auto stale = c.counters().stale_results;
  c.acquire_result(kT0 + 2 * kMs, 987654, leasehold::TransportError{});
  EXPECT_EQ(c.counters().stale_results, stale + 1);
}

TEST(CoreBadInput, PanicPoisonsTheHandle) {
  auto c = make_core();
  auto e = catch_error([&] { c.debug_panic(); });
  EXPECT_EQ(e.code(), LH_ERR_PANIC);
  EXPECT_EQ(catch_error([&] { c.acquire(kT0, "x", 1000ms); }).code(), LH_ERR_POISONED);
  EXPECT_EQ(catch_error([&] { (void)c.poll_output(); }).code(), LH_ERR_POISONED);
  EXPECT_EQ(catch_error([&] { (void)c.counters(); }).code(), LH_ERR_POISONED);
}
