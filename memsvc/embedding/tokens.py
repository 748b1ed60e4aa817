"""Token counts for a model served elsewhere: its tokenizer when given one (a
`tokenizer.json`, read by the `tokenizers` library without torch), else a cautious
estimate. Counts decide chunk sizes and which turns are too long, so an estimate errs on
the high side: chunks come out a little smaller than the model could take."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ESTIMATE_ID = "estimate-v1"


class RemoteTokenizer:
    """A remote model's token counts (`count`), or their estimate; its bound `count` is the
    domain's TokenCounter (memsvc.domain.chunking)."""

    def __init__(self, tokenizer: Any = None, source: str = "") -> None:
        if tokenizer is not None:
            # tokenizer.json files often carry the exporter's truncation and padding: a
            # count is of the whole text, unpadded
            tokenizer.no_truncation()
            tokenizer.no_padding()
        self._tokenizer = tokenizer
        self.id = f"tokenizer:{source}:{tokenizer.get_vocab_size()}" if tokenizer else ESTIMATE_ID
        # [CLS]/[SEP] and the like, which the server adds to every text
        self.special_tokens = 2

    @staticmethod
    def load(source: str) -> RemoteTokenizer:
        """`source`: a tokenizer.json, a directory holding one, or empty for the estimate."""
        if not source:
            return RemoteTokenizer()
        from tokenizers import Tokenizer

        path = Path(source).expanduser()
        if path.is_dir():
            path = path / "tokenizer.json"
        if path.is_file():
            return RemoteTokenizer(Tokenizer.from_file(str(path)), source)
        return RemoteTokenizer(Tokenizer.from_pretrained(source), source)

    def count(self, texts: Sequence[str]) -> list[int]:
        if self._tokenizer is None:
            return [estimate_tokens(t) for t in texts]
        encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encoded]


_WORD = re.compile(r"[A-Za-z0-9]+")


def estimate_tokens(text: str) -> int:
    """At least what BERT-family and tiktoken tokenizers produce for most text: one per
    character outside ASCII (CJK is one token per character, or fewer), one per ASCII
    punctuation mark, one per three letters or digits of a word (English words average
    four or more characters per token). Every character but whitespace counts once
    besides words' letters; counted by str methods in C (a loop over characters in Python
    was half of an index step's time on the remote path)."""
    lengths = list(map(len, _WORD.findall(text)))
    visible = sum(map(len, text.split()))  # str.split() cuts at what str.isspace() calls space
    return sum([(n + 2) // 3 for n in lengths]) + visible - sum(lengths)
