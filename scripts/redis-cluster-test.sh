#!/usr/bin/env bash
# A throw-away Redis Cluster for tests: 3 masters and 3 replicas (cluster-enabled yes) on free
# loopback ports, every process stopped by pid.
#
#   redis-cluster-test.sh start DIR      start it; create the cluster; wait until every node
#                                        reports cluster_state:ok; print the addresses (below)
#   redis-cluster-test.sh stop DIR       stop every process it started (SIGCONT, TERM, then KILL)
#   redis-cluster-test.sh pid DIR PORT   print the pid of the node on PORT
#
# `start` prints, and writes into DIR/addresses:
#   nodes 127.0.0.1:PORT,127.0.0.1:PORT,... (all six)
# DIR/PORT/{pid,log,nodes.conf} hold each node's files. cluster-node-timeout is 2000 ms
# (override with LH_CLUSTER_NODE_TIMEOUT_MS), so a killed master's replica takes over within a
# few seconds. With LH_CLUSTER_TLS=CERTDIR (holding ca.crt, server.crt, server.key) every node
# serves TLS only, its cluster bus and replication included (clients need no certificate).
# A missing redis-server or redis-cli is installed with apt-get as root.
set -euo pipefail
cmd="${1:-}"
dir="${2:-}"
usage() { echo "usage: $0 start|stop DIR | pid DIR PORT" >&2; exit 2; }
[ -n "$cmd" ] && [ -n "$dir" ] || usage
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
node_timeout="${LH_CLUSTER_NODE_TIMEOUT_MS:-2000}"

free_ports() {
    python3 -c '
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

tls_dir="${LH_CLUSTER_TLS:-}"
tls_cli=()
if [ -n "$tls_dir" ]; then
    tls_dir="$(cd "$tls_dir" && pwd)"
    tls_cli=(--tls --cacert "$tls_dir/ca.crt")
fi

cli() { redis-cli "${tls_cli[@]}" -h 127.0.0.1 -p "$1" "${@:2}" 2>/dev/null; }

# A zombie counts as dead: the shell that started the node is gone, its adopter reaps it.
alive() {
    local state
    state="$(cut -d')' -f2 "/proc/$1/stat" 2>/dev/null | awk '{print $1}')" || return 1
    [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# A client port whose cluster bus port (+10000) is free too.
pick_port() {
    local p
    while :; do
        for p in $(free_ports 4); do
            [ "$p" -lt 55535 ] || continue
            [ -e "$dir/$p" ] && continue
            python3 -c 'import socket,sys; s=socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1])))' "$((p + 10000))" 2>/dev/null || continue
            echo "$p"
            return
        done
    done
}

# Start a node on $1 and wait until it answers PING; stop it and fail if it does not.
start_node() {
    local port="$1" n="$dir/$1" pid
    mkdir -p "$n"
    : > "$n/log"
    local listen=(--port "$port")
    if [ -n "$tls_dir" ]; then
        listen=(--port 0 --tls-port "$port" --tls-cluster yes --tls-replication yes
            --tls-cert-file "$tls_dir/server.crt" --tls-key-file "$tls_dir/server.key"
            --tls-ca-cert-file "$tls_dir/ca.crt" --tls-auth-clients no)
    fi
    redis-server "${listen[@]}" --bind 127.0.0.1 --protected-mode no --daemonize no \
        --dir "$n" --save "" --appendonly no --cluster-enabled yes \
        --cluster-config-file "$n/nodes.conf" --cluster-node-timeout "$node_timeout" \
        >>"$n/log" 2>&1 &
    pid=$!
    echo "$pid" > "$n/pid"
    # Our own process must have bound the port: another server may answer PING on it.
    for _ in $(seq 200); do
        alive "$pid" || break
        if grep -q "Ready to accept connections" "$n/log" && cli "$port" PING | grep -q PONG; then
            return 0
        fi
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    echo "redis-cluster-test: node on $port did not come up:" >&2
    tail -3 "$n/log" >&2 || true
    rm -f "$n/pid"
    mv "$n" "$n.failed"
    return 1
}

case "$cmd" in
start)
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        bash "$here/ensure-redis.sh"
    fi
    command -v redis-cli >/dev/null 2>&1 || { echo "redis-cluster-test: redis-cli missing (apt-get install redis-tools)" >&2; exit 1; }
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    # A port chosen free can be taken before the node binds it (another test picks ports the
    # same way): a node that dies or never answers PING is started again on another port.
    addrs=()
    ports=()
    while [ "${#ports[@]}" -lt 6 ]; do
        port="$(pick_port)"
        if start_node "$port"; then
            ports+=("$port")
            addrs+=("127.0.0.1:$port")
            continue
        fi
        attempts=$(( ${attempts:-0} + 1 ))
        [ "$attempts" -lt 5 ] || exit 1
    done
    redis-cli "${tls_cli[@]}" --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 || {
        cat "$dir/create.log" >&2
        exit 1
    }
    for port in "${ports[@]}"; do
        ok=""
        for _ in $(seq 300); do
            if cli "$port" CLUSTER INFO | grep -q "cluster_state:ok"; then ok=1; break; fi
            sleep 0.1
        done
        [ -n "$ok" ] || { echo "redis-cluster-test: node $port never reported cluster_state:ok" >&2; exit 1; }
    done
    # Every replica has synced, so a master killed now leaves a replica that can take over.
    for port in "${ports[@]}"; do
        if cli "$port" ROLE | head -1 | grep -q slave; then
            for _ in $(seq 150); do
                cli "$port" INFO replication | grep -q "master_link_status:up" && break
                sleep 0.1
            done
        fi
    done
    (IFS=,; echo "nodes ${addrs[*]}") > "$dir/addresses"
    cat "$dir/addresses"
    ;;
stop)
    for n in "$dir"/*/pid; do
        [ -f "$n" ] || continue
        pid="$(cat "$n")"
        kill -CONT "$pid" 2>/dev/null || true
        kill -TERM "$pid" 2>/dev/null || true
    done
    for n in "$dir"/*/pid; do
        [ -f "$n" ] || continue
        pid="$(cat "$n")"
        for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    ;;
pid)
    [ -n "${3:-}" ] && [ -f "$dir/$3/pid" ] || usage
    cat "$dir/$3/pid"
    ;;
*)
    usage
    ;;
esac
