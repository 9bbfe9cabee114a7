"""Takes a lock on the embedded default backend (a SQLite file in the user's cache
directory, shared by every process on this host), prints the fencing token and releases.

    pip install ./bindings/python    # from a checkout, or a built wheel
    python examples/python/lock.py [NAME]
"""

from __future__ import annotations

import sys

from leasehold import LockClient, LockTimeout
from leasehold.backends.sqlite import SQLiteLockService, default_path


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "example"
    path = default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with LockClient(SQLiteLockService(path)) as client:
        try:
            with client.acquire(name, ttl=10, wait=5) as lock:
                # Hand the token to every write the lock protects; the resource rejects
                # writes that carry an older token than one it has seen.
                print(f"holding {name!r} in {path}: fencing token {lock.fencing_token}")
        except LockTimeout:
            print(f"{name!r} is held by another process", file=sys.stderr)
            return 1
    print("released")
    return 0


if __name__ == "__main__":
    sys.exit(main())
