"""`memsvc append | search | status | list | export | delete | purge | retire | reindex |
pause | resume`: a command-line client of a running server (progress bars and tables on a
terminal, plain text or JSON otherwise)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from memsvc.domain.pages import page_token
from memsvc.transports.cli.append import cmd_append
from memsvc.transports.cli.connection import Stub, connect, err, out, print_table, turn_or_none
from memsvc.transports.cli.mcp import add_mcp_command, run_mcp
from memsvc.transports.cli.reindex import cmd_reindex
from memsvc.v1 import memory_pb2 as pb

# Conversations `memsvc status` shows without --conversation (memsvc list pages them all).
STATUS_ROWS = 50
_MODES = {
    "dense": pb.SEARCH_MODE_DENSE,
    "keyword": pb.SEARCH_MODE_KEYWORD,
    "hybrid": pb.SEARCH_MODE_HYBRID,
}


def add_client_commands(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--target",
        default=os.environ.get("MEMSVC_TARGET", "127.0.0.1:50051"),
        help="HOST:PORT of the server (env MEMSVC_TARGET)",
    )
    common.add_argument(
        "--token",
        default=os.environ.get("MEMSVC_TOKEN", ""),
        help="bearer token (env MEMSVC_TOKEN)",
    )
    common.add_argument(
        "--ca-file",
        default=os.environ.get("MEMSVC_CA_FILE", ""),
        help="PEM CA to trust: connect with TLS (env MEMSVC_CA_FILE)",
    )

    p = sub.add_parser(
        "append",
        parents=[common],
        help="send events from a file: JSON lines or a JSON array of MemoryEvents, or an"
        " OpenAI-style messages array with --messages",
    )
    p.add_argument(
        "file",
        help="JSON lines (one MemoryEvent per line, the proto's field names), a JSON array"
        ' of them, or with --messages [{role, content}, ...] (or {"messages": [...]})',
    )
    p.add_argument(
        "--messages",
        metavar="CONVERSATION",
        help="the file is an OpenAI-style messages array: append it as this conversation"
        " (turn ids after its last turn, timestamps now unless a message has one)",
    )
    p.add_argument("--wait", action="store_true", help="then wait until they are searchable")
    p.add_argument(
        "--restore",
        action="store_true",
        help="bring back turns that were deleted (or purged) with the events sent, e.g. an"
        " export appended after a delete (role admin); without it they are errors",
    )
    p.add_argument(
        "--wait-timeout",
        type=float,
        default=600.0,
        help="seconds --wait waits at most (default 600); exit 1 if not all are searchable",
    )
    p.add_argument("--allow-gaps", action="store_true")
    p.set_defaults(run=cmd_append)

    p = sub.add_parser("search", parents=[common], help="search memory (EmbedDb)")
    p.add_argument("query")
    p.add_argument("--conversation", action="append", default=[], help="repeatable")
    p.add_argument("--mode", choices=sorted(_MODES), default=None)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_search)

    p = sub.add_parser("status", parents=[common], help="index backlog and states")
    p.add_argument("--conversation", action="append", default=[], help="repeatable")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_status)

    p = sub.add_parser(
        "export",
        parents=[common],
        help="a conversation's events as JSON lines (memsvc append takes them back)",
    )
    p.add_argument("--conversation", required=True)
    p.add_argument("--output", "-o", default="-", help="file to write (default: stdout)")
    p.add_argument(
        "--last", type=int, default=0, help="only the newest N live events (default: all)"
    )
    p.set_defaults(run=cmd_export)

    p = sub.add_parser("list", parents=[common], help="conversations with their state, paged")
    p.add_argument("--limit", type=int, default=50, help="rows per page (default 50)")
    p.add_argument("--after", default="", help="the last conversation id of the previous page")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_list)

    p = sub.add_parser("delete", parents=[common], help="delete turns (logically)")
    p.add_argument("--conversation", required=True)
    p.add_argument("--turns", help="A-B (inclusive); default: the whole conversation")
    p.add_argument("--yes", action="store_true", help="confirm deleting a whole conversation")
    p.set_defaults(run=cmd_delete)

    p = sub.add_parser("purge", parents=[common], help="erase deleted turns and chunks")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--conversation")
    who.add_argument("--all-conversations", action="store_true")
    p.add_argument("--yes", action="store_true", help="confirm: erasure cannot be undone")
    p.set_defaults(run=cmd_purge)

    p = sub.add_parser("retire", parents=[common], help="remove a conversation's chunk version")
    p.add_argument("--conversation", required=True)
    p.add_argument("--chunk-version", type=int, required=True)
    p.set_defaults(run=cmd_retire)

    p = sub.add_parser("reindex", parents=[common], help="rebuild from the event log")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--conversation", action="append")
    which.add_argument("--all", action="store_true")
    p.add_argument("--chunk-version", type=int, default=0)
    p.add_argument("--cancel", action="store_true", help="cancel rebuilds under way")
    p.add_argument(
        "--wait", action="store_true", help="follow the rebuilds to their end with a progress bar"
    )
    p.add_argument("--wait-timeout", type=float, default=600.0, help="seconds (default 600)")
    p.set_defaults(run=cmd_reindex)

    for name, paused in (("pause", True), ("resume", False)):
        p = sub.add_parser(name, parents=[common], help=f"{name} background indexing")
        p.set_defaults(run=_pauser(paused))

    add_mcp_command(sub, common)


def _unavailable_hint(exc: grpc.RpcError, args: argparse.Namespace) -> str:
    """What an UNAVAILABLE most likely means, when the server did not say it itself (a
    server starting up says so in its details: no hint then)."""
    details = exc.details() or ""
    if exc.code() != grpc.StatusCode.UNAVAILABLE or details.startswith("starting up"):
        return ""
    if "Connection refused" in details:
        return f" (nothing listens on {args.target}: is memsvc serve running there?)"
    if args.ca_file:
        return ""
    # a TLS server answers a plaintext client only by closing the connection
    return f" (is {args.target} serving TLS? then pass --ca-file or set MEMSVC_CA_FILE)"


def run_client(args: argparse.Namespace) -> int:
    try:
        if args.command == "mcp":
            code = run_mcp(args)
        else:
            with connect(args) as stub:
                code = args.run(stub, args)
        sys.stdout.flush()  # a reader that went away shows here, not at the interpreter's exit
        return code
    except grpc.RpcError as exc:
        message = f"memsvc: {exc.code().name}: {exc.details()}"
        message += _unavailable_hint(exc, args)
        err.print(message, markup=False, highlight=False)
        return 1
    except BrokenPipeError:
        # the reader went away (`memsvc export | head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (OSError, ValueError) as exc:
        err.print(f"memsvc: {exc}", markup=False, highlight=False)
        return 2


# -- search / status -------------------------------------------------------------------------
def cmd_search(stub: Stub, args: argparse.Namespace) -> int:
    request = pb.EmbedDbRequest(
        query_text=args.query,
        top_k=args.top_k,
        mode=_MODES[args.mode] if args.mode else pb.SEARCH_MODE_UNSPECIFIED,
        filters=pb.SearchFilters(conversation_ids=args.conversation),
    )
    reply = stub.EmbedDb(request, timeout=60)
    if args.json:
        print(json.dumps(_as_dict(reply), ensure_ascii=False, indent=2))
        return 0
    rows = [
        [
            f"{h.score:.3f}",
            h.metadata.conversation_id,
            f"{h.metadata.turn_range.start}-{h.metadata.turn_range.end}",
            h.text,
        ]
        for h in reply.hits
    ]
    print_table(["score", "conversation", "turns", "text"], rows, lines=True)
    return 0


def cmd_status(stub: Stub, args: argparse.Namespace) -> int:
    request = pb.GetIndexStatusRequest(conversation_ids=args.conversation)
    if not args.conversation:
        request.page_size = STATUS_ROWS  # the totals cover every conversation
    reply = stub.GetIndexStatus(request, timeout=30)
    if args.json:
        print(json.dumps(_as_dict(reply), ensure_ascii=False, indent=2))
        return 0
    rows = [
        [
            s.conversation_id,
            s.state + (" (reindex)" if s.reindexing else ""),
            turn_or_none(s.last_appended_turn),
            turn_or_none(s.last_indexed_turn),
            str(s.backlog),
            str(s.attempts),
            s.last_error[:80],
        ]
        for s in reply.conversations
    ]
    columns = ["conversation", "state", "appended", "indexed", "backlog", "attempts", "error"]
    print_table(columns, rows)
    if reply.next_page_token:
        out.print(
            f"(the first {len(reply.conversations)}: memsvc list for every conversation)",
            markup=False,
            highlight=False,
        )
    out.print(
        f"{reply.total_conversations} conversations, backlog {reply.total_backlog} turns,"
        f" pending {reply.pending}, indexing {reply.indexing}, failed {reply.failed},"
        f" {'PAUSED' if reply.paused else 'running'}",
        markup=False,
        highlight=False,
    )
    server = reply.server
    if server.model:
        out.print(
            f"memsvc {server.version}, model {server.model} (dim {server.dim},"
            f" {server.embed_backend}), log on {server.log_backend}"
            + _shards_line(server.store_shards, server.store_shards_loaded)
            + (f"\nWARNING: {server.model_notice}" if server.model_notice else ""),
            markup=False,
            highlight=False,
        )
    return 1 if reply.failed else 0


_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _as_dict(message: Any) -> dict[str, Any]:
    # int64 as JSON numbers, proto field names: what a script reading the output expects
    # (the proto3 JSON mapping writes int64 as strings)
    raw: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _int64_as_numbers(message, raw)


def _int64_as_numbers(message: Any, raw: dict[str, Any]) -> dict[str, Any]:
    for f in message.DESCRIPTOR.fields:
        if f.name not in raw:
            continue
        repeated = f.is_repeated
        if f.type in _INT64:
            raw[f.name] = [int(v) for v in raw[f.name]] if repeated else int(raw[f.name])
        elif f.type == FieldDescriptor.TYPE_MESSAGE and not f.message_type.GetOptions().map_entry:
            value = getattr(message, f.name)
            if repeated:
                for item, sub in zip(value, raw[f.name], strict=True):
                    _int64_as_numbers(item, sub)
            else:
                _int64_as_numbers(value, raw[f.name])
    return raw


def cmd_export(stub: Stub, args: argparse.Namespace) -> int:
    """Every live event, page by page, one JSON object per line in the proto's field names:
    exactly what `append` reads (with --allow-gaps where turns were deleted)."""
    with contextlib.ExitStack() as files:
        sink: TextIO = (
            sys.stdout
            if args.output == "-"
            # conversations are personal data: the file is the owner's alone (0600)
            else files.enter_context(
                open(
                    os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                    "w",
                    encoding="utf-8",
                )
            )
        )
        count, token = 0, ""
        while True:
            reply = stub.ExportEvents(
                pb.ExportEventsRequest(
                    conversation_id=args.conversation,
                    page_size=1000,
                    page_token=token,
                    last=args.last,
                ),
                timeout=120,
            )
            for event in reply.events:
                line = _as_dict(event)
                if not line["payload"]:  # only callers that keep one see the field
                    del line["payload"]
                sink.write(json.dumps(line, ensure_ascii=False) + "\n")
            count += len(reply.events)
            token = reply.next_page_token
            if not token:
                break
    err.print(f"exported {count} events", markup=False, highlight=False)
    return 0


def cmd_list(stub: Stub, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise ValueError("--limit: at least 1")
    # the server's pages, in id order, from --after (its own token format) until --limit
    page: list[pb.IndexStatus] = []
    token = page_token("c", args.after) if args.after else ""
    while True:
        reply = stub.GetIndexStatus(
            pb.GetIndexStatusRequest(page_size=args.limit - len(page), page_token=token),
            timeout=60,
        )
        page += reply.conversations
        token = reply.next_page_token
        if not token or len(page) >= args.limit:
            break
    more = bool(token)
    if args.json:
        print(
            json.dumps(
                {
                    "conversations": [_as_dict(s) for s in page],
                    "next_after": page[-1].conversation_id if more else "",
                },
                ensure_ascii=False,
                indent=2,
            )
        )
        return 0
    rows = [
        [
            s.conversation_id,
            s.state,
            str(s.last_appended_turn + 1),
            turn_or_none(s.last_indexed_turn),
            str(s.backlog),
        ]
        for s in page
    ]
    print_table(["conversation", "state", "turns", "searchable to", "backlog"], rows)
    if more:
        out.print(f"more: --after {page[-1].conversation_id}", markup=False, highlight=False)
    return 0


# -- admin ---------------------------------------------------------------------------------
class NotConfirmed(ValueError):
    pass


def cmd_delete(stub: Stub, args: argparse.Namespace) -> int:
    request = pb.LogicalDeleteBySourceRequest(conversation_id=args.conversation)
    if not args.turns and not args.yes:
        raise NotConfirmed(
            f"this deletes every turn of {args.conversation!r}: add --yes to confirm"
            " (or --turns A-B for some)"
        )
    if args.turns:
        a, sep, b = args.turns.partition("-")
        if not (a.isdigit() and (not sep or b.isdigit())):
            raise ValueError(f"--turns: expected A-B, got {args.turns!r}")
        request.turn_range.start = int(a)
        request.turn_range.end = int(b) if sep else int(a)
    reply = stub.LogicalDeleteBySource(request, timeout=300)
    out.print(f"turns deleted {reply.events_deleted}, chunks hidden {reply.deleted}")
    return 0


def cmd_purge(stub: Stub, args: argparse.Namespace) -> int:
    if not args.yes:
        which = "every conversation" if args.all_conversations else repr(args.conversation)
        raise NotConfirmed(
            f"this erases the deleted turns of {which} for good: add --yes to confirm"
        )
    reply = stub.PurgeDeleted(
        pb.PurgeDeletedRequest(
            conversation_id=args.conversation or "", all_conversations=args.all_conversations
        ),
        timeout=600,
    )
    out.print(f"turns erased {reply.events_purged}, chunks removed {reply.chunks_purged}")
    return 0


def cmd_retire(stub: Stub, args: argparse.Namespace) -> int:
    reply = stub.RetireChunkVersion(
        pb.RetireChunkVersionRequest(
            conversation_id=args.conversation, chunk_version=args.chunk_version
        ),
        timeout=600,
    )
    out.print(f"chunks removed {reply.retired}", markup=False, highlight=False)
    return 0


def _pauser(paused: bool) -> Callable[[Stub, argparse.Namespace], int]:
    def run(stub: Stub, args: argparse.Namespace) -> int:
        reply = stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=paused), timeout=300)
        out.print("indexing paused" if reply.paused else "indexing running")
        return 0

    return run


def _shards_line(shards: int, loaded: int) -> str:
    if shards <= 1:
        return ""
    loading = "" if loaded >= shards else ", the rest load in the background or when used"
    return f", store in {shards} shards ({loaded} loaded{loading})"
