#!/usr/bin/env bash
# Self-check of the federation harness: two real Synapses federating with each other over
# TLS on loopback, and tests/federation/interop.py between them. When this passes, the
# harness and the driver are right, and a failure with Myelin on one side is Myelin's.
#
#   tests/federation/run_synapse_pair.sh
#
# Side A: localhost:18448 (client API http://127.0.0.1:18449), database synapse_pair_a.
# Side B: localhost:19448 (client API http://127.0.0.1:19449), database synapse_pair_b.
# Needs PostgreSQL as tests/federation/synapse.sh says. Exits with the driver's status; on
# failure the Synapse logs' tails are printed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
VENV="${MYELIN_SYNAPSE_VENV:-/var/tmp/myelin-synapse-venv}"
run_started=$SECONDS

work="$(mktemp -d /tmp/myelin-synapse-pair.XXXXXX)"
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    "$here/synapse.sh" stop "$work/a" >/dev/null || true
    "$here/synapse.sh" stop "$work/b" >/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

"$here/make_ca.sh" "$work/tls"
"$here/synapse.sh" install
# Both start at once: each spends most of its startup creating its database schema.
"$here/synapse.sh" start pair_a 18448 18449 "$work/tls" "$work/a" localhost:19448 &
start_a=$!
"$here/synapse.sh" start pair_b 19448 19449 "$work/tls" "$work/b" localhost:18448 &
start_b=$!
started=0
wait "$start_a" && started=$((started + 1))
wait "$start_b" && started=$((started + 1))
[ "$started" -eq 2 ] || exit 1

status=0
FED_CA="$work/tls/ca.pem" "$VENV/bin/python" "$here/interop.py" \
    http://127.0.0.1:18449 localhost:18448 http://127.0.0.1:19449 localhost:19448 || status=$?
if [ "$status" -ne 0 ]; then
    for side in a b; do
        echo "---- last lines of Synapse $side's log"
        tail -n 30 "$work/$side/homeserver.log" || true
    done
fi
echo "run_synapse_pair.sh: exit $status after $((SECONDS - run_started))s in all"
exit "$status"
