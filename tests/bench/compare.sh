#!/usr/bin/env bash
# Myelin and Synapse side by side, on this machine, in one run.
#
# Installs Synapse from PyPI into a virtual environment, runs both homeservers on loopback
# against the same PostgreSQL (separate databases; Synapse's rate limits raised; Myelin built
# in release mode), runs myelin-bench against each, measures the raw commit rate of a
# single-row insert with pgbench (1 and 50 clients), and writes tests/bench/BENCHMARKS.md.
#
# Usage: tests/bench/compare.sh [smoke|full] [SCENARIOS]     (default: full, all scenarios)
# SCENARIOS (comma-separated, as myelin-bench --only) compares a subset; its report goes to a
# scratch directory, not BENCHMARKS.md, which always holds a whole run.
# NO_ANALYZE=1 skips myelin-bench's VACUUM ANALYZE after each set-up (plans on the statistics each
# server keeps, as on a server just filled); its report also goes to the scratch directory.
# BENCH_ARGS adds myelin-bench arguments for both servers (e.g. "--big-account-members 30");
# its report also goes to the scratch directory.
# Needs: a PostgreSQL superuser at PGHOST/PGUSER (default 127.0.0.1, postgres), pgbench.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/bench/lib.sh
scale="${1:-full}"
# Benchmark arguments beyond the counts: a subset of scenarios, no VACUUM ANALYZE.
bench_args=()
[ -n "${2:-}" ] && bench_args=(--only "$2")
[ -n "${NO_ANALYZE:-}" ] && bench_args+=(--no-analyze)
# shellcheck disable=SC2206 # word splitting of BENCH_ARGS is meant
[ -n "${BENCH_ARGS:-}" ] && bench_args+=($BENCH_ARGS)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/myelin-target}"
export PGHOST="${PGHOST:-127.0.0.1}" PGUSER="${PGUSER:-postgres}"
work="$(mktemp -d /tmp/myelin-compare.XXXXXX)"
venv="${SYNAPSE_VENV:-/var/tmp/synapse-venv}"
out="tests/bench"
[ ${#bench_args[@]} -gt 0 ] && out="$work"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

echo "== build Myelin (release)"
cargo build --release --locked --bins

echo "== install Synapse"
install_synapse "$venv"
synapse_version=$("$venv/bin/python" -c "import synapse; print(synapse.__version__)")

echo "== databases"
fresh_databases myelin_bench synapse_bench pgbench_ref

# The big room's members (scenario 12) are registered through an application service, on
# both servers with the same registration.
bench_as_token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
bash tests/bench/bench-registration.sh "$bench_as_token" >"$work/bench-registration.yaml"

echo "== start Myelin"
myelin_port=$(free_port)
start_myelin myelin_bench "$myelin_port" "$work" "$work/bench-registration.yaml"
myelin_pid=$!; pids+=("$myelin_pid")
wait_up "http://127.0.0.1:$myelin_port"

echo "== start Synapse $synapse_version"
synapse_port=$(free_port)
configure_synapse "$venv" "$work/synapse" "$synapse_port" synapse_bench "$work/bench-registration.yaml"
"$venv/bin/python" -m synapse.app.homeserver --config-path "$work/synapse/homeserver.yaml" \
    >"$work/synapse.log" 2>&1 &
synapse_pid=$!; pids+=("$synapse_pid")
wait_up "http://127.0.0.1:$synapse_port"

# Exit status 3 (messages lost, duplicated or reordered) still writes the report, which shows
# the completeness rate; the script then fails at the end.
incomplete=()
echo "== benchmark Myelin"
"$CARGO_TARGET_DIR/release/myelin-bench" --url "http://127.0.0.1:$myelin_port" --scale "$scale" "${bench_args[@]}" \
    --appservice-token "$bench_as_token" --pid "$myelin_pid" --database-url "postgres://$PGUSER@$PGHOST/myelin_bench" --label Myelin \
    --out "$work/myelin.json" --plot "$out/delivery-myelin.svg" || { [ $? -eq 3 ] && incomplete+=(Myelin); }
echo "== benchmark Synapse"
"$CARGO_TARGET_DIR/release/myelin-bench" --url "http://127.0.0.1:$synapse_port" --scale "$scale" "${bench_args[@]}" \
    --appservice-token "$bench_as_token" --pid "$synapse_pid" --database-url "postgres://$PGUSER@$PGHOST/synapse_bench" --label Synapse \
    --out "$work/synapse.json" --plot "$out/delivery-synapse.svg" || { [ $? -eq 3 ] && incomplete+=(Synapse); }

echo "== pgbench: commit rate of a single-row insert"
psql -q -d pgbench_ref -c "CREATE TABLE one_insert (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)"
echo "INSERT INTO one_insert (body) VALUES ('x');" >"$work/insert.sql"
tps() { pgbench -n -d pgbench_ref -f "$work/insert.sql" -c "$1" -j "$2" -T 10 2>/dev/null | awk '/^tps/ {print int($3); exit}'; }
pg1=$(tps 1 1); pg50=$(tps 50 2)

# tests/bench/federation.sh writes its own section of BENCHMARKS.md, and the measurements at
# scale have theirs (Myelin-only runs, both ways of keeping statistics): kept across this rewrite.
kept_sections=""
[ -f "$out/BENCHMARKS.md" ] &&
    kept_sections=$(sed -n -e '/^<!-- scale:/,/^<!-- \/scale -->/p' \
        -e '/^<!-- federation:/,/^<!-- \/federation -->/p' "$out/BENCHMARKS.md")
"$venv/bin/python" - "$work/myelin.json" "$work/synapse.json" "$pg1" "$pg50" "$scale" "$synapse_version" \
    >"$out/BENCHMARKS.md" <<'PY'
import json, platform, subprocess, sys
myelin, synapse = (json.load(open(p)) for p in sys.argv[1:3])
pg1, pg50, scale, synapse_version = sys.argv[3:7]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
def get(report, path):
    for key in path.split("."):
        report = report.get(key) if isinstance(report, dict) else None
    return report
def fmt(v):
    if isinstance(v, int):
        return f"{v:,}"
    return "—" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))
def ratio(m, s, higher_is_better):
    if not isinstance(m, (int, float)) or not isinstance(s, (int, float)) or not m or not s:
        return "—"
    return f"{(m / s if higher_is_better else s / m):.1f}x"
rows = [
    ("1 send, sequential: p50 ms", "send_sequential.p50_ms", False),
    ("1 send, sequential: p99 ms", "send_sequential.p99_ms", False),
    ("1 send, sequential: messages/s", "send_sequential.messages_per_s", True),
    ("2 send, concurrent (users x rooms): messages/s", "send_concurrent.messages_per_s", True),
    ("2 send, concurrent: p50 ms", "send_concurrent.p50_ms", False),
    ("2 send, concurrent: p99 ms", "send_concurrent.p99_ms", False),
    ("4 completeness %", "completeness.completeness_percent", True),
    ("3 delivery to a long-poller: p50 ms", "delivery.p50_ms", False),
    ("3 delivery: p99 ms", "delivery.p99_ms", False),
    ("3 delivery: max ms", "delivery.max_ms", False),
    ("5 initial sync, lazy members: p50 ms", "sync.initial_lazy.p50_ms", False),
    ("5 initial sync, full members: p50 ms", "sync.initial_full_members.p50_ms", False),
    ("5 incremental sync, 1 room changed: p50 ms", "sync.incremental_one_room_changed.p50_ms", False),
    ("6 /messages page of 100: p50 ms", "history.p50_ms", False),
    ("16 incremental sync of a member 5,000 messages behind (100 at smoke scale): p50 ms", "far_behind.p50_ms", False),
    ("7 fan-out, time until all pollers have it: ms", "fanout.all_received_ms", False),
    ("8 idle RSS MiB", "footprint.idle_rss_mib", False),
    ("8 peak RSS MiB", "footprint.peak_rss_mib", False),
    ("8 database growth per 10,000 messages, bytes", "footprint.db_bytes_per_10000_messages", False),
    ("15 read markers (`/read_markers`, fully read and receipt), one reader: p50 ms", "read_markers.sequential.p50_ms", False),
    ("15 read markers, one reader: markers/s", "read_markers.sequential.markers_per_s", True),
    ("15 read markers, 50 readers at once (5 at smoke scale): markers/s", "read_markers.concurrent.markers_per_s", True),
    ("15 read markers, 50 readers at once: p50 ms", "read_markers.concurrent.p50_ms", False),
    ("9 sliding sync, first window of 20: p50 ms", "sliding.first_window_of_20.p50_ms", False),
    ("9 sliding sync, each +100 rooms of the window: p50 ms", "sliding.growing_by_100.p50_ms", False),
    ("9 sliding sync, each +100 rooms of the window: max ms", "sliding.growing_by_100.max_ms", False),
    ("9 sliding sync, whole list: p50 ms", "sliding.whole_list.p50_ms", False),
    ("9 sliding sync, incremental, nothing changed: p50 ms", "sliding.incremental_nothing_changed.p50_ms", False),
    ("9 sliding sync, incremental, one room changed: p50 ms", "sliding.incremental_one_room_changed.p50_ms", False),
    ("9 sliding sync, long-poll wake-up after the send's answer: p50 ms", "sliding.long_poll_wake_up.p50_ms", False),
    ("10 parked long-polls: connections", "parked.connections", True),
    ("10 parked long-polls: server memory per connection, KiB", "parked.kib_per_parked_connection", False),
    ("10 parked long-polls: delivery to one client, alone: p50 ms", "parked.delivery_alone.p50_ms", False),
    ("10 parked long-polls: delivery to one client, while they wait: p50 ms", "parked.delivery_while_parked.p50_ms", False),
    ("10 parked long-polls: delivery while they wait: max ms", "parked.delivery_while_parked.max_ms", False),
    # Scenario 11 loads its history through SQL in Myelin's schema: Synapse's column stays empty.
    ("11 long history: /messages, newest page: p50 ms", "long_history.newest_page.p50_ms", False),
    ("11 long history: /messages, middle page: p50 ms", "long_history.middle_page.p50_ms", False),
    ("11 long history: /messages, oldest page: p50 ms", "long_history.oldest_page.p50_ms", False),
    ("11 long history: /context: p50 ms", "long_history.context.p50_ms", False),
    ("11 long history: timestamp_to_event: p50 ms", "long_history.timestamp_to_event.p50_ms", False),
    ("11 long history: search, rare word: p50 ms", "long_history.search_rare.p50_ms", False),
    ("11 long history: search, common word, best first: p50 ms", "long_history.search_common.p50_ms", False),
    ("11 long history: search, common word, newest first: p50 ms", "long_history.search_common_recent.p50_ms", False),
    ("12 big room: members", "big_room.joins.members", True),
    ("12 big room: joins through the API, all of them: s", "big_room.joins.total_s", False),
    ("12 big room: joins per second", "big_room.joins.per_s", True),
    ("12 big room: one join, last tenth: p50 ms", "big_room.last_tenth_of_joins.p50_ms", False),
    ("12 big room: database growth per member, bytes", "big_room.db_bytes_per_member", False),
    ("12 big room: send: p50 ms", "big_room.send.p50_ms", False),
    ("12 big room: time until every long-poller (1,000 at full scale) has it: ms", "big_room.fan_out.all_received_ms", False),
    ("12 big room: /members: p50 ms", "big_room.members.p50_ms", False),
    ("12 big room: /joined_members: p50 ms", "big_room.joined_members.p50_ms", False),
    ("12 big room: a member's first sync, lazy members: p50 ms", "big_room.initial_sync_lazy.p50_ms", False),
]
print(f"# Benchmarks: Myelin and Synapse side by side\n")
print(f"One run of `tests/bench/compare.sh {scale}` at commit `{commit}` on this machine "
      f"({platform.machine()}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores), "
      f"Synapse {synapse_version} from PyPI, both on loopback against the same PostgreSQL. "
      "Counts are in `src/bin/myelin-bench/main.rs` (`Counts`). Ratio: how many times better Myelin is.\n")
if scale == "smoke":
    print("**Smoke scale**: counts far below the benchmark issue's (a few users and rooms, tens of "
          "messages); it shows the tool and both servers work and the order of magnitude, not the "
          "targets. Synapse answers repeated identical initial syncs from a response cache.\n")
print("| Measure | Myelin | Synapse | Ratio |\n|---|---|---|---|")
for name, path, higher in rows:
    m, s = get(myelin, path), get(synapse, path)
    print(f"| {name} | {fmt(m)} | {fmt(s)} | {ratio(m, s, higher)} |")
print(f"\nPhysical reference: `pgbench`, one `INSERT` per transaction on the same PostgreSQL: "
      f"{pg1} commits/s with 1 client, {pg50} commits/s with 50 clients.\n")
print("Delivery latency distributions: `delivery-myelin.svg`, `delivery-synapse.svg`.\n")
print("Reproduce: `tests/bench/compare.sh full` (or `smoke` for a quick check).")
PY
[ -n "$kept_sections" ] && printf '\n%s\n' "$kept_sections" >>"$out/BENCHMARKS.md"
echo "== wrote $out/BENCHMARKS.md"
cat "$out/BENCHMARKS.md"
if [ ${#incomplete[@]} -gt 0 ]; then
    echo "incomplete delivery: ${incomplete[*]}"
    exit 3
fi
