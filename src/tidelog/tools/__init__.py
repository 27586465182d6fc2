"""Offline tools over log directories and segment files."""
