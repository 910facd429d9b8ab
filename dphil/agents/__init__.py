"""Language-model philosophers: prompts, tools, reply parsing, model registry, litellm calls,
agents and the async episode runner.

`prompts`, `tools` and `parsing` never import litellm, so the local-model trainer
reuses them; `llm` imports litellm on the first model call only.
"""
