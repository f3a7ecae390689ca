"""KV state in RAM: the page store and its layout, moving a slot's state to and from buffers,
slot verbs, cuts and context checkpoints, stream-header rewriting, page-sized buffers."""
