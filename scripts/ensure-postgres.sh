#!/usr/bin/env bash
# Makes sure the PostgreSQL server binaries exist (apt-get as root). Tests start and stop their
# own throw-away clusters with scripts/pg-test-server.sh.
set -euo pipefail
have() {
    command -v initdb >/dev/null 2>&1 && return 0
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
have && exit 0
if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
    # Debian starts a system cluster on 5432; our tests use their own, so stop it.
    (service postgresql stop || true) >/dev/null 2>&1
else
    echo "ensure-postgres: PostgreSQL missing; install it (apt-get install postgresql)" >&2
    exit 1
fi
