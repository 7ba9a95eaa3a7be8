#!/usr/bin/env bash
# Runs a real Synapse (from PyPI) on loopback as a federation peer for Myelin's tests
# (docs: FEDERATION.md §3 and §4).
#
#   tests/federation/synapse.sh install
#       Creates or reuses the virtualenv ${MYELIN_SYNAPSE_VENV:-/var/tmp/myelin-synapse-venv}
#       with tests/federation/requirements-synapse.txt. It is reused while the hash of that
#       file matches the stamp written beside the install.
#
#   tests/federation/synapse.sh start NAME FED_PORT CLIENT_PORT TLS_DIR DATA_DIR [PEER ...]
#       Starts Synapse `localhost:FED_PORT` in the background, from scratch:
#       - federation over TLS on 127.0.0.1:FED_PORT, serving TLS_DIR/cert.pem and key.pem
#         (tests/federation/make_ca.sh makes them) and trusting TLS_DIR/ca.pem for outbound
#         federation, with certificate verification on;
#       - the client API over plain HTTP on 127.0.0.1:CLIENT_PORT, registration open;
#       - federation only with itself and the PEER server names given;
#       - a fresh PostgreSQL database synapse_NAME (dropped first if it exists), reached over
#         TCP as MYELIN_SYNAPSE_PG_USER (postgres) at MYELIN_SYNAPSE_PG_HOST (127.0.0.1) port
#         MYELIN_SYNAPSE_PG_PORT (5432), with no password (trust authentication);
#       - the application services registered by the files in MYELIN_SYNAPSE_APPSERVICES
#         (space-separated absolute paths), if set;
#       - homeserver.yaml, its log config, the signing key, media, homeserver.log (WARNING)
#         and synapse.out (the process's stdout and stderr) in DATA_DIR, the PID in
#         DATA_DIR/synapse.pid.
#       Waits up to MYELIN_SYNAPSE_START_TIMEOUT (60) seconds for the client API and the TLS
#       federation API to answer, then prints one line. On failure prints the logs' tails,
#       stops what it started and exits non-zero.
#
#   tests/federation/synapse.sh stop DATA_DIR
#       Stops the Synapse whose PID is in DATA_DIR/synapse.pid and waits for it to exit.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
VENV="${MYELIN_SYNAPSE_VENV:-/var/tmp/myelin-synapse-venv}"
REQUIREMENTS="$here/requirements-synapse.txt"
PG_HOST="${MYELIN_SYNAPSE_PG_HOST:-127.0.0.1}"
PG_PORT="${MYELIN_SYNAPSE_PG_PORT:-5432}"
PG_USER="${MYELIN_SYNAPSE_PG_USER:-postgres}"
START_TIMEOUT="${MYELIN_SYNAPSE_START_TIMEOUT:-60}"

die() {
    echo "synapse.sh: $*" >&2
    exit 1
}

usage() {
    sed -n '4,/^set -euo/p' "$0" | sed -n 's/^# \{0,1\}//p' >&2
    exit 2
}

cmd_install() {
    local pins
    pins=$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)
    if [ "$(cat "$VENV/.myelin-pins" 2>/dev/null)" = "$pins" ] &&
        "$VENV/bin/python" -c "import synapse, psycopg2, signedjson, nacl, requests" 2>/dev/null; then
        return
    fi
    echo "== installing Synapse into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
    echo "$pins" >"$VENV/.myelin-pins"
}

# True when something accepts TCP connections on 127.0.0.1:$1.
port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# True while PID $1 runs and is not a zombie waiting to be reaped.
alive() {
    local state
    state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

# Drops and recreates database $1 for Synapse, which wants UTF8 with C collation. This goes
# through psycopg2 over TCP exactly as Synapse will, so a connection problem shows here.
fresh_database() {
    "$VENV/bin/python" - "$1" "$PG_HOST" "$PG_PORT" "$PG_USER" <<'PY'
import sys
import psycopg2

dbname, host, port, user = sys.argv[1:]
conn = psycopg2.connect(dbname="postgres", host=host, port=int(port), user=user, connect_timeout=10)
conn.autocommit = True
with conn.cursor() as cur:
    # FORCE ends connections a crashed earlier run may have left open.
    cur.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    cur.execute(
        f'CREATE DATABASE "{dbname}" OWNER "{user}" ENCODING \'UTF8\''
        " LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    )
conn.close()
PY
}

# The app_service_config_files line for MYELIN_SYNAPSE_APPSERVICES, or nothing.
appservices_config() {
    local files=() f
    for f in ${MYELIN_SYNAPSE_APPSERVICES:-}; do files+=("\"$f\""); done
    [ ${#files[@]} -gt 0 ] || return 0
    local IFS=,
    echo "app_service_config_files: [${files[*]}]"
}

write_config() {
    local name=$1 fed_port=$2 client_port=$3 tls_dir=$4 data_dir=$5 dbname=$6
    shift 6
    local server_name="localhost:$fed_port" whitelist peer
    whitelist="\"$server_name\""
    for peer in "$@"; do whitelist+=", \"$peer\""; done

    cat >"$data_dir/log.config" <<EOF
version: 1
formatters:
  precise:
    format: '%(asctime)s - %(name)s - %(lineno)d - %(levelname)s - %(request)s - %(message)s'
handlers:
  file:
    class: logging.FileHandler
    formatter: precise
    filename: "$data_dir/homeserver.log"
    encoding: utf8
root:
  level: WARNING
  handlers: [file]
disable_existing_loggers: false
EOF

    # YAML expands no environment variables: every path is written out absolute.
    cat >"$data_dir/homeserver.yaml" <<EOF
# Generated by tests/federation/synapse.sh for the test peer "$name".
server_name: "$server_name"
public_baseurl: "http://127.0.0.1:$client_port/"
pid_file: "$data_dir/homeserver.pid"
report_stats: false
listeners:
  - port: $fed_port                 # federation and /_matrix/key/v2/server, HTTPS
    bind_addresses: ['127.0.0.1']
    type: http
    tls: true
    x_forwarded: false
    resources:
      - names: [federation]
        compress: false
  - port: $client_port              # client API, plain HTTP, for the test driver
    bind_addresses: ['127.0.0.1']
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false

tls_certificate_path: "$tls_dir/cert.pem"
tls_private_key_path: "$tls_dir/key.pem"
federation_verify_certificates: true
federation_custom_ca_list: ["$tls_dir/ca.pem"]
# The default blacklist holds loopback; an empty one plus this whitelist lets federation
# reach 127.0.0.1 and ::1 (0.0.0.0 and :: stay blocked regardless).
ip_range_blacklist: []
ip_range_whitelist: ['127.0.0.0/8', '::1/128']
trusted_key_servers: []
suppress_key_server_warning: true
federation_domain_whitelist: [$whitelist]
federation:
  client_timeout: 30s
  destination_min_retry_interval: 1s
  destination_retry_multiplier: 2
  destination_max_retry_interval: 10s
allow_public_rooms_over_federation: true
room_list_publication_rules: [{action: allow}]

database:
  name: psycopg2
  args:
    user: "$PG_USER"
    dbname: "$dbname"
    host: "$PG_HOST"
    port: $PG_PORT
    cp_min: 2
    cp_max: 5
log_config: "$data_dir/log.config"
media_store_path: "$data_dir/media_store"
signing_key_path: "$data_dir/signing.key"
macaroon_secret_key: "$(openssl rand -hex 32)"
form_secret: "$(openssl rand -hex 32)"
registration_shared_secret: "$(openssl rand -hex 32)"
enable_registration: true
enable_registration_without_verification: true
url_preview_enabled: false
presence:
  enabled: true
caches:
  sync_response_cache_duration: 0   # otherwise identical /sync requests are answered from a 2 min cache
$(appservices_config)

# Every rate limit raised so that tests are never throttled.
rc_message: &hi {per_second: 100000, burst_count: 1000000}
rc_registration: *hi
rc_login: {address: *hi, account: *hi, failed_attempts: *hi}
rc_joins: {local: *hi, remote: *hi}
rc_joins_per_room: *hi
rc_invites: {per_room: *hi, per_user: *hi, per_issuer: *hi}
rc_room_creation: *hi
rc_send_knock: *hi
rc_media_create: *hi
rc_presence: {per_user: *hi}
rc_federation:
  window_size: 1000
  sleep_limit: 100000
  sleep_delay: 1
  reject_limit: 100000
  concurrent: 1000
EOF
}

# Prints the end of each log in $1, for a start that failed.
show_logs() {
    local f
    for f in "$1/synapse.out" "$1/homeserver.log"; do
        [ -s "$f" ] || continue
        echo "---- last lines of $f" >&2
        tail -n 40 "$f" >&2
    done
}

cmd_start() {
    [ $# -ge 5 ] || usage
    local name=$1 fed_port=$2 client_port=$3 tls_dir=$4 data_dir=$5
    shift 5
    [[ "$name" =~ ^[a-z0-9_]+$ ]] || die "NAME must be lower-case letters, digits and _: '$name'"
    [[ "$fed_port" =~ ^[0-9]+$ && "$client_port" =~ ^[0-9]+$ ]] || die "ports must be numbers"
    local f
    for f in ca.pem cert.pem key.pem; do
        [ -r "$tls_dir/$f" ] || die "no $tls_dir/$f (tests/federation/make_ca.sh makes it)"
    done
    [ -x "$VENV/bin/python" ] || die "no virtualenv at $VENV: run '$0 install' first"

    mkdir -p "$data_dir"
    tls_dir="$(cd "$tls_dir" && pwd)"
    data_dir="$(cd "$data_dir" && pwd)"
    if [ -f "$data_dir/synapse.pid" ] && alive "$(cat "$data_dir/synapse.pid")"; then
        die "a Synapse already runs from $data_dir (PID $(cat "$data_dir/synapse.pid")): stop it first"
    fi
    # A leftover server on either port would answer the readiness checks below.
    for f in "$fed_port" "$client_port"; do
        ! port_in_use "$f" || die "port $f on 127.0.0.1 is already in use"
    done

    # Start from scratch: only the files this script makes are removed from DATA_DIR.
    rm -rf "$data_dir/media_store"
    rm -f "$data_dir"/{homeserver.yaml,log.config,signing.key,homeserver.log,synapse.out,synapse.pid,homeserver.pid}
    local dbname="synapse_$name"
    fresh_database "$dbname"
    write_config "$name" "$fed_port" "$client_port" "$tls_dir" "$data_dir" "$dbname" "$@"

    cd "$data_dir"
    "$VENV/bin/python" -m synapse.app.homeserver -c homeserver.yaml --generate-keys \
        >synapse.out 2>&1 || { show_logs "$data_dir"; die "could not generate keys for $name"; }
    local started=$SECONDS pid why
    "$VENV/bin/python" -m synapse.app.homeserver -c homeserver.yaml >>synapse.out 2>&1 </dev/null &
    pid=$!
    echo "$pid" >synapse.pid

    local client_url="http://127.0.0.1:$client_port" fed_url="https://127.0.0.1:$fed_port"
    while :; do
        if ! alive "$pid"; then
            show_logs "$data_dir"
            rm -f synapse.pid
            die "Synapse $name exited during startup"
        fi
        # The federation probe checks the served certificate against TLS_DIR/ca.pem too.
        if why=$(curl -sSf --max-time 2 "$client_url/_matrix/client/versions" 2>&1 >/dev/null) &&
            why=$(curl -sSf --max-time 2 --cacert "$tls_dir/ca.pem" \
                "$fed_url/_matrix/federation/v1/version" 2>&1 >/dev/null); then
            break
        fi
        if [ $((SECONDS - started)) -ge "$START_TIMEOUT" ]; then
            show_logs "$data_dir"
            cmd_stop "$data_dir" >/dev/null
            die "Synapse $name did not answer within ${START_TIMEOUT}s; last error: ${why%%$'\n'*}"
        fi
        sleep 0.5
    done
    echo "synapse $name (localhost:$fed_port) ready in $((SECONDS - started))s:" \
        "client $client_url, federation https://localhost:$fed_port, pid $pid, data $data_dir"
}

cmd_stop() {
    [ $# -eq 1 ] || usage
    local data_dir=$1 pid
    pid=$(cat "$data_dir/synapse.pid" 2>/dev/null) || { echo "no Synapse PID in $data_dir"; return 0; }
    # Only signal the process if the PID still belongs to a Synapse (PIDs get reused).
    if alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q synapse.app.homeserver; then
        kill -TERM "$pid" 2>/dev/null || true
        local _
        for _ in $(seq 1 100); do
            alive "$pid" || break
            sleep 0.2
        done
        if alive "$pid"; then
            echo "Synapse (PID $pid) ignored SIGTERM for 20s: killing it" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$data_dir/synapse.pid"
    echo "synapse in $data_dir stopped"
}

case "${1:-}" in
    install) shift; [ $# -eq 0 ] || usage; cmd_install ;;
    start) shift; cmd_start "$@" ;;
    stop) shift; cmd_stop "$@" ;;
    *) usage ;;
esac
