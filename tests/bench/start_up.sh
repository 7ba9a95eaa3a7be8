#!/usr/bin/env bash
# Myelin's start with a big database (myelin-bench scenario 14), in one command: a release
# build on a fresh database, the rooms made through the API and their histories loaded through
# SQL, then three restarts, each timed until the server answers and until a user's first sync
# does. Myelin only: the loader writes Myelin's schema.
#
# Usage: tests/bench/start_up.sh [smoke|full] [OUT.json]     (default: full, start-up.json)
# Needs: a PostgreSQL superuser at PGHOST/PGUSER (default 127.0.0.1, postgres). At full scale
# the database grows to about 20 GB and the load takes about half an hour on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/bench/lib.sh
scale="${1:-full}"
out="${2:-start-up.json}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/myelin-target}"
export PGHOST="${PGHOST:-127.0.0.1}" PGUSER="${PGUSER:-postgres}"
work="$(mktemp -d /tmp/myelin-start-up.XXXXXX)"
db=myelin_start_up
port=$(free_port)

echo "== build Myelin (release)"
cargo build --release --locked --bins

fresh_databases "$db"
as_token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
bash tests/bench/bench-registration.sh "$as_token" >"$work/bench-registration.yaml"

# Stops the server if it runs, starts it in the background and prints its process ID: the
# benchmark runs this for each restart, and once here for the first start.
cat >"$work/restart.sh" <<EOF
#!/usr/bin/env bash
if [ -f "$work/pid" ]; then
    pid=\$(cat "$work/pid")
    kill -TERM "\$pid" 2>/dev/null || true
    while kill -0 "\$pid" 2>/dev/null; do sleep 0.05; done
fi
DATABASE_URL="postgres://$PGUSER@$PGHOST/$db" MYELIN_DATA_DIR="$work/myelin" \\
    MYELIN_LISTEN="127.0.0.1:$port" MYELIN_REGISTRATION=open MYELIN_RATE_LIMITS=off \\
    MYELIN_APPSERVICES="$work/bench-registration.yaml" RUST_LOG=warn \\
    setsid "$CARGO_TARGET_DIR/release/myelin" serve >>"$work/myelin.log" 2>&1 </dev/null &
echo \$! >"$work/pid"
echo \$!
EOF
trap 'kill -TERM "$(cat "$work/pid" 2>/dev/null)" 2>/dev/null || true' EXIT
bash "$work/restart.sh" >/dev/null
wait_up "http://127.0.0.1:$port"

"$CARGO_TARGET_DIR/release/myelin-bench" --url "http://127.0.0.1:$port" --scale "$scale" \
    --only start_up --appservice-token "$as_token" \
    --database-url "postgres://$PGUSER@$PGHOST/$db" --restart-command "bash $work/restart.sh" \
    --label Myelin --out "$out"
