"""Showing episodes: the timeline of one episode, the self-contained HTML viewer, choosing what to show."""

from dphil._face import lazy_face

_EXPORTS = {
    "timeline": (
        "Timeline",
        "timeline",
        "render_text",
    ),
    "svg": ("episode_svg",),
    "viewer": ("EpisodePage",),
    "choose": (
        "ShowRequest",
        "show",
    ),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
