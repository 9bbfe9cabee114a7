// leasehold/detail/tls_stream.hpp — TLS for RedisStreamExecutor's streams (rediss://), on OpenSSL
// when LEASEHOLD_OPENSSL is defined (CMake's leasehold::redis_stream defines it and links
// OpenSSL::SSL where OpenSSL is found). Without it a TlsContext cannot be made: its constructor
// throws the reason, which the executor reports.
#pragma once

#include <leasehold/detail/sigpipe.hpp>
#include <leasehold/error.hpp>

#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#if defined(LEASEHOLD_OPENSSL)
#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#endif

namespace leasehold {

// TLS settings of rediss:// streams (PEM files). Empty: the system's CAs, no client certificate.
// The server's certificate is always verified, against the host name of the URL.
struct TlsOptions {
  std::string ca_file;    // the CAs to trust instead of the system's
  std::string cert_file;  // a client certificate (chain) to present
  std::string key_file;   // its private key (empty: in cert_file)
  [[nodiscard]] bool empty() const noexcept { return ca_file.empty() && cert_file.empty() && key_file.empty(); }
};

namespace detail {

#if defined(LEASEHOLD_OPENSSL)
inline constexpr bool kTlsBuiltIn = true;

inline std::string openssl_reason(const char* fallback) {
  const unsigned long e = ERR_get_error();
  const char* r = e != 0 ? ERR_reason_error_string(e) : nullptr;
  return r != nullptr ? r : fallback;
}

// One TLS stream over a connected nonblocking socket. The stream's calls may come from several
// threads (a writer and a reader): an SSL object takes one at a time, so each call holds mu_.
class TlsSession {
 public:
  explicit TlsSession(SSL* ssl) : ssl_(ssl) {}
  // 1 done, 0 under way (want_write() says which way to wait), -1 failed (`why`).
  int handshake(std::string& why) {
    std::lock_guard g(mu_);
    SigpipeScope pipe;
    ERR_clear_error();
    const int r = SSL_connect(ssl_.get());
    if (r == 1) return 1;
    const int e = SSL_get_error(ssl_.get(), r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return 0;
    const long v = SSL_get_verify_result(ssl_.get());
    why = v != X509_V_OK ? std::string("certificate verify failed: ") + X509_verify_cert_error_string(v)
                         : openssl_reason(e == SSL_ERROR_SYSCALL ? "connection closed" : "failed");
    why = "TLS handshake: " + why;
    return -1;
  }
  [[nodiscard]] bool want_write() {
    std::lock_guard g(mu_);
    return SSL_want_write(ssl_.get()) != 0;
  }
  // Bytes moved (> 0), 0 at the stream's end, -1 when it would block, -2 failed (`why`).
  ssize_t read(char* buf, std::size_t n, std::string& why) { return io(buf, n, false, why); }
  ssize_t write(const char* buf, std::size_t n, std::string& why) { return io(const_cast<char*>(buf), n, true, why); }

 private:
  ssize_t io(char* buf, std::size_t n, bool writing, std::string& why) {
    std::lock_guard g(mu_);
    SigpipeScope pipe;
    ERR_clear_error();
    const int len = static_cast<int>(std::min<std::size_t>(n, 1 << 30));
    errno = 0;
    const int r = writing ? SSL_write(ssl_.get(), buf, len) : SSL_read(ssl_.get(), buf, len);
    const int sys = errno;
    if (r > 0) return r;
    const int e = SSL_get_error(ssl_.get(), r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return -1;
    if (e == SSL_ERROR_ZERO_RETURN) return 0;
    why = std::string(writing ? "TLS write: " : "TLS read: ") +
          openssl_reason(e == SSL_ERROR_SYSCALL && sys != 0 ? std::strerror(sys) : "connection closed");
    return -2;
  }
  struct Free {
    void operator()(SSL* s) const noexcept { SSL_free(s); }
  };
  std::mutex mu_;
  std::unique_ptr<SSL, Free> ssl_;
};

// The settings every TLS stream of one executor shares (an SSL_CTX): the CAs, the client
// certificate. Throws Error(status::invalid_argument) when a file cannot be loaded.
class TlsContext {
 public:
  explicit TlsContext(const TlsOptions& o) : ctx_(SSL_CTX_new(TLS_client_method())) {
    if (!ctx_) throw Error(status::invalid_argument, "TLS: " + openssl_reason("SSL_CTX_new failed"));
    SSL_CTX* c = ctx_.get();
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER, nullptr);
    SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if ((o.ca_file.empty() ? SSL_CTX_set_default_verify_paths(c) : SSL_CTX_load_verify_locations(c, o.ca_file.c_str(), nullptr)) != 1)
      fail("cannot load the CA file '" + o.ca_file + "'");
    if (!o.cert_file.empty()) {
      const auto& key = o.key_file.empty() ? o.cert_file : o.key_file;
      if (SSL_CTX_use_certificate_chain_file(c, o.cert_file.c_str()) != 1) fail("cannot load the certificate '" + o.cert_file + "'");
      if (SSL_CTX_use_PrivateKey_file(c, key.c_str(), SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(c) != 1)
        fail("cannot load the private key '" + key + "' of '" + o.cert_file + "'");
    } else if (!o.key_file.empty()) {
      throw Error(status::invalid_argument, "TLS: a key_file without its cert_file");
    }
  }
  // A session on `fd` verifying `server_name` (a host name, sent as SNI, or an IP address);
  // nullptr with `why` when OpenSSL refuses.
  std::unique_ptr<TlsSession> session(int fd, const std::string& server_name, std::string& why) {
    SSL* ssl = SSL_new(ctx_.get());
    if (ssl == nullptr) return why = "TLS: " + openssl_reason("SSL_new failed"), nullptr;
    auto s = std::make_unique<TlsSession>(ssl);
    in6_addr ip{};
    const bool literal = ::inet_pton(AF_INET, server_name.c_str(), &ip) == 1 || ::inet_pton(AF_INET6, server_name.c_str(), &ip) == 1;
    const bool ok = literal ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), server_name.c_str()) == 1
                            : SSL_set_tlsext_host_name(ssl, server_name.c_str()) == 1 && SSL_set1_host(ssl, server_name.c_str()) == 1;
    if (!ok || SSL_set_fd(ssl, fd) != 1) return why = "TLS: cannot verify the server name '" + server_name + "'", nullptr;
    return s;
  }

 private:
  [[noreturn]] static void fail(const std::string& what) {
    throw Error(status::invalid_argument, "TLS: " + what + ": " + openssl_reason("unknown reason"));
  }
  struct Free {
    void operator()(SSL_CTX* c) const noexcept { SSL_CTX_free(c); }
  };
  std::unique_ptr<SSL_CTX, Free> ctx_;
};

#else
inline constexpr bool kTlsBuiltIn = false;

// Built without OpenSSL: the same interface, never made.
class TlsSession {
 public:
  int handshake(std::string& why) { return why = "TLS is not built in", -1; }
  [[nodiscard]] bool want_write() { return false; }
  ssize_t read(char*, std::size_t, std::string& why) { return why = "TLS is not built in", -2; }
  ssize_t write(const char*, std::size_t, std::string& why) { return why = "TLS is not built in", -2; }
};
class TlsContext {
 public:
  explicit TlsContext(const TlsOptions&) {
    throw Error(status::invalid_argument,
                "TLS (rediss://) is not built in: this program was compiled without OpenSSL (link the CMake target "
                "leasehold::redis_stream where OpenSSL is found, or define LEASEHOLD_OPENSSL and link -lssl -lcrypto)");
  }
  std::unique_ptr<TlsSession> session(int, const std::string&, std::string& why) { return why = "TLS is not built in", nullptr; }
};
#endif

}  // namespace detail
}  // namespace leasehold
