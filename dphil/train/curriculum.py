"""Which table sizes a training step uses: fixed, a staged schedule, or advance-on-reward.

The study trained at one table size; a curriculum across sizes is one of the
fixes its authors proposed and did not try. `5:6,10:5,15:5` trains 6 steps at
N=5, then 5 at N=10, then 5 at N=15 (the last stage continues if the run is
longer). `auto` starts at the first size of `-n` and moves to the next one once
the smoothed training reward reaches `advance_at`. The state is a small dict
stored in every checkpoint record, so a resumed run picks up where it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from dphil.io.errors import UsageError


@dataclass(frozen=True)
class Curriculum:
    """`kind` is fixed, staged or auto; `stages` are (sizes, steps) pairs (steps None = open)."""

    kind: str
    stages: tuple[tuple[tuple[int, ...], int | None], ...]
    advance_at: float | None = None
    smoothing: float = 0.5

    @property
    def planned_steps(self) -> int | None:
        """Total steps a staged curriculum describes (None for fixed and auto)."""
        if self.kind != "staged":
            return None
        return sum(s for _, s in self.stages if s is not None)

    @property
    def all_sizes(self) -> tuple[int, ...]:
        seen: list[int] = []
        for sizes, _ in self.stages:
            for n in sizes:
                if n not in seen:
                    seen.append(n)
        return tuple(seen)

    def initial_state(self) -> dict:
        return {"stage": 0, "smoothed_reward": None}

    def sizes(self, step: int, state: dict) -> tuple[int, ...]:
        """Table sizes for `step` (1-based) given the state left by the previous step."""
        if self.kind == "staged":
            done = 0
            for sizes, steps in self.stages:
                done += steps or 0
                if step <= done:
                    return sizes
            return self.stages[-1][0]
        return self.stages[min(state["stage"], len(self.stages) - 1)][0]

    def advance(self, state: dict, train_reward: float) -> dict:
        """The state after a step that scored `train_reward` on average."""
        prev = state.get("smoothed_reward")
        smoothed = train_reward if prev is None else (self.smoothing * prev + (1.0 - self.smoothing) * train_reward)
        stage = state.get("stage", 0)
        if self.kind == "staged":
            return {"stage": stage, "smoothed_reward": smoothed}
        if (
            self.kind == "auto"
            and self.advance_at is not None
            and smoothed >= self.advance_at
            and stage + 1 < len(self.stages)
        ):
            # A new size starts from a fresh average: the old one says nothing about it.
            return {"stage": stage + 1, "smoothed_reward": None}
        return {"stage": stage, "smoothed_reward": smoothed}


def parse_curriculum(
    text: str | None,
    sizes: tuple[int, ...],
    *,
    advance_at: float | None = None,
    smoothing: float = 0.5,
) -> Curriculum:
    """Parse `--curriculum` (None, `auto` or `N:steps,...`) against the `-n` sizes."""
    if not 0.0 <= smoothing < 1.0:
        raise UsageError("--smoothing must be in [0, 1)")
    if text is None or text.strip() == "":
        if advance_at is not None:
            raise UsageError("--advance-at needs --curriculum auto")
        return Curriculum("fixed", ((tuple(sizes), None),))
    text = text.strip()
    if text == "auto":
        if advance_at is None:
            raise UsageError("--curriculum auto needs --advance-at REWARD")
        if len(sizes) < 2:
            raise UsageError("--curriculum auto needs several sizes, e.g. -n 5,10,15")
        return Curriculum("auto", tuple(((n,), None) for n in sizes), advance_at, smoothing)
    if advance_at is not None:
        raise UsageError("--advance-at only applies to --curriculum auto")
    stages: list[tuple[tuple[int, ...], int | None]] = []
    for part in text.split(","):
        n_text, sep, steps_text = part.strip().partition(":")
        try:
            n, steps = int(n_text), int(steps_text)
        except ValueError:
            n = steps = -1
        if not sep or n < 2 or steps < 1:
            raise UsageError(
                f"--curriculum: bad stage {part.strip()!r} (expected N:STEPS with N >= 2 and STEPS >= 1, "
                "e.g. 5:6,10:5,15:5, or auto)"
            )
        stages.append(((n,), steps))
    return Curriculum("staged", tuple(stages))
