"""`kvswap bench`: benchmarks that print figures measured side by side in one run."""
