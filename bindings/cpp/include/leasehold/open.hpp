// leasehold/open.hpp — the executor a backend URL names, and a LockClient on it (Go's
// NewExecutor/Open, Python's from_url):
//
//   redis://[[user]:pass@]host[:port][/db], rediss://… (TLS), unix:///path[?db=N],
//   redis+sentinel://[[user]:pass@]host:port[,host:port…]/master[/db],
//   redis+cluster://[[user]:pass@]host:port[,host:port…], rediss+cluster://…
//                                  RedisStreamExecutor: the core on the wire, no client library
//   memory://                      a MemoryExecutor on a new MemoryService (this process only)
//   sqlite:///abs/path, sqlite:rel/path, sqlite://
//                                  SQLiteExecutor (sqlite://: default_sqlite_path()), where
//                                  LEASEHOLD_HAVE_SQLITE is defined (CMake: leasehold::sqlite)
//   postgresql://…, postgres://…   PostgresExecutor, where LEASEHOLD_HAVE_POSTGRES is defined
//                                  (CMake: leasehold::postgres)
//
//   auto client = leasehold::open_client("rediss://redis.example:6380/0");
//
// An unknown scheme, or a backend not built in, is Error(status::invalid_argument) saying so (the
// URL's password never shows); the rest of a Redis or PostgreSQL URL is checked when the
// LockClient is made (a bad Redis URL: LH_ERR_INVALID_CONFIG).
#pragma once

#include <leasehold.hpp>
#include <leasehold/memory_executor.hpp>
#include <leasehold/redis_stream_executor.hpp>
#if defined(LEASEHOLD_HAVE_SQLITE)
#include <leasehold/sqlite_executor.hpp>
#endif
#if defined(LEASEHOLD_HAVE_POSTGRES)
#include <leasehold/postgres_executor.hpp>
#endif

#include <algorithm>
#include <cctype>
#include <memory>
#include <string>
#include <string_view>

// What this header serves differs with the backends built in: each combination gets its own
// inline namespace, so programs whose files differ never mix two definitions.
#if defined(LEASEHOLD_HAVE_SQLITE) && defined(LEASEHOLD_HAVE_POSTGRES)
#define LEASEHOLD_OPEN_NS open_sqlite_postgres
#elif defined(LEASEHOLD_HAVE_SQLITE)
#define LEASEHOLD_OPEN_NS open_sqlite
#elif defined(LEASEHOLD_HAVE_POSTGRES)
#define LEASEHOLD_OPEN_NS open_postgres
#else
#define LEASEHOLD_OPEN_NS open_redis
#endif

namespace leasehold {
namespace detail {

inline std::string lower_scheme(std::string_view url) {
  const auto colon = url.find(':');
  std::string s(url.substr(0, colon == std::string_view::npos ? 0 : colon));
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The file a sqlite: URL names: sqlite:///abs/path, sqlite:rel/path, or "" for sqlite:// and
// sqlite: (the default path). No host, query or fragment; percent-escapes decoded.
inline std::string sqlite_path_of(std::string_view url) {
  auto body = url.substr(url.find(':') + 1);
  if (body.substr(0, 2) == "//") {
    body.remove_prefix(2);
    if (!body.empty() && body.front() != '/')
      throw Error(status::invalid_argument, "SQLite URLs have no host part (use sqlite:///ABSOLUTE/PATH)");
  }
  if (body.find_first_of("?#") != std::string_view::npos)
    throw Error(status::invalid_argument, "SQLite URLs take no query or fragment");
  std::string path;
  for (std::size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '%') {
      path += body[i];
      continue;
    }
    const auto hex = [&](std::size_t j) { return j < body.size() ? std::isxdigit(static_cast<unsigned char>(body[j])) : 0; };
    if (!hex(i + 1) || !hex(i + 2)) throw Error(status::invalid_argument, "SQLite URL: a bad percent escape");
    path += static_cast<char>(std::stoi(std::string(body.substr(i + 1, 2)), nullptr, 16));
    i += 2;
  }
  return path;
}

}  // namespace detail

inline namespace LEASEHOLD_OPEN_NS {

// The options of the executor make_executor() makes; only those of the URL's backend are read,
// and the URL (or path) in them is replaced by the one given.
struct ExecutorOptions {
  RedisStreamOptions redis;  // redis://, rediss://, unix://, redis+sentinel://, redis+cluster://
#if defined(LEASEHOLD_HAVE_SQLITE)
  SqliteOptions sqlite;
#endif
#if defined(LEASEHOLD_HAVE_POSTGRES)
  PostgresOptions postgres;
#endif
};

// The executor for a backend URL (see the top of this file).
inline std::shared_ptr<Executor> make_executor(std::string_view url, ExecutorOptions options = {}) {
  const auto scheme = detail::lower_scheme(url);
  if (scheme == "redis" || scheme == "rediss" || scheme == "unix" || scheme == "redis+sentinel" ||
      scheme == "redis+cluster" || scheme == "rediss+cluster") {
    options.redis.url = std::string(url);
    return std::make_shared<RedisStreamExecutor>(std::move(options.redis));
  }
  if (scheme == "memory") {
    if (url.find_first_not_of('/', scheme.size() + 1) != std::string_view::npos)
      throw Error(status::invalid_argument, "memory URLs take no host or path (use memory://)");
    return std::make_shared<MemoryExecutor>(std::make_shared<MemoryService>());
  }
  if (scheme == "sqlite") {
#if defined(LEASEHOLD_HAVE_SQLITE)
    auto path = detail::sqlite_path_of(url);
    options.sqlite.path = path.empty() ? default_sqlite_path().string() : std::move(path);
    return std::make_shared<SQLiteExecutor>(std::move(options.sqlite));
#else
    throw Error(status::invalid_argument, "sqlite: URLs need SQLiteExecutor, not built into this program (link the "
                                          "CMake target leasehold::sqlite, which defines LEASEHOLD_HAVE_SQLITE)");
#endif
  }
  if (scheme == "postgresql" || scheme == "postgres") {
#if defined(LEASEHOLD_HAVE_POSTGRES)
    options.postgres.url = std::string(url);
    return std::make_shared<PostgresExecutor>(std::move(options.postgres));
#else
    throw Error(status::invalid_argument, scheme + ": URLs need PostgresExecutor, not built into this program (link "
                                                   "the CMake target leasehold::postgres, which defines LEASEHOLD_HAVE_POSTGRES)");
#endif
  }
  throw Error(status::invalid_argument,
              (scheme.empty() ? std::string("a backend URL without a scheme") : "unknown backend URL scheme '" + scheme + "'") +
                  " (use redis://, rediss://, unix://, redis+sentinel://, redis+cluster://, sqlite://, postgresql:// or "
                                                                         "memory://)");
}

// A LockClient on make_executor(url); it owns the executor.
inline LockClient open_client(std::string_view url, ClientOptions client = {}, ExecutorOptions options = {}) {
  return LockClient(make_executor(url, std::move(options)), std::move(client));
}

}  // namespace LEASEHOLD_OPEN_NS
}  // namespace leasehold
