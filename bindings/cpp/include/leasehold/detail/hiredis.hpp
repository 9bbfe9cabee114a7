// leasehold/detail/hiredis.hpp — hiredis glue for the Redis executor (redis_executor.hpp):
// owned contexts and replies, an argument vector appended as it is, and a reply flattened into
// the core's values (lh_value + one data buffer: lh_io_reply). A type mapping only; what a reply
// means is the core's.
#pragma once

#include <leasehold.hpp>

#include <hiredis/hiredis.h>

namespace leasehold::detail {

struct RedisCtxFree { void operator()(redisContext* c) const noexcept { redisFree(c); } };  // clang-format off
struct RedisReplyFree { void operator()(void* r) const noexcept { freeReplyObject(r); } };   // clang-format on
using RedisCtx = std::unique_ptr<redisContext, RedisCtxFree>;
using RedisReply = std::unique_ptr<redisReply, RedisReplyFree>;

// Appends one argument vector to c's output buffer.
inline int redis_append(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  for (const auto& a : args) argv.push_back(a.data()), lens.push_back(a.size());
  return redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data());
}

// A reply as pre-order values over out.data.
inline void redis_flatten(const redisReply* r, IoReply& out) {
  lh_value v{};
  switch (r->type) {
    case REDIS_REPLY_INTEGER: v.kind = LH_VALUE_INT, v.integer = r->integer; break;
    case REDIS_REPLY_STRING: v.kind = LH_VALUE_BULK; break;
    case REDIS_REPLY_STATUS: v.kind = LH_VALUE_STATUS; break;
    case REDIS_REPLY_ERROR: v.kind = LH_VALUE_ERROR; break;
    case REDIS_REPLY_ARRAY: v.kind = LH_VALUE_ARRAY, v.len = r->elements; break;
    default: v.kind = LH_VALUE_NIL; break;
  }
  if (v.kind == LH_VALUE_BULK || v.kind == LH_VALUE_STATUS || v.kind == LH_VALUE_ERROR) {
    v.offset = out.data.size(), v.len = r->len;
    out.data.append(r->str, r->len);
  }
  out.values.push_back(v);
  if (v.kind == LH_VALUE_ARRAY)
    for (std::size_t i = 0; i < r->elements; ++i) redis_flatten(r->element[i], out);
}

}  // namespace leasehold::detail
