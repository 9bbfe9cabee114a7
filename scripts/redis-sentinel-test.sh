#!/usr/bin/env bash
# A throw-away Redis Sentinel topology for tests: 1 master, 1 replica, 3 sentinels (quorum 2)
# on free loopback ports, every process stopped by pid.
#
#   redis-sentinel-test.sh start DIR     start it; wait until the sentinels see the replica and
#                                        each other; print the addresses (below)
#   redis-sentinel-test.sh stop DIR      stop every process it started (SIGCONT, TERM, then KILL)
#   redis-sentinel-test.sh pid DIR NODE  print a node's pid (NODE: master, replica, s1, s2, s3:
#                                        the roles they started with)
#   redis-sentinel-test.sh master DIR    print the master's address as the sentinels report it
#
# `start` prints, and writes into DIR/addresses:
#   name leasehold
#   master 127.0.0.1:PORT
#   replica 127.0.0.1:PORT
#   sentinels 127.0.0.1:PORT,127.0.0.1:PORT,127.0.0.1:PORT
# DIR/NODE/{pid,port,log,conf} hold each process's files. Sentinels are tuned for tests
# (down-after-milliseconds 1000, failover-timeout 3000; override with LH_SENTINEL_DOWN_AFTER_MS,
# LH_SENTINEL_FAILOVER_TIMEOUT_MS), so a killed master is replaced within a few seconds.
# Sentinel runs as `redis-server --sentinel` (the redis-server binary; Debian's redis-sentinel
# package only adds a service). A missing redis-server is installed with apt-get as root.
set -euo pipefail
cmd="${1:-}"
dir="${2:-}"
usage() { echo "usage: $0 start|stop|master DIR | pid DIR master|replica|s1|s2|s3" >&2; exit 2; }
[ -n "$cmd" ] && [ -n "$dir" ] || usage
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name=leasehold
down_after="${LH_SENTINEL_DOWN_AFTER_MS:-1000}"
failover_timeout="${LH_SENTINEL_FAILOVER_TIMEOUT_MS:-3000}"

free_ports() {
    python3 -c '
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

cli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}" 2>/dev/null; }

# Polls until the command's output contains the text (15 s at most).
wait_for() {
    local what="$1" port="$2" text="$3"
    shift 3
    for _ in $(seq 150); do
        if cli "$port" "$@" | grep -q -- "$text"; then return 0; fi
        sleep 0.1
    done
    echo "redis-sentinel-test: $what did not happen (port $port: $*)" >&2
    return 1
}

# A zombie counts as dead: the shell that started the node is gone, its adopter reaps it.
alive() {
    local state
    state="$(cut -d')' -f2 "/proc/$1/stat" 2>/dev/null | awk '{print $1}')" || return 1
    [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

start_node() {
    local node="$1" n="$dir/$1"
    shift
    redis-server "$@" >>"$n/log" 2>&1 &
    echo $! > "$n/pid"
}

stop_all() {
    for n in "$dir"/master "$dir"/replica "$dir"/s1 "$dir"/s2 "$dir"/s3; do
        [ -f "$n/pid" ] || continue
        pid="$(cat "$n/pid")"
        kill -CONT "$pid" 2>/dev/null || true
        kill -TERM "$pid" 2>/dev/null || true
    done
    for n in "$dir"/master "$dir"/replica "$dir"/s1 "$dir"/s2 "$dir"/s3; do
        [ -f "$n/pid" ] || continue
        pid="$(cat "$n/pid")"
        for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
}

# One attempt at the whole set on freshly chosen ports. A port chosen free can be taken
# before its server binds it (another test picks ports the same way), so `start` tries again.
start_once() {
    read -r -a ports <<<"$(free_ports 5)"
    mport="${ports[0]}" rport="${ports[1]}"
    for node in master replica s1 s2 s3; do mkdir -p "$dir/$node"; : > "$dir/$node/log"; done
    echo "$mport" > "$dir/master/port"
    echo "$rport" > "$dir/replica/port"
    common=(--bind 127.0.0.1 --protected-mode no --daemonize no --save "" --appendonly no)
    start_node master --port "$mport" --dir "$dir/master" "${common[@]}"
    start_node replica --port "$rport" --dir "$dir/replica" "${common[@]}" --replicaof 127.0.0.1 "$mport"
    sentinels=""
    for i in 1 2 3; do
        s="$dir/s$i" port="${ports[$((i + 1))]}"
        echo "$port" > "$s/port"
        # Sentinel rewrites its config file: it must be its own and writable.
        cat > "$s/conf" <<EOF
port $port
bind 127.0.0.1
protected-mode no
daemonize no
dir $s
sentinel monitor $name 127.0.0.1 $mport 2
sentinel down-after-milliseconds $name $down_after
sentinel failover-timeout $name $failover_timeout
sentinel parallel-syncs $name 1
EOF
        start_node "s$i" "$s/conf" --sentinel
        sentinels="${sentinels:+$sentinels,}127.0.0.1:$port"
    done
    wait_for "master start" "$mport" PONG PING || return 1
    wait_for "replication" "$rport" "master_link_status:up" INFO replication || return 1
    # A failover needs every sentinel to know the replica and the other two (hello messages
    # on the master, every 2 s).
    for i in 1 2 3; do
        port="$(cat "$dir/s$i/port")"
        wait_for "sentinel s$i seeing the replica" "$port" "slaves=1" INFO sentinel || return 1
        wait_for "sentinel s$i seeing the others" "$port" "sentinels=3" INFO sentinel || return 1
    done
    # Each answer came from our own processes only if they are all still running.
    for node in master replica s1 s2 s3; do
        alive "$(cat "$dir/$node/pid")" || { echo "redis-sentinel-test: $node exited" >&2; tail -3 "$dir/$node/log" >&2; return 1; }
    done
    {
        echo "name $name"
        echo "master 127.0.0.1:$mport"
        echo "replica 127.0.0.1:$rport"
        echo "sentinels $sentinels"
    } > "$dir/addresses"
}

case "$cmd" in
start)
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        bash "$here/ensure-redis.sh"
    fi
    command -v redis-cli >/dev/null 2>&1 || { echo "redis-sentinel-test: redis-cli missing (apt-get install redis-tools)" >&2; exit 1; }
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    for attempt in 1 2 3; do
        if start_once; then
            cat "$dir/addresses"
            exit 0
        fi
        stop_all
        for node in master replica s1 s2 s3; do rm -f "$dir/$node/pid"; done
        echo "redis-sentinel-test: attempt $attempt failed; trying other ports" >&2
    done
    exit 1
    ;;
stop)
    stop_all
    ;;
pid)
    case "${3:-}" in master|replica|s1|s2|s3) cat "$dir/$3/pid" ;; *) usage ;; esac
    ;;
master)
    for i in 1 2 3; do
        if addr="$(cli "$(cat "$dir/s$i/port")" SENTINEL get-master-addr-by-name "$name")" && [ -n "$addr" ]; then
            echo "$addr" | paste -sd: -
            exit 0
        fi
    done
    echo "redis-sentinel-test: no sentinel answered" >&2
    exit 1
    ;;
*)
    usage
    ;;
esac
