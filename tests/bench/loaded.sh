#!/usr/bin/env bash
# A scenario whose set-up Synapse's API would take hours for, on Myelin and Synapse in one
# command: the long history (myelin-bench scenario 11: a room of 1,000,000 events at full
# scale), the big room (scenario 12: 20,000 members), the big account (scenario 13: 300
# rooms of 300 members) or the start with a big database (scenario 14: 100,000 rooms and
# 10,000,000 events, each server restarted three times). Synapse's API joins 5 to 25 members a second on 2 cores, so its own
# set-up would take hours: Myelin sets the scenario up (through its API, and the long history
# and the start-up's histories through SQL) and is measured; then its users, rooms and events are loaded into a stopped
# Synapse's database (tests/bench/synapse_load.py) and Synapse is measured with the same
# requests and checks (myelin-bench's --set-up-save and --set-up-from). Each server runs alone
# while measured (Myelin is stopped first).
#
# Usage: tests/bench/loaded.sh long_history|big_room|big_account|start_up [smoke|full] [OUT_DIR]
#        (default: full, a scratch directory)
#        BENCH_ARGS adds myelin-bench arguments for both servers (e.g. "--big-account-members 30").
#        MORE_JOINS=N (big_room): after each server's measures of the same room, N more members
#        join it through that server's API (myelin-bench's --big-room-more-joins): at the end of
#        Synapse's run, and for Myelin in a second run on its database once the loader has
#        copied the room as measured.
# Needs: a PostgreSQL superuser at PGHOST/PGUSER (default 127.0.0.1, postgres).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/bench/lib.sh
scenario="${1:?usage: tests/bench/loaded.sh long_history|big_room|big_account|start_up [smoke|full] [OUT_DIR]}"
case "$scenario" in
    long_history | big_room | big_account | start_up) ;;
    *) echo "tests/bench/loaded.sh: no saved set-up for scenario $scenario" >&2; exit 2 ;;
esac
scale="${2:-full}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/myelin-target}"
export PGHOST="${PGHOST:-127.0.0.1}" PGUSER="${PGUSER:-postgres}"
work="${3:-$(mktemp -d "/tmp/myelin-$scenario.XXXXXX")}"
mkdir -p "$work"
venv="${SYNAPSE_VENV:-/var/tmp/synapse-venv}"
bench_args=(--only "$scenario" --scale "$scale")
# shellcheck disable=SC2206 # word splitting of BENCH_ARGS is meant
[ -n "${BENCH_ARGS:-}" ] && bench_args+=($BENCH_ARGS)
# Each server is started, and for the start-up restarted, by a script of `restart_script`.
stop() {
    stop_restarted "$work/myelin-restart.sh"
    stop_restarted "$work/synapse-restart.sh"
}
trap stop EXIT
# The start-up's restarts: myelin-bench runs the script that started the server.
restarts() {
    restart_args=()
    [ "$scenario" != start_up ] || restart_args=(--restart-command "bash $1")
}

# myelin-bench with the scenario's arguments against the server on loopback port $1, whose
# database is $2 and process $pid, labelled $3, its report and plot $work/$4.json and .svg;
# then any further arguments.
run_bench() {
    local port="$1" db="$2" label="$3" name="$4"
    shift 4
    "$CARGO_TARGET_DIR/release/myelin-bench" --url "http://127.0.0.1:$port" "${bench_args[@]}" \
        --appservice-token "$as_token" --pid "$pid" --label "$label" \
        --database-url "postgres://$PGUSER@$PGHOST/$db" \
        --out "$work/$name.json" --plot "$work/$name.svg" "$@"
}

echo "== build Myelin (release), install Synapse"
cargo build --release --locked --bins
install_synapse "$venv"
synapse_version=$("$venv/bin/python" -c "import synapse; print(synapse.__version__)")
myelin_db="myelin_$scenario" synapse_db="synapse_$scenario"
fresh_databases "$myelin_db" "$synapse_db"
as_token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
bash tests/bench/bench-registration.sh "$as_token" >"$work/bench-registration.yaml"

echo "== Myelin: its set-up, then the measures"
port=$(free_port)
myelin_command "$myelin_db" "$port" "$work" "$work/bench-registration.yaml"
restart_script "$work/myelin-restart.sh" "$work/myelin.log" "${MYELIN_COMMAND[@]}"
pid=$(bash "$work/myelin-restart.sh")
wait_up "http://127.0.0.1:$port"
restarts "$work/myelin-restart.sh"
run_bench "$port" "$myelin_db" Myelin myelin "${restart_args[@]}" --set-up-save "$work/set-up.json"
stop
myelin_port=$port
more_joins=()
[ -n "${MORE_JOINS:-}" ] && more_joins=(--big-room-more-joins "$MORE_JOINS")

echo "== Synapse $synapse_version: its schema, Myelin's set-up loaded into it, then the measures"
port=$(free_port)
configure_synapse "$venv" "$work/synapse" "$port" "$synapse_db" "$work/bench-registration.yaml"
restart_script "$work/synapse-restart.sh" "$work/synapse.log" \
    "$venv/bin/python" -m synapse.app.homeserver --config-path "$work/synapse/homeserver.yaml"
start_synapse() {
    pid=$(bash "$work/synapse-restart.sh")
    wait_up "http://127.0.0.1:$port"
}
start_synapse # creates its schema
stop
"$venv/bin/python" tests/bench/synapse_load.py "postgres://$PGUSER@$PGHOST/$myelin_db" \
    "postgres://$PGUSER@$PGHOST/$synapse_db" "$work/bench-registration.yaml"
start_synapse
restarts "$work/synapse-restart.sh"
run_bench "$port" "$synapse_db" Synapse synapse "${restart_args[@]}" "${more_joins[@]}" \
    --set-up-from "$work/set-up.json"
stop

if [ ${#more_joins[@]} -gt 0 ]; then
    echo "== Myelin again on its database: the measures, then the more joins"
    pid=$(bash "$work/myelin-restart.sh")
    wait_up "http://127.0.0.1:$myelin_port"
    run_bench "$myelin_port" "$myelin_db" Myelin myelin-more "${more_joins[@]}" \
        --set-up-from "$work/set-up.json"
    stop
fi

"$venv/bin/python" - "$scenario" "$work/myelin.json" "$work/synapse.json" "$synapse_version" \
    ${more_joins[0]:+"$work/myelin-more.json"} <<'PY'
import json, sys
scenario, version = sys.argv[1], sys.argv[4]
myelin, synapse = (json.load(open(p))[scenario] for p in sys.argv[2:4])
# With MORE_JOINS, the more joins are from Myelin's second run.
if len(sys.argv) > 5:
    myelin["more_joins"] = json.load(open(sys.argv[5]))[scenario].get("more_joins")
def ratio(m, s):
    return f"{s / m:.1f}x" if m and s else "—"
def measured(v):
    return isinstance(v, dict) and "p50_ms" in v
print(f"\n| Measure | Myelin | Synapse {version} | Ratio |\n|---|---|---|---|")
for key, m in myelin.items():
    s = synapse.get(key) or {}
    if not (measured(m) and measured(s)):
        continue
    print(f"| {key}, p50 ms (max) | {m['p50_ms']:,} ({m['max_ms']:,}) | "
          f"{s['p50_ms']:,} ({s['max_ms']:,}) | {ratio(m['p50_ms'], s['p50_ms'])} |")
    for extra in ("response_bytes", "peak_rss_mib", "member_events", "pollers", "db_bytes_per_member"):
        if extra in m:
            theirs = f"{s[extra]:,}" if isinstance(s.get(extra), (int, float)) else "—"
            mine = f"{m[extra]:,}" if isinstance(m[extra], (int, float)) else "—"
            print(f"| {key}: {extra} | {mine} | {theirs} | "
                  f"{ratio(m[extra], s.get(extra)) if extra == 'peak_rss_mib' else ''} |")
for key in ("rss_serving_mib", "rss_after_first_sync_mib", "events", "database_bytes"):
    if isinstance(myelin.get(key), (int, float)):
        theirs = synapse.get(key)
        print(f"| {key} | {myelin[key]:,} | {theirs if theirs is None else f'{theirs:,}'} | |")
set_up = {k: v for k, v in myelin.items() if not measured(v) or k in ("joins", "last_tenth_of_joins")}
print(f"\nSet-up on Myelin: {json.dumps(set_up)}")
PY
echo "== reports in $work"
