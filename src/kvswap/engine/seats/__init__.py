"""Minds on the engine thread: the registry (where each named conversation lives), seating a mind
in a slot, and the anonymous prompt cache."""
