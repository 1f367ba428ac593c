# syntax=docker/dockerfile:1
#
# The `sluice` binary in a small runtime image.
#
#   docker build -t sluice:local .
#   docker run --rm sluice:local --help
#   docker run --rm -e SLUICE_BROKERS=kafka:9092 -e SLUICE_SYSDB=postgres://... -p 9464:9464 sluice:local process
#
# Stage 1 builds with the Rust toolchain (rdkafka compiles its bundled librdkafka, which
# needs OpenSSL headers and pkg-config for the `ssl` feature); stage 2 is Debian slim with
# only the shared libraries the binary links (libssl3) and CA certificates (SASL_SSL
# brokers, TLS to PostgreSQL). The replica runs as an unprivileged user.
# Configuration: SLUICE_* environment variables and/or a TOML file given with
# SLUICE_CONFIG (see src/config.rs, deploy/kubernetes/configmap.yaml).

ARG RUST_VERSION=1.89
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends pkg-config libssl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The cache mounts keep the registry and target dir between builds (BuildKit); the binary
# is copied out of the cached target dir.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin sluice \
    && install -D -m 0755 target/release/sluice /out/sluice \
    && strip --strip-debug /out/sluice

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libssl3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 sluice \
    && useradd --system --uid 10001 --gid sluice --home-dir /var/lib/sluice --create-home --shell /usr/sbin/nologin sluice
COPY --from=build /out/sluice /usr/local/bin/sluice
USER 10001:10001
# The default SQLite sysdb (sqlite://sluice.db) lands here; replicas on several machines
# use PostgreSQL (SLUICE_SYSDB).
WORKDIR /var/lib/sluice
# /metrics, /healthz, /readyz and the API. The binary's default listen address is
# 127.0.0.1:9464, unreachable from outside a container, hence 0.0.0.0 here: `sluice process`
# then refuses to start (exit code 2) without SLUICE_READ_TOKEN / SLUICE_ADMIN_TOKEN, or
# SLUICE_HTTP__ALLOW_UNAUTHENTICATED=true (docs/operations.md, "Roles and tokens").
ENV SLUICE_HTTP=0.0.0.0:9464
EXPOSE 9464
ENTRYPOINT ["sluice"]
CMD ["process"]
