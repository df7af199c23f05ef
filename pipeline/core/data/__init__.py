"""Data sources, deterministic splits and torch batch iterators."""
