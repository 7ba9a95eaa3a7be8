#!/usr/bin/env bash
# A scale-out on one PostgreSQL, in one command: for 1, 2 and 4 processes of a server on one
# database, a release myelin-bench runs the concurrent sends, their completeness and delivery
# to a long-poller (scenarios 2 to 4) with the senders spread over the processes and each
# message's receiver on another process than its sender; then `pgbench` gives the commit rate
# of a single-row insert with 1 and 50 clients, the issue's reference. Prints one line per
# server and process count.
#
# Myelin: that many identical processes (the same database, media directory and
# configuration, each on its own port). Synapse (SERVERS="myelin synapse"): its main process
# and N-1 generic workers, each serving the client API on its own port, joined through Redis
# at 127.0.0.1:6379 (Synapse's own way to scale out); the main process persists every event,
# Synapse's default.
#
# Usage: tests/bench/scale_out.sh [smoke|full] [COUNTS] [OUT_DIR]
#        (default: full, "1 2 4", a scratch directory)
#        SERVERS="myelin synapse": the servers to run, in that order for each count (default:
#        myelin); Synapse is installed from PyPI into SYNAPSE_VENV (default
#        /var/tmp/synapse-venv)
#        RECEIVERS=N: that many long-polling receivers instead of the scale's (0: the concurrent
#        sends alone, each sender reading its room back for the completeness check)
#        NO_ANALYZE=1: no `VACUUM ANALYZE` after the set-up (a server just filled); with
#        MYELIN_STATISTICS_REFRESH=off too, no table is ever analysed
# Needs: a PostgreSQL superuser at PGHOST/PGUSER (default 127.0.0.1, postgres), pgbench; for
# Synapse, Redis on 127.0.0.1:6379.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/bench/lib.sh
scale="${1:-full}"
counts="${2:-1 2 4}"
servers="${SERVERS:-myelin}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/myelin-target}"
export PGHOST="${PGHOST:-127.0.0.1}" PGUSER="${PGUSER:-postgres}"
work="${3:-$(mktemp -d /tmp/myelin-scale-out.XXXXXX)}"
venv="${SYNAPSE_VENV:-/var/tmp/synapse-venv}"
mkdir -p "$work"
db=myelin_scale_out
pids=()
stop_all() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
}
trap stop_all EXIT

echo "== build Myelin (release)"
cargo build --release --locked --bins
if [[ " $servers " == *" synapse "* ]]; then
    echo "== install Synapse"
    install_synapse "$venv"
    # The configuration names an application service; the scenarios run here do not use it.
    bash tests/bench/bench-registration.sh unused-token >"$work/bench-registration.yaml"
fi

# Starts $1 Myelin processes on the database; sets `urls`, adds to `pids`.
start_myelin_processes() {
    rm -rf "$work/data"
    urls=()
    for _ in $(seq 1 "$1"); do
        local port
        port=$(free_port)
        DATABASE_URL="postgres://$PGUSER@$PGHOST/$db" MYELIN_DATA_DIR="$work/data" \
            MYELIN_LISTEN="127.0.0.1:$port" MYELIN_REGISTRATION=open MYELIN_RATE_LIMITS=off \
            RUST_LOG=warn "$CARGO_TARGET_DIR/release/myelin" serve >>"$work/myelin-$1.log" 2>&1 &
        pids+=("$!")
        urls+=("http://127.0.0.1:$port")
        # One at a time: the first runs the migrations the others would wait on.
        wait_up "http://127.0.0.1:$port"
    done
}

# Starts Synapse's main process and $1-1 generic workers on the database; sets `urls`, adds to
# `pids`.
start_synapse_processes() {
    local dir="$work/synapse-$1" port replication
    rm -rf "$dir"
    port=$(free_port)
    configure_synapse "$venv" "$dir" "$port" "$db" "$work/bench-registration.yaml"
    urls=("http://127.0.0.1:$port")
    if [ "$1" -gt 1 ]; then
        replication=$(free_port)
        "$venv/bin/python" tests/bench/synapse_config.py --workers "$dir/homeserver.yaml" "$replication"
    fi
    "$venv/bin/python" -m synapse.app.homeserver --config-path "$dir/homeserver.yaml" \
        >"$dir/main.out" 2>&1 &
    pids+=("$!")
    wait_up "${urls[0]}"
    for i in $(seq 2 "$1"); do
        port=$(free_port)
        sed "s|homeserver.log|worker$i.log|" "$dir/localhost.log.config" >"$dir/worker$i.log.config"
        cat >"$dir/worker$i.yaml" <<YAML
worker_app: synapse.app.generic_worker
worker_name: worker$i
worker_log_config: $dir/worker$i.log.config
worker_listeners:
  - type: http
    port: $port
    bind_addresses: ['127.0.0.1']
    resources:
      - names: [client]
YAML
        "$venv/bin/python" -m synapse.app.generic_worker --config-path "$dir/homeserver.yaml" \
            --config-path "$dir/worker$i.yaml" >"$dir/worker$i.out" 2>&1 &
        pids+=("$!")
        urls+=("http://127.0.0.1:$port")
        wait_up "http://127.0.0.1:$port"
    done
}

for n in $counts; do
    for server in $servers; do
        echo "== $server: $n process(es)"
        fresh_databases "$db"
        "start_${server}_processes" "$n"
        others=$(IFS=,; echo "${urls[*]:1}")
        "$CARGO_TARGET_DIR/release/myelin-bench" --url "${urls[0]}" ${others:+--process-urls "$others"} \
            --scale "$scale" --only concurrent,delivery --pid "${pids[0]}" ${RECEIVERS:+--receivers "$RECEIVERS"} ${NO_ANALYZE:+--no-analyze} \
            --database-url "postgres://$PGUSER@$PGHOST/$db" --label "$server x$n" \
            --out "$work/$server-scale-out-$n.json" --plot "$work/$server-delivery-$n.svg" >"$work/$server-bench-$n.txt"
        stop_all
        python3 - "$work/$server-scale-out-$n.json" "$server" "$n" <<'PY'
import json, sys
report, server, n = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
c, d, k = report["send_concurrent"], report["delivery"], report["completeness"]
where = "on the same process" if n == "1" else "on another process"
print(f"{server}, {n} process(es): concurrent {c['messages_per_s']:.0f} messages/s, send p50 {c['p50_ms']} ms "
      f"p99 {c['p99_ms']} ms, completeness {k['completeness_percent']}%; delivery to a long-poller "
      f"{where} p50 {d['p50_ms']} ms p99 {d['p99_ms']} ms")
PY
    done
done

echo "== pgbench: commit rate of a single-row insert"
psql -q -c "DROP DATABASE IF EXISTS pgbench_ref" -c "CREATE DATABASE pgbench_ref"
psql -q -d pgbench_ref -c "CREATE TABLE one_insert (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)"
echo "INSERT INTO one_insert (body) VALUES ('x');" >"$work/insert.sql"
for clients in 1 50; do
    threads=$((clients < 2 ? 1 : 2))
    tps=$(pgbench -n -d pgbench_ref -f "$work/insert.sql" -c "$clients" -j "$threads" -T 10 2>/dev/null |
        awk '/^tps/ {print int($3); exit}')
    echo "pgbench, $clients client(s): $tps commits/s"
done
echo "reports in $work"
