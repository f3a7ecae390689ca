"""The shared vocabulary below every other package: request and event types, typed errors,
sampling parameters. Imports nothing of kvswap but itself."""
