#!/usr/bin/env bash
# Runs every test: Rust unit and integration tests (real PostgreSQL, real HTTP), then real
# clients (matrix-nio) against a freshly started server using its embedded PostgreSQL.
#
# PostgreSQL: TEST_DATABASE_URL when set, otherwise the test harness starts a throwaway
# cluster with the machine's PostgreSQL binaries (`initdb`, `pg_ctl`).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/myelin-target}"
VENV="${MYELIN_TEST_VENV:-/var/tmp/myelin-venv}"

# Twice: with a server name that carries a port (IDs like @a:localhost:8448, where splitting
# an ID on its last colon goes wrong) and with a plain one.
cargo build --locked --bins
for name in localhost:8448 localhost; do
    echo "== cargo test (server name $name)"
    MYELIN_TEST_SERVER_NAME="$name" cargo test --locked
done

echo "== matrix-nio"
if ! "$VENV/bin/python" -c "import nio" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r tests/clients/requirements.txt
fi

workdir="$(mktemp -d /tmp/myelin-clients.XXXXXX)"
chmod 755 "$workdir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
MYELIN_DATA_DIR="$workdir/data" MYELIN_LISTEN="127.0.0.1:$port" MYELIN_REGISTRATION=open \
    MYELIN_SERVER_NAME=localhost:8448 MYELIN_RATE_LIMITS=off RUST_LOG=warn "$CARGO_TARGET_DIR/debug/myelin" serve >"$workdir/server.log" 2>&1 &
server=$!
stop_server() {
    kill -TERM "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    rm -rf "$workdir"
}
trap stop_server EXIT

for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/_matrix/client/versions" >/dev/null && break
    if ! kill -0 "$server" 2>/dev/null; then cat "$workdir/server.log"; exit 1; fi
    sleep 0.2
done
for script in tests/clients/nio_*.py; do
    "$VENV/bin/python" "$script" "http://127.0.0.1:$port" || { cat "$workdir/server.log"; exit 1; }
done

echo "== matrix-js-sdk"
[ -d tests/clients/js/node_modules ] || (cd tests/clients/js && npm ci --silent --no-audit --no-fund)
for script in tests/clients/js/*.mjs; do
    [ "$(basename "$script")" = harness.mjs ] && continue
    node "$script" "http://127.0.0.1:$port" || { cat "$workdir/server.log"; exit 1; }
done

echo "== myelin-bench (smoke)"
"$CARGO_TARGET_DIR/debug/myelin-bench" --url "http://127.0.0.1:$port" --scale smoke \
    --server-name localhost:8448 --pid "$server" --label "myelin (debug, smoke)" \
    --out "$workdir/bench.json" --plot "$workdir/bench.svg" || { cat "$workdir/server.log"; exit 1; }
