"""The key of an `add_turns` call that carries no `request_id` (issue 81, item 6): agents
rarely pass one, and a call whose answer was lost (a time-out, a dropped connection, an
agent told to try again) stored its turns twice.

So the gateway remembers, per conversation, the last call's turns (a digest of them as
sent, in order) and the key it gave that call, for RETRY_WINDOW_S: the same turns again
within the window, with no other `add_turns` to that conversation between, are that
call again and get its key, so the server answers the first call's answer and writes
nothing. Anything else gets a fresh key: the same turns after another call, or later than
the window, are stored again, as a conversation that really repeats itself ("ok", then
"ok" after the reply) must be. The memory is this gateway's (a retry through another
replica of it is not recognised); `request_id` is exact everywhere."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable

RETRY_WINDOW_S = 30.0
MAX_REMEMBERED = 10_000  # conversations: the oldest are forgotten first


class RecentCalls:
    def __init__(
        self, window_s: float = RETRY_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self.clock = clock
        # (caller, conversation) -> (digest of its last call's turns, that call's key, when)
        self._last: OrderedDict[tuple[str, str], tuple[str, str, float]] = OrderedDict()

    def key_for(self, caller: str, conversation_id: str, turns: bytes) -> str:
        """The idempotency key of a call of these `turns` (serialized as sent) to this
        conversation by this caller (a digest of its token): the last call's key when it
        is that call again within the window, else a new one."""
        digest = hashlib.sha256(turns).hexdigest()
        now = self.clock()
        scope = (caller, conversation_id)
        last = self._last.pop(scope, None)
        if last is not None and last[0] == digest and now - last[2] <= self.window_s:
            key = last[1]
        else:
            key = f"mcp-{uuid.uuid4().hex}"
        self._last[scope] = (digest, key, now)
        while len(self._last) > MAX_REMEMBERED:
            self._last.popitem(last=False)
        return key
