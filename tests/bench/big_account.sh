#!/usr/bin/env bash
# A big account's initial syncs (myelin-bench scenario 13) on Myelin and Synapse, at the issue's
# full shape (300 rooms of 300 members), in one command. Synapse's API joins 14 to 25 members
# a second on 2 cores, so its 89,700 joins would take hours: Myelin sets the account up
# through its API and is measured; then its users, rooms and events are loaded into a stopped
# Synapse's database (tests/bench/synapse_load.py) and Synapse is measured with the same
# requests and checks. Each server runs alone while measured (Myelin is stopped first).
#
# Usage: tests/bench/big_account.sh [smoke|full] [OUT_DIR]      (default: full, a scratch directory)
#        BENCH_ARGS adds myelin-bench arguments for both servers (e.g. "--big-account-members 30").
# Needs: a PostgreSQL superuser at PGHOST/PGUSER (default 127.0.0.1, postgres).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/bench/lib.sh
scale="${1:-full}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/myelin-target}"
export PGHOST="${PGHOST:-127.0.0.1}" PGUSER="${PGUSER:-postgres}"
work="${2:-$(mktemp -d /tmp/myelin-big-account.XXXXXX)}"
mkdir -p "$work"
venv="${SYNAPSE_VENV:-/var/tmp/synapse-venv}"
bench_args=(--only big_account --scale "$scale")
# shellcheck disable=SC2206 # word splitting of BENCH_ARGS is meant
[ -n "${BENCH_ARGS:-}" ] && bench_args+=($BENCH_ARGS)
pid=
stop() {
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=
}
trap stop EXIT

echo "== build Myelin (release), install Synapse"
cargo build --release --locked --bins
install_synapse "$venv"
synapse_version=$("$venv/bin/python" -c "import synapse; print(synapse.__version__)")
fresh_databases myelin_big_account synapse_big_account
as_token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
bash tests/bench/bench-registration.sh "$as_token" >"$work/bench-registration.yaml"

echo "== Myelin: set-up through the API, then the syncs"
port=$(free_port)
start_myelin myelin_big_account "$port" "$work" "$work/bench-registration.yaml"
pid=$!
wait_up "http://127.0.0.1:$port"
"$CARGO_TARGET_DIR/release/myelin-bench" --url "http://127.0.0.1:$port" "${bench_args[@]}" \
    --appservice-token "$as_token" --pid "$pid" \
    --database-url "postgres://$PGUSER@$PGHOST/myelin_big_account" --label Myelin \
    --out "$work/myelin.json" --plot "$work/myelin.svg" --big-account-save "$work/set-up.json"
stop

echo "== Synapse $synapse_version: its schema, Myelin's set-up loaded into it, then the syncs"
port=$(free_port)
configure_synapse "$venv" "$work/synapse" "$port" synapse_big_account "$work/bench-registration.yaml"
start_synapse() {
    "$venv/bin/python" -m synapse.app.homeserver --config-path "$work/synapse/homeserver.yaml" \
        >>"$work/synapse.log" 2>&1 &
    pid=$!
    wait_up "http://127.0.0.1:$port"
}
start_synapse # creates its schema
stop
"$venv/bin/python" tests/bench/synapse_load.py "postgres://$PGUSER@$PGHOST/myelin_big_account" \
    "postgres://$PGUSER@$PGHOST/synapse_big_account" "$work/bench-registration.yaml"
start_synapse
"$CARGO_TARGET_DIR/release/myelin-bench" --url "http://127.0.0.1:$port" "${bench_args[@]}" \
    --appservice-token "$as_token" --pid "$pid" \
    --database-url "postgres://$PGUSER@$PGHOST/synapse_big_account" --label Synapse \
    --out "$work/synapse.json" --plot "$work/synapse.svg" --big-account-from "$work/set-up.json"
stop

"$venv/bin/python" - "$work/myelin.json" "$work/synapse.json" "$synapse_version" <<'PY'
import json, sys
myelin, synapse = (json.load(open(p))["big_account"] for p in sys.argv[1:3])
def ratio(m, s):
    return f"{s / m:.1f}x" if m and s else "—"
print(f"\n| Measure | Myelin | Synapse {sys.argv[3]} | Ratio |\n|---|---|---|---|")
for name, key in [("initial sync, lazy-loaded members", "initial_sync_lazy"),
                  ("initial sync, every member", "initial_sync_full_members")]:
    m, s = myelin[key], synapse[key]
    print(f"| {name}, p50 ms (max) | {m['p50_ms']:,} ({m['max_ms']:,}) | "
          f"{s['p50_ms']:,} ({s['max_ms']:,}) | {ratio(m['p50_ms'], s['p50_ms'])} |")
    print(f"| {name}: response bytes | {m['response_bytes']:,} | {s['response_bytes']:,} | |")
    print(f"| {name}: peak RSS MiB | {m['peak_rss_mib']} | {s['peak_rss_mib']} | "
          f"{ratio(m['peak_rss_mib'], s['peak_rss_mib'])} |")
print(f"\nSet-up: {json.dumps(myelin['set_up'])}")
PY
echo "== reports in $work"
