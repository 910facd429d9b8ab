#!/usr/bin/env bash
# Regenerate samples/ with the toolkit itself. tests/core/test_samples.py checks that
# the committed files are exactly what these commands produce.
set -euo pipefail
cd "$(dirname "$0")"
for policy in random naive hierarchy idle thinker greedy; do
  dphil-rollout -q -m "scripted:$policy" -n 5 --episodes 3 --seed 0 > "$policy.jsonl"
  dphil-score -q "$policy.jsonl" > "$policy.scored.jsonl"
done
dphil-rollout -q -m scripted:hierarchy -n 5 --episodes 3 --seed 0 --protocol dpbench > dpbench-hierarchy.jsonl
dphil-score -q --shaped dpbench-hierarchy.jsonl > dpbench-hierarchy.shaped.jsonl
