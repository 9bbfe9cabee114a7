#!/usr/bin/env bash
# Makes sure redis-server exists (apt-get as root). Tests start and stop their own servers.
set -euo pipefail
command -v redis-server >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
    # Debian starts a system instance on 6379; our tests use their own ports, so stop it.
    (service redis-server stop || true) >/dev/null 2>&1
else
    echo "ensure-redis: redis-server missing; install it (apt-get install redis-server)" >&2
    exit 1
fi
