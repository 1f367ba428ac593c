#!/usr/bin/env bash
# Installs (idempotently) the Debian packages Sluice's build, scripts and tests need,
# and checks the toolchains that cannot come from apt here (Rust via rustup, Java 17).
#
#   deploy/local/deps.sh            everything the test command needs, helm included
#   deploy/local/deps.sh --build    only what building and the demo need (no PostgreSQL,
#                                   Prometheus, kcat, Python venv or helm)
set -euo pipefail

build_only=
case "${1:-}" in
    --build) build_only=1 ;;
    "") ;;
    *) echo "usage: deploy/local/deps.sh [--build]" >&2; exit 2 ;;
esac
need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# Build: rdkafka's bundled librdkafka with the `ssl` feature needs OpenSSL headers and
# pkg-config; zstd/zlib are compiled from the crates. Scripts/tests: kcat, python venv,
# PostgreSQL, Prometheus (the service scripts install those two themselves too).
pkgs=(build-essential pkg-config libssl-dev curl procps python3)
[ -n "$build_only" ] || pkgs+=(kcat python3-venv postgresql prometheus)
for p in "${pkgs[@]}"; do
    have_pkg "$p" || need+=("$p")
done
if ((${#need[@]})); then
    echo "deps.sh: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends "${need[@]}" >/tmp/sluice-apt.log 2>&1; then
        apt-get update >/tmp/sluice-apt-update.log 2>&1 || true
        apt-get install -y --no-install-recommends "${need[@]}" >/tmp/sluice-apt.log 2>&1 ||
            { echo "deps.sh: apt-get install ${need[*]} failed; see /tmp/sluice-apt.log" >&2; exit 1; }
    fi
fi
command -v cargo >/dev/null || { echo "deps.sh: cargo not found. Install Rust: https://rustup.rs (rustup toolchain install stable)" >&2; exit 1; }
# scripts/test.sh checks formatting and lints.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    rustup component add rustfmt clippy >&2 ||
        { echo "deps.sh: cargo fmt / cargo clippy missing. Fix: rustup component add rustfmt clippy" >&2; exit 1; }
fi
command -v java >/dev/null || { echo "deps.sh: java not found. Fix: apt-get install -y openjdk-17-jdk-headless" >&2; exit 1; }
command -v mvn >/dev/null || { echo "deps.sh: mvn not found. Fix: apt-get install -y maven" >&2; exit 1; }
[ -z "$build_only" ] || exit 0
# helm, for deploy/validate.sh's checks of the chart deploy/helm/sluice: built from the Go
# module proxy into the git-ignored .local/bin (a few minutes on a cold module cache).
# Only the test command needs it, never the demo. Without CI a failure only warns (validate.sh then skips the chart); with CI set it fails.
HELM_VERSION=v3.22.0
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# (`helm version` of a go-installed helm says only v3.22; the module version is exact.)
if ! go version -m "$repo/.local/bin/helm" 2>/dev/null | grep -Eq "^[[:space:]]+mod[[:space:]]+helm.sh/helm/v3[[:space:]]+${HELM_VERSION}[[:space:]]"; then
    echo "deps.sh: building helm $HELM_VERSION into $repo/.local/bin (go install; log /tmp/sluice-helm.log)" >&2
    if ! { command -v go >/dev/null && GOBIN="$repo/.local/bin" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"; } >/tmp/sluice-helm.log 2>&1; then
        tail -n 5 /tmp/sluice-helm.log >&2 || true
        if [ -n "${CI:-}" ] && [ "${CI:-}" != false ]; then
            echo "deps.sh: could not build helm $HELM_VERSION (Go: https://go.dev/dl; is the Go module proxy reachable?)" >&2; exit 1
        fi
        echo "deps.sh: WARNING: no helm $HELM_VERSION: deploy/validate.sh will skip the Helm chart" >&2
    fi
fi
