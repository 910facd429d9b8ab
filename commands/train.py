"""dphil-train: GRPO on the table (peft on any machine, OpenPipe ART on a GPU), one checkpoint per step."""

from __future__ import annotations

import click
from dphil.commands._common import command, execute, output_option, quiet_option, wait_lock_option

from dphil.core.table import CONFLICTS, DEADLOCK_MODES, PROTOCOLS, SCHEDULES

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
@click.option(
    "-n",
    "--philosophers",
    "sizes",
    default="5",
    show_default=True,
    metavar="N[,N...]",
    help="Table size(s) to train on (several sizes: groups cycle through them).",
)
@click.option("--rounds", type=click.IntRange(min=1), default=5, show_default=True)
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
@click.option(
    "--reward",
    "variant",
    type=click.Choice(["paper", "shaped"]),
    default=None,
    help="Training reward [default: paper].",
)
@click.option("--shaped", is_flag=True, help="Same as --reward shaped.")
@click.option("--alpha", type=float, default=1.0, show_default=True)
@click.option("--beta", type=float, default=0.5, show_default=True)
@click.option("--gamma", type=float, default=0.3, show_default=True)
@click.option("--delta", type=float, default=0.1, show_default=True)
@click.option("--min-meals", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--protocol", type=click.Choice(list(PROTOCOLS)), default="paper", show_default=True)
@click.option("--schedule", type=click.Choice(SCHEDULES), default="simultaneous", show_default=True)
@click.option("--conflict", type=click.Choice(CONFLICTS), default="random", show_default=True)
@click.option(
    "--deadlock",
    "deadlock_mode",
    type=click.Choice(DEADLOCK_MODES),
    default="terminal",
    show_default=True,
)
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
@click.option(
    "--decode",
    type=click.Choice(["constrained", "free"]),
    default="constrained",
    show_default=True,
    help="peft: constrained samples among the protocol's replies; free generates and parses.",
)
@click.option("--temperature", type=click.FloatRange(min=0), default=1.0, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=48, show_default=True)
@click.option(
    "--prompt",
    "prompt_name",
    default="default",
    show_default=True,
    help="Prompt variant: default, minimal, resource-ordering, symmetry-breaking.",
)
@click.option("--prompt-file", default=None, type=click.Path(dir_okay=False, path_type=str))
@click.option("--memory", default="full", show_default=True, help="full, none or window:K.")
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
    type=click.Choice(["episode", "philosopher", "step"]),
    default="episode",
    show_default=True,
    help="Credit assignment: episode (every turn gets its episode's group advantage, the "
    "study's), philosopher (each philosopher's own share of the reward, per seat), step "
    "(GiGPO: episode advantage + weight x advantage among turns that saw the same state).",
)
@click.option(
    "--advantage-gamma",
    type=click.FloatRange(0, 1),
    default=None,
    help="step: discount of the return from a turn on [default: 0.95].",
)
@click.option(
    "--advantage-weight",
    type=click.FloatRange(min=0),
    default=None,
    help="step: weight of the step-level advantage [default: 1.0].",
)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:1, ...")
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    default="auto",
    show_default=True,
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="CPU threads for torch [default: torch's choice]; 1 is fastest for tiny models on a busy machine.",
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
    "--gradient-checkpointing/--no-gradient-checkpointing",
    default=True,
    show_default=True,
    help="peft: recompute each layer's activations in the backward pass instead of keeping them "
    "(about a tenth more CPU, far less memory; the same gradient).",
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
def main(**opts):
    from dphil.train.launch import launch

    # The run directory is locked too: two trainings of one run would interleave its steps.
    return execute(
        "dphil-train",
        opts["quiet"],
        lambda console: launch(console, opts),
        outputs=(opts["run_dir"], opts["output"], opts["episodes_out"]),
        wait_lock=opts["wait_lock"],
    )


if __name__ == "__main__":
    main()
