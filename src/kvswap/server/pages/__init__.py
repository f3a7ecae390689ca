"""kvswap's own API: page verbs and slot files, GET /pages, the mind verbs, the cluster's
hand-off, /reconfigure."""
