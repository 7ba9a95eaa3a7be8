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

# shellcheck source=tests/federation/lib.sh
. "$here/lib.sh"

"$here/make_ca.sh" "$work/tls"
"$here/synapse.sh" install

start_myelin "$myelin" m1
start_myelin "$myelin" m2
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
