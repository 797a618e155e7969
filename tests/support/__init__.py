"""Helpers the tests share, imported as ``support.<module>`` (pytest puts tests/ on the path)."""
