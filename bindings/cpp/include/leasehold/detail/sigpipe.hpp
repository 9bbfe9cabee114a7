// leasehold/detail/sigpipe.hpp — SIGPIPE kept off an application thread while it writes to a
// socket (the Redis executor runs its pipeline on the caller's thread: redis_executor.hpp).
#pragma once

#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <ctime>

namespace leasehold::detail {

// SIGPIPE blocked on an application thread while it writes to a socket, and one raised meanwhile
// taken back: a peer that went away is EPIPE, and the thread's signal mask is left as it was.
class SigpipeScope {
 public:
  SigpipeScope() noexcept {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t p;
    sigpending(&p);
    was_pending_ = sigismember(&p, SIGPIPE) == 1;
  }
  ~SigpipeScope() {
    sigset_t p;
    sigpending(&p);
    if (!was_pending_ && sigismember(&p, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeScope(const SigpipeScope&) = delete;
  SigpipeScope& operator=(const SigpipeScope&) = delete;

 private:
  sigset_t pipe_{}, old_{};
  bool was_pending_ = false;
};

}  // namespace leasehold::detail
