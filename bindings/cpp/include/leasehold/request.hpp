// leasehold/request.hpp — the requests a backend protocol in the core asks its executor to run,
// owned: Redis commands (Request), SQL transactions (SqlRequest), HTTP calls (HttpRequest).
#pragma once

#include <leasehold.h>

#include <cstdint>
#include <string>
#include <vector>

namespace leasehold {

// A backend request (lh_poll_request), owned: run argv verbatim on `connection`
// (LH_CONNECTION_COMMANDS or LH_CONNECTION_SUBSCRIBER) and answer `id`.
struct Request {
  std::uint64_t id = 0;
  std::uint32_t connection = 0;
  std::vector<std::string> argv;
};

// An SQL request (lh_sql_poll_request), owned: run the statements in order on `connection`
// (LH_SQL_CONNECTION_COMMANDS or LH_SQL_CONNECTION_LISTENER) and answer `id`.
struct SqlParam {
  std::uint32_t kind = LH_VALUE_NIL;  // LH_VALUE_NIL/INT/TEXT/BULK or LH_PARAM_HOST_*
  std::int64_t integer = 0;           // LH_VALUE_INT
  std::string bytes;                  // LH_VALUE_TEXT / LH_VALUE_BULK
};
struct SqlStatement {
  std::string sql;
  std::vector<SqlParam> params;  // ?1.. / $1.. in order
};
struct SqlRequest {
  std::uint64_t id = 0;
  std::uint32_t connection = 0;
  std::vector<SqlStatement> statements;
};

// An HTTP request of the etcd protocol (lh_http_poll_request), owned.
struct HttpRequest {
  std::uint64_t id = 0;
  std::uint32_t kind = 0;  // LH_HTTP_UNARY, LH_HTTP_WATCH or LH_HTTP_CANCEL_WATCH
  std::string method, path, body, authorization;
};

}  // namespace leasehold
