"""Real weights and local model servers: the offline weights cache, server processes, the llama.cpp launcher."""

from dphil._face import lazy_face

_EXPORTS = {
    "weights": (
        "real_model",
        "assemble",
        "convert",
        "verify",
        "cache_dir",
    ),
    "processes": (
        "LocalServer",
        "ServerError",
        "free_port",
        "llamacpp_server",
        "transformers_server",
    ),
    "request": (
        "WeightsRequest",
        "run_weights",
    ),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
