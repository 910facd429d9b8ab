"""dphil-train: GRPO on the table (peft on any machine, OpenPipe ART on a GPU), one checkpoint per step."""

from __future__ import annotations

import click
from dphil.commands._common import (
    command,
    execute,
    local_model_options,
    output_option,
    prompt_options,
    quiet_option,
    refuse_piped_stdin,
    reward_options,
    table_options,
    wait_lock_option,
)

from dphil.train.advantages import DEFAULT_GAMMA, DEFAULT_WEIGHT, MODES, modes_using

BACKENDS = ("peft", "art", "art-serverless", "art-tinker")

HELP = """Train a LoRA adapter with GRPO at the table and write one checkpoint record per step.

Each step plays --groups scenarios (a table size and a seed), each --group-size
times with the current adapter, scores them with the reward of dphil-score,
takes one optimiser step on the group-relative advantages and saves the
adapter under RUN_DIR/steps/NNNN. Rerunning with the same --run-dir resumes
after the last saved step; RUN_DIR/checkpoints.jsonl holds every record.

\b
The published recipe (ART on a GPU):
  dphil-train --backend art --base-model Qwen/Qwen3-14B -n 5 --rounds 5 --steps 16 \\
      --groups 2 --group-size 3 --lora-rank 8 --run-dir runs/paper > ckpts.jsonl
Anywhere (transformers + peft, constrained decoding), with the fixes as flags:
  dphil-train --base-model Qwen/Qwen3-0.6B --shaped --curriculum 5:6,10:5,15:5 \\
      --val-every 2 --val-episodes 8 --run-dir runs/shaped --episodes-out ep.jsonl
"""


@command("dphil-train", help=HELP)
@click.option(
    "--base-model",
    required=True,
    metavar="NAME|DIR",
    help="Hugging Face model id or local directory (weights are loaded, not downloaded, when a directory is given).",
)
@click.option(
    "--run-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=str),
    help="Directory for adapters, the checkpoint journal and settings; reuse it to resume.",
)
@click.option("--run", "run_name", default=None, help="Run name in records [default: RUN_DIR's name].")
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default="peft",
    show_default=True,
    help="peft: transformers + peft, CPU or one GPU. art*: OpenPipe ART (pip install "
    "'dphil[art]'); art-serverless / art-tinker train remotely.",
)
@table_options(sizes_help="Table size(s) to train on (several sizes: groups cycle through them).")
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=None,
    help="Training steps [default: 16, or the total of a staged --curriculum].",
)
@click.option("--groups", type=click.IntRange(min=1), default=2, show_default=True, help="Scenarios per step.")
@click.option(
    "--group-size",
    type=click.IntRange(min=2),
    default=3,
    show_default=True,
    help="Episodes per scenario (the group advantages are relative to).",
)
@click.option("--lora-rank", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--lora-alpha", type=click.IntRange(min=1), default=None, help="LoRA alpha [default: 2 x rank].")
@click.option(
    "--learning-rate",
    "--lr",
    type=click.FloatRange(min=0, min_open=True),
    default=1e-5,
    show_default=True,
)
@reward_options
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Base seed of scenarios and sampling.",
)
@click.option(
    "--curriculum",
    default=None,
    metavar="N:STEPS,...|auto",
    help="Table sizes over the run: 5:6,10:5,15:5, or auto (next size of -n once the "
    "smoothed train reward reaches --advance-at).",
)
@click.option("--advance-at", type=float, default=None, metavar="REWARD")
@click.option(
    "--smoothing",
    type=float,
    default=0.5,
    show_default=True,
    help="auto curriculum: weight of the previous smoothed reward.",
)
@click.option(
    "--val-every",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Validate every K steps (and at the last one); 0: never.",
)
@click.option(
    "--val-episodes",
    type=click.IntRange(min=1),
    default=None,
    help="Held-out scenarios per validation [default: all --val-seeds, else 8].",
)
@click.option(
    "--val-seeds",
    default=None,
    metavar="LIST",
    help="Held-out seeds, e.g. 100000-100015 (never used for training).",
)
@click.option(
    "--val-n",
    default=None,
    metavar="N[,N...]",
    help="Validation table sizes [default: every training size].",
)
@click.option(
    "--episodes-out",
    default=None,
    metavar="FILE",
    help="Keep every training and validation episode, scored, with checkpoint_step.",
)
@prompt_options
@local_model_options
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=48, show_default=True)
@click.option(
    "--clip-epsilon",
    type=click.FloatRange(min=0),
    default=0.2,
    show_default=True,
    help="PPO ratio clipping; 0 for the plain policy gradient.",
)
@click.option(
    "--kl-coef",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Weight of the KL penalty towards the base model.",
)
@click.option("--max-grad-norm", type=click.FloatRange(min=0), default=1.0, show_default=True)
@click.option("--no-scale-advantages", is_flag=True, help="Advantages r - mean instead of (r - mean) / std.")
@click.option(
    "--advantage",
    type=click.Choice(list(MODES)),
    default="episode",
    show_default=True,
    help="Credit assignment: " + "; ".join(f"{name} ({mode.summary})" for name, mode in MODES.items()) + ".",
)
@click.option(
    "--advantage-gamma",
    type=click.FloatRange(0, 1),
    default=None,
    help=f"{', '.join(modes_using('gamma'))}: discount of the return from a turn on [default: {DEFAULT_GAMMA}].",
)
@click.option(
    "--advantage-weight",
    type=click.FloatRange(min=0),
    default=None,
    help=f"{', '.join(modes_using('weight'))}: weight of the step-level advantage [default: {DEFAULT_WEIGHT}].",
)
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    default="auto",
    show_default=True,
    help="The base model's weights (auto: bfloat16 on a GPU, float32 on a CPU); the adapter stays float32.",
)
@click.option(
    "--micro-batch",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Sequences per forward pass.",
)
@click.option(
    "--train-micro-batch",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="peft: decisions per backward pass; bounds training memory, the gradient is the same.",
)
@click.option(
    "--pack-width",
    type=click.IntRange(min=0),
    default=2048,
    show_default=True,
    help="peft: positions per prefix-tree row when scoring the step's replies: every prefix they "
    "share (the system prompt, earlier turns, a reply's candidates) is computed once per row "
    "(the same gradient), and sampling keeps each conversation's keys and values between rounds; "
    "0 scores each reply on its own prompt, --train-micro-batch at a time, and samples from whole prompts.",
)
@click.option(
    "--autocast",
    type=click.Choice(["bf16"]),
    default=None,
    help="peft: matrix products in bfloat16 (torch.autocast), sampling and training; the adapter, "
    "optimiser and loss stay float32. With --dtype bfloat16 the fastest step measured on a CPU with "
    "AMX (docs/training.md); emulated, and many times slower, on a CPU without bfloat16 "
    "instructions (dphil-train warns).",
)
@click.option(
    "--gradient-checkpointing/--no-gradient-checkpointing",
    default=True,
    show_default=True,
    help="peft: recompute each layer's activations in the backward pass instead of keeping them "
    "(about a tenth more CPU, far less memory; the same gradient).",
)
@click.option(
    "--shared-prefix/--no-shared-prefix",
    default=True,
    show_default=True,
    help="peft: what several neighbouring prefix-tree rows hold (each seat's system prompt, turns "
    "their conversations share) is computed once for them, as keys and values the rows attend to, "
    "not once per row (the same gradient; at most --pack-width positions, kept until the rows are "
    "done). Models with sliding-window layers (Gemma 3) compute every row whole.",
)
@click.option(
    "--tensorboard",
    is_flag=True,
    help="Also write each step's metrics as TensorBoard event files in RUN_DIR "
    "(tensorboard --logdir RUN_DIR; needs the tensorboard package).",
)
@click.option("--art-path", default=None, help="ART's storage directory [default: RUN_DIR/art].")
@click.option("--project", default="dphil", show_default=True, help="ART project name.")
@output_option
@wait_lock_option
@quiet_option
def main(
    base_model,
    run_dir,
    run_name,
    backend,
    sizes,
    rounds,
    protocol,
    schedule,
    conflict,
    deadlock_mode,
    steps,
    groups,
    group_size,
    lora_rank,
    lora_alpha,
    learning_rate,
    reward,
    seed,
    curriculum,
    advance_at,
    smoothing,
    val_every,
    val_episodes,
    val_seeds,
    val_n,
    episodes_out,
    prompt,
    prompt_file,
    memory,
    decode,
    temperature,
    device,
    threads,
    max_new_tokens,
    clip_epsilon,
    kl_coef,
    max_grad_norm,
    no_scale_advantages,
    advantage,
    advantage_gamma,
    advantage_weight,
    dtype,
    micro_batch,
    train_micro_batch,
    pack_width,
    autocast,
    gradient_checkpointing,
    shared_prefix,
    tensorboard,
    art_path,
    project,
    output,
    wait_lock,
    quiet,
):
    def body(console):
        refuse_piped_stdin("dphil-train")
        from dphil.train.launch import TrainRequest, launch

        request = TrainRequest(
            base_model=base_model,
            run_dir=run_dir,
            run=run_name,
            backend=backend,
            output=output,
            episodes_out=episodes_out,
            tensorboard=tensorboard,
            sizes=sizes,
            rounds=rounds,
            protocol=protocol,
            schedule=schedule,
            conflict=conflict,
            deadlock_mode=deadlock_mode,
            seed=seed,
            steps=steps,
            groups=groups,
            group_size=group_size,
            curriculum=curriculum,
            advance_at=advance_at,
            smoothing=smoothing,
            val_every=val_every,
            val_episodes=val_episodes,
            val_seeds=val_seeds,
            val_n=val_n,
            reward=reward,
            scale_advantages=not no_scale_advantages,
            advantage=advantage,
            advantage_gamma=advantage_gamma,
            advantage_weight=advantage_weight,
            lora_rank=lora_rank,
            lora_alpha=lora_alpha,
            learning_rate=learning_rate,
            clip_epsilon=clip_epsilon,
            kl_coef=kl_coef,
            max_grad_norm=max_grad_norm,
            prompt=prompt,
            prompt_file=prompt_file,
            memory=memory,
            decode=decode,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            device=device,
            dtype=dtype,
            threads=threads,
            micro_batch=micro_batch,
            train_micro_batch=train_micro_batch,
            pack_width=pack_width,
            autocast=autocast,
            gradient_checkpointing=gradient_checkpointing,
            shared_prefix=shared_prefix,
            art_path=art_path,
            project=project,
        )
        return launch(request, console)

    # The run directory is locked too: two trainings of one run would interleave its steps.
    return execute("dphil-train", quiet, body, outputs=(run_dir, output, episodes_out), wait_lock=wait_lock)


if __name__ == "__main__":
    main()
