"""The CPU experiments' policy: the test suite's tiny random Qwen3, each action name one token.

The tiny tokenizer splits `pick-up-left` into five pieces, so a random model would score every
fork action about 1e-9 under constrained decoding and never eat; with the action names added as
single tokens the untrained policy spreads its probability over all six actions (the whole
reasoning is in bench/train_curve.py's docstring).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from jobs import ROOT, rel

# The prompt the tiny model plays with: its seat, its table and the answer format, nothing else.
PROMPT = "Seat $seat of $n.\n$answer\n"


def policy_args(prompt: Path) -> list[str]:
    """How the tiny model plays, for training and evaluation alike: `prompt` (a file holding
    PROMPT), no memory, one thread, choices scored among the six actions."""
    return ["--prompt-file", rel(prompt), "--memory", "none", "--threads", "1", "--decode", "constrained"]


def build_model(work: Path) -> Path:
    """The tests' tiny Qwen3 model with each multi-token action name made one token."""
    sys.path.insert(0, str(ROOT))
    import torch
    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from dphil.core.protocols import protocol_actions
    from tests.support.tinymodel import build_tiny_model

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    base = build_tiny_model(work / "tiny-base")
    out = work / "tiny-model"
    shutil.rmtree(out, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(base)
    # With the leading space, so `ACTION: eat` and `ACTION: pick-up-left` differ in one token.
    split = [a for a in protocol_actions("paper") if len(tok.tokenize(" " + a)) > 1]
    tok.add_tokens([AddedToken(" " + a, normalized=False) for a in split])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base)
    model.resize_token_embeddings(len(tok), mean_resizing=False)  # new rows: the usual init
    tok.save_pretrained(out)
    model.save_pretrained(out)
    for a in protocol_actions("paper"):
        assert len(tok.tokenize(" " + a)) == 1, a
    return out
