"""The engine thread and what it runs: the loop (`engine`), one step (`step`), everything one
context geometry builds (`runtime`), slots, requests, commands and the asyncio client. Planning
lives in `plan`, KV state and pages in `kv`, minds in `minds`, speculative decoding in `spec`."""
