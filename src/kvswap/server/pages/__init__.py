"""kvswap's own API: page verbs and slot files, GET /pages, minds on the HTTP side, /reconfigure."""
