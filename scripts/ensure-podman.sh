#!/usr/bin/env bash
# Prepares what the image test (tests/deploy/test_image.py) builds and runs the Containerfile with:
# Debian's podman (with runc, netavark and iptables, which netavark needs) and a local base image.
# No image registry is assumed reachable, so the base is made from Debian's packages with mmdebstrap
# (python3, its venv module, CA certificates) and imported as localhost/draftwatch-base:<suite>; it
# is cached under ${DRAFTWATCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/draftwatch}/image/ with the
# containers.conf the test points podman at (CONTAINERS_CONF): no raised ulimits, which some machines
# refuse, and runc, as crun refuses hybrid cgroups. Idempotent: a second run only checks.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DIR="$CACHE/image"
SUITE="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
BASE="localhost/draftwatch-base:$SUITE"

missing=""
for tool in podman runc mmdebstrap iptables; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || missing="$missing $tool"
done
if [ -n "$missing" ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "ensure-podman: apt-get not found; install podman, runc, netavark, iptables and mmdebstrap by hand" >&2
        exit 0  # the image test skips itself without podman (and fails under CI=true)
    fi
    echo "ensure-podman: installing$missing (apt)" >&2
    apt_install podman runc netavark aardvark-dns iptables mmdebstrap uidmap
fi

mkdir -p "$DIR"
CONF="$DIR/containers.conf"
if [ ! -s "$CONF" ]; then
    printf '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n' >"$CONF"
fi
export CONTAINERS_CONF="$CONF"

if ! podman image exists "$BASE"; then
    TAR="$DIR/base-$SUITE.tar"
    if [ ! -s "$TAR" ]; then
        # The host's own apt sources, so that its mirrors are the ones used.
        SOURCES=""
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
            [ -s "$f" ] && grep -qE '^(deb |URIs:)' "$f" && grep -q debian "$f" && SOURCES="$SOURCES $f"
        done
        echo "ensure-podman: building the base image from Debian $SUITE (mmdebstrap, about 30 s)" >&2
        # shellcheck disable=SC2086
        mmdebstrap --quiet --variant=minbase --format=tar \
            --include=python3,python3-venv,ca-certificates "$SUITE" "$TAR.part" $SOURCES
        mv "$TAR.part" "$TAR"
    fi
    podman import --quiet \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        "$TAR" "$BASE" >/dev/null
fi
echo "$BASE"
