"""What the recipe experiment compares: its sizes, the trained recipes and the test arms.

Data and pure functions, apart from bench/recipes.py (which runs them) so that the plan
reads on one screen: the sizes per variant (and the seeds their ranges name), each recipe's
reward, credit mode and table sizes, and which checkpoint of which recipe each test arm plays.
"""

from __future__ import annotations

SIZES = {
    # steps, groups, group size, rounds, seeds, val seeds, test seeds per N, val every
    "full": dict(
        steps=8,
        groups=2,
        group_size=6,
        rounds=6,
        seeds="0,1,2",
        val_seeds="100000-100005",
        test_seeds="200000-200031",
        val_every=2,
        ablations="other,episode,paper,fixed5,last",
    ),
    "smoke": dict(
        steps=2,
        groups=2,
        group_size=2,
        rounds=3,
        seeds="0",
        val_seeds="100000-100001",
        test_seeds="200000-200003",
        val_every=1,
        ablations="other,last",
    ),
    # The study's step on Qwen2.5-Coder-0.5B-Instruct on a CPU: fewer steps and test episodes.
    "real": dict(
        steps=8,
        groups=2,
        group_size=3,
        rounds=5,
        seeds="0,1,2",
        val_seeds="100000-100003",
        test_seeds="200000-200029",
        val_every=2,
        ablations="none",
        n="5",
    ),
    # The study's sizes, on a GPU through ART: Qwen3-14B, N=5, 5 rounds, 16 steps of 2x3.
    "gpu": dict(
        steps=16,
        groups=2,
        group_size=3,
        rounds=5,
        seeds="0,1,2",
        val_seeds="100000-100015",
        test_seeds="200000-200029",
        val_every=2,
        ablations="other,episode,paper,fixed5,last",
    ),
}
ABLATIONS = ("other", "episode", "paper", "fixed5", "last")


def recipes(steps: int, best: str | None, ablations: set[str], credit: str = "val") -> dict[str, dict]:
    """The trained recipes; those using the chosen advantage mode only once `best` is known.

    With the credit mode fixed in advance (`credit` philosopher or step) only that mode's dphil
    runs are trained, and the other's only for the 'other' ablation.
    """
    half = max(1, steps // 2)
    curriculum = ["--curriculum", f"3:{half},5:{steps - half}"]
    fixed5 = ["-n", "5"]
    out = {
        "study": dict(reward="paper", advantage="episode", sizes=fixed5),
        "dphil-philosopher": dict(reward="shaped", advantage="philosopher", sizes=curriculum),
        "dphil-step": dict(reward="shaped", advantage="step", sizes=curriculum),
    }
    if credit != "val" and "other" not in ablations:
        out = {k: v for k, v in out.items() if k in ("study", f"dphil-{credit}")}
    if "episode" in ablations:
        out["abl-episode"] = dict(reward="shaped", advantage="episode", sizes=curriculum)
    if best and "paper" in ablations:
        out[f"abl-paper-{best}"] = dict(reward="paper", advantage=best, sizes=curriculum, after_choice=True)
    if best and "fixed5" in ablations:
        out[f"abl-fixed5-{best}"] = dict(reward="shaped", advantage=best, sizes=fixed5, after_choice=True)
    return out


# The test arms that play the chosen credit mode: their runs and test files name the mode, so
# a choice made again over more seeds (bench/recipes.py, choose) never mixes two modes in an arm.
BY_MODE = frozenset({"dphil", "abl-paper", "abl-fixed5", "abl-last"})


def test_file(arm: str, best: str) -> str:
    """The arm's test-episode journal in the work directory."""
    return f"test-{arm}-{best}.jsonl" if arm in BY_MODE else f"test-{arm}.jsonl"


def arms(best: str, ablations: set[str]) -> dict[str, tuple[str, str]]:
    """Test arm -> (trained recipe, selection rule)."""
    other = "step" if best == "philosopher" else "philosopher"
    every = {
        "study": ("study", "last"),
        "dphil": (f"dphil-{best}", "val"),
        f"abl-{other}": (f"dphil-{other}", "val"),
        "abl-episode": ("abl-episode", "val"),
        "abl-paper": (f"abl-paper-{best}", "val"),
        "abl-fixed5": (f"abl-fixed5-{best}", "val"),
        "abl-last": (f"dphil-{best}", "last"),
    }
    wanted = {
        "other": f"abl-{other}",
        "episode": "abl-episode",
        "paper": "abl-paper",
        "fixed5": "abl-fixed5",
        "last": "abl-last",
    }
    keep = {"study", "dphil", *(wanted[a] for a in ablations)}
    return {k: v for k, v in every.items() if k in keep}


def expand(text: str) -> list[int]:
    """The seeds a size's range names (`100000-100005`, `0,1,2`), as dphil-rollout reads them."""
    from dphil.rollout.grid import parse_int_list

    return parse_int_list(text, "seeds")
