#!/usr/bin/env bash
# Slurm for the `slurm` tests: Debian's slurm-wlm and munge, then a single-node cluster on this
# machine (samples/slurm/start-cluster.sh: munged, slurmctld, slurmd as daemons, no systemd).
# Safe to rerun: installed packages and a running cluster are left as they are.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  # The packages' own service start-up would race start-cluster.sh: hold it off while installing.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  log=$(mktemp)
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
  rm -f "$log"
fi
bash "$(dirname "$0")/../../samples/slurm/start-cluster.sh"
