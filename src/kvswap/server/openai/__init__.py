"""OpenAI's API: /v1/completions, /v1/chat/completions, /v1/responses, and their shapes."""
