"""definition."""
