"""HTTP: the FastAPI shell (app, guard, loader, state, sleep, streaming, the cluster's
forwarder), request building (`requests`), and one sub-package per API family: `llama`
(llama-server's own), `openai`, `anthropic`, `pages` (kvswap's pages, mind verbs, the cluster's
hand-off, reconfigure). A mind's turn itself is `kvswap.minds`'; this package maps requests
onto it."""
