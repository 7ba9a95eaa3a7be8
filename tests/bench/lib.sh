# Shell functions the benchmark scripts share (sourced, not run).

# A free TCP port on loopback.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits until the homeserver at $1 answers /versions (two minutes at most).
wait_up() {
    for _ in $(seq 1 600); do
        curl -sf "$1/_matrix/client/versions" >/dev/null && return 0
        sleep 0.2
    done
    echo "server at $1 did not start"
    return 1
}

# Drops and creates the databases named, with the encoding and collation both servers need.
fresh_databases() {
    for db in "$@"; do
        psql -q -c "DROP DATABASE IF EXISTS $db" \
            -c "CREATE DATABASE $db ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    done
}

# Installs Synapse from PyPI, with the Redis client its workers need (tests/bench/scale_out.sh),
# into the virtual environment $1 unless it is there.
install_synapse() {
    if ! "$1/bin/python" -c "import synapse, txredisapi" 2>/dev/null; then
        python3 -m venv "$1"
        "$1/bin/pip" install --quiet --disable-pip-version-check psycopg2-binary 'matrix-synapse[redis]'
    fi
}

# Writes a Synapse configuration for the benchmarks into the directory $2 (server name
# `localhost`, client listener on port $3, database $4 at PGHOST as PGUSER, the application
# service registration $5), with the virtual environment $1.
configure_synapse() {
    mkdir -p "$2"
    "$1/bin/python" -m synapse.app.homeserver --server-name localhost \
        --config-path "$2/homeserver.yaml" --data-directory "$2" \
        --generate-config --report-stats=no >/dev/null
    # Its log beside its configuration, not in the directory the script was started from.
    sed -i "s|filename: .*homeserver.log|filename: $(realpath "$2")/homeserver.log|" "$2/localhost.log.config"
    "$1/bin/python" tests/bench/synapse_config.py "$2/homeserver.yaml" "$3" "$PGUSER" "$PGHOST" "$4" "$5"
}

# Sets MYELIN_COMMAND to run a release Myelin (open registration, no rate limits, the
# application service registration $4) on the database $1 at PGHOST as PGUSER, listening on
# loopback port $2, its data directory in the directory $3.
myelin_command() {
    MYELIN_COMMAND=(env DATABASE_URL="postgres://$PGUSER@$PGHOST/$1" MYELIN_DATA_DIR="$3/myelin"
        MYELIN_LISTEN="127.0.0.1:$2" MYELIN_REGISTRATION=open MYELIN_RATE_LIMITS=off
        MYELIN_APPSERVICES="$4" RUST_LOG=warn "$CARGO_TARGET_DIR/release/myelin" serve)
}

# Starts a release Myelin in the background (as `myelin_command` $1 $2 $3 $4), its log in the
# directory $3; `$!` is then its process.
start_myelin() {
    myelin_command "$@"
    "${MYELIN_COMMAND[@]}" >"$3/myelin.log" 2>&1 &
}

# Writes the script $1 that stops the process whose ID is in $1.pid (if it runs, waiting for
# it to exit), starts the command given after $2 in the background in its own session, its
# output appended to the file $2, and prints the new process's ID: what a benchmark's
# `--restart-command` runs, and how a script starts a server it restarts.
restart_script() {
    local script="$1" log="$2"
    shift 2
    {
        echo '#!/usr/bin/env bash'
        echo "pidfile=$(printf %q "$script.pid")"
        echo '[ -f "$pidfile" ] && pid=$(cat "$pidfile") && kill -TERM "$pid" 2>/dev/null'
        echo 'while [ -n "${pid:-}" ] && kill -0 "$pid" 2>/dev/null; do sleep 0.05; done'
        printf 'setsid'
        printf ' %q' "$@"
        printf ' >>%q 2>&1 </dev/null &\n' "$log"
        echo 'echo $! >"$pidfile"'
        echo 'echo $!'
    } >"$script"
}

# Stops the process a script of `restart_script` started last (the script $1), if it runs.
stop_restarted() {
    [ -f "$1.pid" ] || return 0
    local pid
    pid=$(cat "$1.pid")
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    rm -f "$1.pid"
}
