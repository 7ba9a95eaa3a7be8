#!/usr/bin/env bash
# Makes a throwaway test CA and one leaf certificate signed by it, for loopback federation
# tests (docs: FEDERATION.md §4).
#
#   tests/federation/make_ca.sh DIR
#
# Writes into DIR (created if needed; earlier files there are replaced):
#   ca.pem, ca.key     the CA (CA:TRUE), to be trusted by every server under test;
#   cert.pem, key.pem  the leaf every server presents: CN=localhost, SAN DNS:localhost,
#                      IP:127.0.0.1, IP:::1, CA:FALSE, extendedKeyUsage serverAuth.
# The leaf must not be the CA itself: rustls/webpki refuses a CA:TRUE certificate used as
# an end entity.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
dir=$1
mkdir -p "$dir"
cd "$dir"
rm -f ca.pem ca.key ca.srl cert.pem key.pem leaf.csr leaf.ext

# openssl reports progress on stderr: show it only when a step fails.
quiet() {
    local out
    if ! out=$("$@" 2>&1); then
        printf '%s\n' "$out" >&2
        return 1
    fi
}

quiet openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
    -keyout ca.key -out ca.pem -subj "/CN=federation test CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign"
quiet openssl req -newkey rsa:2048 -nodes -sha256 -keyout key.pem -out leaf.csr \
    -subj "/CN=localhost"
printf '%s\n' "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth" \
    "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1" >leaf.ext
quiet openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
    -sha256 -extfile leaf.ext -out cert.pem
rm -f leaf.csr leaf.ext ca.srl

# Fail here, not in a server's TLS handshake, if the chain does not hold.
quiet openssl verify -CAfile ca.pem cert.pem
echo "test CA and leaf certificate in $(pwd)"
