"""Pure planning: which tokens go into a step, which job takes which slot, the context geometry,
LoRA sets and their turns. No libllama, no threads."""
