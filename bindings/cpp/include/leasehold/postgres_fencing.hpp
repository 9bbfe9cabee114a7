// leasehold/postgres_fencing.hpp — the storage-side fencing gate on PostgreSQL (libpq; link
// leasehold::postgres).
//
// A lock client can only detect that it lost a lock; the resource must enforce it. The gate
// does that in one transaction per protected operation:
//   1. lock the resource's high-water-mark row (SELECT … FOR UPDATE; the row is created first
//      when missing);
//   2. refuse the operation if token < mark (StaleFencingToken; equal passes, so a retry with
//      the same token works);
//   3. raise the mark to the token;
//   4. run the protected work — its reads as well as its writes — on the same connection, in
//      the same transaction, then commit (or roll everything back if it throws).
// Checking only the final write is not enough: a stale holder that read before its pause and
// writes before the new holder raised the mark would still lose an update.
//
//   leasehold::PostgresFencingGate gate(url);
//   gate.ensure_schema();
//   gate.run("invoices", lease->fencing_token(), [&](PGconn* c) { /* SELECT …; UPDATE … */ });
//
// The table is `leasehold_fencing (resource text primary key, hwm bigint)` by default, the one
// the Python gate uses, so gates of either language guard the same resources.
#pragma once

#include <leasehold.hpp>
#include <leasehold/detail/pg_conninfo.hpp>

#include <libpq-fe.h>

#include <cstdlib>
#include <cstring>

namespace leasehold {

// The token was below the resource's high-water mark: a newer holder wrote already. Nothing ran.
class StaleFencingToken : public std::runtime_error {
 public:
  StaleFencingToken(std::string resource, std::uint64_t token, std::uint64_t hwm)
      : std::runtime_error("leasehold: stale fencing token " + std::to_string(token) + " for \"" + resource +
                           "\" (high-water mark " + std::to_string(hwm) + ")"),
        resource_(std::move(resource)), token_(token), hwm_(hwm) {}
  [[nodiscard]] const std::string& resource() const noexcept { return resource_; }
  [[nodiscard]] std::uint64_t token() const noexcept { return token_; }
  [[nodiscard]] std::uint64_t high_water_mark() const noexcept { return hwm_; }

 private:
  std::string resource_;
  std::uint64_t token_, hwm_;
};

// PostgreSQL refused a statement of the gate, or the connection failed.
class PostgresError : public std::runtime_error {
 public:
  PostgresError(const std::string& what, std::string sqlstate)
      : std::runtime_error("leasehold postgres: " + what), sqlstate_(std::move(sqlstate)) {}
  // The SQLSTATE code ("40P01", …), empty when the connection failed.
  [[nodiscard]] const std::string& sqlstate() const noexcept { return sqlstate_; }

 private:
  std::string sqlstate_;
};

struct FencingGateOptions {
  std::string table = "leasehold_fencing";  // a plain identifier
};

class PostgresFencingGate {
  struct Finish {
    void operator()(PGconn* c) const noexcept { PQfinish(c); }
  };
  struct Clear {
    void operator()(PGresult* r) const noexcept { PQclear(r); }
  };
  using Result = std::unique_ptr<PGresult, Clear>;

 public:
  // Opens (and owns) a connection: postgresql://user:password@host:port/db?sslmode=verify-full.
  // No error quotes the string's password (one that does not parse is not shown at all).
  explicit PostgresFencingGate(const std::string& url, FencingGateOptions options = {}) : PostgresFencingGate(options) {
    std::string refused;
    auto redact = detail::PgRedactor::make(url, refused);
    if (!redact) throw PostgresError("connection failed: " + refused, "");
    redact_ = std::move(*redact);
    owned_.reset(PQconnectdb(url.c_str()));
    if (!owned_ || PQstatus(owned_.get()) != CONNECTION_OK)
      throw PostgresError("connection failed: " + redact_(owned_ ? detail::pg_one_line(PQerrorMessage(owned_.get())) : "out of memory"), "");
    conn_ = owned_.get();
    PQsetNoticeProcessor(conn_, [](void*, const char*) {}, nullptr);  // "already exists, skipping"
  }
  // Borrows the caller's connection (it must outlive the gate, and be idle when run() starts:
  // the gate owns the transaction).
  explicit PostgresFencingGate(PGconn* connection, FencingGateOptions options = {}) : PostgresFencingGate(options) {
    if (connection == nullptr) throw Error(LH_ERR_NULL_ARGUMENT, "PostgresFencingGate: NULL connection");
    conn_ = connection;
  }
  PostgresFencingGate(PostgresFencingGate&& o) noexcept
      : owned_(std::move(o.owned_)), conn_(std::exchange(o.conn_, nullptr)), table_(std::move(o.table_)),
        redact_(std::move(o.redact_)) {}
  PostgresFencingGate& operator=(PostgresFencingGate&& o) noexcept {
    owned_ = std::move(o.owned_);
    conn_ = std::exchange(o.conn_, nullptr);
    table_ = std::move(o.table_);
    redact_ = std::move(o.redact_);
    return *this;
  }

  [[nodiscard]] PGconn* connection() const noexcept { return conn_; }
  [[nodiscard]] const std::string& table() const noexcept { return table_; }

  // Creates the high-water-mark table when missing.
  void ensure_schema() {
    exec("CREATE TABLE IF NOT EXISTS " + table_ + " (resource text PRIMARY KEY, hwm bigint NOT NULL)", {});
  }
  // The highest token accepted for `resource`; nullopt if none ever was.
  [[nodiscard]] std::optional<std::uint64_t> high_water_mark(std::string_view resource) {
    auto r = exec("SELECT hwm FROM " + table_ + " WHERE resource = $1", {std::string(resource)});
    if (PQntuples(r.get()) == 0) return std::nullopt;
    const auto v = std::strtoll(PQgetvalue(r.get(), 0, 0), nullptr, 10);
    if (v < 0) return std::nullopt;
    return static_cast<std::uint64_t>(v);
  }

  // Runs work(PGconn*) in one transaction guarded by `token`, and returns what it returns.
  // Throws StaleFencingToken (nothing ran, nothing changed) when token < the mark,
  // PostgresError when a statement fails (rolled back), and whatever work throws (rolled back,
  // the mark included).
  template <class F>
  auto run(std::string_view resource, std::uint64_t token, F&& work) {
    if (resource.empty()) throw Error(status::invalid_argument, "PostgresFencingGate: empty resource");
    if (token > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      throw Error(status::invalid_argument, "PostgresFencingGate: fencing token out of range");
    if (PQtransactionStatus(conn_) != PQTRANS_IDLE)
      throw Error(status::invalid_argument, "PostgresFencingGate: the connection is inside a transaction (the gate owns it)");
    const std::string res(resource), tok = std::to_string(token);
    exec("BEGIN", {});
    try {
      // The row exists before it is locked (-1: no token yet), so FOR UPDATE always has a row.
      exec("INSERT INTO " + table_ + " (resource, hwm) VALUES ($1, -1) ON CONFLICT (resource) DO NOTHING", {res});
      auto r = exec("SELECT hwm FROM " + table_ + " WHERE resource = $1 FOR UPDATE", {res});
      const auto hwm = PQntuples(r.get()) == 1 ? std::strtoll(PQgetvalue(r.get(), 0, 0), nullptr, 10) : -1;
      if (hwm >= 0 && token < static_cast<std::uint64_t>(hwm))
        throw StaleFencingToken(res, token, static_cast<std::uint64_t>(hwm));
      if (hwm < 0 || token > static_cast<std::uint64_t>(hwm))
        exec("UPDATE " + table_ + " SET hwm = $1 WHERE resource = $2", {tok, res});
      if constexpr (std::is_void_v<std::invoke_result_t<F, PGconn*>>) {
        std::forward<F>(work)(conn_);
        commit();
      } else {
        auto out = std::forward<F>(work)(conn_);
        commit();
        return out;
      }
    } catch (...) {
      if (PQtransactionStatus(conn_) != PQTRANS_IDLE) Result(PQexec(conn_, "ROLLBACK"));
      throw;
    }
  }

 private:
  explicit PostgresFencingGate(const FencingGateOptions& options) : table_(options.table) {
    auto word = [](char c, bool first) {
      return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (!first && c >= '0' && c <= '9');
    };
    bool ok = !table_.empty() && table_.size() <= 63;
    for (std::size_t i = 0; ok && i < table_.size(); ++i) ok = word(table_[i], i == 0);
    if (!ok)
      throw Error(status::invalid_argument, "PostgresFencingGate: table \"" + table_ + "\" is not a plain identifier");
  }

  Result exec(const std::string& sql, const std::vector<std::string>& params) {
    std::vector<const char*> v;
    for (const auto& p : params) v.push_back(p.c_str());
    Result r(PQexecParams(conn_, sql.c_str(), static_cast<int>(v.size()), nullptr, v.data(), nullptr, nullptr, 0));
    const auto st = r ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
      const char* state = r ? PQresultErrorField(r.get(), PG_DIAG_SQLSTATE) : nullptr;
      std::string msg = r ? PQresultErrorMessage(r.get()) : PQerrorMessage(conn_);
      while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
      throw PostgresError(redact_(msg.empty() ? std::string(PQerrorMessage(conn_)) : msg), state != nullptr ? state : "");
    }
    return r;
  }
  void commit() {
    // The work may have swallowed a failed statement: COMMIT would then roll back silently.
    if (PQtransactionStatus(conn_) == PQTRANS_INERROR)
      throw PostgresError("the protected work left the transaction failed; rolled back", "25P02");
    auto r = exec("COMMIT", {});
    if (std::strcmp(PQcmdStatus(r.get()), "COMMIT") != 0) throw PostgresError("the transaction was rolled back", "40000");
  }

  std::unique_ptr<PGconn, Finish> owned_;
  PGconn* conn_ = nullptr;
  std::string table_;
  detail::PgRedactor redact_;  // the owned connection's secrets
};

// The fencing gate of every binding's shared name; the C++ binding's only gate is PostgreSQL's.
using FencingGate = PostgresFencingGate;

}  // namespace leasehold
