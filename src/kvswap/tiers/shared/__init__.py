"""The shared tier: minds' pages, token logs and owner leases in Redis (docs/CLUSTER.md).

A tier like the disk one, below the server: the Redis key layout (`keys`), per-mind leases
with fences (`lease`), the page store with delta segments and its byte budget (`store`,
`segments`, `kvstate`, `manifest`, `chunks`, `budget`, `store_scripts`), the token log
(`token_log`), the client settings and typed errors (`connection`, `errors`); and what a
replica runs on top of them: the leases it holds and their renewal (`holdings`), publishing
minds through and behind their turns (`writer`), taking a mind over (`resume`), and the one
object the server holds (`replica.SharedTier`). No module here imports libllama; the engine
is reached through its client's commands only.
"""
