#!/usr/bin/env bash
# Refresh Debian's package lists once, so the parts after this one can apt-get install by name.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
