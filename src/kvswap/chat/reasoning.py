"""Reasoning blocks (`<think>...</think>`) split from the answer, as llama-server's
`reasoning_format` does for templates that think.

`Reasoning.detect(template_source, prompt)` finds the tags in the template and whether the
prompt already opened a block (templates such as DeepSeek-R1's end the generation prompt with
`<think>`). `split(text, final)` returns (reasoning, rest-of-text offset): the reasoning is
stripped of surrounding whitespace and, mid-stream, never ends with what may still become the
end tag, so it only grows. Formats, as llama-server's `common_reasoning_format`:
"none" leaves the tags in the content; "auto" and "deepseek" move the block into
`reasoning_content`; "deepseek-legacy" does so too but, streamed, keeps it inline in content.
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvswap.grammar.gbnf import RuleSet, literal, text_until

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
THINK_START = "<think>"
THINK_END = "</think>"


def partial_suffix(text: str, word: str) -> int:
    """Length of the longest end of `text` that is a proper start of `word` (to hold back)."""
    for n in range(min(len(word) - 1, len(text)), 0, -1):
        if text.endswith(word[:n]):
            return n
    return 0


@dataclass(frozen=True)
class Reasoning:
    """How to find reasoning in one request's output."""

    start: str = THINK_START
    end: str = THINK_END
    opened: bool = False  # the prompt ended inside an open block

    @staticmethod
    def detect(template_source: str, prompt: str) -> Reasoning | None:
        """The template's reasoning tags, or None when it does not think with `<think>`."""
        if THINK_START not in template_source or THINK_END not in template_source:
            return None
        tail = prompt.rstrip()
        opened = tail.endswith(THINK_START)
        return Reasoning(opened=opened)

    def split(self, text: str, final: bool) -> tuple[str, int]:
        """(reasoning text, offset where the rest of `text` begins).

        Without a block at the start of `text` (and none opened by the prompt) the reasoning
        is empty and the offset 0; a partial start tag is held back (offset = len(text)).
        """
        body_at = 0
        if not self.opened:
            lead = len(text) - len(text.lstrip())
            head = text[lead:]
            if head.startswith(self.start):
                body_at = lead + len(self.start)
            elif not final and self.start.startswith(head):
                return "", len(text)  # maybe the start tag, still arriving
            else:
                return "", 0
        close = text.find(self.end, body_at)
        if close >= 0:
            rest = close + len(self.end)
            return text[body_at:close].strip(), rest
        body = text[body_at:]
        if not final:
            body = body[: len(body) - partial_suffix(body, self.end)]
        return body.strip(), len(text)

    def allow_in_grammar(self, gbnf: str) -> str:
        """`gbnf` (whose `root` no other rule references) behind an optional reasoning block,
        so a constrained answer may still think first (a block the prompt opened must close)."""
        lines = gbnf.splitlines()
        body = [
            "answer ::= " + line[len("root ::= ") :] if line.startswith("root ::= ") else line
            for line in lines
        ]
        rules = RuleSet()
        think = text_until(rules, self.end, "reasoning")
        block = f"{think} ([ \\t\\n]{{0,4}})"
        if self.opened:
            rules.set("root", f"{block} answer")
        else:
            rules.set("root", f"({literal(self.start)} {block})? answer")
        return rules.render() + "\n".join(body) + "\n"


# Thinking markers of templates that think, by their start marker (llama-server's autoparser
# finds these in the template): <think> (DeepSeek-R1, Qwen3, QwQ), Command R7B's.
THINKING_MARKERS = (
    (THINK_START, THINK_END),
    ("<|START_THINKING|>", "<|END_THINKING|>"),
)


def close_thinking(template_source: str, prompt: str) -> str:
    """`--reasoning off`: the prompt with the template's thinking block closed.

    A prompt that already closes one (Qwen3 with enable_thinking false) is kept; one ending
    with an open block (DeepSeek-R1, QwQ force `<think>`) gets the end marker; otherwise a
    template that thinks gets an empty block, so the model answers at once (llama-server).
    """
    for start, end in THINKING_MARKERS:
        if start not in template_source or end not in template_source:
            continue
        tail = prompt.rstrip()
        if tail.endswith(end):
            return prompt
        if tail.endswith(start):
            return prompt + end
        return prompt + start + end
    return prompt
