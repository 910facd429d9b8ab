#!/usr/bin/env bash
# Headless Chromium for the `browser` tests (dphil-show's HTML viewer, dphil-stats' report):
# Debian's chromium, driven by Playwright for Python ([test] extra) through its own driver,
# never `playwright install` (that downloads a browser). Fonts so pages render legibly.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if command -v chromium >/dev/null 2>&1 && fc-list 2>/dev/null | grep -qi dejavu; then
  exit 0
fi
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core fonts-liberation fontconfig >/dev/null
chromium --headless --no-sandbox --disable-gpu --version >/dev/null 2>&1 || {
  echo "30-chromium: chromium installed but does not start" >&2
  exit 1
}
