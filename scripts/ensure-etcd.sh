#!/usr/bin/env bash
# Makes sure etcd (v3.4 or later, with its JSON gateway) exists: apt-get install etcd-server as
# root. Tests start and stop their own clusters (scripts/etcd-test-cluster.sh).
set -euo pipefail
command -v etcd >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null
    # Debian starts a system member on 2379/2380; our tests use their own ports, so stop it.
    (service etcd stop || systemctl stop etcd || true) >/dev/null 2>&1
    command -v etcd >/dev/null 2>&1
else
    echo "ensure-etcd: etcd missing; install it (apt-get install etcd-server)" >&2
    exit 1
fi
