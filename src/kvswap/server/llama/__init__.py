"""llama-server's own API: /completion, /apply-template, /health, /props, /slots, /metrics,
/tokenize, /detokenize, /lora-adapters, and their response shapes (/completion's and the
metrics text are the shell's: `formats_native`, `prometheus`)."""
