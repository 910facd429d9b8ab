"""Running `dphil-score`, and the reward as a command asks for it (`dphil-score`, `dphil-train`).

`RewardRequest` is the one place a reward asked for on a command line is
checked and made into a `RewardSpec`: both commands that take the reward
options go through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from dphil.io.console import Console, output_name
from dphil.io.errors import DataError, UsageError
from dphil.io.jsonl import RecordReader, RecordWriter
from dphil.scoring.reward import TERMS, RewardSpec
from dphil.scoring.score import Scorer
from dphil.scoring.summary import Summary


@dataclass(frozen=True)
class RewardRequest:
    """A reward as asked for: a variant (None: paper), or `shaped`, and the weights, not yet checked."""

    variant: str | None = None
    shaped: bool = False  # the same as variant "shaped"
    alpha: float = TERMS[0].default
    beta: float = TERMS[1].default
    gamma: float = TERMS[2].default
    delta: float = TERMS[3].default
    min_meals: int = 1

    def spec(self) -> RewardSpec:
        """The RewardSpec asked for, or a UsageError (exit 64) saying what is wrong with it."""
        if self.shaped and self.variant == "paper":
            raise UsageError("--shaped contradicts --reward paper")
        try:
            return RewardSpec(
                variant="shaped" if self.shaped else (self.variant or "paper"),
                alpha=self.alpha,
                beta=self.beta,
                gamma=self.gamma,
                delta=self.delta,
                min_meals=self.min_meals,
            )
        except ValueError as e:
            raise UsageError(str(e)) from None


@dataclass(frozen=True)
class ScoreRequest:
    """What `dphil-score` was asked for (see commands/score.py for the meaning of each option)."""

    inputs: tuple[str, ...] = ()  # files, or - for stdin; none: stdin
    reward: RewardRequest = field(default_factory=RewardRequest)
    trust_outcome: bool = False
    output: str | None = None
    on_error: str = "fail"  # fail (exit 65 at the first bad line) or skip


def run_score(req: ScoreRequest, console: Console) -> int:
    """Score every episode of the inputs into the output, line by line; return the exit status."""
    scorer = Scorer(req.reward.spec(), trust_outcome=req.trust_outcome)
    reader = RecordReader(req.inputs, on_error=req.on_error, warn=console.warn)
    # The closing table is for a person at a terminal: logs and pipelines get records only.
    summary = Summary() if console.show_progress else None
    written = 0
    with RecordWriter(req.output) as writer:
        for record in reader:
            try:
                scored = scorer.line(record, reader.raw)
            except DataError as e:
                reader.reject(e)
                continue
            writer.write_line(scored)
            written += 1
            if summary is not None:
                summary.add(orjson.loads(scored))
    if reader.skipped:
        console.error(f"skipped {reader.skipped} bad record(s)")
    if summary is not None and written:
        console.report(summary.render())
        where = output_name(req.output)
        console.report(f"wrote {written} scored episode(s) to {where}")
    return 0
