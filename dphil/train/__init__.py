"""Training an agent at the table with GRPO (`dphil-train`).

Nothing here imports torch, transformers, peft or ART at import time: each
backend imports its stack when a run needs it, so `dphil-train --help` is fast.
"""
