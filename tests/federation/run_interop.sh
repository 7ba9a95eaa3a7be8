#!/usr/bin/env bash
# Federation interop as CI runs it: two Myelins and one Synapse (from PyPI) on loopback, each
# with its own TLS federation listener and a certificate from a CA made for this run, and
# tests/federation/interop.py between Myelin and Myelin, then Myelin and Synapse (queries, keys,
# to-device, and rooms of v11 and v12 created on either side: joins and messages both ways);
# a check that Synapse's log has no complaint about our events; then matrix-js-sdk's Rust
# crypto starting Olm sessions across servers (olm.mjs) and exchanging encrypted messages in a
# room shared across servers, created on either side (encrypted_room.mjs).
#
#   tests/federation/run_interop.sh PATH/TO/myelin
#
# Each Myelin runs its own embedded PostgreSQL under a temporary data directory; the Synapse
# needs PostgreSQL on 127.0.0.1:5432 (tests/federation/synapse.sh). The js-sdk check needs
# tests/clients/js/node_modules (tests/run.sh installs it). Logs are printed on failure.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
myelin="${1:?usage: run_interop.sh PATH/TO/myelin}"
VENV="${MYELIN_SYNAPSE_VENV:-/var/tmp/myelin-synapse-venv}"
started_at=$SECONDS

work="$(mktemp -d /tmp/myelin-interop.XXXXXX)"
chmod 755 "$work"
pids=()
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    "$here/synapse.sh" stop "$work/synapse" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

show_logs() {
    for log in "$work"/*.log "$work/synapse/homeserver.log"; do
        [ -f "$log" ] || continue
        echo "---- last lines of $log"
        tail -n 40 "$log"
    done
}

# start_myelin NAME: starts a Myelin named localhost:FED_PORT; sets NAME_url and NAME_name.
start_myelin() {
    local name=$1 fed client pid
    fed=$(free_port)
    client=$(free_port)
    MYELIN_DATA_DIR="$work/$name" MYELIN_LISTEN="127.0.0.1:$client" \
        MYELIN_SERVER_NAME="localhost:$fed" MYELIN_FEDERATION_LISTEN="127.0.0.1:$fed" \
        MYELIN_TLS_CERT="$work/tls/cert.pem" MYELIN_TLS_KEY="$work/tls/key.pem" \
        MYELIN_FEDERATION_CA_FILE="$work/tls/ca.pem" MYELIN_OUTBOUND_ALLOW="127.0.0.1/32 ::1/128" \
        MYELIN_REGISTRATION=open MYELIN_RATE_LIMITS=off RUST_LOG=warn \
        "$myelin" serve >"$work/$name.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    printf -v "${name}_url" 'http://127.0.0.1:%s' "$client"
    printf -v "${name}_name" 'localhost:%s' "$fed"
    for _ in $(seq 1 300); do
        curl -sf "http://127.0.0.1:$client/_matrix/client/versions" >/dev/null &&
            curl -sf --cacert "$work/tls/ca.pem" \
                "https://localhost:$fed/_matrix/federation/v1/version" >/dev/null &&
            return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    echo "run_interop.sh: Myelin $name did not start" >&2
    show_logs
    exit 1
}

"$here/make_ca.sh" "$work/tls"
"$here/synapse.sh" install

start_myelin m1
start_myelin m2
synapse_fed=$(free_port)
synapse_client=$(free_port)
"$here/synapse.sh" start interop "$synapse_fed" "$synapse_client" "$work/tls" "$work/synapse" \
    "$m1_name" "$m2_name"
synapse_url="http://127.0.0.1:$synapse_client"
synapse_name="localhost:$synapse_fed"

status=0
run() {
    echo "== $*"
    "$@" || { status=1; show_logs; }
}
export FED_CA="$work/tls/ca.pem"
run "$VENV/bin/python" "$here/interop.py" "$m1_url" "$m1_name" "$m2_url" "$m2_name"
run "$VENV/bin/python" "$here/interop.py" "$m1_url" "$m1_name" "$synapse_url" "$synapse_name"
# Synapse must have taken every event of ours without complaint: no signature, hash or auth
# failure, no rejected, soft-failed or unhandled PDU in its log.
synapse_log="$work/synapse/homeserver.log"
echo "== Synapse's log: no complaints about our events"
if grep -E " - (WARNING|ERROR) - " "$synapse_log" |
    grep -iE "Failed to handle PDU|signature|hash|auth|reject|soft.?fail|invalid event"; then
    echo "run_interop.sh: Synapse complained about events from the Myelins (above)" >&2
    status=1
fi
run node "$here/../clients/js/federation/olm.mjs" "$m1_url" "$m2_url"
run node "$here/../clients/js/federation/olm.mjs" "$m1_url" "$synapse_url"
run node "$here/../clients/js/federation/encrypted_room.mjs" "$m1_url" "$m2_url"
run node "$here/../clients/js/federation/encrypted_room.mjs" "$m1_url" "$synapse_url"
run node "$here/../clients/js/federation/encrypted_room.mjs" "$synapse_url" "$m1_url"
echo "run_interop.sh: exit $status after $((SECONDS - started_at))s in all"
exit "$status"
