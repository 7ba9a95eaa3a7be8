#!/usr/bin/env bash
# Schema-driven fuzzing with schemathesis: starts a throwaway Myelin on loopback, registers a
# user and runs schemathesis with its bearer token against
#   1. the project's own api-spec/openapi.yaml (the routes Myelin serves), and
#   2. the Matrix Client-Server API from matrix-spec (bundled into one document by
#      bundle_spec.py), when MATRIX_SPEC_DIR exists.
# Only `not_a_server_error` is checked: any 5xx fails the run. Not part of the default CI run
# (it takes minutes and depends on PyPI and a matrix-spec checkout).
#
# Environment (all optional):
#   CARGO_TARGET_DIR   where the debug binary is (built if missing)    [target]
#   FUZZ_VENV          venv with schemathesis (created from PyPI)      [/var/tmp/myelin-fuzz-venv]
#   MATRIX_SPEC_DIR    matrix-spec data/api/client-server              [/work/shared/matrix-spec/...]
#   FUZZ_MAX_EXAMPLES  cases per operation and phase                   [10]
#   FUZZ_MAX_TIME      time budget per spec, in seconds                [420]
#   FUZZ_SEED          schemathesis seed, for a reproducible run       [random]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
venv=${FUZZ_VENV:-/var/tmp/myelin-fuzz-venv}
spec_dir=${MATRIX_SPEC_DIR:-/work/shared/matrix-spec/data/api/client-server}
max_examples=${FUZZ_MAX_EXAMPLES:-10}
max_time=${FUZZ_MAX_TIME:-420}
seed_args=()
[[ -n ${FUZZ_SEED:-} ]] && seed_args=(--seed "$FUZZ_SEED")

if [[ ! -x $venv/bin/schemathesis ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet schemathesis
fi
# Always build: fuzzing a stale binary reports bugs that are already fixed.
(cd "$repo" && CARGO_TARGET_DIR=$target cargo build --bin myelin)

work=$(mktemp -d /tmp/myelin-fuzz.XXXXXX)
chmod 755 "$work" # run as root, the private PostgreSQL runs as `postgres`
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base=http://127.0.0.1:$port
MYELIN_REGISTRATION=open MYELIN_RATE_LIMITS=off MYELIN_DATA_DIR=$work/data \
    MYELIN_LISTEN=127.0.0.1:$port "$target/debug/myelin" serve >"$work/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 120); do
    curl -sf "$base/_matrix/client/versions" >/dev/null && break
    kill -0 $server 2>/dev/null || { cat "$work/server.log"; exit 1; }
    sleep 0.5
done

token=$(curl -sf -X POST "$base/_matrix/client/v3/register" \
    -d '{"username":"fuzzer","password":"fuzzer-password-1","auth":{"type":"m.login.dummy"}}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["access_token"])')
# A room, so some generated requests reach past the room lookup.
curl -sf -X POST "$base/_matrix/client/v3/createRoom" -H "Authorization: Bearer $token" \
    -d '{"preset":"public_chat","room_alias_name":"fuzz"}' >/dev/null

# Operations that would end the fuzzer's own session (then every later case is a 401).
exclude='/logout|/account/deactivate|/account/password|/delete_devices|/devices/\{deviceId\}$'

fuzz() {
    "$venv/bin/schemathesis" run "$1" --url "$2" \
        -H "Authorization: Bearer $token" \
        --checks not_a_server_error \
        --exclude-path-regex "$exclude" \
        --max-examples "$max_examples" --max-time "$max_time" \
        --request-timeout 70 --workers 2 --no-color \
        --report junit --report-dir "$work/report-$3" "${seed_args[@]}"
}

cd "$work" # schemathesis keeps its example database in the working directory
status=0
fuzz "$repo/api-spec/openapi.yaml" "$base" myelin || status=1
if [[ -d $spec_dir ]]; then
    "$venv/bin/python" "$here/bundle_spec.py" "$spec_dir" "$work/client-server.json"
    fuzz "$work/client-server.json" "$base" matrix-spec || status=1
fi
echo "server log and reports: $work"
exit $status
