# Shell helpers shared by the scripts that start Myelins for federation runs; source it after
# setting `work` (a scratch directory holding tls/ from make_ca.sh) and `pids` (an array).

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# show_logs: the tail of every log under $work, for a failure.
show_logs() {
    local log
    for log in "$work"/*.log "$work"/*/homeserver.log; do
        [ -f "$log" ] || continue
        echo "---- last lines of $log"
        tail -n 40 "$log"
    done
}

# start_myelin BINARY NAME: starts a Myelin named localhost:FED_PORT with its own embedded
# PostgreSQL under $work/NAME, TLS federation with the test CA, open registration and no rate
# limits; sets NAME_url, NAME_name and NAME_pid and waits until both listeners answer.
start_myelin() {
    local myelin=$1 name=$2 fed client pid
    fed=$(free_port)
    client=$(free_port)
    MYELIN_DATA_DIR="$work/$name" MYELIN_LISTEN="127.0.0.1:$client" \
        MYELIN_SERVER_NAME="localhost:$fed" MYELIN_FEDERATION_LISTEN="127.0.0.1:$fed" \
        MYELIN_TLS_CERT="$work/tls/cert.pem" MYELIN_TLS_KEY="$work/tls/key.pem" \
        MYELIN_FEDERATION_CA_FILE="$work/tls/ca.pem" MYELIN_OUTBOUND_ALLOW="127.0.0.1/32 ::1/128" \
        MYELIN_REGISTRATION=open MYELIN_RATE_LIMITS=off RUST_LOG="${RUST_LOG:-warn}" \
        "$myelin" serve >"$work/$name.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    printf -v "${name}_url" 'http://127.0.0.1:%s' "$client"
    printf -v "${name}_name" 'localhost:%s' "$fed"
    printf -v "${name}_pid" '%s' "$pid"
    for _ in $(seq 1 300); do
        curl -sf "http://127.0.0.1:$client/_matrix/client/versions" >/dev/null &&
            curl -sf --cacert "$work/tls/ca.pem" \
                "https://localhost:$fed/_matrix/federation/v1/version" >/dev/null &&
            return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    echo "Myelin $name did not start" >&2
    show_logs
    exit 1
}
