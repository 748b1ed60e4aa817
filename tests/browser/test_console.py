"""The memory console (issue 41) in a real Chromium: sign-in and a wrong token, a reader's
read-only screens, a tenant's token that sees its own conversations only, an admin who
pauses indexing, watches appended turns wait and then become searchable, searches with the
explanation of each hit, deletes and purges with confirmation, and exports. The page runs
under its Content-Security-Policy: a violation (an inline script, a call elsewhere) would
show as a console error, and none may.

Screenshots of each screen go to $MEMSVC_CONSOLE_SCREENSHOTS (make test-browser: the
README's, docs/console/)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx2
import pytest
from playwright.sync_api import expect

from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.support.launch import free_port, start_child, wait_serving

pytestmark = pytest.mark.browser

READER = "console-reader-0123456789"
WRITER = "console-writer-0123456789"
ADMIN = "console-admin-0123456789ab"
ACME_READER = "console-acme-reader-0123456789"
TOKENS = f"reader {READER}\nwriter {WRITER}\nadmin {ADMIN}\nreader {ACME_READER} acme/\n"

SUPPORT = [
    ("user", "My build fails with ModuleNotFoundError: No module named 'yaml'."),
    ("assistant", "Install PyYAML in the same virtualenv: pip install pyyaml."),
    ("user", "Done, and the build passes now. The CI image needs it too."),
    ("assistant", "Add pyyaml to requirements.txt so the CI image installs it."),
]
PREFERENCES = [
    ("user", "Always include version numbers when I ask about libraries."),
    ("assistant", "Understood: I will give version numbers from now on."),
]


class Console:
    def __init__(self, base: str, port: int, shots: Path) -> None:
        self.base = base
        self.url = f"{base}/console/"
        self.shots = shots
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.MemoryServiceStub(self.channel)

    def append(self, conversation: str, turns: list[tuple[str, str]], start: int = 0) -> None:
        events = [
            pb.MemoryEvent(
                conversation_id=conversation,
                turn_id=start + i,
                speaker=speaker,
                text=text,
                timestamp=f"2026-03-0{1 + (start + i) // 3}T09:{(start + i) % 60:02d}:00Z",
            )
            for i, (speaker, text) in enumerate(turns)
        ]
        reply = self.stub.AppendEvents(
            pb.AppendEventsRequest(events=events), metadata=[("authorization", f"Bearer {ADMIN}")]
        )
        assert not reply.errors, reply.errors

    def wait(self, conversation: str, turn: int) -> None:
        reply = self.stub.WaitForIndexed(
            pb.WaitForIndexedRequest(conversation_id=conversation, turn_id=turn, timeout_ms=120000),
            metadata=[("authorization", f"Bearer {ADMIN}")],
        )
        assert reply.indexed, reply

    def shot(self, page: Any, name: str) -> None:
        page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    root = tmp_path_factory.mktemp("console")
    (root / "tokens").write_text(TOKENS)
    shots = Path(os.environ.get("MEMSVC_CONSOLE_SCREENSHOTS") or root / "shots")
    if os.environ.get("MEMSVC_CONSOLE_SCREENSHOTS"):
        # the README's pictures show Chinese turns: without a CJK font they are boxes
        cjk = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout
        assert cjk.strip(), "no CJK font for the screenshots: apt-get install fonts-noto-cjk"
    shots.mkdir(parents=True, exist_ok=True)
    port, http_port = free_port(), free_port()
    proc = start_child(
        root / "data",
        port,
        "--auth-tokens-file",
        str(root / "tokens"),
        "--http-listen",
        f"127.0.0.1:{http_port}",
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, proc)
        c = Console(f"http://127.0.0.1:{http_port}", port, shots)
        c.append("acme/support", SUPPORT)
        c.append("acme/onboarding", [("user", "We start the onboarding on Monday at 9.")])
        c.append("acme/preferences", PREFERENCES)
        c.append("acme/zh", [("user", "我喜欢在周末去爬山，最近去了香山。")])
        c.append("other/private", [("user", "The vault code is 4471.")])
        for conversation, last in (
            ("acme/support", 3),
            ("acme/onboarding", 0),
            ("acme/preferences", 1),
            ("acme/zh", 0),
        ):
            c.wait(conversation, last)
        c.wait("other/private", 0)
        yield c
        c.channel.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


@pytest.fixture
def page(browser: Any, console: Console) -> Iterator[Any]:
    context = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    opened.on("pageerror", lambda e: errors.append(str(e)))
    opened.goto(console.url)
    yield opened
    context.close()
    # 401/403 answers are logged by Chromium as failed resources: the rest are not allowed
    assert [e for e in errors if "status of 40" not in e] == []


def sign_in(page: Any, token: str) -> None:
    page.fill("#token", token)
    page.click("#sign-in-form button[type=submit]")
    expect(page.locator("#nav")).to_be_visible()


def test_served_with_a_strict_policy_and_no_inline_script(console: Console) -> None:
    reply = httpx2.get(console.url, timeout=30)
    assert reply.status_code == 200
    policy = reply.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy and "default-src 'none'" in policy
    assert reply.headers["x-frame-options"] == "DENY"
    assert "<script>" not in reply.text and 'src="console.js"' in reply.text
    assert httpx2.get(f"{console.base}/console/../secrets", timeout=30).status_code == 404
    assert httpx2.get(f"{console.base}/console/tokens", timeout=30).status_code == 404
    redirect = httpx2.get(f"{console.base}/console", timeout=30)
    assert redirect.status_code in (302, 307) and redirect.headers["location"] == "/console/"


def test_a_wrong_token_is_refused_and_not_kept(page: Any, console: Console) -> None:
    page.fill("#token", "not-a-token-of-this-server")
    page.click("#sign-in-form button[type=submit]")
    expect(page.locator("#error")).to_contain_text("The token was refused: unknown token")
    expect(page.locator("#sign-in")).to_be_visible()
    expect(page.locator("#nav")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    console.shot(page, "sign-in")


def test_the_token_stays_in_session_storage_only(page: Any, console: Console) -> None:
    sign_in(page, ADMIN)
    expect(page.locator("#model-warning")).to_be_hidden()  # the configured model serves
    assert page.evaluate("sessionStorage.getItem('memsvc-console-token')") == ADMIN
    assert page.evaluate("localStorage.length") == 0
    assert page.evaluate("document.cookie") == ""
    assert ADMIN not in page.url
    page.reload()  # the tab keeps its sign-in; a new tab would not
    expect(page.locator("#nav")).to_be_visible()
    page.click("#sign-out")
    expect(page.locator("#sign-in")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0


def test_a_reader_sees_read_only_screens(page: Any, console: Console) -> None:
    sign_in(page, READER)
    # an unlimited reader names its conversations: no list, a note, no admin actions
    expect(page.locator("#overview-note")).to_be_visible()
    expect(page.locator("#pause")).to_be_hidden()
    page.click("nav button[data-screen=conversations]")
    expect(page.locator("#list-area")).to_be_hidden()
    page.fill("#open-id", "acme/support")
    page.click("#open-form button[type=submit]")
    expect(page.locator("#turns tbody tr").first).to_contain_text("ModuleNotFoundError")
    expect(page.locator("#who-role")).to_contain_text("reader")
    for control in ("#delete-turns", "#purge", "#conversation-reindex", "#show-deleted"):
        expect(page.locator(control)).to_be_hidden()
    expect(page.locator("#export")).to_be_visible()
    # the reader's view of the server came with the conversation it named
    page.click("nav button[data-screen=overview]")
    expect(page.locator("#server")).to_contain_text("Model")


def test_a_tenant_token_sees_its_own_conversations_only(page: Any, console: Console) -> None:
    sign_in(page, ACME_READER)
    expect(page.locator("#who-role")).to_contain_text("acme/")
    page.click("nav button[data-screen=conversations]")
    rows = page.locator("#conversation-list tbody tr")
    expect(rows).to_have_count(4)
    expect(page.locator("#conversation-list")).not_to_contain_text("other/private")
    console.shot(page, "conversations")
    page.fill("#filter-prefix", "acme/onb")
    expect(rows).to_have_count(1)
    page.fill("#filter-prefix", "")
    page.fill("#open-id", "other/private")
    page.click("#open-form button[type=submit]")
    expect(page.locator("#error")).to_contain_text("permission_denied")
    # its searches span its own conversations only
    page.click("nav button[data-screen=search]")
    page.fill("#q", "vault code")
    page.click("#search-form button[type=submit]")
    expect(page.locator("#search-summary")).to_be_visible()
    expect(page.locator("#hits")).not_to_contain_text("4471")


def test_an_admin_watches_appended_turns_become_searchable(page: Any, console: Console) -> None:
    sign_in(page, ADMIN)
    expect(page.locator("#server")).to_contain_text("sqlite")
    expect(page.locator("#health")).to_contain_text("up")
    page.click("#pause")
    expect(page.locator("#worker-state")).to_have_text("paused")
    console.append("acme/support", [("user", "Which PyYAML version fixes the loader warning?")], 4)
    page.click("nav button[data-screen=conversations]")
    page.click("#conversation-list a:text('acme/support')")
    new_turn = page.locator("#turns tbody tr[data-turn='4']")
    expect(new_turn).to_contain_text("not yet searchable")
    page.click("nav button[data-screen=overview]")
    page.click("#resume")
    expect(page.locator("#worker-state")).to_have_text("running")
    # the open conversation refreshes itself
    expect(new_turn).to_contain_text("searchable", timeout=120_000)
    expect(new_turn).not_to_contain_text("not yet", timeout=120_000)
    # live figures: the charts draw once two readings are in
    page.click("nav button[data-screen=overview]")
    expect(page.locator("#chart-throughput svg")).to_have_count(1, timeout=30_000)
    # issue 66: the sparklines had no axes, and a line could cross its caption: the scale's
    # top and 0, the time span, and every point inside the plot
    chart = page.locator("#chart-throughput svg")
    labels = chart.locator("text").evaluate_all("nodes => nodes.map((n) => n.textContent)")
    assert labels[1:] == ["0", "−1 min", "now"] and labels[0], labels
    drawn = chart.locator("polyline.line").get_attribute("points") or ""
    xs, ys = zip(*(map(float, p.split(",")) for p in drawn.split()), strict=True)
    assert all(6 <= y <= 58 for y in ys), drawn
    assert all(34 <= x <= 236 for x in xs) and max(xs) == 236, drawn  # the newest at "now"
    # a reindex of everything, followed to its end on the progress bar; it shows none done
    # while the worker is paused (issue 66: "9 of 9 rebuilt" at once while 8 were indexing)
    page.click("#pause")
    expect(page.locator("#worker-state")).to_have_text("paused")
    page.click("#reindex-all")
    expect(page.locator("#reindex-text")).to_have_text(re.compile(r"^0 of [1-9]\d* rebuilt"))
    total = page.locator("#reindex-text").inner_text().split(" of ")[1].split()[0]
    page.wait_for_timeout(2_500)  # a poll later: still none done, the status says so
    expect(page.locator("#reindex-text")).to_have_text(f"0 of {total} rebuilt")
    assert page.locator("#reindex-progress").evaluate("bar => bar.value") == 0
    page.click("#resume")
    expect(page.locator("#reindex-text")).to_have_text(
        f"{total} of {total} rebuilt", timeout=120_000
    )
    assert page.locator("#reindex-progress").evaluate("bar => bar.value") == 1
    console.shot(page, "overview")
    page.click("nav button[data-screen=conversations]")
    expect(page.locator("#chunks tbody tr").first).to_contain_text("chk_")
    console.shot(page, "conversation")


def test_a_search_explains_each_hit(page: Any, console: Console) -> None:
    sign_in(page, ADMIN)
    page.click("nav button[data-screen=search]")
    page.fill("#q", "yaml module install")
    page.fill("#q-conversations", "acme/support")
    page.click("#search-form button[type=submit]")
    first = page.locator("#hits > li").first
    expect(first).to_contain_text("PyYAML")
    expect(first.locator("table.why")).to_contain_text("dense")
    expect(first.locator("table.why")).to_contain_text("BM25")
    marks = first.locator("mark")
    expect(marks.first).to_be_visible()
    assert {m.lower() for m in marks.all_inner_texts()} & {"yaml", "install", "module"}
    # a standing instruction that applies is a list of its own
    page.fill("#q", "which library version should I use for requests")
    page.fill("#q-conversations", "")
    page.click("#search-form button[type=submit]")
    expect(page.locator("#standing")).to_contain_text("version numbers")
    console.shot(page, "search")
    page.select_option("#mode", "SEARCH_MODE_KEYWORD")
    page.fill("#q", "pyyaml")
    page.click("#search-form button[type=submit]")
    expect(page.locator("#search-summary")).to_contain_text("keyword")
    expect(page.locator("#hits > li").first.locator("table.why")).to_contain_text("#1")
    # Chinese: the query's two-character pieces are marked in the text
    page.fill("#q", "周末爬山")
    page.fill("#q-conversations", "acme/zh")
    page.click("#search-form button[type=submit]")
    zh_marks = page.locator("#hits > li").first.locator("p.hit-text mark")
    expect(zh_marks.last).to_have_text("爬山")  # the prefix names them too; the turn last
    assert set(zh_marks.all_inner_texts()) == {"周末", "爬山"}


def test_delete_and_purge_ask_first(page: Any, console: Console) -> None:
    sign_in(page, ADMIN)
    page.click("nav button[data-screen=conversations]")
    page.fill("#open-id", "acme/onboarding")
    page.click("#open-form button[type=submit]")
    turn = page.locator("#turns tbody tr[data-turn='0']")
    expect(turn).to_contain_text("Monday")
    turn.locator("input[type=checkbox]").check()
    page.click("#delete-turns")
    expect(page.locator("#delete-question")).to_have_text("Delete turn 0 of acme/onboarding?")
    page.click("#delete-no")  # cancelled: nothing deleted
    expect(page.locator("#delete-confirm")).to_be_hidden()
    expect(turn).to_contain_text("searchable")
    page.click("#delete-turns")
    page.click("#delete-yes")
    expect(turn).to_contain_text("deleted")
    expect(page.locator("#notice")).to_contain_text("1 turn deleted")
    # an admin may read the deleted text until it is purged
    page.check("#show-deleted")
    expect(turn).to_contain_text("Monday")
    expect(page.locator("#purge")).to_be_disabled()
    page.fill("#purge-confirm", "acme/onboardin")
    expect(page.locator("#purge")).to_be_disabled()
    page.fill("#purge-confirm", "acme/onboarding")
    page.click("#purge")
    expect(page.locator("#notice")).to_contain_text("1 turns and 1 chunks purged")
    expect(turn).not_to_contain_text("Monday")
    exported = console.stub.ExportEvents(
        pb.ExportEventsRequest(conversation_id="acme/onboarding"),
        metadata=[("authorization", f"Bearer {ADMIN}")],
    )
    assert list(exported.events) == []


def test_export_downloads_json_lines(page: Any, console: Console) -> None:
    sign_in(page, WRITER)
    page.click("nav button[data-screen=conversations]")
    page.fill("#open-id", "acme/support")
    page.click("#open-form button[type=submit]")
    expect(page.locator("#turns tbody tr").first).to_contain_text("ModuleNotFoundError")
    # a writer may delete turns, not purge
    expect(page.locator("#delete-turns")).to_be_visible()
    expect(page.locator("#purge")).to_be_hidden()
    with page.expect_download() as download:
        page.click("#export")
    assert download.value.suggested_filename == "acme_support.jsonl"
    lines = Path(download.value.path()).read_text().splitlines()
    events = [json.loads(line) for line in lines]
    # the lines `memsvc export` writes (memsvc append takes them back)
    assert events[0] == {
        "conversation_id": "acme/support",
        "turn_id": 0,
        "speaker": "user",
        "text": SUPPORT[0][1],
        "timestamp": "2026-03-01T09:00:00Z",
        "participants": [],
        "speaker_name": "",
    }
    assert [e["text"] for e in events[: len(SUPPORT)]] == [t for _, t in SUPPORT]


def test_a_turn_id_far_out_is_one_gap_row_not_a_frozen_tab(page: Any, console: Console) -> None:
    # issue 62, item 13: one turn id of 10**12 froze the tab of whoever opened the
    # conversation (a row per id); ids between the turns the log holds are now one row
    far = 10**12
    events = [
        pb.MemoryEvent(
            conversation_id="acme/far",
            turn_id=t,
            speaker="user",
            text=text,
            timestamp="2026-03-01T09:00:00Z",
        )
        for t, text in ((0, "The first note."), (far, "A note restored far out."))
    ]
    reply = console.stub.AppendEvents(
        pb.AppendEventsRequest(events=events, allow_gaps=True),
        metadata=[("authorization", f"Bearer {ADMIN}")],
    )
    assert not reply.errors, reply.errors
    sign_in(page, ADMIN)
    page.click("nav button[data-screen=conversations]")
    page.fill("#open-id", "acme/far")
    page.click("#open-form button[type=submit]")
    rows = page.locator("#turns tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.nth(1)).to_contain_text(f"1–{far - 1}")
    expect(page.locator(f"#turns tbody tr[data-turn='{far}']")).to_contain_text("restored far")


def test_a_narrow_screen_fits_the_page(browser: Any, console: Console) -> None:
    # issue 66: at 420 px the page rendered 855 px wide
    context = browser.new_context(viewport={"width": 420, "height": 900})
    page = context.new_page()
    try:
        page.goto(console.url)
        sign_in(page, ADMIN)
        widths = {}
        for screen in ("overview", "conversations", "search"):
            page.click(f"nav button[data-screen={screen}]")
            widths[screen] = page.evaluate("document.documentElement.scrollWidth")
        page.click("nav button[data-screen=conversations]")
        page.fill("#open-id", "acme/support")
        page.click("#open-form button[type=submit]")
        expect(page.locator("#turns tbody tr").first).to_contain_text("ModuleNotFoundError")
        widths["conversation"] = page.evaluate("document.documentElement.scrollWidth")
        assert all(width <= 420 for width in widths.values()), widths
        # times wrapped mid-date ("2026-03-" / "01T09:00:00Z"): a date and a time each keep
        # to one line (one box each); the column may break between them
        lines = page.evaluate(
            "[...document.querySelectorAll('#turns .when span')]"
            ".map((s) => [s.textContent, s.getClientRects().length])"
        )
        assert lines and all(n == 1 for _, n in lines), lines
        assert lines[0][0] == "2026-03-01", lines
    finally:
        context.close()


def test_a_writer_adds_a_memory_from_the_console(page: Any, console: Console) -> None:
    # issue 66: there was no way to add a memory from the console
    sign_in(page, WRITER)
    page.click("nav button[data-screen=conversations]")
    page.fill("#open-id", "acme/preferences")
    page.click("#open-form button[type=submit]")
    expect(page.locator("#conversation-title")).to_have_text("acme/preferences")
    page.select_option("#add-speaker", "user")
    page.fill("#add-text", "Please bring your laptop charger on the first day.")
    page.click("#add-form button[type=submit]")
    expect(page.locator("#notice")).to_contain_text("added to acme/preferences")
    added = page.locator("#turns tbody tr").last
    expect(added).to_contain_text("laptop charger")
    expect(added).to_contain_text("searchable", timeout=120_000)  # the open view refreshes
    expect(added).not_to_contain_text("not yet", timeout=120_000)
    turns = console.stub.ExportEvents(
        pb.ExportEventsRequest(conversation_id="acme/preferences"),
        metadata=[("authorization", f"Bearer {ADMIN}")],
    ).events
    assert [t.text for t in turns].count("Please bring your laptop charger on the first day.") == 1


def test_the_list_agrees_with_the_open_conversation(page: Any, console: Console) -> None:
    # issue 66: the list said `indexing, backlog 12` while the detail said `idle, backlog 0`:
    # each read the status at its own time; the detail's reading now updates its list row
    admin = [("authorization", f"Bearer {ADMIN}")]
    console.append("acme/agree", [("user", "The first note of this conversation.")])
    console.wait("acme/agree", 0)
    sign_in(page, ADMIN)
    page.click("nav button[data-screen=conversations]")
    row = page.locator("#conversation-list tbody tr", has=page.locator("a:text-is('acme/agree')"))
    link = row.locator("a")
    expect(row).to_contain_text("idle")
    console.stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=True), metadata=admin)
    try:
        console.append("acme/agree", [("user", "A second note."), ("user", "A third.")], 1)
        link.click()
        expect(page.locator("#conversation-status")).to_contain_text("backlog 2")
        cells = row.locator("td").all_inner_texts()  # read at once, before any poll
        assert cells[3] == "2" and cells[4] != "idle", cells
    finally:
        console.stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=False), metadata=admin)


def test_a_conversation_with_nothing_indexed_says_so_in_the_list(
    page: Any, console: Console
) -> None:
    # issue 84: the list's "Indexed through" read -1 for a conversation not indexed yet
    admin = [("authorization", f"Bearer {ADMIN}")]
    console.stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=True), metadata=admin)
    try:
        console.append("acme/unindexed", [("user", "Nothing of this is searchable yet.")])
        sign_in(page, ADMIN)
        page.click("nav button[data-screen=conversations]")
        row = page.locator(
            "#conversation-list tbody tr", has=page.locator("a:text-is('acme/unindexed')")
        )
        expect(row).to_contain_text("pending")
        cells = row.locator("td").all_inner_texts()
        assert cells[1:3] == ["1", "—"], cells
    finally:
        console.stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=False), metadata=admin)
