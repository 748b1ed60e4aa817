"""`memsvc append`: events from JSON lines, a JSON array or an OpenAI-style messages array,
sent in batches with a progress bar; with --wait, until they are searchable."""

from __future__ import annotations

import argparse
import json
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format
from rich.progress import Progress

from memsvc.domain.pages import cut
from memsvc.transports.cli.connection import Stub, err, out, progress
from memsvc.v1 import memory_pb2 as pb

BATCH = 500  # events per AppendEvents call, at most
# Bytes per call, at most: within MEMSVC_MAX_REQUEST_MB (default 16) with room to spare.
BATCH_BYTES = 4 * 1024 * 1024


@dataclass
class _Parsed:
    events: list[pb.MemoryEvent] = field(default_factory=list)
    lines: dict[tuple[str, int], int] = field(default_factory=dict)  # (conv, turn) -> line
    errors: list[str] = field(default_factory=list)


MAX_SHOWN_ERRORS = 20


class FileFormatError(ValueError):
    """The file is not what `append` reads: one short message, not an error per line."""


def _records(path: str) -> list[tuple[int, Any]]:
    """(line or position, value) for each record of a JSON-lines file or a JSON array."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        try:
            array = json.loads(text)
        except ValueError as exc:
            raise FileFormatError(
                f"{path}: looks like a JSON array but is not JSON: {exc}"
            ) from None
        return list(enumerate(array, 1))
    records: list[tuple[int, Any]] = []
    bad = 0
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append((n, json.loads(line)))
        except ValueError:
            bad += 1
            records.append((n, line))
    if records and bad == len(records):
        raise FileFormatError(
            f"{path}: not JSON lines (no line is JSON); expected one MemoryEvent object per"
            " line, a JSON array of them, or --messages for an OpenAI-style messages array"
        )
    return records


def _read_events(path: str) -> _Parsed:
    parsed = _Parsed()
    for n, value in _records(path):
        try:
            if not isinstance(value, dict):
                raise ValueError(
                    f"expected a JSON object (one MemoryEvent), got {type(value).__name__}"
                )
            event = json_format.ParseDict(value, pb.MemoryEvent())
        except (ValueError, json_format.ParseError) as exc:
            parsed.errors.append(f"line {n}: {str(exc)[:200]}")
            continue
        parsed.events.append(event)
        parsed.lines[(event.conversation_id, event.turn_id)] = n
    return parsed


_ROLES = {"user": "user", "human": "user", "assistant": "assistant", "ai": "assistant"}
_ROLES |= {"system": "system", "developer": "system"}


def _content_text(content: Any) -> str:
    """OpenAI content: a string, or parts of which the text ones count."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _read_messages(path: str, conversation_id: str, first_turn: int) -> _Parsed:
    with open(path, encoding="utf-8") as f:
        try:
            value = json.load(f)
        except ValueError as exc:
            raise FileFormatError(f"{path}: --messages expects a JSON array: {exc}") from None
    if isinstance(value, dict) and isinstance(value.get("messages"), list):
        value = value["messages"]
    if not isinstance(value, list):
        raise FileFormatError(
            f'{path}: --messages expects [{{role, content}}, ...] or {{"messages": [...]}}'
        )
    now = datetime.now(UTC).astimezone().isoformat(timespec="seconds")
    parsed = _Parsed()
    turn = first_turn
    for n, message in enumerate(value, 1):
        if isinstance(message, dict) and message.get("role") == "tool":
            continue  # tool results are not conversation
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            parsed.errors.append(f"message {n}: expected {{role: user|assistant|system, content}}")
            continue
        if not _content_text(message.get("content")).strip():
            continue  # an assistant message with tool calls only: nothing said
        event = pb.MemoryEvent(
            conversation_id=conversation_id,
            turn_id=turn,
            speaker=_ROLES[message["role"]],
            text=_content_text(message["content"]),
            timestamp=str(message.get("timestamp") or now),
            speaker_name=str(message.get("name") or ""),
        )
        parsed.events.append(event)
        parsed.lines[(conversation_id, turn)] = n
        turn += 1
    return parsed


def _batches(events: list[pb.MemoryEvent]) -> list[list[pb.MemoryEvent]]:
    """Per conversation, in turn order, cut into batches of at most BATCH events and
    BATCH_BYTES (a turn larger than that goes alone): a file whose lines are out of order
    still arrives gap-free, and no batch passes the server's request limit."""
    by_conv: dict[str, list[pb.MemoryEvent]] = {}
    for e in events:
        by_conv.setdefault(e.conversation_id, []).append(e)
    out: list[list[pb.MemoryEvent]] = []
    for conv in by_conv:
        turns = sorted(by_conv[conv], key=lambda e: e.turn_id)
        start = 0
        while start < len(turns):
            batch, _ = cut(
                turns[start : start + BATCH], pb.MemoryEvent.ByteSize, BATCH, BATCH_BYTES
            )
            out.append(batch)
            start += len(batch)
    return out


def _next_turn(stub: Stub, conversation_id: str) -> int:
    reply = stub.GetIndexStatus(
        pb.GetIndexStatusRequest(conversation_ids=[conversation_id]), timeout=30
    )
    known = [c.last_appended_turn for c in reply.conversations]
    return max(known, default=-1) + 1


def cmd_append(stub: Stub, args: argparse.Namespace) -> int:
    if args.messages:
        parsed = _read_messages(args.file, args.messages, _next_turn(stub, args.messages))
    else:
        parsed = _read_events(args.file)
    accepted = duplicates = 0
    problems = list(parsed.errors)
    # refused events grouped by their reason: a conversation refused whole says one thing
    # for all its lines, and is said once with those lines
    refused_lines: dict[str, list[int]] = {}
    refused: set[tuple[str, int]] = set()
    with progress() as bars:
        task = bars.add_task("appending", total=len(parsed.events))
        for batch in _batches(parsed.events):
            reply = stub.AppendEvents(
                pb.AppendEventsRequest(
                    events=batch, allow_gaps=args.allow_gaps, restore=args.restore
                ),
                timeout=300,
            )
            accepted += reply.accepted
            duplicates += reply.duplicates
            for e in reply.errors:
                line = _line_of(e.chunk_id, parsed)
                if line is None:
                    problems.append(f"{e.chunk_id}: {e.message}")
                    continue
                why = e.message
                culprit = _culprit(why, batch, parsed)
                if culprit is not None:  # `events[i].field: why` -> that line's field
                    culprit_line, field_why = culprit
                    why = (
                        field_why
                        if culprit_line == line
                        else (
                            f"not written: line {culprit_line} of its conversation was refused"
                            " (a conversation's turns in one batch are written together)"
                        )
                    )
                refused_lines.setdefault(why, []).append(line)
                conv, _, turn = e.chunk_id.rpartition("#")
                if turn.isdigit():
                    refused.add((conv, int(turn)))
            bars.advance(task, len(batch))
        if args.wait:
            written = [e for e in parsed.events if (e.conversation_id, e.turn_id) not in refused]
            paused = (
                written
                and stub.GetIndexStatus(
                    pb.GetIndexStatusRequest(conversation_ids=[written[0].conversation_id]),
                    timeout=60,
                ).paused
            )
            if paused:  # nothing would be indexed: say so now, not after the time-out
                problems.append(
                    "indexing is paused (memsvc resume starts it): the turns are stored, and"
                    " not searchable until then; not waiting"
                )
            elif written and not _wait_indexed(stub, written, bars, args.wait_timeout):
                problems.append(
                    f"not all accepted turns were searchable within {args.wait_timeout:g} s"
                    " (memsvc status shows the backlog)"
                )
    merged = sum(len(lines) - 1 for lines in refused_lines.values())
    problems[len(parsed.errors) : len(parsed.errors)] = [
        f"{_said_lines(lines)}: {why}"
        for why, lines in sorted(refused_lines.items(), key=lambda item: min(item[1]))
    ]
    out.print(
        f"accepted {accepted}, duplicates {duplicates}, errors {len(problems) + merged}",
        markup=False,
        highlight=False,
    )
    for problem in problems[:MAX_SHOWN_ERRORS]:
        err.print(problem, markup=False, highlight=False)
    if len(problems) > MAX_SHOWN_ERRORS:
        err.print(f"... and {len(problems) - MAX_SHOWN_ERRORS} more", markup=False)
    return 1 if problems else 0


def _said_lines(lines: list[int]) -> str:
    """[3] -> `line 3`; [1, 2, 3, 7] -> `lines 1-3, 7`."""
    if len(lines) == 1:
        return f"line {lines[0]}"
    runs: list[list[int]] = []
    for n in sorted(set(lines)):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return "lines " + ", ".join(
        f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs
    )


def _culprit(message: str, batch: list[pb.MemoryEvent], parsed: _Parsed) -> tuple[int, str] | None:
    """The server names a field of the request (`events[4].timestamp: why`): the file
    line that holds events[4], and `timestamp: why`."""
    found = re.match(r"events\[(\d+)\]\.", message)
    if found is None or int(found[1]) >= len(batch):
        return None
    e = batch[int(found[1])]
    line = parsed.lines.get((e.conversation_id, e.turn_id))
    return None if line is None else (line, message[found.end() :])


def _line_of(key: str, parsed: _Parsed) -> int | None:
    conv, _, turn = key.rpartition("#")
    return parsed.lines.get((conv, int(turn))) if turn.isdigit() else None


def _wait_indexed(
    stub: Stub, events: list[pb.MemoryEvent], bars: Progress, timeout_s: float
) -> bool:
    """Until the last accepted turn of each conversation is searchable (False on time-out)."""
    last: dict[str, int] = {}
    for e in events:
        last[e.conversation_id] = max(last.get(e.conversation_id, -1), e.turn_id)
    task = bars.add_task("indexing", total=len(last))
    deadline = time.monotonic() + timeout_s
    waiting = sorted(last)
    while waiting:
        conv = waiting[0]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        reply = stub.WaitForIndexed(
            pb.WaitForIndexedRequest(
                conversation_id=conv, turn_id=last[conv], timeout_ms=int(min(remaining, 30) * 1000)
            ),
            timeout=min(remaining, 30) + 5,
        )
        if reply.status.state == "failed":
            raise ValueError(f"{conv}: indexing failed: {reply.status.last_error}")
        if reply.indexed:
            waiting.pop(0)
            bars.advance(task, 1)
    return True
