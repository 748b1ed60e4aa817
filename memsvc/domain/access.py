"""Who may do what: a token's role, and the conversation-id prefixes it is limited to.

Method-level rules (which role a call needs) are checked by the transport before the
request is decoded. The rules that depend on the request (which conversations it names,
whether it reads deleted text, whether it spans every conversation) are checked here, by
the services, so every transport applies the same ones."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from memsvc.domain.errors import PermissionDenied


class Role(enum.IntEnum):
    READER = 1
    WRITER = 2
    ADMIN = 3


@dataclass(frozen=True)
class Access:
    role: Role
    # Conversation-id prefixes the token is limited to; empty = every conversation.
    prefixes: tuple[str, ...] = ()

    @property
    def limited(self) -> bool:
        return bool(self.prefixes)

    def allows(self, conversation_id: str) -> bool:
        return not self.prefixes or any(conversation_id.startswith(p) for p in self.prefixes)

    def check(self, conversation_id: str, field: str) -> None:
        """PERMISSION_DENIED unless the token may touch this conversation."""
        if not self.allows(conversation_id):
            raise PermissionDenied(
                f"conversation {conversation_id!r} is outside the prefixes this token is"
                " limited to",
                reason="CONVERSATION_NOT_ALLOWED",
                field=field,
            )

    def check_all(self, conversation_ids: Sequence[str], field: str) -> None:
        for i, conv in enumerate(conversation_ids):
            self.check(conv, f"{field}[{i}]")

    def need_admin(self, what: str, field: str = "") -> None:
        if self.role < Role.ADMIN:
            raise PermissionDenied(
                f"{what} needs role admin, the token has {self.role.name.lower()}",
                reason="ADMIN_REQUIRED",
                field=field,
            )

    def every_conversation(self, what: str) -> None:
        """A call over every conversation: admin only, unless the token is limited to
        prefixes (then it spans only its own)."""
        if not self.limited:
            self.need_admin(
                f"{what} over every conversation (name conversations to use"
                f" role {self.role.name.lower()})"
            )

    def need_unlimited(self, what: str) -> None:
        if self.limited:
            raise PermissionDenied(
                f"{what} acts on every conversation; a token limited to prefixes may not",
                reason="PREFIX_LIMITED",
            )


FULL = Access(Role.ADMIN)
