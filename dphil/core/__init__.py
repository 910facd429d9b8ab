"""The table and its records: the engine, the scripted philosophers, playing and replaying an episode.

Pure Python with no I/O beyond record serialisation; every later stage builds on it. `maths`,
the statistics (numpy and scipy, imported on first use), knows nothing of episodes.
"""

from dphil._face import lazy_face

_EXPORTS = {
    "table": (
        "Table",
        "Observation",
    ),
    "protocols": ("protocol_actions",),
    "policies": ("get_policy",),
    "records": (
        "EpisodeConfig",
        "episode_id",
        "episode_record",
        "check_episode",
        "SCHEMA_VERSION",
    ),
    "episode": (
        "play",
        "play_line",
        "replay",
        "Outcome",
    ),
    "maths": (
        "mean_ci",
        "welch",
        "hedges_g",
        "paired",
        "mcnemar",
        "adjust",
        "power",
        "sample_size",
    ),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
