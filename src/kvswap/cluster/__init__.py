"""kvswap cluster: replicas behind HAProxy and a shared Redis tier (CLUSTER-RESEARCH.md).

Building blocks, each its own module: the HAProxy config (`haproxy`), the Redis key layout
(`shared_keys`), per-mind leases with fences (`lease`), the shared page store with delta
segments and its byte budget (`shared_store`, `segments`, `kvstate`, `manifest`, `chunks`,
`budget`), the local processes (`procs`) and `kvswap cluster up` (`up`). No module here imports
libllama or the engine; the server wires them into its request path.
"""
