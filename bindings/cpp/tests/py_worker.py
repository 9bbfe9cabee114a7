"""Python side of the C++/Python contention test (run by tests/redis_test.cpp).

Acquires the given names in turn through leasehold.LockClient + RedisLockService against the
Redis server on --port, and while holding each lock:
  * INCR test:inside:{name}; any value other than 1 is an exclusivity violation (RPUSH test:violations);
  * RPUSH test:log:{name} "py:<fencing token>" — the C++ side checks the merged log is strictly
    increasing per name.
Prints "ready" once connected, then waits for a line on stdin before starting, and finally one
JSON line {"acquired": n, "timeouts": m}. Exit status 0 unless something unexpected happened.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import redis

from leasehold import LockClient, LockTimeout
from leasehold.backends.redis import RedisLockService


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--names", required=True, help="comma-separated lock names")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--ttl", type=float, default=5.0)
    ap.add_argument("--wait", type=float, default=30.0)
    ap.add_argument("--hold", type=float, default=0.002)
    args = ap.parse_args()
    names = [n for n in args.names.split(",") if n]
    url = f"redis://127.0.0.1:{args.port}/0"
    r = redis.Redis.from_url(url, socket_timeout=10)
    r.ping()
    acquired = timeouts = 0
    with LockClient(RedisLockService.from_url(url)) as client:
        print("ready", flush=True)
        sys.stdin.readline()  # the C++ side starts both at once
        for i in range(args.iterations):
            name = names[i % len(names)]
            try:
                with client.acquire(name, ttl=args.ttl, wait=args.wait) as lock:
                    acquired += 1
                    if r.incr(f"test:inside:{name}") != 1:
                        r.rpush("test:violations", f"py:{name}:{lock.fencing_token}")
                    r.rpush(f"test:log:{name}", f"py:{lock.fencing_token}")
                    time.sleep(args.hold)
                    r.decr(f"test:inside:{name}")
                    if not lock.is_held():
                        r.rpush("test:violations", f"py-lost:{name}:{lock.fencing_token}")
            except LockTimeout:
                timeouts += 1
    print(json.dumps({"acquired": acquired, "timeouts": timeouts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
