"""The request model of the SQL and etcd executors, without a server: requests come out of
the core copied and typed, and a result the core cannot take is reported as a failure of
its request, never an exception in the client and never a grant."""

from __future__ import annotations

from pathlib import Path

import pytest

from leasehold import _ffi
from leasehold._backend import COMMANDS, SqlFailure, bind_params, host_facts, lane_of
from leasehold._core import Config, Core, EtcdOptions, HostFact, HttpRequest, SqlOptions, SqlRequest
from leasehold.backends.sql_executor import SqliteExecutor


def _failed(core: Core, lease: int) -> bool:
    """The lease's events so far end in ACQUIRE_FAILED, and none is ACQUIRED."""
    outs, _ = core.drain()
    kinds = [o.kind for o in outs if o.lease_id == lease]
    return _ffi.LH_EVENT_ACQUIRED not in kinds and kinds[-1:] == [_ffi.LH_EVENT_ACQUIRE_FAILED]


def test_sql_requests_are_copied_out_typed_and_bad_rows_are_a_failure() -> None:
    core = Core(Config(), backend=SqlOptions("postgresql"))
    lease = core.acquire("n", 5_000)
    reqs = core.poll_io()
    assert len(reqs) == 1
    rid, kind, connection, req = reqs[0]
    assert (kind, connection) == (_ffi.LH_IO_SQL, _ffi.LH_CONNECTION_COMMANDS) and lane_of(reqs[0]) == COMMANDS
    assert isinstance(req, SqlRequest) and req.connection == _ffi.LH_CONNECTION_COMMANDS
    assert req.statements and all(isinstance(sql, str) and isinstance(p, list) for sql, p in req.statements)
    # Rows the core cannot take (an integer beyond 64 bits): the request fails, nothing raises.
    core.sql_result(rid, [[[2**70]] for _ in req.statements])
    assert "malformed rows: an integer column outside 64 bits: 1180591620717411303424" in core.backend_last_error()
    core.sql_result(rid, [])  # an answer for an id already answered: ignored
    assert _failed(core, lease)  # one attempt (wait 0), no grant
    with pytest.raises(ValueError):
        SqlOptions("oracle").to_c()
    core.close()


@pytest.mark.parametrize("slice_path", [True, False])
def test_an_sql_request_is_copied_out_whole_through_either_read_of_borrowed_memory(
    slice_path: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """decode_request copies the borrowed buffers by slicing an array over the address space,
    or with ``string_at`` where a span lies past it: both give every statement and typed
    parameter."""
    import ctypes

    from leasehold import _values

    if not slice_path:
        monkeypatch.setattr(_values, "_MEM_END", -1)
    first, second = "SELECT $1, $2, $3", "SELECT $1, $2, $3"
    data = first.encode() + "nämé".encode() + b"\x00\xffblob" + second.encode()
    v, st = _values._VALUE, _values._STATEMENT
    n1, blob = len("nämé".encode()), len(first.encode()) + len("nämé".encode())
    params = b"".join(
        [
            v.pack(_ffi.LH_VALUE_TEXT, 0, 0, len(first.encode()), n1),
            v.pack(_ffi.LH_VALUE_INT, 0, -(2**63), 0, 0),
            v.pack(_ffi.LH_VALUE_BULK, 0, 0, blob, 6),
            v.pack(_ffi.LH_PARAM_HOST_PID, 0, 0, 0, 0),
            v.pack(_ffi.LH_VALUE_NIL, 0, 0, 0, 0),
            v.pack(_ffi.LH_PARAM_HOST_NAME, 0, 0, 0, 0),
        ]
    )
    stmts = st.pack(0, len(first), 0, 3) + st.pack(blob + 6, len(second), 3, 3)
    keep = [ctypes.create_string_buffer(b, len(b)) for b in (data, params, stmts)]
    req = _ffi.lh_io_request()
    a = [ctypes.addressof(b) for b in keep]
    raw = _values.REQUEST_LAYOUT.pack(9, _ffi.LH_IO_SQL, 1, 0, 0, 2, a[2], a[1], 6, a[0], len(data), *[0] * 8, 0, 0)
    ctypes.memmove(ctypes.addressof(req), raw, len(raw))
    got = _values.decode_request(req)
    assert got is not None and got.id == 9 and got.kind == _ffi.LH_IO_SQL and got.connection == 1
    assert got.payload == SqlRequest(
        1, [(first, ["nämé", -(2**63), b"\x00\xffblob"]), (second, [HostFact.PID, None, HostFact.HOST_NAME])]
    )
    assert type(got.payload) is SqlRequest and type(got.payload.statements[1][1][0]) is HostFact


def test_host_facts_are_bound_once_per_request() -> None:
    facts = host_facts()
    params = bind_params([HostFact.MONOTONIC_NS, "x", HostFact.PID, None, HostFact.MONOTONIC_NS], facts)
    assert params[0] == params[4] == facts[HostFact.MONOTONIC_NS] and params[1:4] == ["x", facts[HostFact.PID], None]
    assert len(facts[HostFact.BOOT_ID]) >= 32 and facts[HostFact.WALL_US] > 1_600_000_000 * 10**6


def test_http_requests_are_copied_out_and_an_impossible_status_is_a_failure() -> None:
    core = Core(Config(), backend=EtcdOptions())
    lease = core.acquire("n", 5_000)
    [io] = core.poll_io()
    rid, req = io.id, io.payload
    assert lane_of(io) == COMMANDS and isinstance(req, HttpRequest) and req.kind == io.kind == _ffi.LH_IO_HTTP
    assert req.method == "POST" and req.path.startswith("/v3/") and req.authorization == ""
    core.http_reply(rid, 999, b"{}")  # refused by the ABI: reported as the request's failure
    assert "/v3/lease/grant" in core.backend_last_error() and "999" in core.backend_last_error()
    assert _failed(core, lease)
    core.close()


def test_a_database_error_rolls_back_and_is_reported_as_such(tmp_path: Path) -> None:
    ex = SqliteExecutor(tmp_path / "x.db")
    ex.attach()
    ok = SqlRequest(1, [("CREATE TABLE t (v INTEGER)", []), ("SELECT ?1 + ?2", [1, 2])])
    assert ex.execute(ok) == [[], [(3,)]]
    bad = SqlRequest(1, [("BEGIN IMMEDIATE", []), ("INSERT INTO t VALUES (?1)", [7]), ("INSERT INTO nowhere VALUES (1)", [])])
    with pytest.raises(SqlFailure) as e:
        ex.execute(bad)
    assert e.value.kind == _ffi.LH_FAILURE_DATABASE and "nowhere" in str(e.value)
    assert ex.execute(SqlRequest(1, [("SELECT count(*) FROM t", [])])) == [[(0,)]]  # rolled back
    assert ex.take_resets() == []
    ex.detach()


def test_flattened_rows_take_every_64_bit_integer_and_refuse_one_beyond() -> None:
    """flatten_rows packs both ends of the 64-bit range (booleans as 0/1) and raises
    ValueError, naming the value, for an integer column past either end."""
    from leasehold._values import flatten_rows

    values, n, data = flatten_rows([[(True, 2**63 - 1, -(2**63), None)], []])
    assert (n, data) == (8, b"")
    for bad in (2**63, -(2**63) - 1, 2**70):
        with pytest.raises(ValueError, match=str(bad)):
            flatten_rows([[(1, bad)]])
