"""Tenants at the service level: a prefix-limited token reaches only its conversations,
and reading deleted text needs admin (issue 24; over gRPC in
tests/integration/test_tokens_and_tenants.py), on both event-log backends."""

from __future__ import annotations

import pytest

from memsvc.app import Services
from memsvc.domain.access import Access, Role
from memsvc.domain.errors import PermissionDenied
from memsvc.domain.types import (
    SearchFilters,
    SearchMode,
    SearchRequest,
    TurnRange,
)
from tests.conftest import EN_TURNS, conversation, turn
from tests.support.integrity import SECRET, sync

ACME_READER = Access(Role.READER, ("acme/",))


ACME_WRITER = Access(Role.WRITER, ("acme/",))


def test_a_prefix_limited_token_reaches_only_its_conversations(services_on_both: Services) -> None:
    services = services_on_both  # on both event-log backends
    sync(services, conversation("acme/1", EN_TURNS))
    sync(services, conversation("other/1", [t.replace("Biscuit", "Pepper") for t in EN_TURNS]))
    services.ingest.append([turn("acme/2", 0, "Biscuit chewed the sofa.")])
    denied = [
        lambda: services.search.search(
            SearchRequest("puppy", 5, SearchFilters(("other/1",))), ACME_READER
        ),
        lambda: services.ingest.list_chunks("other/1", False, 10, "", 0, ACME_READER),
        lambda: services.control.wait("other/1", 0, 100, None, lambda: True, ACME_READER),
        lambda: services.control.status(["other/1"], ACME_READER),
        lambda: services.deletion.delete("other/1", None, [], ACME_WRITER),
        lambda: services.ingest.append([turn("other/1", 6, "x")], access=ACME_WRITER),
        lambda: services.ingest.build([turn("other/1", 6, "x")], access=ACME_WRITER),
    ]
    for call in denied:
        with pytest.raises(PermissionDenied) as err:
            call()
        assert err.value.reason == "CONVERSATION_NOT_ALLOWED"
    # its searches and status without conversation ids span its own prefixes only
    services.worker.notify()
    services.control.wait_for_indexed("acme/2", 0, 60)
    hits = services.search.search(SearchRequest("puppy named", 20), ACME_READER).hits
    assert hits and {h.metadata.conversation_id for h in hits} <= {"acme/1", "acme/2"}
    assert [i.conversation_id for i in services.control.status((), ACME_READER)] == [
        "acme/1",
        "acme/2",
    ]
    page, _ = services.control.status_page(0, "", [], "", ACME_READER)  # GetIndexStatus's
    assert [i.conversation_id for i in page] == ["acme/1", "acme/2"]
    assert services.control.totals(ACME_READER).conversations == 2
    # an unlimited reader still needs admin to search everything
    with pytest.raises(PermissionDenied) as err:
        services.search.search(SearchRequest("puppy", 5), Access(Role.READER))
    assert err.value.reason == "ADMIN_REQUIRED"


def test_reading_deleted_text_needs_admin(services_on_both: Services) -> None:
    services = services_on_both  # on both event-log backends
    sync(services, conversation("acme/del", [SECRET, *EN_TURNS[1:]]))
    services.deletion.delete("acme/del", TurnRange(0, 0), [])
    audit = SearchFilters(("acme/del",), include_deleted=True)
    for access in (ACME_READER, Access(Role.WRITER)):
        with pytest.raises(PermissionDenied):
            services.search.search(SearchRequest("locker code", 5, audit), access)
        with pytest.raises(PermissionDenied):
            services.ingest.list_chunks("acme/del", True, 10, "", 0, access)
    hits = services.search.search(SearchRequest("locker code", 5, audit)).hits
    assert any("4417" in h.text for h in hits)


def test_another_tenants_writes_leave_a_tenants_keyword_scores_alone(
    services_on_both: Services,
) -> None:
    """Red-team issue 62, item 10: tenant a/'s keyword scores on its own unchanged text moved
    by -85 % / +191 % when only tenant b/ wrote, which told a/ how many of b/'s texts hold a
    word. Statistics are per tenant now: b/'s writes and deletes move nothing of a/'s."""
    services = services_on_both  # on both event-log backends
    sync(services, conversation("acme/1", EN_TURNS))
    query = "puppy Biscuit hiking trail"

    def scores(access: Access, filters: SearchFilters, top: int = 10) -> list[tuple[str, float]]:
        request = SearchRequest(query, top, filters, SearchMode.KEYWORD)
        return [(h.chunk_id, h.score) for h in services.search.search(request, access).hits]

    def acme_scores() -> list[list[tuple[str, float]]]:
        return [
            scores(ACME_READER, SearchFilters()),
            scores(Access(Role.ADMIN), SearchFilters(("acme/1",))),
        ]

    def unmoved(now: list[list[tuple[str, float]]]) -> bool:
        """The same hits with the same scores, to float32's precision: Milvus sums a
        score's terms in an order that other rows can change, by one unit in the last place
        (on main the scores moved by -85 % / +191 %)."""
        return [[i for i, _ in hits] for hits in now] == [
            [i for i, _ in b] for b in before
        ] and all(
            s == pytest.approx(t, rel=1e-6)
            for hits, b in zip(now, before, strict=True)
            for (_, s), (_, t) in zip(hits, b, strict=True)
        )

    before = acme_scores()
    everyone = scores(Access(Role.ADMIN), SearchFilters())
    assert before[0] and before[0] == before[1] == everyone
    others = [f"The puppy Biscuit {i} went hiking on the trail again." for i in range(40)]
    sync(services, conversation("beta/1", others))
    assert unmoved(acme_scores())
    # a search spanning both tenants does count beta/'s turns
    both = dict(scores(Access(Role.ADMIN), SearchFilters(("acme/1", "beta/1")), 100))
    top, score = before[0][0]
    assert both[top] < score * 0.9
    services.deletion.delete("beta/1", TurnRange(0, 19), [])
    services.deletion.purge_deleted("beta/1")
    assert unmoved(acme_scores())


def test_a_token_prefix_without_a_slash_is_refused() -> None:
    """Issue 81, item 4: tokens `acme` and `globex` (no "/") shared the tenant "" and so
    each other's keyword statistics: globex's writes moved acme's score 1.026 -> 0.270.
    The tokens file now refuses the prefix that cannot have statistics of its own."""
    from memsvc.transports.grpc.auth import TokenFileError, parse_tokens

    token = "t" * 24
    with pytest.raises(TokenFileError, match=r"tokens:2: prefix 2 'globex' has no '/'.*'globex/'"):
        parse_tokens(f"reader {token} acme/\nwriter {token}x acme/ globex\n", "tokens")
    ((_, access),) = parse_tokens(f"reader {token} acme/ acme/u1/\n", "tokens")
    assert access.prefixes == ("acme/", "acme/u1/")
