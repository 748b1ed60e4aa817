"""The model's tokenizer without transformers: the `tokenizers` pipeline that transformers
drives, as a full start recorded it, driven the same way.

Importing transformers costs a start 3-4 s of CPU, most of it torch, which transformers'
configuration code imports. A start on the verified ONNX export (memsvc.embedding.
verified_export) needs neither: transformers' fast tokenizer is a `tokenizers.Tokenizer`
(its backend) plus a few settings (the pad token, the sides it pads and truncates on, the
inputs the model reads). The full start writes them down beside the export
(`tokenizer-record.json`) with the token ids of the probe texts; a later start rebuilds the
tokenizer from the record, and uses it only if the installed transformers and tokenizers
are the recording ones and it gives the same ids for the probes. What this class does per
call is what transformers' TokenizersBackend does for the calls memsvc makes (tests/
test_recorded_tokenizer.py compares the two on the same texts).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from memsvc.embedding.cache_files import write_whole

RECORD_NAME = "tokenizer-record.json"
RECORD_FORMAT = 1


def _stack() -> dict[str, str]:
    """The packages the record came from, as installed (neither is imported to read it)."""
    return {"transformers": version("transformers"), "tokenizers": version("tokenizers")}


@dataclass(frozen=True)
class TokenizerRecord:
    """What transformers' tokenizer adds to its backend, and what the model reads."""

    class_name: str  # transformers' class: part of Embedder.tokenizer_id, kept in the log
    length: int  # len(tokenizer): the vocabulary with added tokens
    backend: str  # the backend pipeline, Tokenizer.to_str()
    pad_id: int
    pad_token: str
    pad_type_id: int
    padding_side: str
    truncation_side: str
    split_special_tokens: bool
    input_names: list[str]
    max_tokens: int  # of the model (ModelInfo.max_tokens), as the full start found it
    dim: int
    probe_ids: list[list[int]]  # the probes' ids, truncated at max_tokens
    stack: dict[str, str]

    @classmethod
    def of(
        cls, tokenizer: Any, max_tokens: int, dim: int, probes: Sequence[str]
    ) -> TokenizerRecord:
        """The record of transformers' fast tokenizer `tokenizer`."""
        ids = tokenizer(list(probes), truncation=True, max_length=max_tokens)["input_ids"]
        return cls(
            class_name=type(tokenizer).__name__,
            length=len(tokenizer),
            backend=tokenizer.backend_tokenizer.to_str(),
            pad_id=int(tokenizer.pad_token_id),
            pad_token=str(tokenizer.pad_token),
            pad_type_id=int(tokenizer.pad_token_type_id),
            padding_side=str(tokenizer.padding_side),
            truncation_side=str(tokenizer.truncation_side),
            split_special_tokens=bool(getattr(tokenizer, "split_special_tokens", False)),
            input_names=list(tokenizer.model_input_names),
            max_tokens=max_tokens,
            dim=dim,
            probe_ids=[list(x) for x in ids],
            stack=_stack(),
        )


def write_record(export_dir: Path, record: TokenizerRecord) -> None:
    """Beside the export."""
    write_whole(
        export_dir / RECORD_NAME, json.dumps({"format": RECORD_FORMAT, **asdict(record)}) + "\n"
    )


def read_record(export_dir: Path) -> TokenizerRecord | None:
    """The record, if there is one of this format from the installed packages."""
    try:
        data = json.loads((export_dir / RECORD_NAME).read_text())
        if data.pop("format", None) != RECORD_FORMAT:
            return None
        record = TokenizerRecord(**data)
    except (OSError, ValueError, TypeError):
        return None
    return record if record.stack == _stack() else None


class RecordedTokenizer:
    """Tokenizes as transformers' fast tokenizer of the record does, for memsvc's calls:
    a batch of single texts, with or without special tokens, truncation at a length,
    character offsets, padding to the longest, numpy tensors.

    Unlike transformers, which sets truncation and padding on its one backend at every
    call, each truncation length has a backend of its own, set once: counting tokens in one
    thread cannot change what another thread's batch is truncated to."""

    is_fast = True

    def __init__(self, record: TokenizerRecord) -> None:
        self.record = record
        self._backends: dict[int | None, Any] = {}
        self._lock = threading.Lock()
        self._backend(None)  # a record that does not load fails here, not at a first call

    def __reduce__(self) -> tuple[type[RecordedTokenizer], tuple[TokenizerRecord]]:
        """Pickles as its record (render processes take the token counter): the lock and
        the backends are rebuilt where it is loaded."""
        return (RecordedTokenizer, (self.record,))

    def __len__(self) -> int:
        return self.record.length

    @property
    def class_name(self) -> str:
        """transformers' class that the record was made from (Embedder.tokenizer_id)."""
        return self.record.class_name

    def _backend(self, max_length: int | None) -> Any:
        with self._lock:
            found = self._backends.get(max_length)
            if found is None:
                from tokenizers import Tokenizer

                found = Tokenizer.from_str(self.record.backend)
                found.no_padding()
                if max_length is None:
                    found.no_truncation()
                else:
                    found.enable_truncation(
                        max_length,
                        stride=0,
                        strategy="longest_first",
                        direction=self.record.truncation_side,
                    )
                found.encode_special_tokens = self.record.split_special_tokens
                self._backends[max_length] = found
            return found

    def __call__(
        self,
        texts: Sequence[str],
        *,
        add_special_tokens: bool = True,
        truncation: bool = False,
        max_length: int | None = None,
        padding: bool = False,
        return_offsets_mapping: bool = False,
        return_tensors: str | None = None,
    ) -> dict[str, Any]:
        backend = self._backend(max_length if truncation else None)
        encodings = backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        names = self.record.input_names
        out: dict[str, Any] = {"input_ids": [e.ids for e in encodings]}
        if "token_type_ids" in names:
            out["token_type_ids"] = [e.type_ids for e in encodings]
        if "attention_mask" in names:
            out["attention_mask"] = [e.attention_mask for e in encodings]
        if return_offsets_mapping:
            out["offset_mapping"] = [e.offsets for e in encodings]
        if padding:
            return self.pad(out, return_tensors=return_tensors)
        return out

    def pad(
        self, encoded: Mapping[str, Sequence[Sequence[Any]]], return_tensors: str | None = "np"
    ) -> dict[str, Any]:
        """Each row padded to the longest, on the record's side: the pad id, the pad type
        id, a 0 in the attention mask (offsets, if any, with (0, 0))."""
        longest = max((len(row) for row in encoded["input_ids"]), default=0)
        fill = {
            "input_ids": self.record.pad_id,
            "token_type_ids": self.record.pad_type_id,
            "attention_mask": 0,
            "offset_mapping": (0, 0),
        }
        left = self.record.padding_side == "left"
        out: dict[str, Any] = {}
        for key, rows in encoded.items():
            padded = []
            for row in rows:
                extra = [fill[key]] * (longest - len(row))
                padded.append(extra + list(row) if left else list(row) + extra)
            out[key] = padded
        if return_tensors == "np":
            return {key: np.asarray(rows, dtype=np.int64) for key, rows in out.items()}
        return out
