// leasehold/etcd_executor.hpp — the etcd v3 executor on libcurl (link leasehold::etcd).
//
// The core speaks the etcd protocol itself (LH_BACKEND_ETCD: keys, leases, transactions,
// watches and the meaning of every reply; docs/etcd-protocol.md); the fencing token is the
// owner key's create revision. This executor only POSTs the core's JSON bodies to a member's
// JSON gateway and hands back what came: a unary reply whole (status and body), a watch stream
// message by message (lh_io_stream_message), the end of a stream or a request no member
// answered as a failure. It keeps the member list: a member that does not answer (refused,
// reset, timed out) is skipped for the next one, and later requests start at the member that
// answered last. One thread drives every transfer (curl multi); connections are reused.
// Authentication is the core's (EtcdOptions::user / password: it authenticates and every
// request then carries its token); TLS is libcurl's (https:// endpoints and the options below).
// A user and password go to https:// endpoints only, unless allow_insecure_auth says the network
// is trusted; an endpoint URL holding credentials is refused (without being shown).
// One EtcdExecutor per LockClient.
#pragma once

#include <leasehold.hpp>

#include <curl/curl.h>

#include <map>

namespace leasehold {

struct EtcdOptions {
  std::vector<std::string> endpoints;  // member base URLs: http://127.0.0.1:2379, https://…
  std::string user, password;          // empty user: no authentication
  // Lets user and password go to http:// endpoints (the etcd:// form too), in clear text: only on
  // a network nobody else can read (loopback, a test).
  bool allow_insecure_auth = false;
  std::chrono::milliseconds connect_timeout{1000};
  // Per member tried (watches are unbounded): below the core's request timeout (2 s by
  // default), so a request to a stopped member still fails over within it.
  std::chrono::milliseconds request_timeout{1000};
  // TLS (https:// endpoints), passed to libcurl: CA bundle, client certificate and key, and
  // whether to verify the server's certificate and host name (keep true outside tests).
  std::string ca_file, cert_file, key_file;
  bool verify_peer = true;
  LogFn log;  // members that did not answer, streams that ended; default: stderr

  // "http://a:2379,http://b:2379" (or "etcd://a:2379,b:2379": http:// is assumed) → endpoints.
  static std::vector<std::string> split(std::string_view list) {
    if (list.starts_with("etcd://")) list.remove_prefix(7);
    std::vector<std::string> out;
    while (!list.empty()) {
      const auto comma = list.find(',');
      std::string one(list.substr(0, comma));
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      while (!one.empty() && one.back() == '/') one.pop_back();
      if (one.empty()) continue;
      if (one.find("://") == std::string::npos) one = "http://" + one;
      out.push_back(std::move(one));
    }
    return out;
  }
};

class EtcdExecutor final : public Executor {
  struct Transfer {
    IoRequest req;
    CURL* easy = nullptr;
    curl_slist* headers = nullptr;
    std::size_t member = 0;  // the member this attempt went to
    std::size_t tried = 0;   // members tried so far
    std::string body;        // unary: the reply; watch: the bytes of an unfinished line
    bool streamed = false;   // watch: a message was passed on (no fail-over any more)
    bool too_big = false;
    EtcdExecutor* self = nullptr;
  };

 public:
  explicit EtcdExecutor(EtcdOptions options) : opts_(std::move(options)) {
    if (opts_.endpoints.empty()) throw Error(status::invalid_argument, "EtcdExecutor needs at least one endpoint");
    for (auto& e : opts_.endpoints)
      while (!e.empty() && e.back() == '/') e.pop_back();
    for (std::size_t i = 0; i < opts_.endpoints.size(); ++i) {
      const auto& e = opts_.endpoints[i];
      const auto scheme = e.find("://");
      const auto host = scheme == std::string::npos ? 0 : scheme + 3;
      const auto host_end = std::min(e.find_first_of("/?#", host), e.size());
      if (e.find('@', host) < host_end)
        throw Error(status::invalid_argument, "EtcdExecutor: endpoint " + std::to_string(i + 1) +
                                                  " holds credentials (not shown): give them as EtcdOptions::user and password");
      if (!opts_.user.empty() && !opts_.allow_insecure_auth && e.rfind("https://", 0) != 0)
        throw Error(status::invalid_argument, "EtcdExecutor: the user and password would cross the network in clear text to " + e +
                                                  " (not https://): use https:// endpoints, or set EtcdOptions::allow_insecure_auth on a trusted network");
    }
    if (!opts_.log) opts_.log = [](std::string_view m) { std::fprintf(stderr, "leasehold etcd: %.*s\n", int(m.size()), m.data()); };
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    multi_ = curl_multi_init();
    if (multi_ == nullptr) throw std::runtime_error("curl_multi_init failed");
  }
  EtcdExecutor(const EtcdExecutor&) = delete;
  EtcdExecutor& operator=(const EtcdExecutor&) = delete;
  ~EtcdExecutor() override {
    close();
    curl_multi_cleanup(multi_);
  }

  // Watch streams open now.
  [[nodiscard]] std::size_t open_watches() const {
    std::lock_guard g(mu_);
    return watches_open_;
  }

  [[nodiscard]] lh_backend_options backend_options() const override {
    auto o = backend_defaults(LH_BACKEND_ETCD);
    if (!opts_.user.empty()) {
      o.etcd_user = detail::bytes_ptr(opts_.user.data());
      o.etcd_user_len = opts_.user.size();
      o.etcd_password = detail::bytes_ptr(opts_.password.data());
      o.etcd_password_len = opts_.password.size();
    }
    return o;
  }
  void start(Sink sink) override {
    sink_ = std::move(sink);
    thread_ = std::thread([this] { loop(); });
  }
  void execute(IoRequest r) override {
    if (r.kind != LH_IO_HTTP && r.kind != LH_IO_HTTP_WATCH && r.kind != LH_IO_HTTP_CANCEL) {
      sink_(IoFailed{r.id, LH_FAILURE_TRANSPORT, "not an HTTP request"});  // never from the core
      return;
    }
    {
      std::lock_guard g(mu_);
      if (closed_) return;
      if (r.kind == LH_IO_HTTP) ++unary_open_;
      queue_.push_back(std::move(r));
    }
    curl_multi_wakeup(multi_);
  }
  // Lets the requests already queued finish (at most a second: the revoke of the pooled
  // lease), then closes every transfer and joins the thread.
  void close() override {
    {
      std::unique_lock g(mu_);
      if (closed_) return;
      idle_cv_.wait_for(g, std::chrono::seconds(1), [&] { return unary_open_ == 0; });
      closed_ = true;
    }
    curl_multi_wakeup(multi_);
    if (thread_.joinable()) thread_.join();
  }

 private:
  void log(const std::string& m) const noexcept try { opts_.log(m); } catch (...) {}

  static std::size_t on_data(char* p, std::size_t size, std::size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    const std::size_t len = size * n;
    t->body.append(p, len);
    if (t->req.kind != LH_IO_HTTP_WATCH) {
      if (t->body.size() > LH_MAX_REPLY_DATA) return t->too_big = true, 0;  // aborts the transfer
      return len;
    }
    long code = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &code);
    if (code != 200) return t->body.size() > 4096 ? 0 : len;  // kept for the failure message
    std::size_t from = 0;
    for (auto nl = t->body.find('\n'); nl != std::string::npos; nl = t->body.find('\n', from)) {
      if (nl > from) {
        t->streamed = true;
        t->self->message(t->req.id, t->body.substr(from, nl - from));
      }
      from = nl + 1;
    }
    t->body.erase(0, from);
    if (t->body.size() > LH_MAX_REPLY_DATA) return t->too_big = true, 0;
    return len;
  }

  void message(std::uint64_t id, std::string line) { sink_(IoStreamMessage{id, std::move(line)}); }
  void reply(std::uint64_t id, std::uint32_t status, std::string body) { sink_(IoHttpReply{id, status, std::move(body)}); }
  void failed(std::uint64_t id, std::string why) { sink_(IoFailed{id, LH_FAILURE_TRANSPORT, std::move(why)}); }

  // Starts (or restarts, on the next member) a transfer.
  bool begin(Transfer& t) {
    if (t.easy == nullptr) {
      t.easy = curl_easy_init();
      if (t.easy == nullptr) return false;
      t.headers = curl_slist_append(t.headers, "Content-Type: application/json");
      t.headers = curl_slist_append(t.headers, "Expect:");
      if (!t.req.authorization.empty()) t.headers = curl_slist_append(t.headers, ("Authorization: " + t.req.authorization).c_str());
    } else {
      curl_multi_remove_handle(multi_, t.easy);
    }
    t.body.clear();
    CURL* e = t.easy;
    const std::string url = opts_.endpoints[t.member] + t.req.path;
    curl_easy_setopt(e, CURLOPT_URL, url.c_str());
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, t.req.body.data());
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t.req.body.size()));
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, t.headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &EtcdExecutor::on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(e, CURLOPT_PRIVATE, &t);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opts_.connect_timeout.count()));
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, t.req.kind == LH_IO_HTTP_WATCH ? 0L : static_cast<long>(opts_.request_timeout.count()));
    if (!opts_.ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, opts_.ca_file.c_str());
    if (!opts_.cert_file.empty()) curl_easy_setopt(e, CURLOPT_SSLCERT, opts_.cert_file.c_str());
    if (!opts_.key_file.empty()) curl_easy_setopt(e, CURLOPT_SSLKEY, opts_.key_file.c_str());
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, opts_.verify_peer ? 1L : 0L);
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, opts_.verify_peer ? 2L : 0L);
    return curl_multi_add_handle(multi_, e) == CURLM_OK;
  }
  void end(std::uint64_t id) {
    auto it = transfers_.find(id);
    if (it == transfers_.end()) return;
    auto& t = *it->second;
    if (t.req.kind == LH_IO_HTTP_WATCH) {
      std::lock_guard g(mu_);
      --watches_open_;
    } else {
      std::lock_guard g(mu_);
      if (unary_open_ > 0 && --unary_open_ == 0) idle_cv_.notify_all();
    }
    curl_multi_remove_handle(multi_, t.easy);
    curl_easy_cleanup(t.easy);
    curl_slist_free_all(t.headers);
    transfers_.erase(it);
  }

  void start_request(IoRequest r) {
    if (r.kind == LH_IO_HTTP_CANCEL) {
      end(r.id);  // nothing answers a cancellation
      return;
    }
    auto t = std::make_unique<Transfer>();
    t->self = this;
    t->req = std::move(r);
    t->member = preferred_ % opts_.endpoints.size();
    t->tried = 1;
    const auto id = t->req.id;
    const bool watch = t->req.kind == LH_IO_HTTP_WATCH;
    auto& slot = transfers_[id];
    slot = std::move(t);
    if (watch) {
      std::lock_guard g(mu_);
      ++watches_open_;
    }
    if (!begin(*slot)) {
      end(id);
      failed(id, "cannot start a transfer");
    }
  }

  void finished(CURL* e, CURLcode rc) {
    Transfer* t = nullptr;
    curl_easy_getinfo(e, CURLINFO_PRIVATE, reinterpret_cast<char**>(&t));
    if (t == nullptr) return;
    const auto id = t->req.id;
    long code = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
    const std::string& member = opts_.endpoints[t->member];
    if (rc == CURLE_OK && t->req.kind != LH_IO_HTTP_WATCH) {
      preferred_ = t->member;
      reply(id, static_cast<std::uint32_t>(code), std::move(t->body));
      end(id);
      return;
    }
    std::string why = rc == CURLE_OK ? "watch stream ended"
                      : t->too_big   ? "body over LH_MAX_REPLY_DATA"
                                     : std::string(curl_easy_strerror(rc));
    if (t->req.kind == LH_IO_HTTP_WATCH && code != 0 && code != 200)
      why = "watch answered " + std::to_string(code) + ": " + t->body.substr(0, 512);
    // No answer from this member (a reply of any status is an answer): try the next one.
    const bool no_answer = rc != CURLE_OK && !t->too_big && code == 0 && !t->streamed;
    if (no_answer && t->tried < opts_.endpoints.size()) {
      log(member + t->req.path + ": " + why + "; trying the next member");
      t->member = (t->member + 1) % opts_.endpoints.size();
      ++t->tried;
      if (begin(*t)) return;
    }
    if (no_answer) preferred_ = (t->member + 1) % opts_.endpoints.size();
    log(member + t->req.path + ": " + why);
    end(id);
    failed(id, member + ": " + why);
  }

  void loop() {
    detail::block_sigpipe_in_this_thread();
    for (;;) {
      std::deque<IoRequest> batch;
      {
        std::lock_guard g(mu_);
        if (closed_) break;
        batch.swap(queue_);
      }
      for (auto& r : batch) start_request(std::move(r));
      int running = 0;
      curl_multi_perform(multi_, &running);
      int left = 0;
      while (CURLMsg* m = curl_multi_info_read(multi_, &left))
        if (m->msg == CURLMSG_DONE) finished(m->easy_handle, m->data.result);
      curl_multi_poll(multi_, nullptr, 0, 1000, nullptr);
    }
    while (!transfers_.empty()) end(transfers_.begin()->first);
  }

  EtcdOptions opts_;
  Sink sink_;
  CURLM* multi_ = nullptr;
  mutable std::mutex mu_;
  std::deque<IoRequest> queue_;  // guarded by mu_
  bool closed_ = false;            // guarded by mu_
  std::size_t watches_open_ = 0;   // guarded by mu_
  std::size_t unary_open_ = 0;     // queued or running unary requests; guarded by mu_
  std::condition_variable idle_cv_;
  // The thread's own:
  std::map<std::uint64_t, std::unique_ptr<Transfer>> transfers_;
  std::size_t preferred_ = 0;
  std::thread thread_;
};

// The earlier name of EtcdExecutor.
using EtcdTransport = EtcdExecutor;

}  // namespace leasehold
