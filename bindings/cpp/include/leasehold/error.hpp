// leasehold/error.hpp — status codes and leasehold::Error (what every fallible call throws), and
// the test-hook declarations shared by the headers that wrap a hook.
#pragma once

#include <leasehold.h>

#include <stdexcept>
#include <string>
#include <string_view>

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

namespace leasehold {

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

}  // namespace leasehold
