#!/usr/bin/env bash
# The federation scenario of the benchmark: two Myelins and two Synapses (from PyPI) on
# loopback, each with a TLS federation listener and a certificate from a CA made for the run,
# and tests/bench/federation.py between them: room-message delivery latency for Myelin to
# Myelin, Myelin to Synapse, Synapse to Myelin and Synapse to Synapse; a burst of messages
# into a room and the time until the other server has them all, in order; joining a remote
# room of many members while local sends on the joining server are timed.
#
#   tests/bench/federation.sh [PATH/TO/myelin] [smoke|full]
#
# Default binary: $CARGO_TARGET_DIR/release/myelin (build it with
# `cargo build --release --bin myelin`; numbers from a debug build mean little). At full
# scale the report replaces the federation section of tests/bench/BENCHMARKS.md; at smoke
# scale it is only printed. Each Myelin runs its own embedded PostgreSQL; the Synapses need
# PostgreSQL on 127.0.0.1:5432 (tests/federation/synapse.sh). Exit status 3: a burst arrived
# incomplete or out of order.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
fed="$root/tests/federation"
myelin="${1:-${CARGO_TARGET_DIR:-/var/tmp/myelin-target}/release/myelin}"
scale="${2:-full}"
VENV="${MYELIN_SYNAPSE_VENV:-/var/tmp/myelin-synapse-venv}"
export MYELIN_SYNAPSE_VENV="$VENV"
[ -x "$myelin" ] || { echo "federation.sh: no Myelin binary at $myelin" >&2; exit 2; }
started_at=$SECONDS

work="$(mktemp -d /tmp/myelin-fedbench.XXXXXX)"
chmod 755 "$work"
pids=()
# shellcheck source=tests/federation/lib.sh
. "$fed/lib.sh"
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    "$fed/synapse.sh" stop "$work/s1" >/dev/null 2>&1 || true
    "$fed/synapse.sh" stop "$work/s2" >/dev/null 2>&1 || true
    # FEDBENCH_KEEP=1 keeps the servers' logs and data for a look afterwards.
    if [ -n "${FEDBENCH_KEEP:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

"$fed/make_ca.sh" "$work/tls" >/dev/null
"$fed/synapse.sh" install
start_myelin "$myelin" m1
start_myelin "$myelin" m2
s1_fed=$(free_port) s1_client=$(free_port) s2_fed=$(free_port) s2_client=$(free_port)
# Both start at once: each spends most of its startup creating its database schema.
"$fed/synapse.sh" start bench_s1 "$s1_fed" "$s1_client" "$work/tls" "$work/s1" \
    "$m1_name" "$m2_name" "localhost:$s2_fed" &
start_s1=$!
"$fed/synapse.sh" start bench_s2 "$s2_fed" "$s2_client" "$work/tls" "$work/s2" \
    "$m1_name" "$m2_name" "localhost:$s1_fed" &
start_s2=$!
wait "$start_s1"
wait "$start_s2"

status=0
FED_CA="$work/tls/ca.pem" "$VENV/bin/python" "$root/tests/bench/federation.py" "$scale" "$work/report.json" \
    "$m1_url" "$m1_name" "$m2_url" "$m2_name" \
    "http://127.0.0.1:$s1_client" "localhost:$s1_fed" "http://127.0.0.1:$s2_client" "localhost:$s2_fed" ||
    status=$?
if [ ! -f "$work/report.json" ]; then
    show_logs
    exit "${status/#0/1}"
fi
cp "$work/report.json" "/tmp/myelin-fedbench-$scale.json"

# The report, as the section of BENCHMARKS.md between its federation markers.
commit=$(git rev-parse --short HEAD)
synapse_version=$("$VENV/bin/python" -c "import synapse; print(synapse.__version__)")
"$VENV/bin/python" - "$work/report.json" "$scale" "$commit" "$synapse_version" "$(nproc)" \
    >"$work/section.md" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
scale, commit, synapse_version, cores = sys.argv[2:6]
c = report["counts"]
def ms(v):
    return "—" if v is None else f"{v:g}"
print("<!-- federation: written by tests/bench/federation.sh full -->")
print("## Federation\n")
print(f"One run of `tests/bench/federation.sh PATH/TO/release/myelin {scale}` at commit `{commit}` on this "
      f"machine ({cores} cores), Synapse {synapse_version} from PyPI; two Myelins (release, each with its "
      "embedded PostgreSQL) and two Synapses (one PostgreSQL), all federating over TLS on loopback.\n")
lat = report["latency"]
base = lat["Synapse to Synapse"]
print(f"Room-message delivery, {c['latency']} messages one at a time: from the start of the sender's "
      "`PUT` until the receiver's waiting `/sync` returns with it. Ratio: Synapse to Synapse's p50 "
      "over this pair's.\n")
print("| Pair | p50 ms | p90 ms | max ms | Ratio |\n|---|---|---|---|---|")
for pair, r in lat.items():
    print(f"| {pair} | {ms(r['p50_ms'])} | {ms(r['p90_ms'])} | {ms(r['max_ms'])} | "
          f"{base['p50_ms'] / r['p50_ms']:.1f}x |")
print(f"\nBurst: {c['burst']} messages sent back to back (one client, one at a time) into a room; "
      "seconds from the first send until the receiver's `/sync` has the last one; then the "
      "receiver's `/messages` checked to hold every one, once, in the order sent.\n")
print("| Pair | sending s | last visible s | after last send s | received | complete, in order |")
print("|---|---|---|---|---|---|")
for pair, r in report["burst"].items():
    print(f"| {pair} | {ms(r['send_s'])} | {ms(r['last_visible_s'])} | {ms(r['after_last_send_s'])} | "
          f"{r['received']} | {'yes' if r['complete_in_order'] else '**no**'} |")
j = report["join"]
print(f"\nJoin: a room on a Myelin with {j['members']} local members (set up through the client API "
      f"in {j['setup_s']} s); the time of a remote user's `/join` of it, while another user on the "
      "joining server sends into a room local to it every 50 ms (send latency p50 / max ms, in "
      "the 3 s before the join and during it).\n")
print("| Joining server | join s | members seen | local send before | local send during |")
print("|---|---|---|---|---|")
for who, r in j.items():
    if not isinstance(r, dict):
        continue
    b, d = r["local_send_before"], r["local_send_during"]
    print(f"| {who.split()[0]} | {ms(r['join_s'])} | {r['joined_members_seen']} | "
          f"{ms(b.get('p50_ms'))} / {ms(b.get('max_ms'))} | {ms(d.get('p50_ms'))} / {ms(d.get('max_ms'))} |")
print("\n<!-- /federation -->")
PY
cat "$work/section.md"
if [ "$scale" = full ]; then
    # Replace the federation section (or append one); compare.sh keeps it when it rewrites the file.
    "$VENV/bin/python" - "$root/tests/bench/BENCHMARKS.md" "$work/section.md" <<'PY'
import re, sys
path, section = sys.argv[1], open(sys.argv[2]).read().strip()
text = open(path).read()
pattern = re.compile(r"<!-- federation:.*?<!-- /federation -->", re.S)
text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section
open(path, "w").write(text.rstrip() + "\n")
PY
    echo "== wrote the federation section of tests/bench/BENCHMARKS.md"
fi
echo "federation.sh: exit $status after $((SECONDS - started_at))s in all"
exit "$status"
