#!/usr/bin/env bash
# Installs the headless browser used by the dashboard's browser test (tests/dashboard/test_browser.py):
# Debian's chromium and chromium-driver, plus a colour emoji font so that the dashboard's status
# badges show in screenshots. Idempotent and quiet: does nothing when all three are present.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] && [ -d /usr/share/fonts/truetype/noto ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-chromium: apt-get not found; install chromium and chromium-driver by hand" >&2
    exit 0  # the browser test skips itself without a browser
fi
apt_install chromium chromium-driver fonts-noto-color-emoji
