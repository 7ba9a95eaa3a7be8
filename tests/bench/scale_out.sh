#!/usr/bin/env bash
# Myelin as a scale-out on one PostgreSQL, in one command: for 1, 2 and 4 processes (the same
# database, media directory and configuration, each on its own port), a release build runs
# myelin-bench's concurrent sends, their completeness and delivery to a long-poller (scenarios
# 2 to 4) with the senders spread over the processes and each message's receiver on another
# process than its sender; then `pgbench` gives the commit rate of a single-row insert with 1
# and 50 clients, the issue's reference. Prints one line per process count.
#
# Usage: tests/bench/scale_out.sh [smoke|full] [COUNTS] [OUT_DIR]
#        (default: full, "1 2 4", a scratch directory)
#        RECEIVERS=N: that many long-polling receivers instead of the scale's (0: the concurrent
#        sends alone, each sender reading its room back for the completeness check)
#        NO_ANALYZE=1: no `VACUUM ANALYZE` after the set-up (a server just filled); with
#        MYELIN_STATISTICS_REFRESH=off too, no table is ever analysed
# Needs: a PostgreSQL superuser at PGHOST/PGUSER (default 127.0.0.1, postgres), pgbench.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/bench/lib.sh
scale="${1:-full}"
counts="${2:-1 2 4}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/myelin-target}"
export PGHOST="${PGHOST:-127.0.0.1}" PGUSER="${PGUSER:-postgres}"
work="${3:-$(mktemp -d /tmp/myelin-scale-out.XXXXXX)}"
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

for n in $counts; do
    echo "== $n process(es)"
    fresh_databases "$db"
    rm -rf "$work/data"
    urls=()
    for i in $(seq 1 "$n"); do
        port=$(free_port)
        DATABASE_URL="postgres://$PGUSER@$PGHOST/$db" MYELIN_DATA_DIR="$work/data" \
            MYELIN_LISTEN="127.0.0.1:$port" MYELIN_REGISTRATION=open MYELIN_RATE_LIMITS=off \
            RUST_LOG=warn "$CARGO_TARGET_DIR/release/myelin" serve >>"$work/myelin-$n.log" 2>&1 &
        pids+=("$!")
        urls+=("http://127.0.0.1:$port")
        # One at a time: the first runs the migrations the others would wait on.
        wait_up "http://127.0.0.1:$port"
    done
    others=$(IFS=,; echo "${urls[*]:1}")
    "$CARGO_TARGET_DIR/release/myelin-bench" --url "${urls[0]}" ${others:+--process-urls "$others"} \
        --scale "$scale" --only concurrent,delivery --pid "${pids[0]}" ${RECEIVERS:+--receivers "$RECEIVERS"} ${NO_ANALYZE:+--no-analyze} \
        --database-url "postgres://$PGUSER@$PGHOST/$db" --label "Myelin x$n" \
        --out "$work/scale-out-$n.json" --plot "$work/delivery-$n.svg" >"$work/bench-$n.txt"
    stop_all
    python3 - "$work/scale-out-$n.json" "$n" <<'PY'
import json, sys
report, n = json.load(open(sys.argv[1])), sys.argv[2]
c, d, k = report["send_concurrent"], report["delivery"], report["completeness"]
where = "on the same process" if n == "1" else "on another process"
print(f"{n} process(es): concurrent {c['messages_per_s']:.0f} messages/s, send p50 {c['p50_ms']} ms "
      f"p99 {c['p99_ms']} ms, completeness {k['completeness_percent']}%; delivery to a long-poller "
      f"{where} p50 {d['p50_ms']} ms p99 {d['p99_ms']} ms")
PY
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
