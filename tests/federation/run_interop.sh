#!/usr/bin/env bash
# Federation interop as CI runs it: two Myelins and one Synapse (from PyPI) on loopback, each
# with its own TLS federation listener and a certificate from a CA made for this run, and
# tests/federation/interop.py between Myelin and Myelin, then Myelin and Synapse (queries, keys,
# to-device, and rooms of v11 and v12 created on either side: joins and messages both ways);
# a check that Synapse's log has no complaint about our events; then matrix-js-sdk's Rust
# crypto starting Olm sessions across servers (olm.mjs) and exchanging encrypted messages in a
# room shared across servers, created on either side (encrypted_room.mjs). Given the echo
# appservice's registration (tests/run.sh passes it), the same Synapse also runs the client
# checks whose shapes must be Synapse's: tests/clients/appservice_echo.py with that
# registration (its url moved to a port of its own) and tests/clients/admin_check.py as an
# admin made with Synapse's register_new_matrix_user.
#
#   [ECHO_REGISTRATION=FILE AS_TOKEN=T HS_TOKEN=T MYELIN_TEST_VENV=DIR] \
#       tests/federation/run_interop.sh PATH/TO/myelin
#
# MYELIN_TEST_VENV is the venv of tests/clients/requirements.txt (mautrix); without
# ECHO_REGISTRATION those two checks are skipped.
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
synapse_appservices=
if [ -n "${ECHO_REGISTRATION:-}" ]; then
    echo_port=$(free_port)
    sed -E "s|^url: .*|url: http://127.0.0.1:$echo_port|" "$ECHO_REGISTRATION" \
        >"$work/echo-registration.yaml"
    synapse_appservices="$work/echo-registration.yaml"
fi
MYELIN_SYNAPSE_APPSERVICES="$synapse_appservices" \
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
if [ -n "${ECHO_REGISTRATION:-}" ]; then
    client_python="${MYELIN_TEST_VENV:-/var/tmp/myelin-venv}/bin/python"
    checks_started=$SECONDS
    AS_TOKEN="$AS_TOKEN" HS_TOKEN="$HS_TOKEN" HS_NAME="$synapse_name" AS_PORT="$echo_port" \
        run "$client_python" "$here/../clients/appservice_echo.py" "$synapse_url"
    run "$VENV/bin/register_new_matrix_user" -c "$work/synapse/homeserver.yaml" \
        -u shapes_admin -p admin-pw-1 --admin "$synapse_url"
    ADMIN_USER=shapes_admin ADMIN_PASSWORD=admin-pw-1 \
        run "$client_python" "$here/../clients/admin_check.py" "$synapse_url"
    echo "run_interop.sh: Synapse's client checks took $((SECONDS - checks_started))s"
fi
echo "run_interop.sh: exit $status after $((SECONDS - started_at))s in all"
exit "$status"
