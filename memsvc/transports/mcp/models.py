"""What the MCP tools take and return: pydantic models, so each tool publishes an input and
an output schema, and the mapping of a memsvc hit onto the tools' flatter one."""

from __future__ import annotations

from pydantic import BaseModel, Field

from memsvc.v1 import memory_pb2 as pb


# -- inputs ----------------------------------------------------------------------------------
class Turn(BaseModel):
    turn_id: int | None = Field(
        None,
        description="Optional. Omit it (in every turn of the call) and memsvc appends the "
        "turns after the conversation's last one, returning their ids. Give it to edit a "
        "stored turn (its id with new text) or to keep your own numbering (from 0, no gaps).",
    )
    speaker: str = Field(description='Who spoke: "user", "assistant" or "system".')
    text: str = Field(description="What was said.")
    timestamp: str | None = Field(
        None,
        description='Optional: when, RFC 3339 with a UTC offset, e.g. "2026-02-02T10:15:30'
        '+08:00". Omitted = the time memsvc receives the turn.',
    )
    speaker_name: str | None = Field(None, description='Display name, e.g. "Caroline".')
    participants: list[str] | None = Field(
        None, description="Display names of everyone in the conversation."
    )


# -- outputs ---------------------------------------------------------------------------------
class TurnError(BaseModel):
    turn: str = Field(description='"<conversation_id>#<turn_id>"')
    message: str
    reason: str


class AddTurnsResult(BaseModel):
    accepted: int = Field(description="New or edited turns written to the durable log.")
    duplicates: int = Field(description="Identical re-sends: nothing changed.")
    turn_ids: list[int] = Field(description="The turn id of each turn sent, in order.")
    indexed: bool | None = Field(
        description="With wait: whether the last turn is searchable now; else null."
    )
    backlog: int | None = Field(description="With wait: turns still to index.")


class Hit(BaseModel):
    chunk_id: str
    score: float
    text: str
    conversation_id: str
    turn_start: int
    turn_end: int
    turns: list[int] = Field(
        default_factory=list,
        description="The turns the text holds when fewer than turn_start..turn_end (a late"
        " hit under a turn budget keeps its turns nearest the query); empty: all of them.",
    )
    time_start: str
    time_end: str
    speakers: list[str]
    participants: list[str]


class SearchResult(BaseModel):
    query: str
    mode: str
    hits: list[Hit]
    standing: list[Hit] = Field(
        default_factory=list,
        description="Standing instructions and preferences the user gave that apply to this"
        " query: follow them.",
    )


class DeleteResult(BaseModel):
    conversation_id: str
    turns_deleted: int = Field(description="Turns newly marked deleted (0 on a repeat).")
    chunks_deleted: int = Field(description="Stored chunks hidden from search.")


class ConversationStatus(BaseModel):
    conversation_id: str
    state: str = Field(description="idle | pending | indexing | failed")
    last_appended_turn: int
    last_indexed_turn: int
    backlog: int
    last_error: str


class StatusResult(BaseModel):
    conversations: list[ConversationStatus]
    total_conversations: int = Field(description="Every conversation the token may see.")
    total_backlog: int
    paused: bool
    next_page_token: str = Field(
        "", description="Pass as page_token for the next conversations; empty at the end."
    )


def hit_of(h: pb.Hit) -> Hit:
    return Hit(
        chunk_id=h.chunk_id,
        score=round(h.score, 4),
        text=h.text,
        conversation_id=h.metadata.conversation_id,
        turn_start=h.metadata.turn_range.start,
        turn_end=h.metadata.turn_range.end,
        turns=list(h.turns),
        time_start=h.metadata.timestamp_range.start,
        time_end=h.metadata.timestamp_range.end,
        speakers=list(h.metadata.speakers),
        participants=list(h.metadata.participants),
    )
