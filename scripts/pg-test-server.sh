#!/usr/bin/env bash
# A throw-away PostgreSQL cluster for tests, on a free loopback port, stopped by its pid.
#
#   pg-test-server.sh start DIR [PORT]   initdb in DIR (once), start, print the URL
#   pg-test-server.sh stop DIR           stop the server whose pid DIR/data/postmaster.pid holds
#
# Starting again on an existing DIR keeps the data and the port (a restart). The superuser is
# `postgres` with password `leasehold`; password authentication (scram) is required on TCP.
# PostgreSQL refuses to run as root: as root the cluster runs as the `postgres` user.
# Tests run without WAL flushes (fsync=off, synchronous_commit=off) for speed; with
# PG_TEST_DURABLE=1 the cluster keeps PostgreSQL's defaults (every commit waits for its WAL
# flush), as a production server does: what the benchmarks measure.
set -euo pipefail
cmd="${1:-}"
dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2; }

bindir="$(dirname "$(command -v initdb 2>/dev/null || true)")"
if [ ! -x "$bindir/initdb" ]; then
    bindir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
fi
[ -x "$bindir/initdb" ] || { echo "pg-test-server: no initdb (run scripts/ensure-postgres.sh)" >&2; exit 1; }
# The server binary next to initdb (Debian's /usr/local/bin links point into one version).
bindir="$(dirname "$(readlink -f "$bindir/initdb")")"

as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$cmd" in
start)
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        printf 'leasehold\n' > "$dir/pw"
        [ "$(id -u)" = 0 ] && chown postgres "$dir/pw"
        as_pg "$bindir/initdb" -D "$dir/data" -U postgres --pwfile="$dir/pw" \
            --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
            || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    port="${3:-}"
    [ -z "$port" ] && [ -f "$dir/port" ] && port="$(cat "$dir/port")"
    # A port chosen here can be taken before the server binds it (another test picks ports
    # the same way): then another is chosen. A given or kept port is tried once.
    tries=1
    [ -z "$port" ] && tries=3
    durability="-c fsync=off -c full_page_writes=off -c synchronous_commit=off"
    [ "${PG_TEST_DURABLE:-0}" = 1 ] && durability=""
    for attempt in $(seq "$tries"); do
        if [ "$tries" -gt 1 ]; then
            port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
        fi
        echo "$port" > "$dir/port"
        if as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 start \
            -o "-p $port -k $dir -c listen_addresses=127.0.0.1 $durability" >/dev/null; then
            echo "postgresql://postgres:leasehold@127.0.0.1:$port/postgres"
            exit 0
        fi
        cat "$dir/server.log" >&2
        echo "pg-test-server: start on port $port failed (attempt $attempt of $tries)" >&2
    done
    exit 1
    ;;
stop)
    pidfile="$dir/data/postmaster.pid"
    [ -f "$pidfile" ] || exit 0
    pid="$(head -1 "$pidfile")"
    kill -INT "$pid" 2>/dev/null || exit 0
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || exit 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    ;;
*)
    echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2 ;;
esac
