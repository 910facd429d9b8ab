"""A tiny randomly initialised Qwen3 (or Gemma 3) model and its tokenizer, built offline for tests.

Tests never download weights. This builds, in a directory, what
`from_pretrained` expects of a Qwen3 checkpoint: a byte-level BPE tokenizer
trained on table vocabulary (so prompts stay short), a Qwen-style chat
template, and a Qwen3ForCausalLM of a few hundred thousand parameters. Every
byte is representable, so any prompt or reply round-trips.

    from tests.support.tinymodel import build_tiny_model
    path = build_tiny_model(tmp_path / "tiny")   # -> the same path, now a model dir
"""

from __future__ import annotations

from pathlib import Path

# Qwen's chat markers; the template below is a minimal Qwen-style one.
IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Words the table's prompts use, repeated so BPE merges them into single tokens.
_CORPUS = """
You are philosopher 0 at a round table of 5 philosophers dining together.
Each philosopher needs both the left fork and the right fork to eat.
Your left fork is fork 0 and your right fork is fork 1. Round 1 of 5.
You hold your left fork. You do not hold your right fork. The left fork is free.
The right fork is held by a neighbour. You have eaten 0 meals. Meals so far.
Your last action was pick-up-left and it succeeded. It failed: held-by-neighbour.
already-held not-holding needs-both-forks lost-conflict no-action
Choose exactly one action. Reply with the action name only. Call one tool.
Available actions: pick-up-left, pick-up-right, put-down-left, put-down-right, eat, think.
Available actions: grab-left, grab-right, release, wait.
pick-up-left pick-up-right put-down-left put-down-right eat think
grab-left grab-right release wait
ACTION: eat ACTION: think ACTION: pick-up-left ACTION: pick-up-right
{"action": "eat"} {"action": "think"} {"action": "pick-up-left"} {"action": "release"}
system user assistant tool deadlock avoid starvation fairness throughput
the a an and or of to in is it you your we they he she not no yes
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20
"""


def _corpus() -> list[str]:
    """Table vocabulary plus the agent prompts themselves, so a prompt is a few hundred tokens."""
    lines = [line for line in _CORPUS.strip().splitlines() if line.strip()]
    try:
        from dphil.agents.prompts import builtin_prompt
    except ImportError:  # the prompts module is optional for the tokenizer
        return lines
    # The variants the tiny tokenizer was first trained on, frozen: a later variant's lines would
    # change its merges, and with them every tiny model the tests were written against.
    for variant in ("default", "minimal", "resource-ordering", "symmetry-breaking"):
        for protocol in ("paper", "dpbench"):
            for tools in (True, False):
                text = builtin_prompt(variant).system(protocol, 5, 1, tools=tools)
                lines.extend(line for line in text.splitlines() if line.strip())
    return lines


def build_tiny_model(
    path: str | Path,
    *,
    hidden_size: int = 96,
    layers: int = 2,
    vocab_size: int = 1024,
    seed: int = 0,
    architecture: str = "qwen3",
    sliding_window: int = 8,
) -> Path:
    """Write a tiny Qwen3 model + tokenizer to `path` (created) and return `path`.

    `architecture="qwen2"` builds Qwen2's (the instruction-tuned Qwen2.5 models'
    family); `architecture="gemma3"` builds Gemma 3's text model instead (the base
    weights' family): sliding-window layers with a window of `sliding_window`
    tokens beside full-attention ones, one key/value head, a final-logit
    softcap; so code that builds its own attention masks meets what the real
    model does. Deterministic for a given seed. Takes well under a second on a CPU.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus() * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=EOT,
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)

    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(fast),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        head_dim=hidden_size // 4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=fast.convert_tokens_to_ids(IM_END),
        pad_token_id=fast.convert_tokens_to_ids(EOT),
        bos_token_id=None,
    )
    if architecture == "gemma3":
        config = Gemma3TextConfig(
            **common,
            num_key_value_heads=1,
            sliding_window=sliding_window,
            layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
            final_logit_softcapping=30.0,
        )
        model = Gemma3ForCausalLM(config)
    elif architecture == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common, num_key_value_heads=2))
    elif architecture == "qwen2":  # the real instruction-tuned models' family: biased q/k/v, no q/k norms
        common.pop("head_dim")
        model = Qwen2ForCausalLM(Qwen2Config(**common, num_key_value_heads=2))
    else:
        raise ValueError(f"unknown tiny architecture {architecture!r} (qwen3, qwen2 or gemma3)")
    config = model.config
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(path)
    return path


def count_parameters(path: str | Path) -> int:
    """Number of parameters of the model saved at `path` (for the size check in tests)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(path)
    return sum(p.numel() for p in model.parameters())
