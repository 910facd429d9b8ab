"""The table and its records: the engine, the scripted philosophers, playing and replaying an episode.

Pure Python with no I/O beyond record serialisation; every later stage builds on it.
"""

from dphil._face import lazy_face

_EXPORTS = {
    "table": (
        "Table",
        "Observation",
        "protocol_actions",
    ),
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
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
