#!/bin/sh
# Finish a dphil-rollout grid from cron: one resumable run into OUT, logged to OUT's .log file.
#
#   dphil-cron.sh OUT.jsonl ROLLOUT-OPTIONS...
#   dphil-cron.sh grid.jsonl -m qwen3-14b -m gpt-5.4 -n 5,10,15 --episodes 30
#
# Each run skips the episodes already complete in OUT, retries errored ones, cuts a torn last line
# left by a killed run, and appends the rest; once the grid is complete a run writes nothing. A run
# that starts while the previous one still writes OUT exits at once (status 75; OUT's lock names
# the holder in the log) instead of duplicating its episodes: the next run picks up.
#
# Environment: DPHIL_VENV, the virtual environment with dphil installed (default: .venv in the
# checkout this script belongs to, else dphil-rollout from PATH); DPHIL_LOG, the log file
# (default: OUT with .jsonl replaced by .log). Cron's PATH is minimal, so nothing else is assumed.
set -u
if [ $# -lt 2 ]; then
  echo "usage: dphil-cron.sh OUT.jsonl ROLLOUT-OPTIONS..." >&2
  exit 64
fi
out=$1
shift
log=${DPHIL_LOG:-${out%.jsonl}.log}
here=$(cd "$(dirname "$0")" && pwd)
venv=${DPHIL_VENV:-$here/../../.venv}
if [ -x "$venv/bin/dphil-rollout" ]; then
  rollout=$venv/bin/dphil-rollout
elif rollout=$(command -v dphil-rollout); then
  :
else
  echo "$(date -u +%FT%TZ) dphil-cron.sh: dphil-rollout not found: set DPHIL_VENV" >> "$log"
  exit 69
fi

echo "$(date -u +%FT%TZ) start pid $$: dphil-rollout $* -o $out --resume --wait-lock 0" >> "$log"
"$rollout" "$@" -o "$out" --resume --wait-lock 0 >> "$log" 2>&1
status=$?
case $status in
  0) why="done" ;;
  75) why="not finished: another run holds $out, or some episodes errored; the next run resumes" ;;
  *) why="failed" ;;
esac
echo "$(date -u +%FT%TZ) exit $status pid $$: $why" >> "$log"
exit "$status"
