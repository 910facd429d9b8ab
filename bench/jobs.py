"""dphil's installed commands run from the CPU experiments (bench/train_curve.py, bench/recipes.py).

Where the commands are, paths relative to the repository (every command runs there, and the
records hold on any checkout), a few commands at a time with none left running if the
experiment stops, and the JSONL the commands write read back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dphil.io.console_scripts import locate

ROOT = Path(__file__).resolve().parent.parent


def rel(path: Path) -> str:
    """Paths in records relative to the repository, so they hold on any checkout."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def tool(name: str) -> str:
    found = locate(name)
    if not found:
        sys.exit(f"{name} not found: pip install -e . in this environment")
    return found


def run_jobs(jobs: list[tuple[str, list[str]]], width: int, logs: Path) -> dict[str, float]:
    """Run commands `width` at a time (cwd = repository root); stop on the first failure."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    pending, running, took = list(jobs), {}, {}
    try:
        _run_jobs(pending, running, took, width, logs, env)
    except BaseException:  # interrupted or killed: leave no command running behind us
        for proc, _, _ in running.values():
            proc.terminate()
        for proc, _, _ in running.values():
            proc.wait()
        raise
    return took


def _run_jobs(pending: list, running: dict, took: dict, width: int, logs: Path, env: dict) -> None:
    while pending or running:
        while pending and len(running) < width:
            name, cmd = pending.pop(0)
            log = (logs / f"{name}.log").open("w")
            running[name] = (subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log, env=env), time.monotonic(), log)
            print(f"  started {name}", file=sys.stderr)
        time.sleep(1)
        for name, (proc, started, log) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[name]
            took[name] = time.monotonic() - started
            if proc.returncode != 0:
                for other, _, _ in running.values():
                    other.terminate()
                tail = (logs / f"{name}.log").read_text().splitlines()[-15:]
                sys.exit(f"{name} failed ({proc.returncode}):\n" + "\n".join(tail))
            print(f"  {name} done in {took[name]:.0f}s", file=sys.stderr)


def check(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc.stdout


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
