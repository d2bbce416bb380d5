"""fairq."""
