"""dphil: measure and improve how language models coordinate at Dijkstra's dining table."""

__version__ = "0.1.0"
