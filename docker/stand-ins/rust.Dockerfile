# Local stand-in for the public `rust:1-bookworm` image, which cannot be pulled on a machine
# without registry access: Debian bookworm, a C compiler (ring builds C code) and the host's
# Rust toolchain, at the paths the real image uses. docker/test.sh builds it only when no
# image of that name exists; the build context is the toolchain it copies in.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev make pkg-config \
    && rm -rf /var/lib/apt/lists/*
COPY toolchain /usr/local/rustup/toolchains/local
# The host's CA bundle: cargo then trusts whatever certificates this machine's route to
# crates.io presents, as cargo on the host does.
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:/usr/local/rustup/toolchains/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LABEL org.myelin.stand-in="rust:1-bookworm, built by docker/test.sh from the host's toolchain"
