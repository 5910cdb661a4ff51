"""The explorer in a real browser (Debian's chromium, driven by playwright) over a real
swarm: tiny-model nodes on the embedded NATS and EVM, run in this process through a
blocking portal so the test can call the same contract the page reads.

Every number checked on the page is compared with a contract view or event read here,
not with the explorer's own API. Screenshots go to ``runs/explorer-screenshots/`` (or
``$SAPO_EXPLORER_SCREENSHOTS``; docs/explorer.md says how the one in the docs was made).
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from sapo_async.ledger.audit import ledger_scores
from sapo_async.ledger.journal import Journal
from sapo_async.process import free_port

pytestmark = [pytest.mark.slow, pytest.mark.nats, pytest.mark.evm, pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(os.environ.get("SAPO_EXPLORER_SCREENSHOTS", "runs/explorer-screenshots"))
WAIT_MS = 60_000  # a condition on the page; a loaded CI machine runs rounds slowly
ROUNDS = 3


def _need_browser() -> Any:
    """playwright's sync API, or skip (fail under CI=true: the bootstrap installs both)."""
    reason = ""
    try:
        from playwright import sync_api
    except ImportError:
        reason = "playwright is not installed (pip install -e '.[dev]')"
    if not reason and not Path(CHROMIUM).exists():
        reason = "Debian's chromium is not installed (scripts/bootstrap.sh, as root)"
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return sync_api


@dataclass
class Demo:
    portal: BlockingPortal
    swarm: Any
    url: str
    log_dir: Path

    def chain(self, fn: Any, *args: Any) -> Any:
        """Call an async ledger method on the demo's event loop."""
        return self.portal.call(fn, *args)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    from sapo_async.explorer.demo import DemoSettings, serve_demo

    _need_browser()
    settings = DemoSettings(nodes=3, rounds=ROUNDS, name="explorer-browser")
    log_dir = tmp_path_factory.mktemp("explorer-logs")
    with (
        start_blocking_portal("asyncio") as portal,
        portal.wrap_async_context_manager(serve_demo(settings, log_dir)) as (swarm, url),
    ):
        portal.call(swarm.wait_settled, 240)
        yield Demo(portal, swarm, url, log_dir)


@pytest.fixture(scope="module")
def browser(demo: Demo) -> Iterator[Any]:
    sync_api = _need_browser()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    yield pg
    context.close()


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def cell(page: Any, node: str, col: str) -> str:
    return str(page.locator(f'#nodes tr[data-node="{node}"] td[data-col="{col}"]').inner_text())


def get_json(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_swarm_page_shows_the_contracts_numbers_and_usage_graph(demo: Demo, page: Any):
    ledger = demo.swarm.ledger
    nodes = demo.chain(ledger.nodes)
    stats = {a: demo.chain(ledger.node_stats, a) for a in nodes}
    page.goto(demo.url)
    page.wait_for_function(
        "n => document.querySelectorAll('#nodes tbody tr').length === n", arg=len(nodes)
    )
    for a, s in stats.items():
        assert s.rounds_committed >= ROUNDS
        assert cell(page, a, "rounds_committed") == str(s.rounds_committed)
        assert cell(page, a, "last_round") == str(s.last_round)
        assert cell(page, a, "rollouts_committed") == str(s.rollouts_committed)
        assert cell(page, a, "external_used") == str(s.external_used)
        assert cell(page, a, "credit_received") == str(s.credit_received)
    # The contribution score is the ledger audit's own (sapo_async.ledger.score).
    scores = demo.chain(ledger_scores, ledger)
    for a in stats:
        assert cell(page, a, "score") == f"{scores[a].score:.3f}"
    total = page.locator('[data-total="rounds_committed"]').inner_text()
    assert total == str(sum(s.rounds_committed for s in stats.values()))
    # The backlog is the running nodes' own (settled: nothing pending, nobody paused).
    for n in demo.swarm.nodes:
        assert n.recorder is not None
        backlog = page.locator(f'#nodes tr[data-node="{n.address}"] td[data-col="backlog"]')
        assert backlog.inner_text() == str(n.recorder.statistics().pending) == "0"
        assert backlog.get_attribute("data-source") == "node"
        assert backlog.get_attribute("data-paused") == "false"

    # The usage graph draws one edge per (producer, consumer), weighted as the events say.
    events: Counter[tuple[str, str]] = Counter()
    for u in demo.chain(ledger.usage_credits):
        events[(u.producer, u.consumer)] += u.count
    assert events, "a swarm that trained on each other credits usage"
    drawn = {
        (g.get_attribute("data-producer"), g.get_attribute("data-consumer")): int(
            g.get_attribute("data-count")
        )
        for g in page.locator("#usage-graph g.usage").all()
    }
    assert drawn == dict(events)
    shot(page, "swarm")


def test_swarm_table_sorts_by_the_clicked_column(demo: Demo, page: Any):
    page.goto(demo.url)
    page.wait_for_selector("#nodes tbody tr")

    def column(col: str) -> list[int]:
        return [int(t) for t in page.locator(f'#nodes td[data-col="{col}"]').all_inner_texts()]

    assert page.get_attribute('th[data-key="credit_received"]', "aria-sort") == "descending"
    assert column("credit_received") == sorted(column("credit_received"), reverse=True)
    page.click('th[data-key="credit_received"]')
    page.wait_for_selector('th[data-key="credit_received"][aria-sort="ascending"]')
    assert column("credit_received") == sorted(column("credit_received"))
    page.click('th[data-key="external_used"]')
    page.wait_for_selector('th[data-key="external_used"][aria-sort="descending"]')
    assert column("external_used") == sorted(column("external_used"), reverse=True)


def test_node_page_shows_timeline_rounds_reward_curve_and_usage(demo: Demo, page: Any):
    ledger = demo.swarm.ledger
    node = demo.chain(ledger.nodes)[0]
    stats = demo.chain(ledger.node_stats, node)
    page.goto(f"{demo.url}/node/{node}")
    page.wait_for_selector("#rounds tbody tr")
    assert page.inner_text("#node-address") == node
    assert page.inner_text('[data-stat="rounds_committed"]') == str(stats.rounds_committed)
    assert page.inner_text('[data-stat="credit_received"]') == str(stats.credit_received)
    assert page.get_attribute("#timeline-chart", "data-points") == str(stats.rounds_committed)
    for r in demo.chain(ledger.rounds_of, node):
        stored = demo.chain(ledger.commitment_of, node, r)
        row = page.locator(f'#rounds tr[data-round="{r}"]')
        assert row.locator('td[data-col="rollouts"]').inner_text() == str(stored.rollout_count)
        assert row.locator('td[data-col="external"]').inner_text() == str(stored.external_count)
    # The reward curve has one point per line of the node's round log.
    name = next(n.name for n in demo.swarm.nodes if n.address == node)
    lines = (demo.log_dir / f"{name}.jsonl").read_text().splitlines()
    assert page.get_attribute("#reward-curve", "data-points") == str(len(lines))
    rejected = sum(sum(json.loads(line)["rejections"].values()) for line in lines)
    if rejected:
        texts = page.locator("#rejections td:nth-child(2)").all_inner_texts()
        assert sum(int(t) for t in texts) == rejected
    else:
        assert page.is_visible("#rejections-empty")
    credited = page.locator("#credit-by-consumer td:nth-child(2)").all_inner_texts()
    assert sum(int(t) for t in credited) == stats.credit_received
    shot(page, "node")


def _committed_hash(demo: Demo) -> tuple[str, int, bytes, list[bytes]]:
    """(node, round, hash, proof) of a rollout some node committed, from its journal."""
    for path in sorted(demo.swarm.journal_dir.glob("*.sqlite")):
        with Journal(path) as journal:
            for entry in journal.entries():
                c = entry.commitment
                if c.rollout_hashes:
                    h = c.rollout_hashes[0]
                    return c.node, c.round, h, c.rollout_tree().proof(h)
    raise AssertionError("no journal holds a committed rollout")


def test_verify_says_included_and_not_included_as_the_contract_does(demo: Demo, page: Any):
    ledger = demo.swarm.ledger
    node, rnd, h, proof = _committed_hash(demo)
    assert demo.chain(ledger.is_rollout_included, node, rnd, h, proof) is True

    page.goto(f"{demo.url}/verify?hash=0x{h.hex()}")
    page.wait_for_selector("#verdict")
    assert page.get_attribute("#verdict", "data-included") == "true"
    assert page.locator(f'#found tr[data-included="true"] a[href="/node/{node}"]').count() >= 1
    shot(page, "verify")

    # A hash no node committed: not in any journal, so not included.
    unknown = os.urandom(32)
    page.fill("#hash", "0x" + unknown.hex())
    page.click("#verify-button")
    page.wait_for_selector('#verdict[data-included="false"]')
    assert "no commitment names this hash" in page.inner_text("#verdict-message")

    # The visitor's own proof: the real proof of a real round, for a forged hash. The
    # contract refuses it, and the page says so.
    assert demo.chain(ledger.is_rollout_included, node, rnd, unknown, proof) is False
    page.click("details summary")
    page.fill("#node", node)
    page.fill("#round", str(rnd))
    page.fill("#proof", ",".join("0x" + p.hex() for p in proof))
    page.click("#verify-button")
    page.wait_for_selector('#found tr[data-included="false"]')
    assert page.get_attribute("#verdict", "data-included") == "false"
    # ... and the same proof for the real hash is accepted.
    page.fill("#hash", "0x" + h.hex())
    page.click("#verify-button")
    page.wait_for_selector('#found tr[data-included="true"]')
    assert page.get_attribute("#verdict", "data-included") == "true"


def test_a_node_joining_shows_up_live_without_a_reload(demo: Demo, page: Any):
    page.goto(demo.url)
    page.wait_for_selector("#nodes tbody tr")
    before = page.locator("#nodes tbody tr").count()
    page.evaluate("window.__samePage = true")
    try:
        late = demo.portal.call(demo.swarm.add_node, 2)
        page.wait_for_function(
            "a => { const td = document.querySelector("
            "`#nodes tr[data-node='${a}'] td[data-col='rounds_committed']`);"
            " return td && td.textContent === '2'; }",
            arg=late.address,
        )
        assert page.locator("#nodes tbody tr").count() == before + 1
        assert page.evaluate("window.__samePage") is True  # updated in place, no reload
        assert page.get_attribute("#live", "data-state") == "live"
    finally:
        demo.portal.call(demo.swarm.wait_settled, 240)


def test_bad_input_gives_a_clear_message_on_the_page_and_a_json_error(demo: Demo, page: Any):
    ledger_address = demo.swarm.ledger.address
    nobody = "0x" + "00" * 19 + "01"
    cases = [
        ("/node/0xnot-an-address", "/api/node/0xnot-an-address", 400, "not an Ethereum address"),
        (
            f"/node/{nobody}",
            f"/api/node/{nobody}",
            404,
            f"is not a node of the ledger at {ledger_address}",
        ),
        ("/verify?hash=0x1234", "/api/verify/0x1234", 400, "is not a rollout hash"),
    ]
    for path, api, status, message in cases:
        page.goto(demo.url + path)
        page.wait_for_selector("#error:not([hidden])")
        assert message in page.inner_text("#error")
        code, body = get_json(demo.url + api)
        assert code == status
        assert message in body["error"]["message"]
    shot(page, "bad-input")
    code, body = get_json(f"{demo.url}/api/verify/0x{'ab' * 32}?node={nobody}&round=x")
    assert (code, body["error"]["code"]) == (400, "bad_round")
    code, body = get_json(f"{demo.url}/api/nothing-here")
    assert (code, body["error"]["code"]) == (404, "no_such_api")


def test_an_unreachable_chain_is_a_503_and_a_message_on_the_page(demo: Demo, page: Any):
    from sapo_async.explorer.app import build_app
    from sapo_async.explorer.server import serving
    from sapo_async.explorer.source import Explorer
    from sapo_async.ledger.connect import connect_ledger

    rpc = f"http://127.0.0.1:{free_port()}"
    explorer = Explorer(connect_ledger(rpc, "0x" + "11" * 20), chain=rpc)
    with demo.portal.wrap_async_context_manager(serving(build_app(explorer))) as url:
        code, body = get_json(f"{url}/api/swarm")
        assert code == 503
        assert body["error"]["code"] == "chain_unreachable"
        assert f"cannot reach the chain at {rpc}" in body["error"]["message"]
        page.goto(url)
        page.wait_for_selector("#error:not([hidden])")
        assert f"cannot reach the chain at {rpc}" in page.inner_text("#error")
        page.wait_for_selector('#live[data-state="down"]')  # the live stream says so too
        shot(page, "unreachable")
