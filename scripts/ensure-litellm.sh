#!/usr/bin/env bash
# Installs the LiteLLM proxy for the gateway test (tests/deploy/test_litellm.py) into a virtual
# environment of its own, ${DRAFTWATCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/draftwatch}/litellm/VERSION/,
# because litellm[proxy] pins older openai, huggingface-hub, rich, websockets and python-dateutil than
# the project's venv holds: installed there it would downgrade them. pip only, so the user's pip
# configuration and mirrors apply. draftwatch itself is not installed there: its integration
# (monitor/gateways/litellm*.py) needs only litellm and httpx, and the proxy imports it from the
# checkout through PYTHONPATH. A second run is a no-op once an install has completed. Prints the
# venv's litellm command last.
set -euo pipefail

# 1.106.12: the newest release whose [proxy] extra resolves from PyPI (1.108 and later pin
# litellm-proxy / litellm-proxy-extras builds that were never published there), and below 1.107.0,
# the release line reported compromised. An exact pin, so a bad upload cannot come in unasked.
LITELLM_VERSION="${LITELLM_VERSION:-1.106.12}"

PYTHON="${PYTHON:-python3}"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PREFIX="$CACHE/litellm/$LITELLM_VERSION"
VENV="$PREFIX/venv"
COMMAND="$VENV/bin/litellm"
# Written once the installed proxy has imported: importing it again on every run takes seconds.
STAMP="$VENV/.draftwatch-installed"

say() { echo "ensure-litellm: $*" >&2; }

installed() {
    [ -x "$COMMAND" ] && [ -f "$STAMP" ]
}

main() {
    if installed; then
        echo "$COMMAND"
        exit 0
    fi
    if ! "$PYTHON" -c "import venv" >/dev/null 2>&1; then
        say "no python with venv at $PYTHON (set PYTHON)"
        exit 1
    fi
    mkdir -p "$PREFIX"
    wait_turn "$PREFIX/.lock"
    if installed; then
        echo "$COMMAND"
        exit 0
    fi
    # A venv left half-made by an interrupted run is made again from nothing.
    rm -rf "$VENV"
    say "installing litellm[proxy]==$LITELLM_VERSION into $VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "litellm[proxy]==$LITELLM_VERSION"
    if ! "$VENV/bin/python" -c "import litellm.proxy.proxy_server" >/dev/null 2>&1; then
        say "litellm $LITELLM_VERSION installed but its proxy does not import"
        exit 1
    fi
    touch "$STAMP"
    echo "$COMMAND"
}

main "$@"; exit
