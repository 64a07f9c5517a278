#!/usr/bin/env bash
# Installs the Prometheus stack the monitoring tests run for real (tests/prometheus/): Debian's
# prometheus (with promtool) and prometheus-alertmanager. The packages' own services are not used:
# the tests start each binary on a free port with a temporary config and data directory, so the
# services the packages enable are stopped again where systemd runs them. Idempotent and quiet:
# does nothing when the three binaries are present.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if command -v prometheus >/dev/null && command -v promtool >/dev/null && command -v prometheus-alertmanager >/dev/null; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-prometheus: apt-get not found; install prometheus and prometheus-alertmanager by hand" >&2
    exit 0  # the Prometheus tests skip themselves without the binaries (and fail under CI=true)
fi
echo "ensure-prometheus: installing prometheus and prometheus-alertmanager (apt-get)" >&2
# policy-rc.d 101: the packages' post-install scripts must not start their services here.
POLICY=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod +x "$POLICY"
    trap '$SUDO rm -f "$POLICY"' EXIT
fi
apt_install prometheus prometheus-alertmanager
