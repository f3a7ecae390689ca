"""A request body made ready to run, for every API family: schemas, sampling fields, chat
planning (template, tools, grammar), constraints, LoRA sets, engine requests."""
