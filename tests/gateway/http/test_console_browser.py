"""The console in a real browser: ``carpool serve`` (echo engine) as a process, ``/console`` in
headless Chromium (Debian's package, driven by Playwright; nothing is downloaded at run time),
a tenant key refused, the admin key signed in (kept in sessionStorage, never in the URL), load
sent, and the panels showing non-zero numbers that change. A screenshot is saved as an
artefact (its path is printed; ``CARPOOL_TEST_ARTEFACTS`` overrides the folder).

Skips only where no Chromium executable is found (``make setup`` installs Debian's).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.ttft_split import PARTS
from tests.gateway.harness import make_tenant
from tests.gateway.procs import spawn

pytestmark = pytest.mark.timeout(90)
ADMIN_KEY = "cp-admin-" + "b" * 32
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


def artefact_dir() -> Path:
    path = Path(os.environ.get("CARPOOL_TEST_ARTEFACTS")
                or Path(tempfile.gettempdir()) / "carpool-artefacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium through Playwright. Opened after the test's own asyncio work: the sync
    API runs an event loop of its own in this thread."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                               args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def send_load(url: str, key: str, stop: threading.Event, counts: list[int]) -> None:
    body = {"model": "echo", "prompt": "a few words to echo back " * 4, "max_tokens": 24}
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            r = client.post(url + "/v1/completions", json=body,
                            headers={"Authorization": f"Bearer {key}"})
            counts.append(r.status_code)


def metric(page: Any, path: str) -> str:
    return str(page.locator(f'[data-metric="{path}"]').first.inner_text())


def wait_until(page: Any, check: Any, timeout_s: float = 15.0) -> None:
    """Poll from Python: the page's CSP forbids the string evaluation wait_for_function uses."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the console never showed it"
        page.wait_for_timeout(200)


def number(text: str) -> float:
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return 0.0


def test_console_in_chromium(redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("no Chromium executable on PATH (make setup installs Debian's 'chromium')")
    ns = f"t{uuid.uuid4().hex[:10]}"
    env = {"CARPOOL_ADMIN_KEY": ADMIN_KEY}
    with spawn("all", redis_url, ns, tiny_model_dir, tmp_path, "--echo-step-ms", "4",
               env=env) as server:
        tenant_key = make_tenant(redis_url, ns, "acme", rpm=100_000, max_concurrency=64)
        with chromium() as browser:
            check_console(browser, server.url, tenant_key)


def check_console(browser: Any, url: str, tenant_key: str) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1500})
    page.goto(url + "/console")
    assert page.locator("#login").is_visible()

    # a tenant key is refused: the error is shown, no panel, the key not kept
    page.fill("#key", tenant_key)
    page.click("#login-form button")
    wait_until(page, lambda: page.inner_text("#login-error") != "")
    assert "401" in page.inner_text("#login-error")
    assert not page.locator("#dash").is_visible()
    assert page.evaluate("sessionStorage.getItem('carpool.adminKey')") is None

    page.fill("#key", ADMIN_KEY)
    page.click("#login-form button")
    page.wait_for_selector("#dash", state="visible", timeout=10_000)
    assert page.evaluate("sessionStorage.getItem('carpool.adminKey')") == ADMIN_KEY
    assert ADMIN_KEY not in page.url and tenant_key not in page.url

    stop, codes = threading.Event(), []  # type: ignore[var-annotated]
    load = [threading.Thread(target=send_load, args=(url, tenant_key, stop, codes))
            for _ in range(4)]
    for t in load:
        t.start()
    try:
        wait_until(page, lambda: number(metric(page, "engine.tokens_per_s")) > 0)
        before = number(metric(page, "counters.admitted"))
        # the numbers change under load: wait for a redraw that shows more (no fixed sleep:
        # on a crowded machine a redraw can take longer than any one guess)
        wait_until(page, lambda: number(metric(page, "counters.admitted")) > before, 30.0)
        after = number(metric(page, "counters.admitted"))
        tokens = number(metric(page, "engine.tokens_per_s"))
        admitted = number(metric(page, "tier.interactive.admitted_per_s"))
        ttft = metric(page, "tier.interactive.ttft_p50")
        steps = number(metric(page, "engine.steps_per_s"))
        # the worker's step budget: a TPOT target derived from the steps it has seen
        target_cell = page.locator('[data-metric="budget.target"]')
        wait_until(page, lambda: target_cell.count() > 0
                   and target_cell.first.inner_text().endswith("ms"), 30.0)
        target = metric(page, "budget.target")
        # the TTFT budget: every part of a first token's path, and the steps it took
        steps_cell = page.locator('[data-metric="tier.interactive.ttft.steps_p99"]')
        wait_until(page, lambda: number(steps_cell.first.inner_text()) >= 1, 30.0)
        budget = {part: metric(page, f"tier.interactive.ttft.{part}_p99") for part in PARTS}
        ttft_steps = number(steps_cell.first.inner_text())
        shot = artefact_dir() / "console.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"\nconsole screenshot: {shot}")
    finally:
        stop.set()
        for t in load:
            t.join(30)
    assert codes and set(codes) == {200}
    assert after > before > 0  # the numbers change under load
    assert tokens > 0 and admitted > 0 and steps > 0
    assert ttft.endswith("ms") and number(target) > 0
    assert all(v.endswith("ms") for v in budget.values()), budget
    assert ttft_steps >= 1
    assert page.locator('[data-metric="doctor.verdict"]').inner_text() == "No symptom"
    assert page.locator('#tenants td', has_text="acme").count() == 1
