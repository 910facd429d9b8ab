"""From a `TrainRequest` (what `dphil-train` was asked for) to a running training loop.

Checks, backend choice, outputs. Every combination of options that cannot work
is refused here with a usage error (exit 64) before any model is loaded; the
heavy imports happen only once the run is known to make sense.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dphil.io.console import Console, output_name
from dphil.io.errors import UsageError
from dphil.io.jsonl import RecordWriter
from dphil.rollout.grid import parse_int_list
from dphil.scoring.request import RewardRequest
from dphil.train.advantages import MODES, AdvantageSpec, modes_using
from dphil.train.curriculum import parse_curriculum
from dphil.train.loop import Progress, TrainConfig, default_val_seeds, derive_seed, run_training
from dphil.train.run_dir import load_journal, recorded_run_name, trim_episodes

DEFAULT_STEPS = 16
DEFAULT_VAL_EPISODES = 8


@dataclass(frozen=True)
class TrainRequest:
    """Everything one `dphil-train` invocation asks for, independent of the command line.

    The defaults are the command's. Lists keep the command line's syntax (`sizes` "5" or
    "5,10,15", `val_seeds` "100000-100015", `curriculum` "5:6,10:5" or "auto"): `launch`
    parses and checks them with everything else, so every combination that cannot work
    is one UsageError (exit 64) naming the option, before any model loads.
    """

    base_model: str  # Hugging Face id or local directory
    run_dir: str
    run: str | None = None  # the run's name in records [default: run_dir's name]
    backend: str = "peft"  # peft, art, art-serverless or art-tinker
    output: str | None = None  # checkpoint records [default: stdout]
    episodes_out: str | None = None  # every training and validation episode, scored
    tensorboard: bool = False
    # the table
    sizes: str = "5"
    rounds: int = 5
    protocol: str = "paper"
    schedule: str = "simultaneous"
    conflict: str = "random"
    deadlock_mode: str = "terminal"
    seed: int = 0
    # the run: steps, scenarios, curriculum, validation
    steps: int | None = None  # [default: the staged curriculum's total, else DEFAULT_STEPS]
    groups: int = 2
    group_size: int = 3
    curriculum: str | None = None
    advance_at: float | None = None
    smoothing: float = 0.5
    val_every: int = 0
    val_episodes: int | None = None
    val_seeds: str | None = None
    val_n: str | None = None
    # reward and credit assignment
    reward: RewardRequest = field(default_factory=RewardRequest)
    scale_advantages: bool = True
    advantage: str = "episode"  # a name of dphil.train.advantages.MODES
    advantage_gamma: float | None = None  # modes_using('gamma') only [default: advantages.DEFAULT_GAMMA]
    advantage_weight: float | None = None  # modes_using('weight') only [default: advantages.DEFAULT_WEIGHT]
    # the adapter and the optimiser
    lora_rank: int = 8
    lora_alpha: int | None = None  # [default: 2 x lora_rank]
    learning_rate: float = 1e-5
    clip_epsilon: float = 0.2  # 0: the plain policy gradient
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    # the policy
    prompt: str = "default"  # a built-in prompt variant, unless prompt_file is given
    prompt_file: str | None = None
    memory: str = "full"
    decode: str = "constrained"  # peft; the ART backends always generate freely
    temperature: float = 1.0
    max_new_tokens: int = 48
    # peft: where and how it computes
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None  # [default: torch's choice]
    micro_batch: int = 16
    train_micro_batch: int = 2
    pack_width: int = 2048
    autocast: str | None = None
    gradient_checkpointing: bool = True
    shared_prefix: bool = True
    # ART
    art_path: str | None = None  # [default: run_dir/art]
    project: str = "dphil"


def build_config(req: TrainRequest) -> TrainConfig:
    """A TrainConfig from the request, or a UsageError naming the bad option."""
    sizes = tuple(parse_int_list(req.sizes, "-n"))
    if min(sizes) < 2:
        raise UsageError("-n: a table needs at least 2 philosophers")
    reward = req.reward.spec()
    curriculum = parse_curriculum(req.curriculum, sizes, advance_at=req.advance_at, smoothing=req.smoothing)
    steps = req.steps or curriculum.planned_steps or DEFAULT_STEPS
    run_dir = Path(req.run_dir)
    val_every = req.val_every
    val_seeds: tuple[int, ...] = ()
    val_sizes: tuple[int, ...] = ()
    asked = (req.val_seeds, req.val_episodes, req.val_n)
    if any(x is not None for x in asked) and not val_every:
        raise UsageError("--val-seeds/--val-episodes/--val-n need --val-every K")
    if val_every:
        if req.val_seeds:
            listed = parse_int_list(req.val_seeds, "--val-seeds")
            count = req.val_episodes or len(listed)
            if count > len(listed):
                raise UsageError(f"--val-episodes {count}: only {len(listed)} --val-seeds given")
            val_seeds = tuple(listed[:count])
        else:
            val_seeds = default_val_seeds(req.seed, req.val_episodes or DEFAULT_VAL_EPISODES)
        val_sizes = tuple(parse_int_list(req.val_n, "--val-n")) if req.val_n else curriculum.all_sizes
        if min(val_sizes) < 2:
            raise UsageError("--val-n: a table needs at least 2 philosophers")
    lora_alpha = req.lora_alpha or 2 * req.lora_rank
    advantage = build_advantage(req)
    from dphil.local.play import parse_memory

    parse_memory(req.memory)  # refuse a bad --memory before any model loads
    policy = {
        "decode": req.decode if req.backend == "peft" else "free",
        "temperature": req.temperature,
        "max_new_tokens": req.max_new_tokens,
        "prompt": req.prompt if req.prompt_file is None else f"file:{req.prompt_file}",
        "memory": req.memory,
        "learning_rate": req.learning_rate,
        "clip_epsilon": req.clip_epsilon,
        "kl_coef": req.kl_coef,
        "scale_advantages": req.scale_advantages,
    }
    return TrainConfig(
        base_model=req.base_model,
        run_dir=run_dir,
        # A resumed run keeps its name even when its directory was moved or renamed.
        run=req.run or recorded_run_name(run_dir) or run_dir.resolve().name,
        backend=req.backend,
        lora_rank=req.lora_rank,
        lora_alpha=lora_alpha,
        learning_rate=req.learning_rate,
        steps=steps,
        groups=req.groups,
        group_size=req.group_size,
        rounds=req.rounds,
        protocol=req.protocol,
        schedule=req.schedule,
        conflict=req.conflict,
        deadlock_mode=req.deadlock_mode,
        reward=reward,
        curriculum=curriculum,
        seed=req.seed,
        scale_advantages=req.scale_advantages,
        advantage=advantage,
        val_every=val_every,
        val_seeds=val_seeds,
        val_sizes=val_sizes,
        policy=policy,
    )


def build_advantage(req: TrainRequest) -> AdvantageSpec:
    """--advantage and its parameters; a parameter the mode does not use is a usage error."""
    mode = req.advantage or "episode"
    gamma, weight = req.advantage_gamma, req.advantage_weight
    if mode in MODES:  # an unknown mode is refused by the spec below
        for param, value in (("gamma", gamma), ("weight", weight)):
            if value is not None and param not in MODES[mode].params:
                users = " or ".join(modes_using(param))
                raise UsageError(f"--advantage-{param} applies only to --advantage {users}, not {mode}")
    try:
        return AdvantageSpec(
            mode=mode,
            **({} if gamma is None else {"gamma": gamma}),
            **({} if weight is None else {"weight": weight}),
        )
    except ValueError as e:
        raise UsageError(str(e)) from None


def make_backend_factory(cfg: TrainConfig, req: TrainRequest):
    """A function `resume_from -> backend`, imported lazily for the chosen backend."""
    from dphil.agents.prompts import get_prompt
    from dphil.local.play import parse_memory

    prompt = get_prompt(req.prompt, req.prompt_file)
    memory = parse_memory(req.memory)
    if cfg.backend == "peft":
        from dphil.train.peft_backend import PeftBackend, PeftSettings

        if req.threads:
            import torch

            torch.set_num_threads(req.threads)

        settings = PeftSettings(
            base_model=cfg.base_model,
            prompt=prompt,
            lora_rank=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            learning_rate=cfg.learning_rate,
            clip_epsilon=req.clip_epsilon or None,
            kl_coef=req.kl_coef,
            max_grad_norm=req.max_grad_norm,
            decode=req.decode,
            temperature=req.temperature,
            max_new_tokens=req.max_new_tokens,
            memory=memory,
            device=req.device,
            dtype=req.dtype,
            micro_batch=req.micro_batch,
            train_micro_batch=req.train_micro_batch,
            pack_width=req.pack_width,
            autocast=req.autocast,
            gradient_checkpointing=req.gradient_checkpointing,
            shared_prefix=req.shared_prefix,
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
        temperature=req.temperature,
        max_new_tokens=req.max_new_tokens,
        memory=memory,
        path=req.art_path or str(cfg.run_dir / "art"),
        project=req.project,
        run=cfg.run,
        advantage=cfg.advantage.mode,
    )
    return lambda resume_from: ArtBackend(settings_art, resume_from=resume_from)


def launch(req: TrainRequest, console: Console) -> int:
    """Run one dphil-train request; return the exit status."""
    cfg = build_config(req)
    if req.tensorboard:
        from dphil.train.tensorboard_log import check_available

        check_available()
    factory = make_backend_factory(cfg, req)
    if cfg.backend == "peft" and req.autocast:
        from dphil.local.loading import slow_bf16

        slow = slow_bf16(req.device)
        if slow:
            console.warn(f"--autocast {req.autocast}: {slow}")
    episodes_path = req.episodes_out
    if episodes_path is not None:
        journal = load_journal(cfg.run_dir) if cfg.run_dir.exists() else []
        last = journal[-1]["step"] if journal else 0
        if last == 0:
            Path(episodes_path).unlink(missing_ok=True)
        else:
            trim_episodes(episodes_path, last)
    episodes = RecordWriter(episodes_path, mode="append") if episodes_path else None
    out = RecordWriter(req.output)
    board = None
    ok = False
    try:
        if req.tensorboard:
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
    console.report(f"adapters and the journal in {cfg.run_dir}; checkpoint records to {output_name(req.output)}")
    return 0
