"""HTTP: the FastAPI shell (app, guard, loader, state, sleep, streaming), request building
(`requests`), and one sub-package per API family: `llama` (llama-server's own), `openai`,
`anthropic`, `pages` (kvswap's pages, minds and reconfigure)."""
