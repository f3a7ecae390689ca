"""Speculative decoding: drafts (a draft model or n-grams), verification, rollback."""
