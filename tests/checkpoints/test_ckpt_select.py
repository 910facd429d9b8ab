"""dphil-ckpt-select: rules, ties, gaps, errors, plot, export and merge.

Validation episodes are played by the real engine with scripted philosophers
and scored by the real reward: at checkpoint step s, h(s) of the k held-out
seeds are played by `hierarchy` (never deadlocks, eats) and the rest by `naive`
(deadlocks), on the same seeds at every step, so the validation curve follows
h(s) exactly when hierarchy beats naive on every seed (checked, not assumed).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from dphil.checkpoints.record import load_checkpoints, located, read_inputs
from dphil.checkpoints.selection import select
from dphil.core.episode import play
from dphil.core.policies import get_policy
from dphil.core.records import EpisodeConfig
from dphil.io.errors import DataError, NoInputError
from dphil.scoring.reward import RewardSpec, score
from tests.support.commands import command_path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schemas" / "checkpoint.schema.json"
# The published shape: training reward rising to step 9 of 16 (steps 0..15), then falling.
STUDY_H = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 8, 7, 6, 5, 4, 3]
STUDY_TRAIN = [0.20, 0.28, 0.35, 0.41, 0.47, 0.52, 0.58, 0.63, 0.69, 0.74, 0.70, 0.66, 0.61, 0.57, 0.52, 0.48]
SEEDS = list(range(1000, 1010))


# -- helpers ---------------------------------------------------------------------------


def episode(
    policy: str, seed: int, step: int, *, run: str | None = "r1", spec: RewardSpec | None = None, scored: bool = True
) -> dict:
    """One real episode at N=5, R=5, tagged with its checkpoint, scored by the real reward."""
    variant = {"checkpoint_step": step, **({"run": run} if run is not None else {})}
    config = EpisodeConfig(model=f"scripted:{policy}", n=5, rounds=5, seed=seed, variant=variant)
    rec = play(config, get_policy(policy))
    if scored:
        reward, metrics = score(
            spec or RewardSpec("shaped"),
            protocol=rec["protocol"],
            n=rec["n"],
            rounds=rec["rounds"],
            meals=rec["meals"],
            deadlock=rec["deadlock"],
            deadlock_round=rec["deadlock_round"],
            rounds_played=rec["rounds_played"],
            turns=rec["turns"],
        )
        rec["reward"], rec["metrics"] = reward, metrics
    return rec


def val_curve(h: list[int], *, run: str | None = "r1", seeds: list[int] = SEEDS, **kw) -> list[dict]:
    """Validation episodes for steps 0..len(h)-1: h[s] hierarchy episodes, the rest naive."""
    out = []
    for step, good in enumerate(h):
        for j, seed in enumerate(seeds):
            out.append(episode("hierarchy" if j < good else "naive", seed, step, run=run, **kw))
    return out


def ckpt(step: int, train: float | None = None, *, run: str | None = "r1", path: str | None = None, **extra) -> dict:
    rec = {"kind": "checkpoint", "step": step}
    if run is not None:
        rec["run"] = run
    if path is not None:
        rec["path"] = path
    if train is not None:
        rec["train_reward"] = train
    rec.update(extra)
    return rec


def study_ckpts(**extra) -> list[dict]:
    return [ckpt(s, r, **extra) for s, r in enumerate(STUDY_TRAIN)]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def items(records: list[dict], source: str = "t.jsonl"):
    return [(source, i, r) for i, r in enumerate(records, start=1)]


def run_cli(*args: str, stdin: str | None = None, cwd: Path | None = None, pre: str = ""):
    """The installed command in a subprocess, through real pipes.

    `pre` is Python run first in the same interpreter (to hide a module); then the
    command's entry point is called directly instead of through the console script.
    """
    if pre:
        argv = [sys.executable, "-c", pre + "from dphil.commands.ckpt_select import main; main()"]
    else:
        argv = [command_path("dphil-ckpt-select")]
    return subprocess.run([*argv, *args], input=stdin, capture_output=True, text=True, cwd=cwd, timeout=120)


def out_records(proc) -> list[dict]:
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture(scope="module")
def study_val() -> list[dict]:
    eps = val_curve(STUDY_H)
    # Precondition of the design: hierarchy beats naive on every seed, so the curve follows h.
    for seed in SEEDS:
        good = episode("hierarchy", seed, 0)["reward"]["total"]
        bad = episode("naive", seed, 0)["reward"]["total"]
        assert good > bad, (seed, good, bad)
    return eps


# -- the study's shape under each rule ----------------------------------------------------


def test_study_shape_by_train_picks_the_peak_not_the_last_step():
    sel = select(read_inputs(items(study_ckpts())), by="train")
    [chosen] = sel.chosen
    assert chosen["step"] == 9
    s = chosen["selection"]
    assert (s["by"], s["metric"], s["score"], s["candidates"]) == ("train", "reward", 0.74, 16)
    assert s["last_step"] == 15 and s["last_score"] == 0.48
    # Ten steps (5..14) score above 0.48; none ties it.
    assert s["last_rank"] == 1 + sum(1 for v in STUDY_TRAIN if v > 0.48) == 11
    assert s["ci"] is None  # no spread known for a bare train_reward


def test_study_shape_by_last_reproduces_the_recipe():
    sel = select(read_inputs(items(study_ckpts())), by="last")
    assert [r["step"] for r in sel.chosen] == [15]
    s = sel.chosen[0]["selection"]
    assert s["last_rank"] == 1 and s["score"] == 0.48 and s["rule"] is None


def test_study_shape_by_val_is_the_default_with_episodes(study_val):
    sel = select(read_inputs(items(study_ckpts() + study_val)))
    [chosen] = sel.chosen
    s = chosen["selection"]
    assert s["by"] == "val" and chosen["step"] == 9
    step9 = [e["reward"]["total"] for e in study_val if e["checkpoint_step"] == 9]
    step15 = [e["reward"]["total"] for e in study_val if e["checkpoint_step"] == 15]
    assert s["n"] == 10 and math.isclose(s["score"], statistics.fmean(step9))
    assert math.isclose(s["last_score"], statistics.fmean(step15))
    assert s["last_step"] == 15 and s["last_score"] < s["score"]
    # Ranks follow h: 15 has h=3, beaten by steps with h>3 (3..14 minus none) -> 12 better.
    better = sum(1 for h in STUDY_H if h > STUDY_H[15])
    ties_earlier = sum(1 for st, h in enumerate(STUDY_H) if h == STUDY_H[15] and st < 15)
    assert s["last_rank"] == better + ties_earlier + 1


def test_val_ci_is_the_t_interval_of_the_mean(study_val):
    from scipy.stats import t

    sel = select(read_inputs(items(study_ckpts() + study_val)), by="val", top=16)
    rec = next(r for r in sel.chosen if r["step"] == 12)
    values = [e["reward"]["total"] for e in study_val if e["checkpoint_step"] == 12]
    m, sd = statistics.fmean(values), statistics.stdev(values)
    half = t.ppf(0.975, len(values) - 1) * sd / math.sqrt(len(values))
    lo, hi = rec["selection"]["ci"]
    assert math.isclose(lo, m - half) and math.isclose(hi, m + half)
    assert math.isclose(rec["selection"]["se"], sd / math.sqrt(len(values)))


def test_one_se_on_train_records_picks_the_earliest_within_one_se():
    # train_reward_std is the population sd (as dphil-train writes it): sample sd =
    # 0.15 * sqrt(4/3), se = sample sd / sqrt(4) = 0.0866; best 0.80 at step 9 -> threshold
    # 0.7134; step 6 (0.72) is the earliest above it, step 5 (0.70) is not.
    train = [0.1, 0.2, 0.3, 0.5, 0.6, 0.70, 0.72, 0.75, 0.78, 0.80, 0.7, 0.6]
    recs = [ckpt(s, r, train_reward_std=0.15, train_episodes=4) for s, r in enumerate(train)]
    best = select(read_inputs(items(recs)), by="train")
    one_se = select(read_inputs(items(recs)), by="train", rule="one-se", top=3)
    assert best.chosen[0]["step"] == 9
    assert [r["step"] for r in one_se.chosen] == [6, 7, 8]
    assert one_se.chosen[0]["selection"]["rule"] == "one-se"
    assert math.isclose(one_se.chosen[0]["selection"]["se"] or 0, 0.15 * math.sqrt(4 / 3) / 2)


def test_one_se_on_validation_episodes_matches_an_independent_computation():
    h = [2, 4, 6, 7, 8, 6, 5]  # peak at 4 with spread: some naive episodes remain at every step
    eps = val_curve(h)
    recs = [ckpt(s, None) for s in range(len(h))]
    sel = select(read_inputs(items(recs + eps)), by="val", rule="one-se")
    per_step = {s: [e["reward"]["total"] for e in eps if e["checkpoint_step"] == s] for s in range(len(h))}
    means = {s: statistics.fmean(v) for s, v in per_step.items()}
    best = max(means, key=lambda s: (means[s], -s))
    se = statistics.stdev(per_step[best]) / math.sqrt(len(per_step[best]))
    expected = min(s for s in means if means[s] >= means[best] - se)
    assert best == 4
    assert sel.chosen[0]["step"] == expected
    assert expected < best  # the data cannot tell step 3 from step 4 apart


def test_one_se_without_a_standard_error_is_a_clear_error():
    with pytest.raises(DataError, match="one-se needs a standard error"):
        select(read_inputs(items(study_ckpts())), by="train", rule="one-se")


def test_smoothing_ignores_a_lone_spike():
    train = [0.1, 0.1, 0.1, 1.0, 0.1, 0.2, 0.5, 0.6, 0.7, 0.75, 0.7, 0.6, 0.5]
    recs = [ckpt(s, r) for s, r in enumerate(train)]
    assert select(read_inputs(items(recs)), by="train").chosen[0]["step"] == 3
    smoothed = select(read_inputs(items(recs)), by="train", smooth=3).chosen[0]
    assert smoothed["step"] == 9
    assert math.isclose(smoothed["selection"]["score"], (0.7 + 0.75 + 0.7) / 3)
    assert smoothed["selection"]["smooth"] == 3


def test_deadlock_rate_is_minimised_and_meals_maximised():
    h = [3, 9, 6, 10, 2]  # naive deadlocks, hierarchy never does: fewest deadlocks at step 3
    eps = val_curve(h)
    recs = [ckpt(s, None) for s in range(len(h))]
    dl = select(read_inputs(items(recs + eps)), metric="deadlock_rate").chosen[0]
    assert dl["step"] == 3 and dl["selection"]["goal"] == "min"
    rates = {s: statistics.fmean(float(e["deadlock"]) for e in eps if e["checkpoint_step"] == s) for s in range(len(h))}
    assert dl["selection"]["score"] == min(rates.values()) == rates[3]
    meals = select(read_inputs(items(recs + eps)), metric="meals").chosen[0]
    totals = {s: statistics.fmean(sum(e["meals"]) for e in eps if e["checkpoint_step"] == s) for s in range(len(h))}
    assert meals["step"] == max(totals, key=lambda s: (totals[s], -s))
    thr = select(read_inputs(items(recs + eps)), metric="throughput").chosen[0]
    assert thr["selection"]["metric"] == "throughput" and thr["selection"]["goal"] == "max"


def test_meals_and_deadlock_work_on_unscored_episodes_but_reward_does_not():
    eps = val_curve([2, 8, 5], scored=False)
    recs = [ckpt(s, None) for s in range(3)]
    assert select(read_inputs(items(recs + eps)), metric="deadlock_rate").chosen[0]["step"] == 1
    with pytest.raises(DataError, match="not scored"):
        select(read_inputs(items(recs + eps)), metric="reward")


# -- ties and gaps ------------------------------------------------------------------------


def test_ties_go_to_the_earlier_step_including_float_noise():
    recs = [ckpt(0, 0.1), ckpt(1, 0.3), ckpt(2, 0.1 + 0.2), ckpt(3, 0.3), ckpt(4, 0.2)]
    sel = select(read_inputs(items(list(reversed(recs)))), by="train", top=4)
    assert [r["step"] for r in sel.chosen] == [1, 2, 3, 4]
    assert [r["selection"]["rank"] for r in sel.chosen] == [1, 2, 3, 4]
    assert sel.chosen[0]["selection"]["last_rank"] == 4


def test_missing_steps_and_missing_validation():
    # Checkpoints saved every other step, validation run for only some of them.
    recs = [ckpt(s, 0.1 * s) for s in (0, 2, 4, 6, 8, 10)]
    h = {2: 4, 4: 9, 8: 6}
    eps = [
        episode("hierarchy" if j < good else "naive", seed, step)
        for step, good in h.items()
        for j, seed in enumerate(SEEDS)
    ]
    sel = select(read_inputs(items(recs + eps)))
    s = sel.chosen[0]["selection"]
    assert sel.chosen[0]["step"] == 4 and s["by"] == "val"
    assert s["candidates"] == 3
    assert s["last_step"] == 10 and s["last_score"] is None and s["last_rank"] is None
    assert any("no val score for" in n and "step 10" in n and "step 0" in n for n in sel.notes)
    # By train every step is a candidate and the last one wins here.
    by_train = select(read_inputs(items(recs + eps)), by="train").chosen[0]
    assert by_train["step"] == 10 and by_train["selection"]["last_rank"] == 1


def test_duplicate_records_collapse_but_conflicting_ones_are_an_error():
    recs = study_ckpts()
    sel = select(read_inputs(items(recs) + items(recs, "again.jsonl")), by="train")
    assert sel.chosen[0]["selection"]["candidates"] == 16
    clash = [*recs, ckpt(9, 0.1)]
    with pytest.raises(DataError, match=r"two different checkpoint records for run 'r1' step 9"):
        select(read_inputs(items(clash)), by="train")


def test_reselecting_an_output_replaces_its_selection():
    first = select(read_inputs(items(study_ckpts())), by="train").chosen
    again = select(read_inputs(items(study_ckpts() + first)), by="last").chosen[0]
    assert again["selection"]["by"] == "last"


# -- runs ---------------------------------------------------------------------------------


def test_runs_are_kept_apart_and_run_selects_within_one():
    a = [ckpt(s, r, run="paper") for s, r in enumerate(STUDY_TRAIN)]
    b = [ckpt(s, 0.05 * s, run="shaped") for s in range(16)]
    both = read_inputs(items(a + b))
    overall = select(both, by="train").chosen[0]
    assert (overall["run"], overall["step"]) == ("shaped", 15)  # 0.75 > 0.74
    assert overall["selection"]["candidates"] == 32
    only_paper = select(read_inputs(items(a + b)), by="train", run="paper").chosen[0]
    assert (only_paper["run"], only_paper["step"]) == ("paper", 9)
    assert only_paper["selection"]["candidates"] == 16
    with pytest.raises(Exception, match="--by last needs a single run"):
        select(read_inputs(items(a + b)), by="last")


def test_episode_without_run_is_ambiguous_between_runs():
    recs = [ckpt(0, 0.1, run="a"), ckpt(0, 0.2, run="b")]
    eps = [episode("hierarchy", 1000, 0, run=None)]
    with pytest.raises(DataError, match="names no run"):
        select(read_inputs(items(recs + eps)))
    sel = select(read_inputs(items(recs + eps)), run="b")
    assert sel.chosen[0]["run"] == "b" and sel.chosen[0]["selection"]["n"] == 1


def test_validation_episodes_for_unknown_steps_are_named():
    eps = [*val_curve([5, 5]), episode("naive", 1000, 17), episode("naive", 1001, 20), episode("naive", 1002, 17)]
    recs = [ckpt(0, 0.1), ckpt(1, 0.2)]
    with pytest.raises(DataError) as err:
        select(read_inputs(items(recs + eps, "val.jsonl")))
    msg = str(err.value)
    assert "run 'r1' step 17 (2 episode(s), first at val.jsonl:23)" in msg
    assert "run 'r1' step 20" in msg and "step 0" not in msg


def test_mixed_reward_variants_are_refused():
    recs = [ckpt(0), ckpt(1)]
    eps = [episode("hierarchy", 1000, 0), episode("hierarchy", 1000, 1, spec=RewardSpec("paper"))]
    with pytest.raises(DataError, match="scored with different rewards"):
        select(read_inputs(items(recs + eps)))


def test_error_and_training_episodes_are_counted_not_used():
    recs = [ckpt(0), ckpt(1)]
    bad = {**episode("naive", 1000, 0), "status": "error", "reward": None}
    # dphil-train tags training rollouts split "train" (checkpoint_step: the adapter sampled from).
    train_ep = {**episode("hierarchy", 1001, 0), "split": "train", "checkpoint_step": None}
    eps = [episode("naive", 1000, 0), episode("hierarchy", 1000, 1), bad, train_ep]
    sel = select(read_inputs(items(recs + eps)))
    assert sel.chosen[0]["step"] == 1 and sel.chosen[0]["selection"]["n"] == 1
    assert any("1 validation episode(s) with status 'error'" in n for n in sel.notes)
    assert any("1 training episode(s)" in n for n in sel.notes)


def test_records_as_dphil_train_writes_them():
    """Extra fields of every shape pass through; val_* summaries rank when no episodes are given."""
    recs = [
        ckpt(
            s,
            r,
            path=f"/ckpt/{s:04d}",
            base_model="Qwen/Qwen3-14B",
            lora_rank=8,
            backend="peft",
            n=[5],
            train_seeds=[1, 2, 3],
            reward_weights={"alpha": 1.0},
            train_reward_std=0.1,
            train_episodes=6,
            val_reward=v,
            val_reward_std=0.2,
            val_episodes=10,
            val_n=[5],
            val_reward_by_n={"5": v},
            curriculum_state_before={"size": 5},
        )
        for s, (r, v) in enumerate(zip(STUDY_TRAIN, [0.1 * h for h in STUDY_H], strict=True))
    ]
    sel = select(read_inputs(items(recs)))
    chosen = sel.chosen[0]
    assert chosen["step"] == 9 and chosen["selection"]["by"] == "val"
    assert chosen["selection"]["n"] == 10 and chosen["selection"]["ci"] is not None
    assert {k: v for k, v in chosen.items() if k != "selection"} == recs[9]
    with pytest.raises(DataError, match="field 'val_episodes' should be"):
        read_inputs(items([{**recs[0], "val_episodes": 2.5}]))


def test_read_checkpoints_for_the_rollout(tmp_path):
    path = write_jsonl(tmp_path / "ck.jsonl", list(reversed(study_ckpts(path="/x"))))
    ckpts = load_checkpoints([str(path)])
    assert [c.step for c in ckpts] == list(range(16)) and ckpts[0].path == "/x"
    write_jsonl(path, [ckpt(0), {"kind": "checkpoint", "step": "3"}])
    with pytest.raises(DataError, match=r"ck.jsonl:2: field 'step' should be a non-negative"):
        load_checkpoints([str(path)])
    write_jsonl(path, [ckpt(0), episode("naive", 1, 0)])
    with pytest.raises(DataError, match=r"ck.jsonl:2: expected a checkpoint record"):
        load_checkpoints([str(path)])


# -- the command through real pipes --------------------------------------------------------


def test_cli_pipe_mixed_inputs_in_any_order(tmp_path, study_val):
    adapters = tmp_path / "adapters"
    recs = []
    for s, r in enumerate(STUDY_TRAIN):
        (adapters / f"{s:04d}").mkdir(parents=True)
        recs.append(ckpt(s, r, path=str(adapters / f"{s:04d}")))
    ck = write_jsonl(tmp_path / "ckpts.jsonl", recs[::2])
    more = write_jsonl(tmp_path / "more.jsonl", recs[1::2])
    stdin = "".join(json.dumps(e) + "\n" for e in reversed(study_val))
    proc = run_cli(str(ck), "-", str(more), stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    [rec] = out_records(proc)
    assert rec["step"] == 9 and rec["selection"]["by"] == "val"
    assert "chose step 9" in proc.stderr and "last step 15" in proc.stderr
    # The record is the input record unchanged, plus `selection`.
    assert {k: v for k, v in rec.items() if k != "selection"} == recs[9]


def test_output_matches_the_schema(tmp_path, study_val):
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    ck = write_jsonl(
        tmp_path / "ck.jsonl",
        study_ckpts(
            base_model="Qwen/Qwen3-14B", lora_rank=8, backend="peft", n=5, train_episodes=6, train_reward_std=0.1
        ),
    )
    val = write_jsonl(tmp_path / "val.jsonl", study_val)
    for args in (
        ["--by", "val", "--top", "3"],
        ["--by", "last"],
        ["--by", "train", "--smooth", "3"],
        ["--by", "train", "--rule", "one-se"],
    ):
        proc = run_cli(str(ck), str(val), "--no-check-path", *args)
        assert proc.returncode == 0, proc.stderr
        for rec in out_records(proc):
            validator.validate(rec)
    errors = list(validator.iter_errors({"kind": "checkpoint", "step": -1, "lora_rank": "8"}))
    assert len(errors) == 2


def test_cli_adapter_directory_gone_exits_66(tmp_path):
    recs = [ckpt(s, r, path=str(tmp_path / f"gone-{s}")) for s, r in enumerate(STUDY_TRAIN)]
    ck = write_jsonl(tmp_path / "ck.jsonl", recs)
    proc = run_cli(str(ck), "--by", "train")
    assert proc.returncode == 66
    assert proc.stdout == ""
    assert "gone-9" in proc.stderr and "does not exist" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    ok = run_cli(str(ck), "--by", "train", "--no-check-path")
    assert ok.returncode == 0 and out_records(ok)[0]["step"] == 9
    # A record that names no path is not checked (hand-written records for analysis).
    bare = write_jsonl(tmp_path / "bare.jsonl", study_ckpts())
    assert run_cli(str(bare), "--by", "train").returncode == 0


def test_cli_unknown_steps_exit_65(tmp_path):
    ck = write_jsonl(tmp_path / "ck.jsonl", [ckpt(0, 0.1), ckpt(1, 0.2)])
    val = write_jsonl(tmp_path / "val.jsonl", [episode("naive", 1000, 0), episode("naive", 1000, 7)])
    proc = run_cli(str(ck), str(val))
    assert proc.returncode == 65
    assert "step 7" in proc.stderr and f"{val}:2" in proc.stderr


def test_cli_usage_errors_exit_64(tmp_path):
    ck = write_jsonl(tmp_path / "ck.jsonl", study_ckpts())
    for args, words in (
        (["--by", "train", "--smooth", "2"], "odd"),
        (["--merge"], "--merge needs --export"),
        (["--by", "last", "--rule", "one-se"], "--by last takes the last step"),
        (["--run", "nope"], "no checkpoint records for run 'nope'"),
        (["--export", str(tmp_path / "x"), "--top", "2"], "--top 2"),
        (["--metric", "speed"], "speed"),
        (["--by", "train", "--base-model", "x"], "only applies with --merge"),
        (["--by", "train", "--plot", str(tmp_path / "c.txt")], "image file"),
    ):
        proc = run_cli(str(ck), *args)
        assert proc.returncode == 64, (args, proc.stderr)
        assert words in proc.stderr and proc.stdout == ""


def test_cli_bad_input_and_missing_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ckpt(0, 0.1)) + "\n" + '{"kind": "checkpoint", "step": 1, "train_reward": "high"}\n')
    proc = run_cli(str(bad), "--by", "train")
    assert proc.returncode == 65 and f"{bad}:2: field 'train_reward'" in proc.stderr
    proc = run_cli(str(tmp_path / "nope.jsonl"))
    assert proc.returncode == 66
    proc = run_cli("-", stdin="")
    assert proc.returncode == 65 and "no checkpoint records" in proc.stderr


def test_plain_selection_imports_no_heavy_stack(tmp_path):
    ck = write_jsonl(tmp_path / "ck.jsonl", study_ckpts())
    code = (
        "import sys\nfrom dphil.commands.ckpt_select import main\n"
        "rc = main(sys.argv[1:], standalone_mode=False)\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'litellm', 'art', 'matplotlib')"
        " if m in sys.modules]\n"
        "assert rc == 0 and not heavy, (rc, heavy)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(ck), "--by", "train"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_output_file_is_written_atomically(tmp_path):
    ck = write_jsonl(tmp_path / "ck.jsonl", [ckpt(0, 0.5, path=str(tmp_path / "gone"))])
    out = tmp_path / "best.jsonl"
    out.write_text("previous\n")
    proc = run_cli(str(ck), "-o", str(out))
    assert proc.returncode == 66 and out.read_text() == "previous\n"
    proc = run_cli(str(ck), "-o", str(out), "--no-check-path", "-q")
    assert proc.returncode == 0 and proc.stderr == ""
    assert json.loads(out.read_text())["step"] == 0


# -- plot ---------------------------------------------------------------------------------


def test_plot_writes_a_png(tmp_path, study_val):
    ck = write_jsonl(tmp_path / "ck.jsonl", study_ckpts())
    val = write_jsonl(tmp_path / "val.jsonl", study_val)
    png = tmp_path / "curve.png"
    proc = run_cli(str(ck), str(val), "--smooth", "3", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".curve.png")]


def test_plot_without_matplotlib_exits_69(tmp_path):
    ck = write_jsonl(tmp_path / "ck.jsonl", study_ckpts())
    proc = run_cli(str(ck), "--plot", str(tmp_path / "c.png"), pre="import sys; sys.modules['matplotlib'] = None; ")
    assert proc.returncode == 69
    assert "matplotlib" in proc.stderr and not (tmp_path / "c.png").exists()


# -- export and merge on a tiny real model ----------------------------------------------------


@pytest.fixture(scope="module")
def tiny_adapters(tmp_path_factory):
    """A tiny Qwen3 base model and two rank-8 LoRA adapters with non-zero weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tests.support.tinymodel import build_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    base = build_tiny_model(root / "base")
    paths = []
    for step in (0, 1):
        torch.manual_seed(100 + step)
        model = AutoModelForCausalLM.from_pretrained(base)
        cfg = LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False, task_type="CAUSAL_LM"
        )
        peft_model = get_peft_model(model, cfg)
        out = root / "run" / f"{step:04d}"
        peft_model.save_pretrained(out)
        paths.append(out)
    return base, paths


def tiny_ckpts(base: Path, paths: list[Path], **extra) -> list[dict]:
    return [
        ckpt(s, r, path=str(p), base_model=str(base), lora_rank=8, **extra)
        for s, (r, p) in enumerate(zip([0.9, 0.4], paths, strict=True))
    ]


def test_export_copies_the_chosen_adapter(tmp_path, tiny_adapters):
    base, paths = tiny_adapters
    ck = write_jsonl(tmp_path / "ck.jsonl", tiny_ckpts(base, paths))
    dest = tmp_path / "out" / "best"
    proc = run_cli(str(ck), "--by", "train", "--export", str(dest))
    assert proc.returncode == 0, proc.stderr
    rec = out_records(proc)[0]
    assert rec["step"] == 0 and rec["selection"]["exported_to"] == str(dest.resolve())
    src = paths[0]
    for f in src.iterdir():
        assert (dest / f.name).read_bytes() == f.read_bytes()
    assert oct(dest.stat().st_mode & 0o777) != oct(0o700)
    # A non-empty destination is refused, not overwritten.
    again = run_cli(str(ck), "--by", "train", "--export", str(dest))
    assert again.returncode == 73 and "not empty" in again.stderr


def test_export_refuses_an_adapter_that_disagrees_with_its_record(tmp_path, tiny_adapters):
    base, paths = tiny_adapters
    for change, words in (
        ({"lora_rank": 16}, "LoRA rank 8 but"),
        ({"base_model": "Qwen/Qwen3-14B"}, "says base model"),
    ):
        recs = [{**r, **change} for r in tiny_ckpts(base, paths)]
        ck = write_jsonl(tmp_path / "ck.jsonl", recs)
        dest = tmp_path / "never"
        proc = run_cli(str(ck), "--by", "train", "--export", str(dest))
        assert proc.returncode == 65 and words in proc.stderr, proc.stderr
        assert not dest.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".never")]


def test_export_needs_adapter_files(tmp_path):
    empty = tmp_path / "empty-adapter"
    empty.mkdir()
    ck = write_jsonl(tmp_path / "ck.jsonl", [ckpt(0, 0.5, path=str(empty))])
    proc = run_cli(str(ck), "--export", str(tmp_path / "dest"))
    assert proc.returncode == 66 and "adapter_config.json" in proc.stderr


@pytest.mark.slow
def test_merge_writes_a_model_equal_to_base_plus_adapter(tmp_path, tiny_adapters):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, paths = tiny_adapters
    ck = write_jsonl(tmp_path / "ck.jsonl", tiny_ckpts(base, paths))
    dest = tmp_path / "merged"
    proc = run_cli(str(ck), "--by", "train", "--export", str(dest), "--merge")
    assert proc.returncode == 0, proc.stderr
    assert out_records(proc)[0]["selection"]["merged_to"] == str(dest.resolve())
    assert not (dest / "adapter_config.json").exists() and (dest / "config.json").is_file()

    tok = AutoTokenizer.from_pretrained(dest)
    ids = tok("You hold your left fork. eat think", return_tensors="pt")["input_ids"]
    merged = AutoModelForCausalLM.from_pretrained(dest).eval()
    assert not any("lora" in k for k in merged.state_dict())
    plain = AutoModelForCausalLM.from_pretrained(base).eval()
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(paths[0])).eval()
    with torch.no_grad():
        got = merged(ids).logits
        want = with_adapter(ids).logits
        bare = plain(ids).logits
    assert torch.allclose(got, want, atol=1e-4)
    assert not torch.allclose(got, bare, atol=1e-3)  # the adapter really changed the weights


def test_merge_checks_before_loading_anything(tmp_path, tiny_adapters):
    base, paths = tiny_adapters
    recs = [{**r, "lora_rank": 4} for r in tiny_ckpts(base, paths)]
    ck = write_jsonl(tmp_path / "ck.jsonl", recs)
    proc = run_cli(
        str(ck),
        "--by",
        "train",
        "--export",
        str(tmp_path / "m"),
        "--merge",
        pre="import sys; sys.modules['torch'] = None; ",
    )
    assert proc.returncode == 65 and "LoRA rank 8 but" in proc.stderr
    ok = [r for r in tiny_ckpts(base, paths)]
    ck = write_jsonl(tmp_path / "ck.jsonl", ok)
    proc = run_cli(
        str(ck),
        "--by",
        "train",
        "--export",
        str(tmp_path / "m"),
        "--merge",
        pre="import sys; sys.modules['torch'] = None; ",
    )
    assert proc.returncode == 69 and "pip install" in proc.stderr
    assert not (tmp_path / "m").exists()


def test_fixture_paths_are_real(tiny_adapters):
    _, paths = tiny_adapters
    cfg = json.loads((paths[0] / "adapter_config.json").read_text())
    assert cfg["r"] == 8 and os.path.isdir(paths[1])
    with pytest.raises(NoInputError):
        from dphil.checkpoints.export import adapter_dir

        adapter_dir({"step": 0, "path": str(paths[0] / "missing")})


def test_located_pairs_records_with_lines(tmp_path):
    from dphil.io.jsonl import RecordReader

    path = write_jsonl(tmp_path / "a.jsonl", study_ckpts()[:3])
    pairs = [(s, n) for s, n, _ in located(RecordReader([str(path)]))]
    assert pairs == [(str(path), i) for i in (1, 2, 3)]
