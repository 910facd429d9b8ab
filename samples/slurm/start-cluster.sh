#!/usr/bin/env bash
# Start a single-node Slurm cluster on this machine: munged, slurmctld and slurmd as plain
# daemons (no systemd), so samples/slurm/grid.sbatch can be tried on a workstation and the
# `slurm` tests have a real cluster. Needs root and Debian's packages:
#
#     apt-get install slurm-wlm munge
#     sudo samples/slurm/start-cluster.sh          # start, or check that it is up (safe to rerun)
#     sudo samples/slurm/start-cluster.sh --stop   # stop the daemons it started (by pid)
#
# It writes $SLURM_CONF (default /etc/slurm/slurm.conf, which every Slurm command reads) and keeps
# state, logs and pid files under $DPHIL_SLURM_STATE (default /var/spool/dphil-slurm). It never
# overwrites a slurm.conf it did not write: on a machine with a real Slurm, leave that one alone.
# The node is this host (`hostname -s`) with the CPUs slurmd detects; jobs run as the user who
# submits them, root included. Quiet on success; on failure it prints the daemon's log.
set -euo pipefail

CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
STATE=${DPHIL_SLURM_STATE:-/var/spool/dphil-slurm}
MARK="# Written by dphil samples/slurm/start-cluster.sh"
NODE=$(hostname -s)

die() { echo "start-cluster.sh: $*" >&2; exit 1; }

# The pid in FILE when that process is alive and is the named program, else nothing.
live_pid() {
  local file=$1 name=$2 pid
  [ -s "$file" ] || return 1
  pid=$(cat "$file")
  [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] && echo "$pid"
}

stop_pid() {
  local file=$1 name=$2 pid
  pid=$(live_pid "$file" "$name") || return 0
  kill "$pid"
  for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
  [ -d "/proc/$pid" ] && kill -9 "$pid"
  rm -f "$file"
}

stop_all() {
  stop_pid "$STATE/slurmd.pid" slurmd
  stop_pid "$STATE/slurmctld.pid" slurmctld
  if [ -e "$STATE/munged.ours" ]; then
    stop_pid /run/munge/munged.pid munged
    rm -f "$STATE/munged.ours"
  fi
}

if [ "${1:-}" = "--stop" ]; then
  stop_all
  exit 0
fi
[ $# -eq 0 ] || die "usage: start-cluster.sh [--stop]"
[ "$(id -u)" -eq 0 ] || die "run me as root (slurmd starts jobs as their users)"
for prog in munged slurmctld slurmd sinfo; do
  command -v "$prog" >/dev/null || die "$prog not found: apt-get install slurm-wlm munge"
done

# --- munge: Slurm's authentication. A running munged (systemd's, say) is used as it is. ---
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [ ! -s /etc/munge/munge.key ]; then
    install -d -o munge -g munge -m 0700 /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key
  fi
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
  mkdir -p "$STATE" && touch "$STATE/munged.ours"
  runuser -u munge -- munged || die "munged did not start: $(tail -3 /var/log/munge/munged.log 2>/dev/null)"
  for _ in $(seq 50); do munge -n | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null 2>&1 || die "munged does not answer"
fi

# --- slurm.conf for one node: this host, as slurmd sees it, with less memory than it has. ---
hardware=$(slurmd -C | head -1 | sed -e 's/^NodeName=[^ ]* //' -e 's/ *RealMemory=[0-9]*//')
memory=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.8 }' /proc/meminfo)
want=$(cat <<EOF
$MARK: a single-node cluster on this machine.
ClusterName=dphil
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
# Finished jobs stay visible to scontrol/squeue for 5 minutes (there is no accounting database).
MinJobAge=300
KillWait=10
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
NodeName=$NODE NodeAddr=127.0.0.1 $hardware RealMemory=$memory State=UNKNOWN
PartitionName=main Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
)

if [ -e "$CONF" ] && ! head -1 "$CONF" | grep -qF "$MARK"; then
  die "$CONF exists and was not written by this script; set SLURM_CONF to another path"
fi
if [ ! -e "$CONF" ] || [ "$(cat "$CONF")" != "$want" ]; then
  stop_pid "$STATE/slurmd.pid" slurmd   # they run on the old configuration
  stop_pid "$STATE/slurmctld.pid" slurmctld
  mkdir -p "$(dirname "$CONF")"
  printf '%s\n' "$want" > "$CONF.tmp" && mv "$CONF.tmp" "$CONF"
fi
export SLURM_CONF=$CONF

# --- the daemons, unless they are running already ---
mkdir -p "$STATE/slurmctld" "$STATE/slurmd"
if ! live_pid "$STATE/slurmctld.pid" slurmctld >/dev/null; then
  slurmctld || die "slurmctld did not start: $(tail -5 "$STATE/slurmctld.log" 2>/dev/null)"
fi
if ! live_pid "$STATE/slurmd.pid" slurmd >/dev/null; then
  slurmd || die "slurmd did not start: $(tail -5 "$STATE/slurmd.log" 2>/dev/null)"
fi

# --- wait until the node takes jobs (idle, or busy with jobs from an earlier start) ---
for _ in $(seq 600); do
  node_state=$(sinfo -h -N -n "$NODE" -o %T 2>/dev/null || true)
  case $node_state in
    idle|mixed|allocated|completing) exit 0 ;;
    down*|drain*) scontrol update NodeName="$NODE" State=RESUME 2>/dev/null || true ;;
  esac
  sleep 0.1
done
die "node $NODE is '${node_state:-unknown}' after 60 s; logs: $STATE/slurmctld.log $STATE/slurmd.log
$(tail -5 "$STATE/slurmctld.log" "$STATE/slurmd.log" 2>/dev/null)"
