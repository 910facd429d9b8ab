"""Several servers for one model (one vLLM per GPU node): calls spread by litellm's Router.

A registry entry whose `api_base` is a list becomes one Router deployment per URL, all
under the alias. The Router picks a server per call (`simple-shuffle`); a server whose
call fails is put in cooldown for COOLDOWN_SECONDS, so the gateway's retry of that call,
and the calls after it, go to the others. The gateway keeps its own retries, backoff,
limits and reply cap: the Router is asked for one attempt at a time.
"""

from __future__ import annotations

from typing import Any

from dphil.agents.registry import ModelSpec

COOLDOWN_SECONDS = 30.0


def make_router(litellm: Any, spec: ModelSpec, key: str | None) -> Any:
    """A Router over `spec.bases` for the alias `spec.name`."""
    deployments = []
    for k, base in enumerate(spec.bases):
        params: dict[str, Any] = {"model": spec.model, "api_base": base}
        if key:
            params["api_key"] = key
        deployments.append(
            {"model_name": spec.name, "litellm_params": params, "model_info": {"id": f"{spec.name}#{k}"}}
        )
    return litellm.Router(
        model_list=deployments,
        routing_strategy="simple-shuffle",
        num_retries=0,  # the gateway retries, with its backoff and limits
        allowed_fails=0,  # one failed call takes a server out of rotation...
        cooldown_time=COOLDOWN_SECONDS,  # ...for this long
        set_verbose=False,
    )
