#!/usr/bin/env bash
# Runs every check and test, stopping at the first failure:
#   1. `cargo fmt --check` and `cargo clippy --all-targets --locked -- -D warnings`;
#   2. Rust unit and integration tests (real PostgreSQL, real HTTP);
#   3. real clients against one freshly started server using its embedded PostgreSQL:
#      the matrix-nio scripts (tests/clients/nio_*.py), a parse of its metrics page with the
#      Prometheus Python client (tests/clients/metrics_check.py), a mautrix-python echo
#      appservice (tests/clients/appservice_echo.py, registered with MYELIN_APPSERVICES), the
#      admin API in the shapes synapse-admin and Ketesa expect (tests/clients/admin_check.py,
#      as an admin made with `myelin user create --admin`), then the matrix-js-sdk scripts
#      (tests/clients/js/*.mjs, Node.js as package.json's engines field says), then matrix-sdk
#      with matrix-sdk-ui (tests/clients/rust-sdk, its own Cargo project and target dir);
#   4. federation interop (tests/federation/run_interop.sh): two more Myelins and a Synapse
#      from PyPI, each with a TLS federation listener and a test CA made for the run: the
#      interop driver both ways and matrix-js-sdk Olm sessions across servers, and the same
#      Synapse, given the same echo registration, runs appservice_echo.py and admin_check.py
#      (the shapes those scripts assert are Synapse's, not only ours);
#   5. a `myelin-bench --scale smoke` run against the first server.
#
# PostgreSQL: TEST_DATABASE_URL when set, otherwise the test harness starts a throwaway
# cluster with the machine's PostgreSQL binaries (`initdb`, `pg_ctl`).
# The Python venv (MYELIN_TEST_VENV) and tests/clients/js/node_modules are reused between runs
# while the pins they were installed from are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/myelin-target}"
VENV="${MYELIN_TEST_VENV:-/var/tmp/myelin-venv}"

# Fail now, not after the Rust tests, on a Node.js too old for matrix-js-sdk.
node_needed=$(sed -nE 's/.*"node": *">=([0-9]+).*/\1/p' tests/clients/js/package.json)
node_major=$(node --version 2>/dev/null | sed -nE 's/^v([0-9]+).*/\1/p')
if [ "${node_major:-0}" -lt "$node_needed" ]; then
    echo "tests/run.sh: tests/clients/js needs Node.js >= $node_needed, found" \
        "$(node --version 2>/dev/null || echo none) (.ci/run installs one)" >&2
    exit 1
fi

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --all-targets --locked -- -D warnings

# Twice: with a server name that carries a port (IDs like @a:localhost:8448, where splitting
# an ID on its last colon goes wrong) and with a plain one.
cargo build --locked --bins
for name in localhost:8448 localhost; do
    echo "== cargo test (server name $name)"
    MYELIN_TEST_SERVER_NAME="$name" cargo test --locked
done

# A stamp beside what was installed records the hash of the pins it came from.
pins_hash() { cat "$@" | sha256sum | cut -d' ' -f1; }

echo "== matrix-nio"
nio_pins=$(pins_hash tests/clients/requirements.txt)
if [ "$(cat "$VENV/.myelin-pins" 2>/dev/null)" != "$nio_pins" ] \
    || ! "$VENV/bin/python" -c "import nio, mautrix" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r tests/clients/requirements.txt
    echo "$nio_pins" >"$VENV/.myelin-pins"
fi

workdir="$(mktemp -d /tmp/myelin-clients.XXXXXX)"
chmod 755 "$workdir"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
metrics_port=$(free_port)
# The echo appservice's registration, with fresh tokens (tests/clients/appservice_echo.py).
# Its namespace names no server (regexes match from the start of the ID, in Synapse as here),
# so the Synapse of the federation run takes the same registration (run_interop.sh; only its
# url moves to a port of its own, out of reach of this server's retried transactions).
as_port=$(free_port)
as_token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
hs_token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
cat >"$workdir/echo-registration.yaml" <<EOF
id: echo
url: http://127.0.0.1:$as_port
as_token: $as_token
hs_token: $hs_token
sender_localpart: echobot
rate_limited: false
receive_ephemeral: true
de.sorunome.msc2409.push_ephemeral: true
namespaces:
  users:
    - exclusive: true
      regex: '@echo_.*'
EOF
# myelin-bench's big room (scenario 12) registers its members through an application service
# of its own, with no URL (nothing is pushed to it).
bench_as_token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
bash tests/bench/bench-registration.sh "$bench_as_token" >"$workdir/bench-registration.yaml"
MYELIN_DATA_DIR="$workdir/data" MYELIN_LISTEN="127.0.0.1:$port" MYELIN_REGISTRATION=open \
    MYELIN_METRICS_LISTEN="127.0.0.1:$metrics_port" \
    MYELIN_SERVER_NAME=localhost:8448 MYELIN_RATE_LIMITS=off MYELIN_MAX_EVENT_DELAY_MS=86400000 \
    MYELIN_APPSERVICES="$workdir/echo-registration.yaml,$workdir/bench-registration.yaml" \
    RUST_LOG=warn "$CARGO_TARGET_DIR/debug/myelin" serve >"$workdir/server.log" 2>&1 &
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
# The metrics page after those clients, through the Prometheus client's OpenMetrics parser.
"$VENV/bin/python" tests/clients/metrics_check.py "http://127.0.0.1:$metrics_port/metrics" \
    || { cat "$workdir/server.log"; exit 1; }

echo "== mautrix-python echo appservice"
AS_TOKEN="$as_token" HS_TOKEN="$hs_token" HS_NAME=localhost:8448 AS_PORT="$as_port" \
    "$VENV/bin/python" tests/clients/appservice_echo.py "http://127.0.0.1:$port" \
    || { cat "$workdir/server.log"; exit 1; }

echo "== admin API shapes (synapse-admin, Ketesa)"
MYELIN_DATA_DIR="$workdir/data" MYELIN_SERVER_NAME=localhost:8448 \
    "$CARGO_TARGET_DIR/debug/myelin" user create shapes_admin --admin --password admin-pw-1 \
    || { cat "$workdir/server.log"; exit 1; }
ADMIN_USER=shapes_admin ADMIN_PASSWORD=admin-pw-1 \
    "$VENV/bin/python" tests/clients/admin_check.py "http://127.0.0.1:$port" \
    || { cat "$workdir/server.log"; exit 1; }

echo "== matrix-js-sdk"
# The Node.js major version is part of the stamp: installed packages may depend on it.
js_pins="$(pins_hash tests/clients/js/package-lock.json) node$node_major"
if [ "$(cat tests/clients/js/node_modules/.myelin-pins 2>/dev/null)" != "$js_pins" ]; then
    (cd tests/clients/js && npm ci --silent --no-audit --no-fund)
    echo "$js_pins" >tests/clients/js/node_modules/.myelin-pins
fi
for script in tests/clients/js/*.mjs; do
    [ "$(basename "$script")" = harness.mjs ] && continue
    node "$script" "http://127.0.0.1:$port" || { cat "$workdir/server.log"; exit 1; }
done

echo "== matrix-rust-sdk (SyncService, RoomListService, Timeline over sliding sync)"
# Its own Cargo project and target dir (kept between runs): the SDK never slows the server's build.
(cd tests/clients/rust-sdk && CARGO_TARGET_DIR=/var/tmp/myelin-sdk-target cargo build --locked --quiet)
/var/tmp/myelin-sdk-target/debug/myelin-sdk-client "http://127.0.0.1:$port" || { cat "$workdir/server.log"; exit 1; }

echo "== federation: two Myelins and a Synapse on loopback"
# With the echo registration and this venv, its Synapse runs the echo appservice and the
# admin check too.
ECHO_REGISTRATION="$workdir/echo-registration.yaml" AS_TOKEN="$as_token" HS_TOKEN="$hs_token" \
    MYELIN_TEST_VENV="$VENV" bash tests/federation/run_interop.sh "$CARGO_TARGET_DIR/debug/myelin" || { cat "$workdir/server.log"; exit 1; }

echo "== myelin-bench (smoke)"
"$CARGO_TARGET_DIR/debug/myelin-bench" --url "http://127.0.0.1:$port" --scale smoke \
    --server-name localhost:8448 --pid "$server" --label "myelin (debug, smoke)" \
    --appservice-token "$bench_as_token" \
    --out "$workdir/bench.json" --plot "$workdir/bench.svg" || { cat "$workdir/server.log"; exit 1; }
