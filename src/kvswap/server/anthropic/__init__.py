"""Anthropic's API: /v1/messages (+ /count_tokens), its body as a chat body, answers and events."""
