// leasehold/detail/pg_conninfo.hpp — keeps a libpq connection string's secrets out of every
// message the PostgreSQL executor and the fencing gate log or throw.
//
// libpq quotes the connection string, or a piece of it, in its errors: a URI that does not parse
// ("postgresql://u:S3CRET@[::1/db"), a bad percent escape in the password ("S3%zzCRET"), and a
// password with an unescaped '/' (read as the port: invalid integer value "S3CRET"). So a string
// that does not parse is refused up front with libpq's reason minus everything it quoted, a URI
// with an '@' in its path is refused, and the password libpq parsed (and the URI's raw password
// text) is masked in every other message.
#pragma once

#include <libpq-fe.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold::detail {

// libpq's multi-line messages as one line.
inline std::string pg_one_line(const char* m) {
  std::string s = m != nullptr ? m : "";
  for (auto& ch : s)
    if (ch == '\n' || ch == '\t') ch = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// `s` with %XX escapes decoded (a bad escape is kept as written).
inline std::string pg_percent_decoded(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) != 0 &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2])) != 0) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

class PgRedactor {
 public:
  PgRedactor() = default;  // masks nothing
  // The redactor for `conninfo`, or nullopt and `error` (which never quotes the string) when the
  // string is refused.
  static std::optional<PgRedactor> make(const std::string& conninfo, std::string& error) {
    PgRedactor r;
    const std::string_view s = conninfo;
    std::string_view rest;
    for (std::string_view scheme : {"postgresql://", "postgres://"})
      if (s.size() >= scheme.size() && s.substr(0, scheme.size()) == scheme) rest = s.substr(scheme.size());
    if (!rest.empty()) {
      // As libpq reads it, the userinfo ends at the first '@' before any '/'; its password as
      // written is masked too.
      const auto slash = rest.find('/');
      const auto at = rest.substr(0, slash).find('@');
      if (at != std::string_view::npos) {
        const auto colon = rest.substr(0, at).find(':');
        if (colon != std::string_view::npos) {
          r.add(std::string(rest.substr(colon + 1, at - colon - 1)));
          r.add(pg_percent_decoded(rest.substr(colon + 1, at - colon - 1)));
        }
      }
      // An '@' in the path: a password with an unescaped '/', which libpq would read as a host,
      // a port and a database name (and quote in its errors).
      if (slash != std::string_view::npos) {
        const auto query = rest.find('?', slash);
        if (rest.substr(slash, query == std::string_view::npos ? std::string_view::npos : query - slash).find('@') !=
            std::string_view::npos) {
          error = "the connection string has an '@' after its host part: a password with '/' or '@' must be "
                  "percent-encoded (%2F, %40); the string is not shown, as it may hold a password";
          return std::nullopt;
        }
      }
    }
    char* err = nullptr;
    PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
    if (opts == nullptr) {
      error = "the connection string does not parse (" + (err != nullptr ? r.unquoted(err) : std::string("out of memory")) +
              "); it is not shown, as it may hold a password";
      PQfreemem(err);
      return std::nullopt;
    }
    for (auto* o = opts; o->keyword != nullptr; ++o)
      if (o->val != nullptr && (std::string_view(o->keyword) == "password" || std::string_view(o->keyword) == "sslpassword"))
        r.add(o->val);
    PQconninfoFree(opts);
    return r;
  }

  // `m` with every secret of the connection string masked.
  [[nodiscard]] std::string operator()(std::string m) const {
    for (const auto& secret : secrets_)
      for (auto at = m.find(secret); at != std::string::npos; at = m.find(secret, at + 3)) m.replace(at, secret.size(), "***");
    return m;
  }

 private:
  void add(std::string secret) {
    if (secret.empty() || std::find(secrets_.begin(), secrets_.end(), secret) != secrets_.end()) return;
    secrets_.push_back(std::move(secret));
    std::sort(secrets_.begin(), secrets_.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  }
  // libpq's message with everything from its first to its last double quote cut (what it quotes
  // of the string, even when the string itself holds quotes), then masked.
  [[nodiscard]] std::string unquoted(const char* m) const {
    std::string s = pg_one_line(m);
    const auto first = s.find('"'), last = s.rfind('"');
    if (first != std::string::npos) s = s.substr(0, first) + "..." + (last > first ? s.substr(last + 1) : std::string());
    while (s.size() > 1 && (s.back() == ':' || s.back() == ' ')) s.pop_back();
    return (*this)(s);
  }

  std::vector<std::string> secrets_;  // longest first
};

}  // namespace leasehold::detail
