"""Pure text handling for generation and chat: no libllama, no I/O.

- `utf8`: `Utf8Decoder`, incremental decoding of token piece bytes.
- `stops`: `StopMatcher`, stop strings over streamed text, as llama-server applies them.
- `output`: `TextAssembler`, the per-request glue of the two (bytes in, stream deltas out).
- `template`: `ChatTemplate`, GGUF chat templates rendered in a jinja2 sandbox with
  llama-server's context, and the message validation that precedes rendering.
"""

from kvswap.text.messages import (
    InvalidMessagesError,
    normalize_messages,
    normalize_tools,
    validate_messages,
)
from kvswap.text.output import TextAssembler
from kvswap.text.stops import StopMatcher, StopResult, apply_stops
from kvswap.text.template import (
    CHATML_TEMPLATE,
    ChatTemplate,
    TemplateCaps,
    TemplateError,
    TemplateRaisedError,
    TemplateRenderError,
    TemplateSyntaxError,
    strip_leading_bos,
    strip_trailing_eos,
)
from kvswap.text.utf8 import Utf8Decoder

__all__ = [
    "CHATML_TEMPLATE",
    "ChatTemplate",
    "InvalidMessagesError",
    "StopMatcher",
    "StopResult",
    "TemplateCaps",
    "TemplateError",
    "TemplateRaisedError",
    "TemplateRenderError",
    "TemplateSyntaxError",
    "TextAssembler",
    "Utf8Decoder",
    "apply_stops",
    "normalize_messages",
    "normalize_tools",
    "strip_leading_bos",
    "strip_trailing_eos",
    "validate_messages",
]
