"""Storage engines behind one interface (see api.py)."""
