"""From `dphil-train`'s options to a running training loop: checks, backend choice, outputs.

Every combination of options that cannot work is refused here with a usage
error (exit 64) before any model is loaded; the heavy imports happen only
once the run is known to make sense.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dphil.io.console import Console
from dphil.io.errors import UsageError
from dphil.io.jsonl import RecordWriter
from dphil.rollout.grid import parse_int_list
from dphil.scoring.reward import RewardSpec
from dphil.train.advantages import AdvantageSpec
from dphil.train.curriculum import parse_curriculum
from dphil.train.loop import (
    Progress,
    TrainConfig,
    default_val_seeds,
    derive_seed,
    load_journal,
    run_training,
    trim_episodes,
)

DEFAULT_STEPS = 16
DEFAULT_VAL_EPISODES = 8


def build_config(opts: dict[str, Any]) -> TrainConfig:
    """A TrainConfig from the command's options, or a UsageError naming the bad option."""
    sizes = tuple(parse_int_list(opts["sizes"], "-n"))
    if min(sizes) < 2:
        raise UsageError("-n: a table needs at least 2 philosophers")
    if opts["shaped"] and opts["variant"] == "paper":
        raise UsageError("--shaped contradicts --reward paper")
    try:
        reward = RewardSpec(
            variant="shaped" if opts["shaped"] else (opts["variant"] or "paper"),
            alpha=opts["alpha"],
            beta=opts["beta"],
            gamma=opts["gamma"],
            delta=opts["delta"],
            min_meals=opts["min_meals"],
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    curriculum = parse_curriculum(opts["curriculum"], sizes, advance_at=opts["advance_at"], smoothing=opts["smoothing"])
    steps = opts["steps"] or curriculum.planned_steps or DEFAULT_STEPS
    run_dir = Path(opts["run_dir"])
    val_every = opts["val_every"]
    val_seeds: tuple[int, ...] = ()
    val_sizes: tuple[int, ...] = ()
    asked = (opts["val_seeds"], opts["val_episodes"], opts["val_n"])
    if any(x is not None for x in asked) and not val_every:
        raise UsageError("--val-seeds/--val-episodes/--val-n need --val-every K")
    if val_every:
        if opts["val_seeds"]:
            listed = parse_int_list(opts["val_seeds"], "--val-seeds")
            count = opts["val_episodes"] or len(listed)
            if count > len(listed):
                raise UsageError(f"--val-episodes {count}: only {len(listed)} --val-seeds given")
            val_seeds = tuple(listed[:count])
        else:
            val_seeds = default_val_seeds(opts["seed"], opts["val_episodes"] or DEFAULT_VAL_EPISODES)
        val_sizes = tuple(parse_int_list(opts["val_n"], "--val-n")) if opts["val_n"] else curriculum.all_sizes
        if min(val_sizes) < 2:
            raise UsageError("--val-n: a table needs at least 2 philosophers")
    lora_alpha = opts["lora_alpha"] or 2 * opts["lora_rank"]
    advantage = build_advantage(opts)
    from dphil.local.play import parse_memory

    parse_memory(opts["memory"])  # refuse a bad --memory before any model loads
    policy = {
        "decode": opts["decode"] if opts["backend"] == "peft" else "free",
        "temperature": opts["temperature"],
        "max_new_tokens": opts["max_new_tokens"],
        "prompt": opts["prompt_name"] if opts["prompt_file"] is None else f"file:{opts['prompt_file']}",
        "memory": opts["memory"],
        "learning_rate": opts["learning_rate"],
        "clip_epsilon": opts["clip_epsilon"],
        "kl_coef": opts["kl_coef"],
        "scale_advantages": not opts["no_scale_advantages"],
    }
    return TrainConfig(
        base_model=opts["base_model"],
        run_dir=run_dir,
        run=opts["run_name"] or run_dir.resolve().name,
        backend=opts["backend"],
        lora_rank=opts["lora_rank"],
        lora_alpha=lora_alpha,
        learning_rate=opts["learning_rate"],
        steps=steps,
        groups=opts["groups"],
        group_size=opts["group_size"],
        rounds=opts["rounds"],
        protocol=opts["protocol"],
        schedule=opts["schedule"],
        conflict=opts["conflict"],
        deadlock_mode=opts["deadlock_mode"],
        reward=reward,
        curriculum=curriculum,
        seed=opts["seed"],
        scale_advantages=not opts["no_scale_advantages"],
        advantage=advantage,
        val_every=val_every,
        val_seeds=val_seeds,
        val_sizes=val_sizes,
        policy=policy,
    )


def build_advantage(opts: dict[str, Any]) -> AdvantageSpec:
    """--advantage and its parameters; a parameter the mode does not use is a usage error."""
    mode = opts.get("advantage") or "episode"
    gamma, weight = opts.get("advantage_gamma"), opts.get("advantage_weight")
    if mode != "step":
        given = [o for o, v in (("--advantage-gamma", gamma), ("--advantage-weight", weight)) if v is not None]
        if given:
            raise UsageError(f"{given[0]} applies only to --advantage step, not {mode}")
    try:
        return AdvantageSpec(
            mode=mode,
            **({} if gamma is None else {"gamma": gamma}),
            **({} if weight is None else {"weight": weight}),
        )
    except ValueError as e:
        raise UsageError(str(e)) from None


def make_backend_factory(cfg: TrainConfig, opts: dict[str, Any]):
    """A function `resume_from -> backend`, imported lazily for the chosen backend."""
    from dphil.agents.prompts import get_prompt
    from dphil.local.play import parse_memory

    prompt = get_prompt(opts["prompt_name"], opts["prompt_file"])
    memory = parse_memory(opts["memory"])
    if cfg.backend == "peft":
        from dphil.train.peft_backend import PeftBackend, PeftSettings

        if opts.get("threads"):
            import torch

            torch.set_num_threads(opts["threads"])

        settings = PeftSettings(
            base_model=cfg.base_model,
            prompt=prompt,
            lora_rank=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            learning_rate=cfg.learning_rate,
            clip_epsilon=opts["clip_epsilon"] or None,
            kl_coef=opts["kl_coef"],
            max_grad_norm=opts["max_grad_norm"],
            decode=opts["decode"],
            temperature=opts["temperature"],
            max_new_tokens=opts["max_new_tokens"],
            memory=memory,
            device=opts["device"],
            dtype=opts["dtype"],
            micro_batch=opts["micro_batch"],
            train_micro_batch=opts.get("train_micro_batch") or 2,
            gradient_checkpointing=opts.get("gradient_checkpointing", True),
            init_seed=derive_seed("lora-init", cfg.seed),
        )
        return lambda resume_from: PeftBackend(settings, resume_from=resume_from)
    from dphil.train.art_backend import ArtBackend, ArtSettings

    settings_art = ArtSettings(
        base_model=cfg.base_model,
        prompt=prompt,
        flavour=cfg.backend,
        lora_rank=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        learning_rate=cfg.learning_rate,
        temperature=opts["temperature"],
        max_new_tokens=opts["max_new_tokens"],
        memory=memory,
        path=opts["art_path"] or str(cfg.run_dir / "art"),
        project=opts["project"],
        run=cfg.run,
        advantage=cfg.advantage.mode,
    )
    return lambda resume_from: ArtBackend(settings_art, resume_from=resume_from)


def launch(console: Console, opts: dict[str, Any]) -> int:
    """Run `dphil-train` with its parsed options; return the exit status."""
    cfg = build_config(opts)
    if opts.get("tensorboard"):
        from dphil.train.tensorboard_log import check_available

        check_available()
    factory = make_backend_factory(cfg, opts)
    episodes_path = opts["episodes_out"]
    if episodes_path is not None:
        journal = load_journal(cfg.run_dir) if cfg.run_dir.exists() else []
        last = journal[-1]["step"] if journal else 0
        if last == 0:
            Path(episodes_path).unlink(missing_ok=True)
        else:
            trim_episodes(episodes_path, last)
    episodes = RecordWriter(episodes_path, mode="append") if episodes_path else None
    out = RecordWriter(opts["output"])
    board = None
    ok = False
    try:
        if opts.get("tensorboard"):
            from dphil.train.tensorboard_log import TensorBoardLog

            board = TensorBoardLog(cfg.run_dir, load_journal(cfg.run_dir) if cfg.run_dir.exists() else [])

        def emit(record: dict[str, Any]) -> None:
            out.write(record)
            out.flush()
            if board is not None:
                board.write(record)

        run_training(cfg, factory, Progress(emit=emit, episodes=episodes, say=console.warn))
        ok = True
    finally:
        if board is not None:
            board.close()
        if episodes is not None:
            episodes.close(success=ok)
        out.close(success=ok)
    return 0
