"""A mind's turn, from the mind's key to the turn's end, on the event loop: no HTTP.

- `names`: the mind a request names (a header's text and/or a body's field), in its tenant's
  namespace;
- `session`: one turn of a mind at a time (its lock), the mind kept busy and claimed for this
  server, its disk copy read back, the barrier after a restore, what it no longer needs let go;
- `placement`: in a cluster, whose turn it is (serve here, forward to the owner, wait a dead
  owner's lease out and take over, or refuse), a pure rule and its lease wait;
- `shared`: the turn's side of the shared tier (its worker threads, hand-offs, the forwarder's
  questions), and `figures`: what a turn's end writes and counts.

The HTTP server maps requests onto these (`server.streaming`, `server.forward`); nothing here
imports FastAPI, Starlette or `kvswap.server`, so the whole turn runs in a unit test.
"""
