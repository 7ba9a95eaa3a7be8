#!/usr/bin/env bash
# Builds Myelin's image (docker/Dockerfile) here and runs docker/docker-compose.yml for real:
# waits for the container to turn healthy, then registers a user, logs in, creates a room,
# sends a message and syncs it back through the published port with curl, checks /health
# and /readyz. Then runs the standalone image (with PostgreSQL's binaries) alone, without
# DATABASE_URL, and registers on it. Tears everything down (containers and volumes).
#
# Where no registry can be reached, the base images the Dockerfile and the compose file name
# are made locally when absent (the names stay those of the public images, so the files are
# unchanged): debian:bookworm-slim from a debootstrapped bookworm, the Rust builder from it plus
# the host's Rust toolchain and CA bundle, the PostgreSQL image from it plus Debian's postgresql-15
# (docker/stand-ins/). Where the real images are present they are used as they are.
#
# Needs: root (or the docker group), Debian's docker.io engine (dockerd is started when none
# runs), debootstrap and rustc for the stand-ins, curl, and `docker compose`, `docker-compose`
# or neither (then the compose file's two services are run with `docker run`).
# Environment: MYELIN_DOCKER_WORK (default /var/tmp/myelin-docker: stand-in rootfs, logs),
# MYELIN_DOCKER_PORT (default 18008, published on 127.0.0.1), MYELIN_DOCKER_COMPOSE=none.
set -euo pipefail

started=$(date +%s)
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${MYELIN_DOCKER_WORK:-/var/tmp/myelin-docker}
port=${MYELIN_DOCKER_PORT:-18008}
project=myelin-docker-test
compose_file=$repo/docker/docker-compose.yml
builder_image=$(sed -n 's/^FROM \([^ ]*\) AS build$/\1/p' "$repo/docker/Dockerfile")
runtime_image=$(awk '/^FROM /{image=$2} END{print image}' "$repo/docker/Dockerfile")
postgres_image=$(sed -n 's/^ *image: *\(postgres:[^ ]*\)$/\1/p' "$compose_file")
base_url=http://127.0.0.1:$port
mkdir -p "$work"

log() { printf '%s docker/test.sh: %s\n' "$(date +%T)" "$*"; }
die() { log "FAILED: $*"; exit 1; }

# The engine.
if ! docker info >/dev/null 2>&1; then
    command -v dockerd >/dev/null || die "no Docker engine (Debian: apt-get install docker.io)"
    log "starting dockerd (log: $work/dockerd.log)"
    dockerd >"$work/dockerd.log" 2>&1 &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || die "dockerd did not start; see $work/dockerd.log"
fi

# A CLI that builds with BuildKit (the Dockerfile's cache mounts need it): CLIs from 23 on need
# the buildx plugin for that; Debian's 20.10 CLI has BuildKit built in.
build_cli=
if docker buildx version >/dev/null 2>&1; then
    build_cli=docker
else
    for cli in $(type -ap docker) /usr/bin/docker; do
        case $("$cli" version -f '{{.Client.Version}}' 2>/dev/null) in
            19.* | 20.* | 2[12].*) build_cli=$cli && break ;;
        esac
    done
fi
[ -n "$build_cli" ] || die "no Docker CLI with BuildKit: install the buildx plugin (docker-buildx)"

# Compose v2, v1, or none (MYELIN_DOCKER_COMPOSE=none forces the docker run path).
if [ "${MYELIN_DOCKER_COMPOSE:-}" = none ]; then
    compose=()
elif docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
elif command -v docker-compose >/dev/null; then
    compose=(docker-compose)
else
    compose=()
fi

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

stand_in_base() {
    have_image debian:bookworm-slim && return
    local rootfs=$work/rootfs-bookworm
    if [ ! -x "$rootfs/bin/sh" ]; then
        command -v debootstrap >/dev/null || die "no debian:bookworm-slim and no debootstrap"
        log "debootstrapping bookworm into $rootfs"
        rm -rf "$rootfs"
        debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian \
            >"$work/debootstrap.log" 2>&1 || die "debootstrap failed; see $work/debootstrap.log"
    fi
    log "importing the stand-in debian:bookworm-slim"
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' - debian:bookworm-slim >/dev/null
}

stand_in_rust() {
    have_image "$builder_image" && return
    local context=$work/rust-context sysroot
    sysroot=$(rustc --print sysroot) || die "no $builder_image and no host Rust toolchain"
    log "building the stand-in $builder_image from $sysroot"
    rm -rf "$context" && mkdir -p "$context/toolchain"
    cp "$repo/docker/stand-ins/rust.Dockerfile" "$context/Dockerfile"
    tar -C "$sysroot" --exclude=./share -c . | tar -C "$context/toolchain" -x
    cp /etc/ssl/certs/ca-certificates.crt "$context/"
    DOCKER_BUILDKIT=0 docker build -q -t "$builder_image" "$context" >/dev/null
    rm -rf "$context"
}

stand_in_postgres() {
    have_image "$postgres_image" && return
    log "building the stand-in $postgres_image (Debian's PostgreSQL 15)"
    DOCKER_BUILDKIT=0 docker build -q -t "$postgres_image" \
        -f "$repo/docker/stand-ins/postgres.Dockerfile" "$repo/docker/stand-ins" >/dev/null
}

[ "$runtime_image" = debian:bookworm-slim ] || die "the runtime stage is $runtime_image now; update this script"
stand_in_base
stand_in_rust
stand_in_postgres

# One image per variant: myelin:latest as docker-compose.yml builds it (no PostgreSQL binaries),
# myelin:standalone as a plain `docker build` makes it (with them). The second shares the first's
# build stage, so it costs one apt-get.
build() { # tag, extra build options...
    local tag=$1
    shift
    log "building $tag with $build_cli (BuildKit; log: $work/build-${tag#*:}.log)"
    local build_started
    build_started=$(date +%s)
    DOCKER_BUILDKIT=1 "$build_cli" build --progress=plain -f "$repo/docker/Dockerfile" \
        -t "$tag" "$@" "$repo" >"$work/build-${tag#*:}.log" 2>&1 || {
        tail -30 "$work/build-${tag#*:}.log"
        die "$tag did not build"
    }
    log "built $tag in $(($(date +%s) - build_started)) s; \
$(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')"
}
build myelin:latest --build-arg EMBEDDED_POSTGRES=no
build myelin:standalone

# What the compose file reads from the environment.
export MYELIN_HTTP_PUBLISH=127.0.0.1:$port MYELIN_REGISTRATION=open MYELIN_RATE_LIMITS=off \
    MYELIN_SERVER_NAME=localhost MYELIN_PUBLIC_BASEURL=$base_url/ POSTGRES_PASSWORD=test-only

# Up and down, with compose or, without it, the same two services by hand.
if [ ${#compose[@]} -gt 0 ]; then
    log "running the compose file with ${compose[*]}"
    up() { "${compose[@]}" -p "$project" -f "$compose_file" up -d --no-build; }
    down() { "${compose[@]}" -p "$project" -f "$compose_file" down -v --remove-orphans; }
    myelin_container() { "${compose[@]}" -p "$project" -f "$compose_file" ps -q myelin; }
    service_logs() { "${compose[@]}" -p "$project" -f "$compose_file" logs --no-color; }
else
    log "no docker compose: running the compose file's services with docker run"
    up() {
        docker network create "$project" >/dev/null
        docker run -d --name "$project-postgres" --network "$project" --network-alias postgres \
            -e POSTGRES_USER=myelin -e POSTGRES_PASSWORD="$POSTGRES_PASSWORD" \
            -e POSTGRES_DB=myelin -v "$project-postgres:/var/lib/postgresql/data" \
            --health-cmd 'pg_isready -h 127.0.0.1 -U myelin -d myelin' --health-interval 2s \
            --restart unless-stopped \
            "$postgres_image" >/dev/null
        for _ in $(seq 60); do
            [ "$(docker inspect -f '{{.State.Health.Status}}' "$project-postgres")" = healthy ] && break
            sleep 1
        done
        docker run -d --name "$project-myelin" --network "$project" -p "$MYELIN_HTTP_PUBLISH:8008" \
            --restart unless-stopped \
            -e DATABASE_URL="postgres://myelin:$POSTGRES_PASSWORD@postgres:5432/myelin" \
            -e MYELIN_SERVER_NAME -e MYELIN_PUBLIC_BASEURL -e MYELIN_REGISTRATION \
            -e MYELIN_RATE_LIMITS -v "$project-myelin:/data" myelin:latest >/dev/null
    }
    down() {
        docker rm -f "$project-myelin" "$project-postgres" >/dev/null 2>&1 || true
        docker volume rm "$project-myelin" "$project-postgres" >/dev/null 2>&1 || true
        docker network rm "$project" >/dev/null 2>&1 || true
    }
    myelin_container() { echo "$project-myelin"; }
    service_logs() { docker logs "$project-postgres" 2>&1; docker logs "$project-myelin" 2>&1; }
fi

finish() {
    local status=$?
    if [ $status -ne 0 ]; then
        service_logs >"$work/services.log" 2>&1 || true
        log "service logs: $work/services.log"
    fi
    down >/dev/null 2>&1 || true
    log "torn down; whole run took $(($(date +%s) - started)) s"
    exit $status
}
down >/dev/null 2>&1 || true
trap finish EXIT
up

wait_healthy() { # container
    local health
    log "waiting for $1 to turn healthy (HEALTHCHECK: myelin healthcheck)"
    for _ in $(seq 120); do
        health=$(docker inspect -f '{{.State.Health.Status}}' "$1")
        [ "$health" = healthy ] && break
        [ "$health" = unhealthy ] && die "$1 is unhealthy"
        sleep 1
    done
    [ "$health" = healthy ] || die "$1 did not turn healthy in 120 s"
    [ "$(docker inspect -f '{{.Config.User}}' "$1")" = myelin ] || die "$1 runs as root"
    log "healthy"
}
container=$(myelin_container)
wait_healthy "$container"

# One request; prints the body, fails on a status other than 200.
call() {
    local method=$1 path=$2 body=${3:-} token=${4:-} args=(-sS -X "$1" -o "$work/response" -w '%{http_code}')
    [ -n "$body" ] && args+=(-H 'Content-Type: application/json' --data "$body")
    [ -n "$token" ] && args+=(-H "Authorization: Bearer $token")
    local status
    status=$(curl "${args[@]}" "$base_url$path")
    [ "$status" = 200 ] || die "$method $path: $status $(cat "$work/response")"
    cat "$work/response"
}
json() { python3 -c 'import json,sys; print(eval("json.load(sys.stdin)" + sys.argv[1]))' "$1"; }

[ "$(call GET /health)" = OK ] || die "/health did not answer OK"
[ "$(call GET /readyz | json '["status"]')" = ready ] || die "/readyz is not ready"
call POST /_matrix/client/v3/register \
    '{"username":"alice","password":"docker-test-pw","auth":{"type":"m.login.dummy"}}' >/dev/null
token=$(call POST /_matrix/client/v3/login \
    '{"type":"m.login.password","identifier":{"type":"m.id.user","user":"alice"},"password":"docker-test-pw"}' |
    json '["access_token"]')
room=$(call POST /_matrix/client/v3/createRoom '{"name":"docker"}' "$token" | json '["room_id"]')
event=$(call PUT "/_matrix/client/v3/rooms/$room/send/m.room.message/t1" \
    '{"msgtype":"m.text","body":"hello from docker/test.sh"}' "$token" | json '["event_id"]')
synced=$(call GET '/_matrix/client/v3/sync?timeout=0' '' "$token" |
    json "[\"rooms\"][\"join\"][\"$room\"][\"timeline\"][\"events\"]")
case $synced in
    *"$event"*"hello from docker/test.sh"* | *"hello from docker/test.sh"*"$event"*) ;;
    *) die "the message $event is not in the synced timeline: $synced" ;;
esac
log "registered @alice:localhost, logged in, created $room, sent $event and synced it back"
[ "$(docker exec "$container" myelin healthcheck && echo ok)" = ok ] || die "myelin healthcheck failed"
down >/dev/null 2>&1

# The standalone image alone: no DATABASE_URL, so the server runs its own PostgreSQL in /data.
standalone=$project-standalone
up() {
    docker run -d --name "$standalone" -p "127.0.0.1:$port:8008" -v "$standalone:/data" \
        -e MYELIN_REGISTRATION=open -e MYELIN_RATE_LIMITS=off myelin:standalone >/dev/null
}
down() {
    docker rm -f "$standalone" >/dev/null 2>&1 || true
    docker volume rm "$standalone" >/dev/null 2>&1 || true
}
service_logs() { docker logs "$standalone" 2>&1; }
log "running myelin:standalone alone (its own PostgreSQL under /data)"
up
wait_healthy "$standalone"
[ "$(call GET /readyz | json '["status"]')" = ready ] || die "/readyz is not ready"
call POST /_matrix/client/v3/register \
    '{"username":"bob","password":"docker-test-pw","auth":{"type":"m.login.dummy"}}' >/dev/null
docker exec "$standalone" test -s /data/postgres/data/PG_VERSION || die "no cluster in /data"
log "registered @bob:localhost on the standalone container's own PostgreSQL"
log "PASSED"
