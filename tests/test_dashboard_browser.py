"""The dashboard (issue 18) in a real browser: Debian's Chromium, driven by Playwright, against a
private `make run` fleet (`edge-gateway dev`, city fra) over real HTTP.

Each page loads without console errors or failed requests and shows what the API holds, and is
saved as <page>.png (the tests below add playground-chat, gateway-logs, gateway-log-detail and
fleet-under-load) in $EDGEFIRE_SCREENSHOTS: `make screenshots` sets it to docs/dashboard, which the
README links; otherwise the pytest tmp dir, so that a test run leaves the tree clean. The
playground streams a SmolLM2 answer from fra and shows an embedding's shape; a gateway created in
the UI logs a cached request as HIT; the fleet page's live numbers move under load; without a dev
session the page asks for a token and shows the API's error for a wrong one. The browser is
/usr/bin/chromium (`make test` installs Debian's package when it is missing); `playwright install`
is never needed.

On a failure the tab's screenshot, the browser console log and the fleet's log are saved in the
test's pytest tmp dir and their paths printed (and added to the error)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from bench.soak_fleet import Fleet, private_fleet, warm_up
from edgefire.contract.cities import all_cities
from tests.gateway_fakes import gateway as plain_gateway

pytestmark = pytest.mark.slow

SHOTS_ENV = "EDGEFIRE_SCREENSHOTS"
CHROMIUM = Path("/usr/bin/chromium")
SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
MINILM = "@cf/sentence-transformers/all-minilm-l6-v2"  # catalog.yaml: 384 dimensions
KIMI = "@cf/moonshotai/kimi-k2.5"  # a miniature here
PAGES = ("fleet", "models", "gateway", "charts", "playground")
CHARTS = ("requests", "tokens", "ttft", "itl", "cache", "errors")
WAIT_MS = 30_000  # a shared 2-core CI machine runs the fleet and the browser side by side
IDLE_MS = 120_000  # for work to finish on a loaded machine (a SmolLM2 answer, the fleet's load)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
IDLE = re.compile(r"^\s*0\s*$")

expect.set_options(timeout=WAIT_MS)


# --- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    """`make run`'s fleet, private to this module, with SmolLM2 and MiniLM loaded."""
    with private_fleet("fra") as fleet:
        warm_up(fleet)
        yield fleet


@pytest.fixture(scope="module")
def api(fleet: Fleet) -> Iterator[httpx.Client]:
    """The public API as a client sees it (the dev account's token)."""
    with _client(fleet) as client:
        yield client


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium "
                    "(apt-get install -y chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield browser
        browser.close()


@dataclass
class Ui:
    """One browser tab, and what it logged: every console message, the errors among them
    (console errors and uncaught exceptions) and the requests that failed or answered >= 400."""

    page: Page
    evidence_dir: Path
    shots: Path  # where screenshot() saves
    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def watch(self) -> None:
        self.page.on("console", self._on_console)
        self.page.on("pageerror", lambda exc: self._error(f"uncaught: {exc}"))
        self.page.on("requestfailed", lambda r: self.failed.append(
            f"{r.method} {r.url}: {r.failure}"))
        self.page.on("response", lambda r: r.status >= 400 and self.failed.append(
            f"{r.request.method} {r.url}: HTTP {r.status}"))

    def _on_console(self, message) -> None:
        where = message.location or {}
        self.console.append(f"[{message.type}] {message.text} "
                            f"({where.get('url', '')}:{where.get('lineNumber', '')})")
        if message.type == "error":
            self.errors.append(message.text)

    def _error(self, text: str) -> None:
        self.console.append(f"[pageerror] {text}")
        self.errors.append(text)

    def by_id(self, testid: str) -> Locator:
        return self.page.get_by_test_id(testid)

    def assert_clean(self) -> None:
        """Nothing went wrong in the browser so far."""
        assert self.errors == [], f"console errors: {self.errors}"
        assert self.failed == [], f"failed requests: {self.failed}"

    def save_evidence(self, exc: BaseException, fleet_log: Path | None) -> None:
        shot, log = self.evidence_dir / "failure.png", self.evidence_dir / "console.log"
        notes = []
        with contextlib.suppress(Exception):
            self.page.screenshot(path=shot, full_page=True)
            notes.append(f"screenshot: {shot}")
        log.write_text("\n".join([f"url: {self._url()}", *self.console, "", "failed requests:",
                                  *self.failed]) + "\n")
        notes.append(f"browser console log: {log}")
        if fleet_log is not None and fleet_log.exists():  # gone with the fleet otherwise
            shutil.copy(fleet_log, self.evidence_dir / "fleet.log")
            notes.append(f"fleet log (gateway and node): {self.evidence_dir / 'fleet.log'}")
        for note in notes:
            print(note)
            exc.add_note(note)

    def _url(self) -> str:
        with contextlib.suppress(Exception):
            return self.page.url
        return "?"


@pytest.fixture
def ui(browser: Browser, tmp_path: Path) -> Iterator[Ui]:
    """A fresh tab (its own storage) on a laptop-sized window."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(WAIT_MS)
    shots = Path(os.environ.get(SHOTS_ENV) or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    ui = Ui(context.new_page(), tmp_path, shots)
    ui.watch()
    try:
        yield ui
    finally:
        context.close()


def keeps_evidence(test: Callable) -> Callable:
    """On failure, the tab's screenshot, its console log and the fleet's log go to the test's
    tmp dir."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        try:
            return test(*args, **kwargs)
        except BaseException as exc:
            ui, fleet = kwargs.get("ui"), kwargs.get("fleet")
            if ui is not None:
                ui.save_evidence(exc, fleet.log_path if fleet else None)
            raise

    return run


# --- helpers ----------------------------------------------------------------------------------

def _client(fleet: Fleet, token: str | None = None) -> httpx.Client:
    return httpx.Client(base_url=f"{fleet.gateway_url}/client/v4/accounts/{fleet.account}",
                        headers={"authorization": f"Bearer {token or fleet.token}"},
                        timeout=120, trust_env=False)


def open_dashboard(ui: Ui, base_url: str, page: str = "fleet") -> None:
    """Open `/` (dev sign-in happens by itself), then the page through its nav link."""
    ui.page.goto(f"{base_url}/")
    nav = ui.by_id(f"nav-{page}")
    expect(nav).to_be_visible()
    if page != "fleet":  # the default page
        nav.click()
    expect(ui.page).to_have_url(re.compile(rf"#/{page}$"))


def screenshot(ui: Ui, name: str) -> None:
    ui.page.screenshot(path=ui.shots / f"{name}.png", full_page=True)


def number(locator: Locator) -> float:
    text = locator.inner_text()
    found = NUMBER.search(text.replace(",", ""))
    assert found, f"no number in {text!r}"
    return float(found.group())


def choose(select: Locator, value: str) -> None:
    """Pick a model in the playground (a <select>, or a text box with suggestions)."""
    if select.evaluate("e => e.tagName") == "SELECT":
        select.select_option(value)
    else:
        select.fill(value)


# --- the playground ---------------------------------------------------------------------------

# Every change to the playground's answer: (ms since the observer started, its text length).
_RECORD_OUTPUT = """() => {
  window.__pgLengths = [];
  const t0 = performance.now();
  const read = () => {
    const el = document.querySelector('[data-testid="pg-output"]');
    const n = el ? el.textContent.trim().length : 0;
    const seen = window.__pgLengths;
    if (!seen.length || seen[seen.length - 1][1] !== n) seen.push([performance.now() - t0, n]);
  };
  new MutationObserver(read).observe(document.body,
                                     {childList: true, subtree: true, characterData: true});
}"""


def _is_inference(response) -> bool:
    url = response.url
    return response.request.method == "POST" and ("/ai/run/" in url or "/ai/v1/" in url)


@keeps_evidence
def test_playground_streams_answers_says_when_a_miniature_answered_and_shows_a_shape(
        fleet: Fleet, ui: Ui) -> None:
    open_dashboard(ui, fleet.gateway_url, "playground")
    page = ui.page
    choose(ui.by_id("pg-model"), SMOL)
    page.get_by_label("Max tokens").fill("24")  # short: the CI machine has 2 cores
    page.get_by_label("Temperature").fill("0")
    ui.by_id("pg-input").fill("Name three colours of the rainbow.")
    page.evaluate(_RECORD_OUTPUT)
    with page.expect_response(_is_inference) as answered:
        ui.by_id("pg-send").click()
    response = answered.value
    assert response.status == 200, (response.url, response.status)
    assert response.headers.get("x-edgefire-node") == "fra"
    # The whole stream has arrived once the page is no longer busy (Response.finished() has no
    # timeout and can miss the end of a streamed fetch, so it is not used).
    expect(ui.by_id("pg-send")).to_be_enabled(timeout=IDLE_MS)
    expect(ui.by_id("pg-tps")).to_have_text(NUMBER)
    assert number(ui.by_id("pg-tps")) > 0
    expect(ui.by_id("pg-node")).to_contain_text("fra")
    lengths = page.evaluate("window.__pgLengths")
    grew = [n for _, n in lengths]
    # Streamed: the answer appeared piece by piece, growing over time, and ends non-empty.
    assert len(grew) >= 4 and grew == sorted(grew), lengths
    assert grew[-1] > 0 and lengths[-1][0] > lengths[1][0], lengths
    assert ui.by_id("pg-output").inner_text().strip()
    expect(ui.by_id("pg-miniature")).to_be_hidden()  # SmolLM2 is itself
    screenshot(ui, "playground-chat")

    # Kimi K2.5 is answered by its miniature, and the page says what of it is synthetic.
    choose(ui.by_id("pg-model"), KIMI)
    ui.by_id("pg-input").fill("Hi")
    with page.expect_response(_is_inference) as answered:
        ui.by_id("pg-send").click()
    assert answered.value.status == 200, (answered.value.url, answered.value.status)
    expect(ui.by_id("pg-send")).to_be_enabled(timeout=IDLE_MS)
    expect(ui.by_id("pg-miniature")).to_contain_text("miniature: num_layers 4 of 61")

    choose(ui.by_id("pg-model"), MINILM)
    ui.by_id("pg-input").fill("edge inference in Frankfurt")
    with page.expect_response(_is_inference) as answered:
        ui.by_id("pg-send").click()
    assert answered.value.status == 200, (answered.value.url, answered.value.status)
    expect(ui.by_id("pg-shape")).to_have_text(re.compile(r"\b1\D{1,5}384\b"))
    ui.assert_clean()


# --- AI Gateway -------------------------------------------------------------------------------

@keeps_evidence
def test_a_gateway_created_in_the_ui_logs_a_cached_request_as_hit(
        fleet: Fleet, api: httpx.Client, ui: Ui) -> None:
    gateway_id = f"browser-{uuid.uuid4().hex[:8]}"
    open_dashboard(ui, fleet.gateway_url, "gateway")
    ui.by_id("gateway-create-id").fill(gateway_id)
    ui.by_id("gateway-create").click()
    row = ui.by_id(f"gateway-row-{gateway_id}")
    expect(row).to_be_visible()
    row.click()  # its settings (and logs)
    ui.page.get_by_label(re.compile(r"cache ttl", re.I)).fill("300")
    ui.by_id("gateway-save").click()
    expect(row).to_contain_text("300")
    created = api.get(f"/ai-gateway/gateways/{gateway_id}")
    assert created.status_code == 200, created.text
    assert created.json()["result"]["cache_ttl"] == 300

    # The same request twice, as a client sends it through that gateway.
    body = {"prompt": "Say hello in French.", "temperature": 0, "max_tokens": 8}
    headers = {"cf-aig-gateway-id": gateway_id}
    first, second = (api.post(f"/ai/run/{SMOL}", json=body, headers=headers) for _ in range(2))
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    assert (first.headers["cf-aig-cache-status"],
            second.headers["cf-aig-cache-status"]) == ("MISS", "HIT")

    row.click()
    logs = ui.by_id("log-row")
    expect(logs).to_have_count(2)
    hit = ui.page.locator('[data-testid="log-row"][data-cached="true"]')
    expect(hit).to_have_count(1)
    expect(hit).to_contain_text("HIT")
    screenshot(ui, "gateway-logs")
    hit.click()
    detail = ui.by_id("log-detail")
    expect(detail).to_be_visible()
    expect(detail).to_contain_text(SMOL)
    expect(detail).to_contain_text(second.headers["cf-aig-log-id"])
    expect(detail).to_contain_text("Say hello in French.")  # the stored request body
    screenshot(ui, "gateway-log-detail")
    ui.assert_clean()


# --- the fleet under load ---------------------------------------------------------------------

def _stream_until(fleet: Fleet, stop: threading.Event, errors: list[str]) -> None:
    """Streaming SmolLM2 requests, one after the other, until stop is set."""
    body = {"messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}],
            "stream": True, "max_tokens": 32}
    try:
        with _client(fleet) as client:
            while not stop.is_set():
                with client.stream("POST", f"/ai/run/{SMOL}", json=body) as response:
                    if response.status_code != 200:
                        errors.append(f"{response.status_code} {response.read()!r}")
                        return
                    for _ in response.iter_lines():
                        pass
    except Exception as exc:  # reported by the test
        errors.append(repr(exc))


# The numbers fra's running, waiting and KV show (null where one shows none yet).
_NUMBERS = """(ids) => ids.map((id) => {
  const el = document.querySelector(`[data-testid="${id}"]`);
  const found = el?.textContent.match(/-?\\d+(\\.\\d+)?/);
  return found ? Number(found[0]) : null;
})"""
# The numbers once busy (requests running or waiting, or more KV in use than before); else false.
_BUSY = f"""([ids, before]) => {{
  const numbers = ({_NUMBERS})(ids);
  const [running, waiting, kv] = numbers;
  return (running > 0 || waiting > 0 || kv > before[2]) && numbers;
}}"""


@keeps_evidence
def test_the_fleet_page_shows_frankfurt_s_live_numbers_change_under_load(
        fleet: Fleet, ui: Ui) -> None:
    open_dashboard(ui, fleet.gateway_url, "fleet")
    ids = ["city-fra-running", "city-fra-waiting", "city-fra-kv"]
    for testid in ids:
        expect(ui.by_id(testid).first).to_have_text(NUMBER)
    # Idle first (an answer another test left behind may still be finishing).
    expect(ui.by_id("city-fra-running").first).to_have_text(IDLE, timeout=IDLE_MS)
    expect(ui.by_id("city-fra-waiting").first).to_have_text(IDLE, timeout=IDLE_MS)
    before = ui.page.evaluate(_NUMBERS, ids)

    stop, errors = threading.Event(), []
    clients = [threading.Thread(target=_stream_until, args=(fleet, stop, errors), daemon=True)
               for _ in range(6)]
    for client in clients:
        client.start()
    try:
        # The page polls the fleet every 2 s: fra's numbers must move while the load runs.
        busy = ui.page.wait_for_function(_BUSY, arg=[ids, before], timeout=WAIT_MS).json_value()
        screenshot(ui, "fleet-under-load")
    finally:
        stop.set()
        for client in clients:
            client.join(timeout=120)
    assert errors == [], errors
    assert busy[0] + busy[1] > 0 or busy[2] > before[2], (before, busy)
    # And back to idle once the load is gone.
    expect(ui.by_id("city-fra-running").first).to_have_text(IDLE, timeout=IDLE_MS)
    ui.assert_clean()


# --- signing in without a dev session ---------------------------------------------------------

@keeps_evidence
def test_without_a_dev_session_the_page_asks_for_a_token_and_shows_the_api_error(
        serve, tmp_path: Path, ui: Ui) -> None:
    # A plain gateway (`edge-gateway start`, not dev): its /dashboard/session answers 404.
    with plain_gateway(serve, tmp_path) as gateway:
        session = httpx.get(f"{gateway.url}/dashboard/session", trust_env=False)
        assert session.status_code == 404
        wrong = httpx.get(f"{gateway.url}/client/v4/accounts/{gateway.account_id}"
                          "/ai-gateway/gateways", headers={"authorization": "Bearer wrong"},
                          trust_env=False)
        assert wrong.status_code == 401
        message = wrong.json()["errors"][0]["message"]

        page = ui.page
        page.goto(f"{gateway.url}/")
        account = page.get_by_label(re.compile(r"account", re.I))
        token = page.get_by_label(re.compile(r"token", re.I))
        expect(account).to_be_visible()
        expect(token).to_be_visible()
        expect(ui.by_id("nav-fleet")).not_to_be_visible()
        account.fill(gateway.account_id)
        token.fill("wrong")
        sign_in = page.get_by_role("button", name=re.compile(r"sign in", re.I))
        sign_in.click()
        expect(page.locator("body")).to_contain_text(message)
        expect(ui.by_id("nav-fleet")).not_to_be_visible()

        token.fill(gateway.token)
        sign_in.click()
        expect(ui.by_id("nav-fleet")).to_be_visible()
        expect(token).not_to_be_visible()
        page.reload()  # the session survives a reload (sessionStorage)
        expect(ui.by_id("nav-fleet")).to_be_visible()
        expect(token).not_to_be_visible()
        # The 404 session probe and the 401 are expected (and requests the reload cut short);
        # nothing else may go wrong.
        assert [e for e in ui.errors if "Failed to load resource" not in e] == [], ui.errors
        unexpected = [f for f in ui.failed if not f.endswith(("HTTP 401", "HTTP 404",
                                                                "net::ERR_ABORTED"))]
        assert unexpected == [], ui.failed


# --- every page -------------------------------------------------------------------------------

def _fleet_page(ui: Ui, fleet: Fleet, api: httpx.Client) -> None:
    marker_and_row = ui.by_id("city-fra")
    expect(marker_and_row).to_have_count(2)  # on the map and in the table
    for element in marker_and_row.all():
        expect(element).to_be_visible()
    expect(ui.page.get_by_role("main")).to_contain_text("Frankfurt")
    for city in all_cities():  # every configured city, heartbeating or offline
        expect(ui.by_id(f"city-{city.code}").first).to_be_attached()
    for testid in ("city-fra-running", "city-fra-waiting", "city-fra-kv"):
        expect(ui.by_id(testid).first).to_have_text(NUMBER)
    # The capacity table: Kimi K2.5's real model fits Frankfurt's 8×H100 (as 8 pipeline
    # stages) and not London's one L4; the cities' verdicts follow.
    kimi = ui.by_id("capacity").locator("tbody tr").filter(has_text="kimi-k2.5")
    codes = [code.lower() for code in ui.by_id("capacity").locator("thead th").all_inner_texts()]
    cells = {code: kimi.locator("td").nth(i - 1) for i, code in enumerate(codes) if i}
    expect(cells["fra"]).to_contain_text("✓ pp8")
    expect(cells["lhr"]).to_contain_text("too big")
    expect(cells["lhr"]).to_contain_text("✗ weights")


def _models_page(ui: Ui, fleet: Fleet, api: httpx.Client) -> None:
    listing = api.get("/ai/models/search", params={"per_page": 1000}).json()
    total = listing["result_info"]["total_count"]
    rows = ui.by_id("model-row")
    visible = rows.filter(visible=True)
    expect(visible).to_have_count(total)  # the whole catalog a client sees
    smol = visible.filter(has=ui.page.get_by_text(SMOL, exact=True))  # not its -int8, … variants
    minilm = visible.filter(has=ui.page.get_by_text(MINILM, exact=True))
    expect(smol).to_have_count(1)
    search = ui.by_id("model-search")
    search.fill("minilm")
    expect(minilm).to_have_count(1)
    expect(smol).to_have_count(0)
    search.fill("smollm2")
    expect(smol).to_have_count(1)
    expect(minilm).to_have_count(0)
    assert 1 <= visible.count() < total
    search.fill("")
    expect(visible).to_have_count(total)
    task = ui.page.get_by_label("Task")
    task.select_option(label="Text Embeddings")
    expect(minilm).to_have_count(1)
    expect(smol).to_have_count(0)
    task.select_option(index=0)  # all
    expect(visible).to_have_count(total)
    # Its details: where it is loaded, its prices and its schema.
    ui.page.get_by_text(SMOL, exact=True).click()
    expect(smol).to_contain_text("Frankfurt")
    expect(smol).to_contain_text("per M input tokens")
    expect(smol).to_contain_text('"prompt"')


def _gateway_page(ui: Ui, fleet: Fleet, api: httpx.Client) -> None:
    expect(ui.by_id("gateway-create-id")).to_be_visible()
    expect(ui.by_id("gateway-create")).to_be_visible()
    for gateway in api.get("/ai-gateway/gateways").json()["result"]:
        expect(ui.by_id(f"gateway-row-{gateway['id']}")).to_be_visible()


def _charts_page(ui: Ui, fleet: Fleet, api: httpx.Client) -> None:
    for chart in CHARTS:
        expect(ui.by_id(f"chart-{chart}")).to_be_visible()
        box = ui.by_id(f"chart-{chart}").bounding_box()
        assert box and box["height"] > 50 and box["width"] > 100, (chart, box)
        expect(ui.by_id(f"chart-{chart}").locator("canvas").first).to_be_visible()  # drawn


def _playground_page(ui: Ui, fleet: Fleet, api: httpx.Client) -> None:
    for testid in ("pg-model", "pg-input", "pg-send"):
        expect(ui.by_id(testid)).to_be_visible()
    model = ui.by_id("pg-model")
    if model.evaluate("e => e.tagName") == "SELECT":
        expect(model.locator(f'option[value="{SMOL}"]')).to_have_count(1)

SHOWS = {"fleet": _fleet_page, "models": _models_page, "gateway": _gateway_page,
         "charts": _charts_page, "playground": _playground_page}


# Last in the module, so the screenshots show the traffic the tests above made.
@pytest.mark.parametrize("name", PAGES)
@keeps_evidence
def test_every_page_loads_cleanly_and_shows_its_content(
        name: str, fleet: Fleet, api: httpx.Client, ui: Ui) -> None:
    open_dashboard(ui, fleet.gateway_url, name)
    SHOWS[name](ui, fleet, api)
    ui.page.wait_for_load_state("networkidle")
    ui.assert_clean()
    screenshot(ui, name)
