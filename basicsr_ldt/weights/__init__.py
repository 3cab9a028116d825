"""Weights on disk: safe checkpoint reading and writing (``checkpoint``), the upstream releases by
name with their configurations (``releases``), and downloading and checking them (``fetch``)."""
