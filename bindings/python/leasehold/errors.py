"""Exceptions raised by leasehold.

Hierarchy::

    LeaseholdError
    ├── LibraryError (ImportError)          the shared library is missing or has the wrong ABI
    ├── CoreError                           the core refused a call (status name + detail)
    │   ├── InvalidArgument (ValueError)    empty/oversized name, bad TTL, bad config, ...
    │   ├── UnknownLease (LookupError)      a lease id the core never issued
    │   ├── LeaseEnded                      the lease already reached a terminal state
    │   ├── NotGranted                      token/validity asked before any grant
    │   ├── TooManyLeases                   the configured max_leases was reached
    │   └── CorePanic / CorePoisoned        a bug in the core (please report)
    ├── LockTimeout (TimeoutError)          not acquired within ``wait``
    │   └── BackendUnavailable              ... because the backend kept failing
    ├── AcquireCancelled                    the acquire was cancelled before a grant
    ├── ClientClosed (RuntimeError)         the client is closed (or closing)
    ├── LockNotHeld (RuntimeError)          a released/lost handle was used as if held
    │   └── LockLost                        ... it was lost (``reason`` says why)
    ├── RenewTimeout (TimeoutError)         a manual renew() got no answer within its timeout
    └── StaleFencingToken                   the fencing gate refused an out-of-date token

Misuse that Python itself can detect (wrong argument types, negative TTLs) raises the
built-in ``TypeError``/``ValueError`` before the core is called; ``InvalidArgument`` is a
``ValueError`` too, so ``except ValueError`` catches both.
"""

from __future__ import annotations

__all__ = [
    "LeaseholdError",
    "LibraryError",
    "CoreError",
    "InvalidArgument",
    "UnknownLease",
    "LeaseEnded",
    "NotGranted",
    "TooManyLeases",
    "CorePanic",
    "CorePoisoned",
    "LockTimeout",
    "BackendUnavailable",
    "AcquireCancelled",
    "ClientClosed",
    "LockNotHeld",
    "LockLost",
    "RenewTimeout",
    "StaleFencingToken",
]


class LeaseholdError(Exception):
    """Base class of every exception raised by leasehold."""


class LibraryError(LeaseholdError, ImportError):
    """The native library could not be found or loaded, or its ABI version differs."""


class CoreError(LeaseholdError):
    """The core refused a call. Carries the numeric status, its name and the handle's detail.

    The core's state is unchanged after a ``CoreError`` (errors are for misuse only).
    """

    def __init__(self, status: int, status_name: str, detail: str = "", function: str = "") -> None:
        self.status = status
        self.status_name = status_name
        self.detail = detail
        self.function = function
        where = f"{function}: " if function else ""
        msg = f"{where}{status_name}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class InvalidArgument(CoreError, ValueError):
    """An argument was rejected by the core (name, TTL, config, seed, sizes, enum values)."""


class UnknownLease(CoreError, LookupError):
    """The lease id was never issued by this core."""


class LeaseEnded(CoreError):
    """The lease already ended (released, lost or failed) and its record was dropped."""


class NotGranted(CoreError):
    """A fencing token or validity was requested before the lease was ever granted."""


class TooManyLeases(CoreError):
    """The core already tracks ``max_leases`` live leases."""


class CorePanic(CoreError):
    """The core panicked inside the C ABI boundary (a bug); the handle is now poisoned."""


class CorePoisoned(CoreError):
    """The core handle was poisoned by an earlier panic; every call fails from now on."""


class LockTimeout(LeaseholdError, TimeoutError):
    """The lock was not acquired within ``wait``.

    This is the single way ``acquire`` reports "not acquired": it either returns a held
    handle or raises this (or a subclass).
    """

    def __init__(self, name: str, wait: float, message: str | None = None) -> None:
        self.name = name
        self.wait = wait
        super().__init__(message or f"lock {name!r} not acquired within {wait:g}s (held by another owner)")


class BackendUnavailable(LockTimeout):
    """The lock was not acquired within ``wait`` because the backend kept failing."""

    def __init__(self, name: str, wait: float, detail: str = "") -> None:
        self.detail = detail
        message = f"lock {name!r} not acquired within {wait:g}s: backend unavailable"
        super().__init__(name, wait, f"{message} ({detail})" if detail else message)


class AcquireCancelled(LeaseholdError):
    """The acquire was cancelled (by the caller or by close()) before it was granted."""


class ClientClosed(LeaseholdError, RuntimeError):
    """The client was closed; it accepts no new calls."""


class LockNotHeld(LeaseholdError, RuntimeError):
    """A handle that was released or lost was used as if it were held."""


class LockLost(LockNotHeld):
    """The lock was lost (renewal rejected, validity elapsed, failure budget spent, ...):
    raised by ``renew()`` on a lost handle, or when the lease is lost while it waits.
    ``reason`` is the handle's ``lost_reason``."""

    def __init__(self, name: str, reason: str | None) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"lock {name!r} was lost ({reason or 'unknown reason'})")


class RenewTimeout(LeaseholdError, TimeoutError):
    """A manual ``renew()`` was not answered within its timeout. The lease is unchanged: the
    core keeps retrying the renewal within the failure budget, and reports a loss as usual."""

    def __init__(self, name: str, timeout: float) -> None:
        self.name = name
        self.timeout = timeout
        super().__init__(f"renewal of lock {name!r} not answered within {timeout:g}s")


class StaleFencingToken(LeaseholdError):
    """The fencing gate refused a token lower than the resource's high-water mark.

    The holder of this token lost the lock (a newer holder already wrote); the protected
    operation was not performed and its transaction was rolled back.
    """

    def __init__(self, resource: str, token: int, high_water_mark: int) -> None:
        self.resource = resource
        self.token = token
        self.high_water_mark = high_water_mark
        super().__init__(
            f"stale fencing token {token} for {resource!r}: a holder with token {high_water_mark} already wrote"
        )
