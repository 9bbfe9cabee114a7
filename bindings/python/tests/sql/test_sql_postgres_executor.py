"""PostgresExecutor / AsyncPostgresExecutor: the core's SQL protocol on a real PostgreSQL
(one cluster per test session, a fresh database per test), and the PostgreSQL fencing gate
(leasehold.fencing, dialect "postgres") on the same server through psycopg."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from leasehold import LockClient, errors
from leasehold.aio import AsyncLockClient
from leasehold.backends.sql_executor import PostgresExecutor
from leasehold.backends.sql_executor_async import AsyncPostgresExecutor
from leasehold.fencing import FencingGate


def _grants(path: Path) -> list[int]:
    return [int(line.split()[0]) for line in path.read_text().splitlines()]


def _max_fence(workdir: Path) -> int:
    return max((f for p in workdir.glob("grants-*") for f in _grants(p)), default=0)


def _wait_for_grant_above(workdir: Path, mark: int, bound: float = 30.0) -> int:
    """The highest fence the loop workers recorded, once one is above ``mark`` (bounded)."""
    end = time.monotonic() + bound
    while (top := _max_fence(workdir)) <= mark and time.monotonic() < end:
        time.sleep(0.05)
    return top


def _line(p, timeout: float = 60.0) -> str:
    """The next stdout line of worker ``p`` (bounded: a hung worker fails the test)."""
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(p.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    assert out and out[0], f"worker said nothing within {timeout}s: {p.stderr.read() if p.poll() is not None else ''}"
    return out[0].strip()


def test_processes_contend_fences_increase_and_the_pg_gate_loses_no_update(pg_url: str, tmp_path: Path, spawn) -> None:
    workers = [spawn("contend", f"pg:{pg_url}", "job", "10", str(tmp_path), f"pg:{pg_url}") for _ in range(3)]
    for w in workers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0 and out.split() == ["DONE"], err
    fences = _grants(tmp_path / "grants")
    assert len(fences) == 30
    assert all(a < b for a, b in zip(fences, fences[1:])), fences
    import psycopg

    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT n FROM lh_counter WHERE id = 1").fetchone() == (30,)
        assert conn.execute("SELECT hwm FROM leasehold_fencing WHERE resource = 'job'").fetchone() == (fences[-1],)
        (last,) = conn.execute("SELECT fence FROM leasehold_fences WHERE name = 'job'").fetchone()
        assert last == fences[-1]


def test_the_pg_gate_rejects_only_lower_tokens_in_one_transaction(pg_url: str) -> None:
    import psycopg

    with psycopg.connect(pg_url) as conn:
        gate = FencingGate(conn, dialect="postgres")
        gate.ensure_schema()
        conn.execute("CREATE TABLE items (v BIGINT)")
        conn.commit()
        with gate.guard("r", 10) as cur:
            cur.execute("INSERT INTO items VALUES (10)")
        with gate.guard("r", 10) as cur:  # equal passes: a retry with the same token
            cur.execute("INSERT INTO items VALUES (11)")
        with pytest.raises(errors.StaleFencingToken):
            with gate.guard("r", 9) as cur:
                cur.execute("INSERT INTO items VALUES (9)")
        with pytest.raises(RuntimeError):  # the protected work fails: all of it rolls back
            with gate.guard("r", 12) as cur:
                cur.execute("INSERT INTO items VALUES (12)")
                raise RuntimeError("boom")
        assert gate.high_water_mark("r") == 10
        assert [v for (v,) in conn.execute("SELECT v FROM items ORDER BY v").fetchall()] == [10, 11]
        conn.commit()
        # A second connection waits on the mark row (FOR UPDATE) while the first holds it.
        with psycopg.connect(pg_url) as other:
            other_gate = FencingGate(other, dialect="postgres")
            entered = threading.Event()
            done: list[int] = []
            with gate.guard("r", 20):

                def second() -> None:
                    entered.set()
                    with other_gate.guard("r", 20):
                        done.append(1)

                t = threading.Thread(target=second)
                t.start()
                entered.wait(5)
                time.sleep(0.2)
                assert done == []  # blocked on the row lock
            t.join(10)
            assert done == [1]


def test_a_paused_holder_is_fenced_out_and_learns_it_lost_the_lock(pg_url: str, spawn) -> None:
    """Kleppmann's case: the holder is SIGSTOP'd past its TTL, another process takes over and
    writes; the resumed holder's write is rejected by the gate and its handle is lost."""
    holder = spawn("hold", f"pg:{pg_url}", "k", "1.5", f"pg:{pg_url}")
    first = int(_line(holder).split()[1])
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        writer = spawn("write", f"pg:{pg_url}", "k", "5", f"pg:{pg_url}")
        said = _line(writer)
        assert said.startswith("WROTE"), said
        second = int(said.split()[1])
        assert second > first
        holder.stdin.write("write\n")
        holder.stdin.flush()
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    assert _line(holder) == f"WRITE-REJECTED {second}"
    assert _line(holder).startswith("LOST")
    holder.stdin.close()
    assert holder.wait(30) == 0
    import psycopg

    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT token FROM lh_writes").fetchall() == [(second,)]


def test_a_waiter_wakes_on_the_release_notification(pg_url: str) -> None:
    with LockClient(PostgresExecutor(pg_url)) as a, LockClient(PostgresExecutor(pg_url)) as b:
        held = a.acquire("n", ttl=30.0)
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(b.acquire("n", ttl=5.0, wait=25.0)))
        t.start()
        time.sleep(0.5)
        released_at = time.monotonic()
        held.release()
        t.join(30)
        # Woken by NOTIFY, not by the holder's expiry 30 s away.
        assert got and time.monotonic() - released_at < 15.0
        assert got[0].fencing_token > held.fencing_token  # type: ignore[attr-defined]
        got[0].release()  # type: ignore[attr-defined]
        # Acquire is idempotent per token and renewals run on the server's clock.
        with a.acquire("m", ttl=1.0) as lock:
            time.sleep(1.5)
            assert lock.is_held() and not lock.lost.is_set()


def test_async_clients_contend_through_the_async_executor(pg_url: str) -> None:
    async def main() -> list[int]:
        fences: list[int] = []
        async with AsyncLockClient(AsyncPostgresExecutor(pg_url)) as a, AsyncLockClient(
            AsyncPostgresExecutor(pg_url)
        ) as b:

            async def worker(c: AsyncLockClient) -> None:
                for _ in range(5):
                    async with await c.acquire("async", ttl=5.0, wait=20.0) as lock:
                        fences.append(lock.fencing_token)
                        await asyncio.sleep(0.01)

            await asyncio.wait_for(asyncio.gather(worker(a), worker(b)), 60)
            assert await a.wait_idle(5) and await b.wait_idle(5)
        return fences

    fences = asyncio.run(main())
    assert len(fences) == 10
    assert all(x < y for x, y in zip(fences, fences[1:])), fences


def test_wrong_password_unreachable_server_and_foreign_table_are_clear_errors(pg_url: str) -> None:
    import socket

    bad = pg_url.replace(":leasehold@", ":wrong@")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cases = [
        (bad, "password authentication failed"),
        (f"postgresql://postgres:x@127.0.0.1:{port}/postgres", "connection failed"),
    ]
    for url, said in cases:
        client = LockClient(PostgresExecutor(url, connect_timeout=2))
        with pytest.raises(errors.BackendUnavailable) as e:
            client.acquire("n", ttl=5.0, wait=0.5)
        assert said in str(e.value), str(e.value)
        client.close(timeout=0.2)
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE leasehold_locks (name text PRIMARY KEY, owner int)")
        client = LockClient(PostgresExecutor(pg_url))
        with pytest.raises(errors.BackendUnavailable) as e:
            client.acquire("n", ttl=5.0, wait=1.0)
        assert "leasehold_locks" in str(e.value), str(e.value)
        client.close(timeout=0.2)
        assert conn.execute("SELECT count(*) FROM leasehold_locks").fetchone() == (0,)


def test_a_server_restart_mid_run_hangs_nothing_and_fences_never_regress(pg_server, pg_url: str, tmp_path: Path, spawn) -> None:
    workers = [spawn("loop", f"pg:{pg_url}", "r", "60", str(tmp_path)) for _ in range(2)]
    before = _wait_for_grant_above(tmp_path, 0)
    assert before > 0, "no grant before the restart"
    pg_server.restart()
    mark = _max_fence(tmp_path)
    after = _wait_for_grant_above(tmp_path, mark)  # acquisitions resume on new connections
    time.sleep(0.5)
    (tmp_path / "stop").touch()
    for w in workers:
        out, err = w.communicate(timeout=60)
        assert w.returncode == 0 and out.startswith("DONE"), err
    every: list[int] = []
    for p in tmp_path.glob("grants-*"):
        fences = _grants(p)
        assert all(a < b for a, b in zip(fences, fences[1:])), fences
        every += fences
    assert len(every) == len(set(every))
    assert after > mark >= before and max(every) >= after, "no grant after the restart"


def test_a_server_process_that_stops_answering_is_a_transport_failure_not_a_hang(pg_url: str) -> None:
    from leasehold import _ffi
    from leasehold._backend import SqlFailure
    from leasehold._core import SqlRequest

    ask_pid = SqlRequest(_ffi.LH_CONNECTION_COMMANDS, [("SELECT pg_backend_pid()", [])])
    ping = SqlRequest(_ffi.LH_CONNECTION_COMMANDS, [("SELECT $1::bigint + 1", [41])])

    def stopped(pid: int):  # the server process behind our connection, SIGSTOP'd
        os.kill(pid, signal.SIGSTOP)
        return lambda: os.kill(pid, signal.SIGCONT)

    # The failure's kind is the contract, not its text. No hang: the 1 s request timeout
    # ends it, far below the bound.
    ex = PostgresExecutor(pg_url, request_timeout=1.0)
    ex.attach()
    [[(pid,)]] = ex.execute(ask_pid)
    resume = stopped(pid)
    try:
        t0 = time.monotonic()
        with pytest.raises(SqlFailure) as e:
            ex.execute(ping)
        assert e.value.kind == _ffi.LH_FAILURE_TRANSPORT, e.value
        assert time.monotonic() - t0 < 30, "the stopped server's request hung"
    finally:
        resume()
    assert ex.execute(ping) == [[(42,)]]  # on a new connection, reported as reopened
    assert ex.take_resets() == [_ffi.LH_CONNECTION_COMMANDS]
    ex.detach()

    async def main() -> None:
        ax = AsyncPostgresExecutor(pg_url, request_timeout=1.0)
        ax.attach()
        [[(apid,)]] = await ax.execute(ask_pid)
        resume = stopped(apid)
        try:
            t0 = time.monotonic()
            with pytest.raises(SqlFailure) as e:
                await ax.execute(ping)
            assert e.value.kind == _ffi.LH_FAILURE_TRANSPORT, e.value
            assert time.monotonic() - t0 < 30, "the stopped server's request hung"
        finally:
            resume()
        assert await ax.execute(ping) == [[(42,)]]
        assert ax.take_resets() == [_ffi.LH_CONNECTION_COMMANDS]
        await ax.detach()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_forked_child_leaves_the_parents_lock_and_connections_alone(pg_url: str) -> None:
    with LockClient(PostgresExecutor(pg_url)) as c, LockClient(PostgresExecutor(pg_url)) as other:
        h = c.acquire("parent", ttl=1.0)
        waiter: list[object] = []
        t = threading.Thread(target=lambda: waiter.append(other.acquire("parent", ttl=2.0, wait=30.0)))
        t.start()  # a waiter LISTENs: both of c's and other's connections are open
        time.sleep(0.3)
        pid = os.fork()
        if pid == 0:  # the child: its own core and connections; the parent's lease is not its own
            code = 1
            try:
                lost = h.lost.is_set()
                child = c.acquire("child", ttl=5.0)
                ok = child.release() == "released"
                code = 0 if (lost and ok) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        time.sleep(1.3)  # past the TTL: the parent kept renewing on its own connection
        assert h.is_held() and not h.lost.is_set()
        assert h.release() == "released"
        t.join(30)
        assert waiter and waiter[0].fencing_token > h.fencing_token  # type: ignore[attr-defined]
        waiter[0].release()  # type: ignore[attr-defined]


def test_a_read_only_database_is_a_clear_error_never_a_grant_and_a_held_lease_is_lost(pg_url: str) -> None:
    """default_transaction_read_only (SQLSTATE 25006): acquire fails with the server's reason
    and writes nothing; a lease held when the database turns read-only cannot renew and is
    lost, its row kept until it expires; writable again, the next fence is higher."""
    import psycopg

    db = pg_url.rsplit("/", 1)[1]
    admin_url = pg_url.rsplit("/", 1)[0] + "/postgres"
    holder = LockClient(PostgresExecutor(pg_url, request_timeout=1.0))
    held = holder.acquire("n", ttl=2.0)

    ro = LockClient(PostgresExecutor(pg_url, request_timeout=1.0, options="-c default_transaction_read_only=on"))
    with pytest.raises(errors.BackendUnavailable) as e:
        ro.acquire("n", ttl=2.0, wait=0.3)
    assert "read-only transaction" in str(e.value), str(e.value)
    assert "read-only transaction" in ro.backend_last_error()
    ro.close(timeout=0.2)
    assert held.is_held()

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {db} SET default_transaction_read_only = on")
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (db,))
        assert held.lost.wait(20), "the lease outlived a database it could not renew in"
        with psycopg.connect(pg_url) as conn:
            token, fence = conn.execute("SELECT token, fence FROM leasehold_locks WHERE name = 'n'").fetchone()
        assert token and fence == held.fencing_token
        admin.execute(f"ALTER DATABASE {db} RESET default_transaction_read_only")
    holder.close(timeout=0.2)

    after = LockClient(PostgresExecutor(pg_url))
    with after.acquire("n", ttl=2.0, wait=10.0) as again:
        assert again.fencing_token > held.fencing_token
    after.close()


def test_asynchronous_commit_shares_locks_with_the_default(pg_url: str) -> None:
    """A client whose operations commit asynchronously and a default one contend for one
    name: the waiter is woken by the release and gets a higher fence, in both directions."""
    fast = LockClient(PostgresExecutor(pg_url, asynchronous_commit=True))
    slow = LockClient(PostgresExecutor(pg_url))
    for first, second in ((fast, slow), (slow, fast)):
        h1 = first.acquire("a", ttl=30.0)
        got: list = []
        t = threading.Thread(target=lambda: got.append(second.acquire("a", ttl=30.0, wait=20.0)))
        t.start()
        time.sleep(0.3)
        h1.release()
        t.join(30)
        assert got and got[0].fencing_token > h1.fencing_token
        got[0].release()
    fast.close()
    slow.close()


def test_one_statement_with_parameters_of_other_types_is_prepared_again_not_misread(pg_url: str) -> None:
    """Statements are prepared per text and parameter types: the same text with an integer,
    a text, a NULL and a blob gets a statement for each (a text bound to the bigint one would
    be refused), and every answer is its own."""
    from leasehold import _ffi
    from leasehold._core import SqlRequest

    def ask(value: object) -> list[list[tuple[object, ...]]]:
        return ex.execute(SqlRequest(_ffi.LH_CONNECTION_COMMANDS, [("SELECT $1::text", [value])]))

    ex = PostgresExecutor(pg_url)
    ex.attach()
    try:
        assert ask(7) == [[("7",)]]
        assert ask("seven") == [[("seven",)]]
        assert ask(8) == [[("8",)]]
        assert ask(None) == [[(None,)]]
        assert ask(b"\x00\x01") == [[("\\x0001",)]]
        assert ask("eight") == [[("eight",)]]
        # A statement of another text on the same connection is unaffected.
        assert ex.execute(SqlRequest(_ffi.LH_CONNECTION_COMMANDS, [("SELECT $1::bigint * 2", [21])])) == [[(42,)]]
    finally:
        ex.detach()


def test_integers_bind_as_bigint_as_given_and_a_host_fact_in_a_later_statement_is_bound(pg_url: str) -> None:
    """A plain integer parameter binds as ``bigint`` whatever its size (the protocol's type,
    with no wrapper per value), and a request whose host fact is only in its second statement
    still has it bound."""
    from leasehold import _ffi
    from leasehold._core import HostFact, SqlRequest

    ex = PostgresExecutor(pg_url)
    ex.attach()
    try:
        for v in (0, 5, -(2**31) - 1, 2**40, 2**63 - 1, -(2**63)):
            assert ex.execute(SqlRequest(_ffi.LH_CONNECTION_COMMANDS, [("SELECT pg_typeof($1)::text, $1", [v])])) == [
                [("bigint", v)]
            ]
        rows = ex.execute(
            SqlRequest(
                _ffi.LH_CONNECTION_COMMANDS,
                [("SELECT $1::bigint + 1", [1]), ("SELECT pg_typeof($1)::text, $1 = $2", [HostFact.PID, os.getpid()])],
            )
        )
        assert rows == [[(2,)], [("bigint", True)]]
    finally:
        ex.detach()


def test_a_requests_host_facts_are_read_once_and_bound_with_the_protocols_types(pg_url: str) -> None:
    """Every host fact of a request is read once, as it starts (the same monotonic time in each
    of its statements), bound as the protocol's types, and read anew for the next request."""
    import socket

    from leasehold import _ffi
    from leasehold._core import HostFact, SqlRequest

    facts = [HostFact.MONOTONIC_NS, HostFact.WALL_US, HostFact.BOOT_ID, HostFact.PID, HostFact.HOST_NAME]
    ex = PostgresExecutor(pg_url)
    ex.attach()
    try:
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        rows = ex.execute(
            SqlRequest(
                _ffi.LH_CONNECTION_COMMANDS,
                [
                    ("SELECT $1::bigint, $2::bigint, $3::text, $4::bigint, $5::text", list(facts)),
                    ("SELECT $1::bigint, $2::text, $3::bigint", [HostFact.MONOTONIC_NS, "x", 5]),
                ],
            )
        )
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        [(mono, wall, boot, pid, host)] = rows[0]
        assert before <= mono <= after
        assert rows[1] == [(mono, "x", 5)]
        assert (pid, host) == (os.getpid(), socket.gethostname())
        assert boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        assert abs(wall - time.time_ns() // 1000) < 60 * 10**6
        [[(again,)]] = ex.execute(SqlRequest(_ffi.LH_CONNECTION_COMMANDS, [("SELECT $1::bigint", [HostFact.MONOTONIC_NS])]))
        assert again > mono
    finally:
        ex.detach()
