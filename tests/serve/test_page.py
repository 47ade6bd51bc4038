"""The web page in headless Chromium (Playwright driving /usr/bin/chromium): a question asked, its answer, SQL, ledger
bars and turns on the page; screenshots saved under tmp_path and as the README's docs/images/serve.png; with a local
engine, the turns appear one by one while the episode is still running (streamed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.serve.conftest import COUNT_Q, N_ORDERS, LiveService, build_local_service, build_service, plans
from tests.serve.local_engine import StepEngine

CHROMIUM = os.environ.get("BAPSQL_CHROMIUM", "/usr/bin/chromium")
README_IMAGE = Path(__file__).resolve().parents[2] / "docs" / "images" / "serve.png"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.slow


@pytest.fixture
def browser_page(tmp_path):
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (install it, e.g. apt-get install -y chromium, or set BAPSQL_CHROMIUM)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(str(tmp_path / "chromium-profile"), executable_path=CHROMIUM,
                                                        headless=True, args=ARGS,
                                                        viewport={"width": 1280, "height": 860})
        try:
            yield context.new_page()
        finally:
            context.close()


def test_the_page_asks_and_shows_answer_sql_and_ledger(browser_page, shop, chat_server, tmp_path):
    asker, engine, app = build_service([shop], chat_server.base_url, tmp_path / "logs")
    page = browser_page
    try:
        with LiveService(app) as live:
            page.goto(live.url + "/")
            page.wait_for_selector("#db option[value='shop']", state="attached")
            assert page.input_value("#budget") == "S"
            page.fill("#question", COUNT_Q)
            page.select_option("#budget", "M")
            page.click("#ask")
            page.wait_for_function("document.querySelector('#answer').textContent.trim().length > 0", timeout=60_000)
            answer = page.text_content("#answer").strip()
            sql = page.text_content("#sql")
            status = page.text_content("#status")
            turns = page.locator("#turns .turn").count()
            queries_bar = page.text_content(".bar[data-channel='queries']")
            page.screenshot(path=str(tmp_path / "serve.png"), full_page=True)
    finally:
        asker.close()
        engine.close()
    assert answer == str(N_ORDERS)
    assert "SELECT count(*) FROM orders" in sql and "estimate rows" in sql
    assert status.startswith("answered") and "budget M" in status
    assert turns == 3 and "1 /" in queries_bar
    assert (tmp_path / "serve.png").stat().st_size > 10_000
    README_IMAGE.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tmp_path / "serve.png", README_IMAGE)
    assert asker.logged == 1


def test_the_page_shows_turns_as_they_stream_from_a_local_engine(browser_page, shop, tmp_path):
    engine = StepEngine(plans(), hold_from_turn=2)  # the answer turn waits until released
    asker, app = build_local_service([shop], engine, tmp_path / "logs")
    page = browser_page
    try:
        with LiveService(app) as live:
            page.goto(live.url + "/")
            page.wait_for_selector("#db option[value='shop']", state="attached")
            page.fill("#question", COUNT_Q)
            page.click("#ask")
            page.wait_for_function("document.querySelectorAll('#turns .turn').length === 2", timeout=60_000)
            assert page.text_content("#answer").strip() == ""  # two turns shown, the episode still running
            assert page.text_content("#status").startswith("asking")
            engine.release()
            page.wait_for_function("document.querySelector('#answer').textContent.trim().length > 0", timeout=60_000)
            answer, turns = page.text_content("#answer").strip(), page.locator("#turns .turn").count()
    finally:
        engine.release()
        asker.close()
    assert answer == str(N_ORDERS) and turns == 3 and asker.logged == 1
