// leasehold/request.hpp — the IO the core asks for and what an executor hands back: IoRequest,
// an owned copy of one lh_io_request (a command, an SQL transaction or an HTTP call), and
// IoAnswer, one answer of the seam's kinds (lh_io_reply, lh_io_http_reply, lh_io_stream_message,
// lh_io_failed, lh_io_message, lh_io_connection). Both cross unread: their meaning is the core's.
#pragma once

#include <leasehold.h>

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace leasehold {

// One parameter of an SQL statement.
struct SqlParam {
  std::uint32_t kind = LH_VALUE_NIL;  // LH_VALUE_NIL/INT/TEXT/BULK or LH_PARAM_HOST_*
  std::int64_t integer = 0;           // LH_VALUE_INT
  std::string bytes;                  // LH_VALUE_TEXT / LH_VALUE_BULK
};
struct SqlStatement {
  std::string sql;
  std::vector<SqlParam> params;  // ?1.. / $1.. in order
};

// One request (lh_io_poll), owned; the fields of other kinds are empty. Run it on `connection`
// and answer `id`:
//   LH_IO_COMMAND    argv verbatim (Redis; the memory service's call)  → IoReply or IoFailed;
//   LH_IO_SQL        the statements in order                           → IoReply or IoFailed;
//   LH_IO_HTTP       POST body to a member's base URL + path           → IoHttpReply or IoFailed;
//   LH_IO_HTTP_WATCH the same, the response kept open                  → IoStreamMessage…, IoFailed;
//   LH_IO_HTTP_CANCEL close the watch stream `id` (no answer);
//   LH_IO_OPEN       connect `stream` to host:port (TLS with server_name when tls) or unix_path,
//                    giving up at `deadline` → IoOpened, or IoClosed with the reason; then every
//                    read → IoReceived, its end → IoClosed;
//   LH_IO_WRITE      write `data` on `stream` after earlier writes (no answer; a failure: IoClosed);
//   LH_IO_SHUTDOWN   close `stream` (no answer).
struct IoRequest {
  std::uint64_t id = 0;
  std::uint32_t kind = LH_IO_NONE;            // LH_IO_*
  std::uint32_t connection = 0;               // LH_CONNECTION_* (COMMAND, SQL)
  std::vector<std::string> argv;              // COMMAND
  std::vector<SqlStatement> statements;       // SQL
  std::string method, path, body, authorization;  // HTTP (authorization: send unless empty)
  // Streams (LH_BACKEND_REDIS_STREAM: the core owns the Redis wire, the host moves bytes).
  std::uint64_t stream = 0;                   // OPEN, WRITE, SHUTDOWN (== id)
  std::uint64_t deadline = 0;                 // OPEN: give up then (ns, the core's clock)
  std::string host, unix_path, server_name;   // OPEN: TCP host, or a Unix socket's path; TLS name
  std::uint32_t port = 0;                     // OPEN over TCP
  bool tls = false;                           // OPEN: wrap the stream in TLS
  std::string data;                           // WRITE: the bytes
};
// The earlier per-backend names of a request: the same type.
using Request = IoRequest;
using SqlRequest = IoRequest;
using HttpRequest = IoRequest;

// The values answering a COMMAND or SQL request: lh_values in pre-order (an array is followed
// by its elements), strings as offset/len into `data`.
struct IoReply {
  std::uint64_t id = 0;
  std::vector<lh_value> values;
  std::string data;
};
// The whole reply to an HTTP request (any status: the core judges it).
struct IoHttpReply {
  std::uint64_t id = 0;
  std::uint32_t status = 0;
  std::string body;
};
// One newline-delimited message of an HTTP watch stream, without the newline.
struct IoStreamMessage {
  std::uint64_t id = 0;
  std::string message;
};
// No answer came (LH_FAILURE_TRANSPORT), or the database refused the request
// (LH_FAILURE_DATABASE); a watch stream's end too.
struct IoFailed {
  std::uint64_t id = 0;
  std::uint32_t kind = LH_FAILURE_TRANSPORT;
  std::string message;
};
// A notification that arrived on a connection: a pub/sub message, a NOTIFY, a memory-service
// release (channel = the name, no payload).
struct IoMessage {
  std::string channel, payload;
};
// Something happened to a connection: LH_CONNECTION_REOPENED, or a subscription of `channel`
// taking effect or ending (LH_CONNECTION_SUBSCRIBED / _UNSUBSCRIBED).
struct IoConnection {
  std::uint32_t connection = LH_CONNECTION_COMMANDS;
  std::uint32_t event = LH_CONNECTION_REOPENED;
  std::string channel;
};
// A stream of an LH_IO_OPEN is open (TLS handshake included): lh_io_opened.
struct IoOpened {
  std::uint64_t stream = 0;
};
// Bytes read on a stream, split anywhere: lh_io_received.
struct IoReceived {
  std::uint64_t stream = 0;
  std::string bytes;
};
// A stream ended or never opened, with the reason: lh_io_closed.
struct IoClosed {
  std::uint64_t stream = 0;
  std::string message;
};
using IoAnswer = std::variant<IoReply, IoHttpReply, IoStreamMessage, IoFailed, IoMessage, IoConnection, IoOpened,
                              IoReceived, IoClosed>;

}  // namespace leasehold
