#!/usr/bin/env bash
# A throw-away etcd cluster for tests, on free loopback ports, its members stopped by pid.
#
#   etcd-test-cluster.sh start DIR [N]     start N members (default 3); print the client URLs
#   etcd-test-cluster.sh stop DIR          stop every member (SIGCONT first, then TERM, KILL)
#   etcd-test-cluster.sh kill DIR I        SIGKILL member I (1-based)
#   etcd-test-cluster.sh restart DIR I     start member I again on its data and ports
#   etcd-test-cluster.sh pid DIR I         print member I's pid
#
# DIR/endpoints holds the client URLs, comma-separated; DIR/mI/{pid,url,log,data} each member's.
# Elections are tuned for tests (heartbeat 50 ms, election timeout 500 ms), so a new leader is
# elected within about a second of a leader's death.
set -euo pipefail
cmd="${1:-}"
dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop|kill|restart|pid DIR [N|I]" >&2; exit 2; }
command -v etcd >/dev/null 2>&1 || { echo "etcd-test-cluster: no etcd (run scripts/ensure-etcd.sh)" >&2; exit 1; }

free_ports() {
    python3 -c '
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

run_member() {
    local i="$1" m="$dir/m$1"
    # shellcheck disable=SC2046
    etcd $(cat "$m/args") >>"$m/log" 2>&1 &
    echo $! > "$m/pid"
}

wait_ready() {
    local url="$1"
    for _ in $(seq 150); do
        if python3 -c '
import sys, urllib.request
urllib.request.urlopen(urllib.request.Request(sys.argv[1] + "/v3/kv/range", data=b"{\"key\":\"AA==\"}"), timeout=1).read()' "$url" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

stop_all() {
    for m in "$dir"/m*/; do
        [ -f "$m/pid" ] || continue
        pid="$(cat "$m/pid")"
        kill -CONT "$pid" 2>/dev/null || true
        kill -TERM "$pid" 2>/dev/null || true
    done
    for m in "$dir"/m*/; do
        [ -f "$m/pid" ] || continue
        pid="$(cat "$m/pid")"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
}

# One attempt at N members on freshly chosen ports. A port chosen free can be taken before
# its member binds it (another test picks ports the same way), so `start` tries again.
start_once() {
    local n="$1"
    read -r -a ports <<<"$(free_ports $((2 * n)))"
    cluster="" urls=""
    for i in $(seq "$n"); do
        peer="http://127.0.0.1:${ports[$((2 * i - 1))]}"
        cluster="${cluster:+$cluster,}m$i=$peer"
    done
    for i in $(seq "$n"); do
        m="$dir/m$i"
        mkdir -p "$m"
        client="http://127.0.0.1:${ports[$((2 * i - 2))]}"
        peer="http://127.0.0.1:${ports[$((2 * i - 1))]}"
        echo "$client" > "$m/url"
        urls="${urls:+$urls,}$client"
        echo "--name m$i --data-dir $m/data --listen-client-urls $client --advertise-client-urls $client --listen-peer-urls $peer --initial-advertise-peer-urls $peer --initial-cluster $cluster --initial-cluster-state new --initial-cluster-token lh-$$ --heartbeat-interval 50 --election-timeout 500 --log-level warn" > "$m/args"
        run_member "$i"
    done
    echo "$urls" > "$dir/endpoints"
    for i in $(seq "$n"); do
        wait_ready "$(cat "$dir/m$i/url")" || { echo "etcd-test-cluster: member $i did not start" >&2; tail -20 "$dir/m$i/log" >&2; return 1; }
    done
}

case "$cmd" in
start)
    mkdir -p "$dir"
    for attempt in 1 2 3; do
        if start_once "${3:-3}"; then
            cat "$dir/endpoints"
            exit 0
        fi
        stop_all
        rm -rf "$dir"/m*/
        echo "etcd-test-cluster: attempt $attempt failed; trying other ports" >&2
    done
    exit 1
    ;;
stop)
    stop_all
    ;;
kill)
    pid="$(cat "$dir/m$3/pid")"
    kill -CONT "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.1; done
    ;;
restart)
    run_member "$3"
    ;;
pid)
    cat "$dir/m$3/pid"
    ;;
*)
    echo "usage: $0 start|stop|kill|restart|pid DIR [N|I]" >&2
    exit 2
    ;;
esac
