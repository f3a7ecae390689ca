"""kvswap cluster: the tooling above the server for replicas behind HAProxy.

The HAProxy config and its runtime API (`haproxy`), the local processes (`procs`),
`kvswap cluster up` (`up`) and the `kvswap cluster` command line (`cli`). The shared Redis tier
the replicas use lives below the server, in `kvswap.tiers.shared`.
"""
