// leasehold/redis_stream_executor.hpp — RedisStreamExecutor: Redis with the connections in the
// core (LH_BACKEND_REDIS_STREAM); this executor only moves bytes on POSIX sockets and knows no
// Redis command.
//
// The core parses the URL (redis://, rediss://, unix://, redis+sentinel://, redis+cluster://)
// and runs the handshake, the scripts, the subscriber and the reconnects. It asks to open a stream
// (a nonblocking connect with TCP_NODELAY, or a Unix socket, given up at its deadline), to write
// on it and to close it; everything read goes back to it, split anywhere.
//   writes — on the thread that hands the request over (a nonblocking send under the client's
//            lock; what the socket does not take at once is flushed by the reader thread);
//   reads  — one reader thread (epoll) feeds every stream; an application thread that waits for
//            its own request (acquire, release) reads the reply itself, within its call's bound,
//            and the reader thread leaves that stream alone meanwhile: no thread hop on the
//            answer's way. The reader thread also connects (a host name is resolved there).
//
//   auto client = leasehold::LockClient(std::make_shared<leasehold::RedisStreamExecutor>(
//       "redis://127.0.0.1:6379/0"));
//
// TLS (rediss://: the server's certificate verified for the URL's host, RedisStreamOptions::tls
// for the CAs and a client certificate) is on OpenSSL, built in where LEASEHOLD_OPENSSL is
// defined (detail/tls_stream.hpp); without it a rediss:// URL is refused at construction.
// Header-only; CMake: leasehold::redis_stream (OpenSSL where found), or leasehold::leasehold
// (no TLS). One executor per LockClient.
#pragma once

#include <leasehold.hpp>
#include <leasehold/detail/tls_stream.hpp>
#include <leasehold/redis_protocol.hpp>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace leasehold {

struct RedisStreamOptions {
  // redis://[user:pass@]host[:port][/db], rediss://… (TLS), unix:///path[?db=N],
  // redis+sentinel://[user:pass@]host:port[,host:port…]/master[/db].
  std::string url = "redis://127.0.0.1:6379";
  TlsOptions tls;                               // rediss://: CAs and client certificate
  std::string client_name;                      // CLIENT SETNAME of both connections; empty: none
  std::uint32_t protocol = 0;                   // LH_REDIS_PROTOCOL_*; 0: the core's default (RESP3)
  std::chrono::milliseconds connect_timeout{0};  // how long an OPEN may take; 0: the core's default
  std::chrono::milliseconds request_timeout{0};  // a reply's bound before reconnecting; 0: default
  std::optional<RedisProtocolOptions> redis;    // the core's Redis protocol options; nullopt: defaults
};

// Counters of a RedisStreamExecutor: which thread read the bytes it fed.
struct RedisStreamStats {
  std::uint64_t caller_reads = 0;  // by an application thread waiting for its own request
  std::uint64_t reader_reads = 0;  // by the executor's reader thread
  std::uint64_t reader_wakeups = 0;  // stream events the reader thread handled (connect, read, flush)
};

class RedisStreamExecutor final : public Executor {
 public:
  explicit RedisStreamExecutor(std::string url) : RedisStreamExecutor(with_url(std::move(url))) {}
  // Throws Error(status::invalid_argument) when TLS is asked for (rediss://, tls options) and
  // cannot be set up: no OpenSSL, a file that does not load.
  explicit RedisStreamExecutor(RedisStreamOptions options = {}) : opts_(std::move(options)) {
    const auto scheme = opts_.url.substr(0, opts_.url.find(':'));
    if (!opts_.tls.empty() || (scheme.size() == 6 && ::strncasecmp(scheme.c_str(), "rediss", 6) == 0))
      tls_ = std::make_shared<detail::TlsContext>(opts_.tls);
    ep_ = ::epoll_create1(EPOLL_CLOEXEC);
    wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ep_ < 0 || wake_ < 0) {
      if (ep_ >= 0) ::close(ep_);
      if (wake_ >= 0) ::close(wake_);
      throw std::runtime_error("RedisStreamExecutor: epoll or eventfd failed");
    }
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = 0;  // stream ids start at 1
    ::epoll_ctl(ep_, EPOLL_CTL_ADD, wake_, &e);
  }
  ~RedisStreamExecutor() override {
    close();
    ::close(ep_);
    ::close(wake_);
  }

  [[nodiscard]] lh_backend_options backend_options() const override {
    auto o = backend_defaults(LH_BACKEND_REDIS_STREAM);
    if (opts_.redis) opts_.redis->apply(o);
    o.redis_url = reinterpret_cast<const std::uint8_t*>(opts_.url.data());
    o.redis_url_len = opts_.url.size();
    if (!opts_.client_name.empty()) {
      o.redis_client_name = reinterpret_cast<const std::uint8_t*>(opts_.client_name.data());
      o.redis_client_name_len = opts_.client_name.size();
    }
    if (opts_.protocol != 0) o.redis_protocol = opts_.protocol;
    if (opts_.connect_timeout.count() > 0) o.redis_connect_timeout_ms = static_cast<std::uint32_t>(opts_.connect_timeout.count());
    if (opts_.request_timeout.count() > 0) o.redis_request_timeout_ms = static_cast<std::uint64_t>(opts_.request_timeout.count());
    return o;
  }
  [[nodiscard]] RedisStreamStats stats() const noexcept {
    return {caller_reads_.load(), reader_reads_.load(), reader_wakeups_.load()};
  }
  void start(Sink sink) override {
    sink_ = std::move(sink);
    reader_ = std::thread([this] { reader_loop(); });
  }
  void execute(IoRequest r) override { run(r, false); }
  // A WRITE is sent at once; the calling thread then reads the answer in run_pending_until().
  void execute_for_caller(IoRequest r) override { run(r, true); }
  void run_pending() noexcept override { run_pending_until(Clock::time_point::max()); }
  // Reads the streams this thread wrote on until something came or `deadline`; the reader
  // thread takes them back then (and whatever else arrives later).
  void run_pending_until(Clock::time_point deadline) noexcept override {
    // The thread's own vectors, kept between calls (no allocation per request); a call nested
    // in one (a sink that runs IO) has fresh ones.
    thread_local Scratch reused;
    thread_local bool in_use = false;
    Scratch fresh;
    Scratch& sc = in_use ? fresh : reused;
    struct Use {
      bool& flag;
      bool was;
      Scratch& sc;
      ~Use() {
        sc.clear();  // the streams are not kept alive by a thread between calls
        flag = was;
      }
    } use{in_use, in_use, sc};
    in_use = true;
    auto& [mine, held, fds, polled] = sc;
    {
      // One pass under the lock: this thread's borrows out, and the streams it can read taken
      // (try_lock: the reader thread, which takes rd before mu_, may hold one).
      std::lock_guard g(mu_);
      const auto me = std::this_thread::get_id();
      auto keep = borrows_.begin();
      for (auto& b : borrows_) {
        if (b.thread != me) {
          if (&*keep != &b) *keep = std::move(b);
          ++keep;
          continue;
        }
        Stream* s = b.s.get();
        if (!s->closed && s->reads == b.reads && std::find(polled.begin(), polled.end(), s) == polled.end()) {
          // else ended, or read since this write: the answer went through the reader thread
          if (std::unique_lock rd(s->rd, std::try_to_lock); rd.owns_lock()) {
            fds.push_back(pollfd{s->fd, POLLIN, 0});
            polled.push_back(s);
            held.push_back(std::move(rd));
          }
        }
        mine.push_back(std::move(b));
      }
      borrows_.erase(keep, borrows_.end());
    }
    if (mine.empty()) return;
    while (!fds.empty()) {
      const auto left = deadline == Clock::time_point::max()
                            ? std::chrono::nanoseconds(std::chrono::hours(1))
                            : std::max(std::chrono::nanoseconds(0), deadline - Clock::now());
      if (fds.size() == 1 && polled[0]->blocking && left >= kSlice) {
        // One recv that waits at most a slice; the deadline is looked at between slices.
        if (read_some(*polled[0], caller_reads_, true) || Clock::now() >= deadline || closed_.load()) break;
        continue;
      }
      const auto secs = std::chrono::duration_cast<std::chrono::seconds>(left);
      const timespec ts{static_cast<time_t>(secs.count()), static_cast<long>((left - secs).count())};
      const int n = ::ppoll(fds.data(), fds.size(), &ts, nullptr);
      if (n < 0 && errno == EINTR) continue;
      bool got = false;
      for (std::size_t i = 0; n > 0 && i < fds.size(); ++i)
        if (fds[i].revents != 0) got = read_some(*polled[i], caller_reads_) || got;
      if (got || n < 0 || Clock::now() >= deadline || closed_.load()) break;
    }
    held.clear();  // the read locks, before the reader thread may have the streams back
    std::lock_guard g(mu_);
    for (auto& b : mine)
      if (--b.s->borrowed == 0) arm(*b.s);
  }
  // Stops the reader thread and closes every stream (nothing is reported after this).
  void close() override {
    if (closed_.exchange(true)) return;
    wake();
    if (reader_.joinable()) reader_.join();
    std::lock_guard g(mu_);
    auto streams = std::move(streams_);
    for (auto& [id, s] : streams) end_locked(*s);
    streams_.clear();
    opens_.clear();
  }

 private:
  static RedisStreamOptions with_url(std::string url) {
    RedisStreamOptions o;
    o.url = std::move(url);
    return o;
  }
  static constexpr std::size_t kBuf = 1 << 16;
  // A plain socket is blocking with a receive timeout of one slice: the caller that reads its
  // own reply waits in recv() itself (one system call per reply, where ppoll() and a
  // nonblocking recv() take two). Every other read and every write passes MSG_DONTWAIT.
  static constexpr std::chrono::microseconds kSlice{5000};
  struct Stream {
    explicit Stream(std::uint64_t i) : id(i) {}
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    ~Stream() {
      if (fd >= 0) ::close(fd);
    }
    const std::uint64_t id;
    int fd = -1;
    bool open = false;           // connected (else connecting, or in the TLS handshake when tls)
    std::atomic<bool> closed{false};  // shut down or reported ended: nothing more goes to the core
                                      // (set under mu_; read_some reads it without)
    std::uint64_t deadline = 0;  // connecting: give up then
    std::vector<sockaddr_storage> addrs;
    std::vector<socklen_t> lens;
    std::size_t next = 0;        // the address to try next
    std::string out;             // written but not yet taken by the socket
    bool wants_tls = false;      // OPEN asked for TLS, verifying server_name
    std::string server_name;
    std::unique_ptr<detail::TlsSession> tls;  // set (reader thread) before `open`
    int borrowed = 0;            // application threads reading it now: the reader thread does not
    std::uint32_t armed = 0;     // the interest last set (0: none, or the reader thread took it)
    bool blocking = false;       // a blocking socket with a receive timeout of kSlice (set before open)
    std::atomic<std::uint64_t> reads{0};  // reads fed so far, so a borrower sees one it did not do
    std::mutex rd;               // held while reading and feeding: bytes reach the core in order
    std::unique_ptr<char[]> buf{new char[kBuf]};  // (rd) what one read takes
  };
  struct Borrow {
    std::shared_ptr<Stream> s;
    std::uint64_t reads;
    std::thread::id thread;  // the thread that reads it (run_pending_until)
  };
  struct Scratch {  // run_pending_until's
    std::vector<Borrow> mine;
    std::vector<std::unique_lock<std::mutex>> held;
    std::vector<pollfd> fds;
    std::vector<Stream*> polled;
    void clear() noexcept {
      held.clear();
      mine.clear();
      fds.clear();
      polled.clear();
    }
  };

  void wake() const noexcept { [[maybe_unused]] auto n = ::write(wake_, "\1\0\0\0\0\0\0\0", 8); }
  void emit(IoAnswer&& a) {
    if (!closed_.load()) sink_(std::move(a));
  }
  // (mu_) The reader thread's interest in `s`: reads unless borrowed, writes while bytes wait.
  // A borrowed stream with nothing to send stays disarmed (`force`: disarm it now). An interest
  // already set is not set again; one the reader thread took (EPOLLONESHOT) counts as none from
  // the moment it handles the event, and it re-arms after every event, so skipping never loses one.
  void arm(Stream& s, bool force = false) {
    if (s.closed || s.fd < 0 || (s.open && s.borrowed > 0 && s.out.empty() && !force)) return;
    const std::uint32_t opening = s.open || !s.tls || s.tls->want_write() ? EPOLLOUT : EPOLLIN;  // connect, handshake
    const std::uint32_t want =
        s.open ? ((s.borrowed == 0 ? EPOLLIN : 0u) | (s.out.empty() ? 0u : EPOLLOUT)) : opening;
    if (want == s.armed) return;
    epoll_event e{};
    e.events = EPOLLONESHOT | want;
    e.data.u64 = s.id;
    ::epoll_ctl(ep_, EPOLL_CTL_MOD, s.fd, &e);
    s.armed = want;
  }
  // (mu_) Forgets `s`; its fd closes with the last reference (a borrower may still poll it).
  void end_locked(Stream& s) {
    if (s.closed) return;
    s.closed = true;
    if (s.fd >= 0) {
      ::epoll_ctl(ep_, EPOLL_CTL_DEL, s.fd, nullptr);
      ::shutdown(s.fd, SHUT_RDWR);
    }
    streams_.erase(s.id);
  }
  void fail(Stream& s, std::string why) {
    {
      std::lock_guard g(mu_);
      if (s.closed) return;
      end_locked(s);
    }
    emit(IoClosed{s.id, std::move(why)});
  }
  static std::string err(const char* what, int e) { return std::string(what) + ": " + std::strerror(e); }
  // Bytes moved on `s` (TLS or not): > 0, 0 at the end, -1 when it would block, -2 failed (`why`).
  static ssize_t send_some(Stream& s, const char* p, std::size_t n, std::string& why) {
    if (s.tls) return s.tls->write(p, n, why);
    return plain(::send(s.fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT), "write", why);
  }
  // `flags` 0: a blocking plain stream waits up to a slice (kSlice).
  static ssize_t recv_some(Stream& s, char* p, std::size_t n, std::string& why, int flags = MSG_DONTWAIT) {
    if (s.tls) return s.tls->read(p, n, why);
    return plain(::recv(s.fd, p, n, flags), "read", why);
  }
  static ssize_t plain(ssize_t r, const char* what, std::string& why) {
    if (r >= 0) return r;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return -1;
    why = err(what, errno);
    return -2;
  }

  void run(IoRequest& r, bool caller) {
    if (r.kind == LH_IO_OPEN) {
      auto s = std::make_shared<Stream>(r.stream);
      s->deadline = r.deadline;
      {
        std::lock_guard g(mu_);
        streams_[r.stream] = s;
        opens_.push_back({s, std::move(r)});
      }
      wake();
      return;
    }
    if (r.kind != LH_IO_WRITE && r.kind != LH_IO_SHUTDOWN) {
      emit(IoFailed{r.id, LH_FAILURE_TRANSPORT, "RedisStreamExecutor runs only streams (LH_BACKEND_REDIS_STREAM)"});
      return;
    }
    std::string why;
    std::shared_ptr<Stream> s;
    {
      std::lock_guard g(mu_);
      auto it = streams_.find(r.stream);
      if (it == streams_.end()) return;  // reported ended already
      s = it->second;
      if (r.kind == LH_IO_SHUTDOWN) return end_locked(*s);
      // A reader here: the reader thread's interest goes before the bytes do, so the answer
      // never wakes it, and the count of reads is taken before too, so a read that may hold the
      // answer shows (the reader thread counts without mu_). An ended stream's borrow is only
      // given back: run_pending_until skips it.
      if (caller && s->open) {
        borrows_.push_back({s, s->reads, std::this_thread::get_id()});
        if (s->borrowed++ == 0) arm(*s, true);
      }
      if (!s->open || !s->out.empty()) {
        s->out += r.data;
      } else if (!r.data.empty()) {
        const auto n = send_some(*s, r.data.data(), r.data.size(), why);
        if (n == -2 || n == 0) {
          if (why.empty()) why = "write: end of stream";
          end_locked(*s);
        } else if (static_cast<std::size_t>(std::max<ssize_t>(n, 0)) < r.data.size()) {
          s->out.append(r.data, static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
          arm(*s);
        }
      }
    }
    if (!why.empty()) emit(IoClosed{s->id, std::move(why)});
  }

  // (s.rd held) Reads what is there and feeds it; true when something came (or the end).
  // `wait`: the first recv may wait a slice (a blocking stream only).
  bool read_some(Stream& s, std::atomic<std::uint64_t>& count, bool wait = false) {
    char* buf = s.buf.get();
    for (bool got = false;;) {
      std::string why;
      const auto n = recv_some(s, buf, kBuf, why, wait ? 0 : MSG_DONTWAIT);
      wait = false;
      if (n == -1) return got;
      if (n <= 0) {
        fail(s, n == 0 ? std::string("end of stream") : why);
        return true;
      }
      if (s.closed) return true;
      ++s.reads;
      emit(IoReceived{s.id, std::string(buf, static_cast<std::size_t>(n))});
      ++count;
      got = true;
      if (!s.tls && static_cast<std::size_t>(n) < kBuf) return true;  // TLS may hold more than the socket shows
    }
  }

  // (reader thread) Resolves and starts connecting; the result comes as EPOLLOUT.
  void start_open(const std::shared_ptr<Stream>& s, const IoRequest& r) {
    if (r.tls && !tls_) {  // asked for by the core alone (a Sentinel's answer): the default settings
      try {
        tls_ = std::make_shared<detail::TlsContext>(opts_.tls);
      } catch (const Error& e) {
        return fail(*s, e.detail());
      }
    }
    s->wants_tls = r.tls;
    s->server_name = r.server_name;
    if (!r.unix_path.empty()) {
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      if (r.unix_path.size() >= sizeof a.sun_path) return fail(*s, "unix socket path too long");
      std::memcpy(a.sun_path, r.unix_path.c_str(), r.unix_path.size() + 1);
      sockaddr_storage st{};
      std::memcpy(&st, &a, sizeof a);
      s->addrs.push_back(st);
      s->lens.push_back(sizeof a);
    } else {
      addrinfo hints{}, *list = nullptr;
      hints.ai_socktype = SOCK_STREAM;
      const std::string port = std::to_string(r.port);
      if (const int rc = ::getaddrinfo(r.host.c_str(), port.c_str(), &hints, &list); rc != 0)
        return fail(*s, "resolve " + r.host + ": " + ::gai_strerror(rc));
      for (auto* a = list; a != nullptr; a = a->ai_next) {
        sockaddr_storage st{};
        std::memcpy(&st, a->ai_addr, a->ai_addrlen);
        s->addrs.push_back(st);
        s->lens.push_back(a->ai_addrlen);
      }
      ::freeaddrinfo(list);
    }
    try_next(*s, ECONNREFUSED);
  }
  // (reader thread) Connects to the next address, or reports the last failure.
  void try_next(Stream& s, int last) {
    std::lock_guard g(mu_);
    while (!s.closed && s.next < s.addrs.size()) {
      const auto& a = s.addrs[s.next];
      const auto len = s.lens[s.next++];
      if (s.fd >= 0) ::epoll_ctl(ep_, EPOLL_CTL_DEL, s.fd, nullptr), ::close(s.fd);
      s.fd = ::socket(a.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (s.fd < 0) { last = errno; continue; }
      if (a.ss_family != AF_UNIX) {
        const int one = 1;
        ::setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      }
      if (::connect(s.fd, reinterpret_cast<const sockaddr*>(&a), len) != 0 && errno != EINPROGRESS) {
        last = errno;
        continue;
      }
      epoll_event e{};
      e.events = EPOLLOUT | EPOLLONESHOT;
      e.data.u64 = s.id;
      ::epoll_ctl(ep_, EPOLL_CTL_ADD, s.fd, &e);
      s.armed = EPOLLOUT;
      return;
    }
    if (s.closed) return;
    end_locked(s);
    mu_.unlock();
    emit(IoClosed{s.id, err("connect", last)});
    mu_.lock();
  }
  // (reader thread) A connect finished: open, or the next address.
  void connected(Stream& s) {
    int e = 0;
    socklen_t len = sizeof e;
    if (::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
    if (e != 0) return try_next(s, e);
    if (s.wants_tls) {
      std::string why;
      auto t = tls_->session(s.fd, s.server_name, why);
      if (!t) return fail(s, why);
      {
        std::lock_guard g(mu_);
        s.tls = std::move(t);
      }
      return handshake(s);
    }
    opened(s);
  }
  // (reader thread) One step of the TLS handshake: open, failed, or waiting for the socket.
  void handshake(Stream& s) {
    std::string why;
    const int r = s.tls->handshake(why);
    if (r < 0) return fail(s, why);
    if (r == 0) {
      std::lock_guard g(mu_);
      return arm(s);
    }
    opened(s);
  }
  void opened(Stream& s) {
    {
      std::lock_guard g(mu_);
      if (s.closed) return;
      if (!s.tls) {  // see kSlice
        const timeval slice{0, static_cast<suseconds_t>(kSlice.count())};
        const int flags = ::fcntl(s.fd, F_GETFL);
        s.blocking = flags >= 0 && ::setsockopt(s.fd, SOL_SOCKET, SO_RCVTIMEO, &slice, sizeof slice) == 0 &&
                     ::fcntl(s.fd, F_SETFL, flags & ~O_NONBLOCK) == 0;
      }
      s.open = true;
    }
    emit(IoOpened{s.id});  // the handshake's writes go out from here, inline
    std::lock_guard g(mu_);
    arm(s);
  }

  void reader_loop() {
    epoll_event evs[16];
    while (!closed_.load()) {
      int timeout = -1;
      std::vector<std::shared_ptr<Stream>> expired;
      std::deque<std::pair<std::shared_ptr<Stream>, IoRequest>> opens;
      {
        std::lock_guard g(mu_);
        opens.swap(opens_);
        const auto now = now_ns();
        for (auto& [id, s] : streams_) {
          if (s->open) continue;
          if (s->deadline <= now) {
            expired.push_back(s);
          } else {
            const auto ms = static_cast<int>(std::min<std::uint64_t>((s->deadline - now + 999999) / 1000000, 60000));
            timeout = timeout < 0 ? ms : std::min(timeout, ms);
          }
        }
      }
      for (auto& s : expired) fail(*s, s->tls ? "TLS handshake timed out" : "connect timed out");
      for (auto& [s, r] : opens) start_open(s, r);
      if (!opens.empty() || !expired.empty()) continue;
      const int n = ::epoll_wait(ep_, evs, 16, timeout);
      for (int i = 0; i < n; ++i) {
        if (evs[i].data.u64 == 0) {
          std::uint64_t v;
          [[maybe_unused]] auto r = ::read(wake_, &v, sizeof v);
          continue;
        }
        std::shared_ptr<Stream> s;
        bool reading = false;
        {
          std::lock_guard g(mu_);
          auto it = streams_.find(evs[i].data.u64);
          if (it == streams_.end()) continue;
          s = it->second;
          s->armed = 0;  // EPOLLONESHOT: taken by this event
          ++reader_wakeups_;
          if (std::string why; s->open && (evs[i].events & EPOLLOUT) && !(why = flush_locked(*s)).empty()) {
            end_locked(*s);
            mu_.unlock();
            emit(IoClosed{s->id, std::move(why)});
            mu_.lock();
            continue;
          }
          reading = s->open && s->borrowed == 0 && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR));
        }
        if (!s->open) {
          s->tls ? handshake(*s) : connected(*s);
          continue;
        }
        if (reading) {
          std::unique_lock rd(s->rd, std::try_to_lock);
          if (rd.owns_lock()) read_some(*s, reader_reads_);
        }
        std::lock_guard g(mu_);
        arm(*s);
      }
    }
  }
  // (mu_) Sends what waits; why the stream broke, or "".
  std::string flush_locked(Stream& s) {
    std::string why;
    while (!s.out.empty()) {
      const auto n = send_some(s, s.out.data(), s.out.size(), why);
      if (n == -1) break;
      if (n <= 0) return why.empty() ? "write: end of stream" : why;
      s.out.erase(0, static_cast<std::size_t>(n));
    }
    return {};
  }

  RedisStreamOptions opts_;
  std::shared_ptr<detail::TlsContext> tls_;  // made here, or by the reader thread on a first TLS OPEN
  Sink sink_;
  int ep_ = -1, wake_ = -1;
  std::atomic<bool> closed_{false};
  std::atomic<std::uint64_t> caller_reads_{0}, reader_reads_{0}, reader_wakeups_{0};
  std::mutex mu_;  // streams_, opens_, borrows_ and every Stream's fields but rd
  std::unordered_map<std::uint64_t, std::shared_ptr<Stream>> streams_;
  std::deque<std::pair<std::shared_ptr<Stream>, IoRequest>> opens_;
  std::vector<Borrow> borrows_;  // the writes application threads read the answers of
  std::thread reader_;
};

}  // namespace leasehold
