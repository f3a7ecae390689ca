"""Chat output beyond plain text: tools, tool calls, reasoning, and their parsing.

`message` (the parsed assistant message and the diffs a stream sends), `tools` (OpenAI tools
and `tool_choice`, validated), `partial_json` (JSON that may be cut short), `reasoning`
(`<think>` blocks), `toolformats` (how a template's model writes tool calls: the prompt
adaptation, the grammar that enforces them, the parser that reads them back), `parser` (one
choice's incremental parser). Pure: no libllama, no HTTP.
"""
