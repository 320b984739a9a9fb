"""The audit dashboard in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium) against a real ``relaygraph serve`` on loopback
with the scripted model.

Each test saves a screenshot of the pages it opened under the module's output folder (the
path is printed; ``RELAYGRAPH_DASHBOARD_SHOTS=docs/dashboard`` saves them there too, which
is how the docs' screenshots are made) and fails on any error in the browser's console.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from relaygraph.client import Client
from relaygraph.store import Ledger

from ._scripts import REFUSED_RUN_PYTHON
from ._service import free_port, stop_process, wait_answering
from .conftest import EXAMPLE_RELAY

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SHOTS_ENV = "RELAYGRAPH_DASHBOARD_SHOTS"
APPROVAL_POLICY = {"agents": {"coder": {"approval": ["run_python"]}}}

pytestmark = [
    # A server, two eval runs by the CLI and a browser: about a minute together.
    pytest.mark.slow,
    pytest.mark.skipif(
        not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
        reason="needs Debian's chromium and chromium-driver (.ci/run installs them)",
    ),
]


class Stage:
    """A running ``relaygraph serve``, two projects' keys, and where screenshots go."""

    def __init__(self, url: str, home: Path, keys: dict[str, str], shots: Path) -> None:
        self.url, self.home, self.keys, self.shots = url, home, keys, shots
        self.eval_runs: list[str] = []

    def client(self, project: str = "research") -> Client:
        return Client(self.url, self.keys[project])

    def run(self, project: str = "research", **body: Any) -> dict[str, Any]:
        """Submit a task and wait for it to finish or pause."""
        with self.client(project) as client:
            task = client.submit(**body)
            return client.wait(task["id"], timeout=60)  # type: ignore[no-any-return]


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["RELAYGRAPH_HOME"] = str(home)
    env.pop("RELAYGRAPH_DATABASE_URL", None)
    return env


def _relaygraph(home: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "relaygraph.cli", *args],
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


def _golden(folder: Path, *, regress: bool) -> Path:
    """Two cases on the scripted relay and the refused tool; with ``regress`` the relay
    case expects another first agent, so that it fails."""
    shutil.copy(EXAMPLE_RELAY, folder / "relay.json")
    (folder / "refusing.json").write_text(json.dumps(REFUSED_RUN_PYTHON), encoding="utf-8")
    cases = [
        {
            "id": "relay",
            "input": "When are checkpoints written?",
            "script": "relay.json",
            "expect": {
                "first_agent": "writer" if regress else "researcher",
                "handoffs": [["researcher", "coder"]],
                "answer_contains": ["41 checkpoints"],
            },
        },
        {
            "id": "refused-tool",
            "input": "When are checkpoints written? Do not run code.",
            "script": "refusing.json",
            "expect": {"violations": ["tool_not_allowed"], "tools_not_used": ["run_python"]},
        },
    ]
    path = folder / ("golden-regress.jsonl" if regress else "golden.jsonl")
    path.write_text("\n".join(json.dumps(c) for c in cases) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    root = tmp_path_factory.mktemp("dashboard")
    home, scripts, shots = root / "home", root / "scripts", root / "screenshots"
    for folder in (home, scripts, shots):
        folder.mkdir()
    shutil.copy(EXAMPLE_RELAY, scripts / "relay.json")
    (scripts / "refusing.json").write_text(json.dumps(REFUSED_RUN_PYTHON), encoding="utf-8")
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        ledger.upgrade()
        keys = {name: ledger.create_project(name)[1] for name in ("research", "other")}
    # Eval runs recorded by the CLI in the server's ledger (the same data directory).
    for regress in (False, True):
        report = root / f"eval-{int(regress)}"
        _relaygraph(home, "eval", str(_golden(scripts, regress=regress)), "--out", str(report))
    port = free_port()
    log = root / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [
                *(sys.executable, "-m", "relaygraph.cli", "serve", "--port", str(port)),
                *("--model", f"scripted:{EXAMPLE_RELAY}", "--scripts", str(scripts)),
            ],
            # Traced as a server may be: spans to the log, so that task pages show trace ids.
            env={
                **_env(home),
                "RELAYGRAPH_UI_REFRESH_SECONDS": "1",
                # Eval runs belong to no project: shown only where the operator says so.
                "RELAYGRAPH_UI_SHOW_EVALS": "true",
                "OTEL_TRACES_EXPORTER": "console",
            },
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(server, f"{url}/healthz", log, seconds=30, name="relaygraph serve")
        print(f"\ndashboard screenshots: {shots}")
        yield Stage(url, home, keys, shots)
    finally:
        stop_process(server, 20)
        assert key_never_logged(log, keys), "an API key appeared in the server's log"


def key_never_logged(log: Path, keys: dict[str, str]) -> bool:
    text = log.read_text(errors="replace")
    return not any(key in text for key in keys.values())


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tempfile.mkdtemp(prefix="relaygraph-chromium-")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1366,900",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def expected_answers() -> list[str]:
    """Addresses a test expects an error status from (a not-found page, a refused form):
    Chrome logs those answers in the console, and they are not errors of the page."""
    return []


@pytest.fixture
def page(browser: WebDriver, stage: Stage, expected_answers: list[str]) -> Iterator[WebDriver]:
    """The browser, signed out at the start of each test; its console is checked after."""
    browser.delete_all_cookies()
    browser.get(f"{stage.url}/ui/login")
    browser.delete_all_cookies()
    browser.get_log("browser")  # Start each test with an empty console.
    yield browser
    errors = console_errors(browser, expected_answers)
    assert not errors, f"the browser's console has errors: {errors}"


def console_errors(driver: WebDriver, expected: list[str]) -> list[str]:
    """The console's errors and warnings, but the network's report of an answer expected."""
    found = []
    for entry in driver.get_log("browser"):
        if entry["level"] not in ("SEVERE", "WARNING"):
            continue
        message = entry["message"]
        if entry.get("source") == "network" and any(url in message for url in expected):
            continue
        found.append(message)
    return found


def wait_for(driver: WebDriver, find: Callable[[WebDriver], Any], timeout: float = 30) -> Any:
    # The page swaps the parts that changed while a task runs: an element found a moment
    # ago may be gone by the time it is read, which only means "look again".
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        return WebDriverWait(
            driver,
            timeout,
            poll_frequency=0.1,
            ignored_exceptions=(StaleElementReferenceException,),
        ).until(find)
    except TimeoutException:
        raise AssertionError(f"timed out on {driver.current_url}") from None


DESKTOP = (1366, 900)
PHONE = (390, 844)
AXE = Path(__file__).parent / "vendor" / "axe.min.js"
"""axe-core, vendored (tests/vendor/README.md says why and from where)."""
BLOCKING_IMPACTS = ("serious", "critical")
WIDER_THAN_THE_SCREEN = """
const past = e => e.getBoundingClientRect().right > innerWidth + 1;
const scrolls = '.graph-scroll, .table-scroll, .table-card, pre';
const wide = [...document.querySelectorAll('body *')].filter(
  e => past(e) && !e.closest(scrolls) && ![...e.children].some(past));
return wide.slice(0, 5).map(e => e.tagName.toLowerCase() + '.' + String(e.className)
  + ' ' + Math.round(e.getBoundingClientRect().right));
"""
"""The innermost elements past the window's right edge, outside the parts that scroll."""


def axe_violations(driver: WebDriver) -> list[str]:
    """axe-core's serious and critical violations of the page as it stands, one line each
    (rule, impact, the first elements it names)."""
    if not driver.execute_script("return typeof window.axe === 'object'"):
        driver.execute_script(AXE.read_text(encoding="utf-8"))
    found = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']})"
        "  .then(r => done(r.violations.map(v => [v.id, v.impact,"
        "    v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(' | ')])))"
        "  .catch(e => done([['axe-error', 'critical', String(e)]]));"
    )
    return [f"{rule} ({impact}): {where}" for rule, impact, where in found
            if impact in BLOCKING_IMPACTS]  # fmt: skip


def check_state(driver: WebDriver, stage: Stage, name: str) -> None:
    """Check the page as it stands, on a desktop and on a phone, and keep screenshots:
    no serious or critical axe-core violation at either size, and at the phone's width
    nothing makes the page wider than the screen (the browser would zoom it out)."""
    failures = []
    try:
        for label, (width, height) in (("desktop", DESKTOP), ("phone", PHONE)):
            driver.set_window_size(width, height)
            wait_for(driver, lambda d, w=width: d.execute_script("return innerWidth") <= w)
            failures += [f"{name} at {label} size: {v}" for v in axe_violations(driver)]
            if label == "phone":
                inner, scroll = driver.execute_script(
                    "return [innerWidth, document.documentElement.scrollWidth]"
                )
                if scroll > inner:
                    wide = driver.execute_script(WIDER_THAN_THE_SCREEN)
                    failures.append(
                        f"{name} is {scroll} px wide on a {inner} px phone screen: {wide}"
                    )
                # A drawing keeps its text readable: it scrolls rather than shrinks.
                smallest = driver.execute_script(
                    "const t = [...document.querySelectorAll('svg.graph .node text')];"
                    "return t.length ? Math.min(...t.map(e => e.getBoundingClientRect().height))"
                    " : null;"
                )
                if smallest is not None and smallest < 10:
                    failures.append(f"{name}'s graph text is {smallest:.1f} px tall on a phone")
            _screenshot(driver, stage, f"{name}-{label}" if label == "phone" else name, width)
    finally:
        driver.set_window_size(*DESKTOP)
    assert not failures, "\n".join(failures)


def _screenshot(driver: WebDriver, stage: Stage, name: str, width: int) -> None:
    """Save the whole page (the window grown to the page's height) as ``name``.png."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, max(900, min(int(height) + 20, 6000)))
    driver.save_screenshot(str(stage.shots / f"{name}.png"))
    extra = os.environ.get(SHOTS_ENV)
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(stage.shots / f"{name}.png", Path(extra) / f"{name}.png")


def sign_in(driver: WebDriver, stage: Stage, project: str = "research", path: str = "/ui") -> None:
    driver.get(stage.url + path)
    field = wait_for(driver, lambda d: d.find_element(By.NAME, "key"))
    assert "/ui/login" in driver.current_url and stage.keys[project] not in driver.current_url
    field.send_keys(stage.keys[project])
    field.send_keys(Keys.ENTER)
    wait_for(driver, lambda d: "/ui/login" not in d.current_url)
    assert stage.keys[project] not in driver.current_url


def text_of(driver: WebDriver, css: str) -> str:
    return " ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, css))


def edge(driver: WebDriver, number: int) -> WebElement:
    return driver.find_element(By.CSS_SELECTOR, f'.edge[data-edge="{number}"]')


def status_is(status: str) -> Callable[[WebDriver], bool]:
    def check(driver: WebDriver) -> bool:
        shown = driver.find_elements(By.CSS_SELECTOR, "#section-summary [data-status]")
        return bool(shown) and shown[0].get_attribute("data-status") == status

    return check


def test_sign_in_list_and_the_handoff_graph_of_a_relay(page: WebDriver, stage: Stage) -> None:
    relay = stage.run(input="When are checkpoints written?")
    assert relay["status"] == "succeeded"
    page.get(f"{stage.url}/ui")
    wait_for(page, lambda d: d.find_element(By.NAME, "key"))
    check_state(page, stage, "login")
    sign_in(page, stage)
    row = wait_for(
        page, lambda d: d.find_element(By.CSS_SELECTOR, f'tr[data-task="{relay["id"]}"]')
    )
    assert row.get_attribute("data-status") == "succeeded"
    assert "researcher" in row.text and "coder" in row.text and "writer" in row.text

    row.find_element(By.CSS_SELECTOR, ".task-cell a").click()
    wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".edge[data-edge]"))
    edges = [
        (e.get_attribute("data-from"), e.get_attribute("data-to"), e.get_attribute("data-kind"))
        for e in page.find_elements(By.CSS_SELECTOR, ".edge[data-edge]")
    ]
    assert edges == [
        ("supervisor", "researcher", "route"),
        ("researcher", "coder", "direct"),
        ("supervisor", "writer", "route"),
    ]
    # Routes and direct handoffs are drawn differently.
    route_line = edge(page, 1).find_element(By.CSS_SELECTOR, ".edge-line")
    direct_line = edge(page, 2).find_element(By.CSS_SELECTOR, ".edge-line")
    assert route_line.value_of_css_property("stroke-dasharray") in ("none", "")
    assert direct_line.value_of_css_property("stroke-dasharray") not in ("none", "")
    # Clicking an edge shows its task, reason, step and tokens.
    edge(page, 2).click()
    detail = page.find_element(By.CSS_SELECTOR, '[data-edge-detail="2"]')
    assert detail.is_displayed()
    assert "a calculation is best checked by running code" in detail.text
    assert "Compute how many checkpoints" in detail.text
    assert "Step" in detail.text and "Tokens so far" in detail.text
    # The keyboard reaches the edges too.
    page.execute_script("arguments[0].focus()", edge(page, 3))
    page.switch_to.active_element.send_keys(Keys.ENTER)
    third = page.find_element(By.CSS_SELECTOR, '[data-edge-detail="3"]')
    assert third.is_displayed() and not detail.is_displayed()
    assert "the facts and the numbers are in; a report is the deliverable" in third.text
    assert edge(page, 3).get_attribute("aria-pressed") == "true"
    assert "report.md" in text_of(page, "#section-answer")
    # Traced: the root span's trace id (the one the exporter printed), with a Copy button.
    trace_id = page.find_element(By.CSS_SELECTOR, "[data-otel-trace-id]").text
    assert re.fullmatch("[0-9a-f]{32}", trace_id)
    assert f'"trace_id": "0x{trace_id}"' in (stage.home.parent / "serve.log").read_text()
    check_state(page, stage, "task")
    page.find_element(By.CSS_SELECTOR, f'button[data-copy="{trace_id}"]').click()
    copied = ("Copied", "Selected")  # Selected: where the browser offers no clipboard
    wait_for(page, lambda d: d.find_element(By.CSS_SELECTOR, "button[data-copy]").text in copied)


LARGE_TEAM = [f"Specialist{i}ForEveryKindOfQuestion" for i in range(8)]
"""Eight agents with names too long for their boxes."""


def test_a_large_teams_graph_keeps_every_box_apart_and_every_name_inside(
    page: WebDriver, stage: Stage
) -> None:
    first, last = LARGE_TEAM[0], LARGE_TEAM[-1]
    team = "\n".join(
        f'[agents.{name}]\ndescription = "answers question kind {i}"\nprompt = "Answer."\n'
        for i, name in enumerate(LARGE_TEAM)
    )
    script = {
        "supervisor": [
            {"route": {"next": first, "task": "Start", "reason": "the first kind"}},
            {"route": {"next": "FINISH", "task": "", "reason": "answered"}},
        ],
        first: [
            {"tool_calls": [{"name": f"transfer_to_{last}", "args": {"task": "Finish it",
                                                                     "reason": "the last kind"}}]}
        ],
        last: [{"content": "Answered."}],
        "finalize": [{"content": "Answered."}],
    }  # fmt: skip
    (stage.home.parent / "scripts" / "large.json").write_text(json.dumps(script))
    with stage.client() as client:
        client.push_team("large", toml=team)
    task = stage.run(input="A question for a large team", team="large", model="scripted:large.json")
    assert task["status"] == "succeeded", task
    sign_in(page, stage, path=f"/ui/tasks/{task['id']}")
    wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".edge[data-edge]"))
    # Measured as drawn: each box's left and right edge, and its name's width against it.
    nodes = page.execute_script(
        "return [...document.querySelectorAll('.node')].map(n => {"
        "  const box = n.querySelector('rect').getBBox(), text = n.querySelector('text');"
        "  const title = n.querySelector('title');"
        "  return [n.dataset.node, box.x, box.x + box.width, text.getBBox().width,"
        "          title ? title.textContent : null];"
        "});"
    )
    row = sorted((n for n in nodes if n[0] != "supervisor"), key=lambda n: n[1])
    assert [n[0] for n in row] == LARGE_TEAM
    assert all(a[2] < b[1] for a, b in pairwise(row)), row
    assert all(text_width < right - left for _, left, right, text_width, _ in nodes), nodes
    assert all(title == name for name, *_, title in row), row
    edges = [e.get_attribute("data-to") for e in page.find_elements(By.CSS_SELECTOR, ".edge")]
    assert edges == [first, last]
    check_state(page, stage, "large-team")


def test_approve_and_edit_from_the_page_without_reloading(
    page: WebDriver, stage: Stage, expected_answers: list[str]
) -> None:
    sign_in(page, stage)
    page.execute_script("window.notReloaded = true")
    # The list is open when the task is submitted: its row appears by itself.
    with stage.client() as client:
        task = client.submit("Compute the checkpoints, with approval", policy=APPROVAL_POLICY)
    wait_for(
        page,
        lambda d: d.find_elements(
            By.CSS_SELECTOR, f'tr[data-task="{task["id"]}"][data-status="interrupted"]'
        ),
    )
    assert page.execute_script("return window.notReloaded") is True

    page.get(f"{stage.url}/ui/tasks/{task['id']}")
    wait_for(page, status_is("interrupted"))
    page.execute_script("window.notReloaded = true")
    assert "waiting for you" in text_of(page, "#section-approvals")
    # Edit with arguments the tool does not take: the schema's error, in the form (the
    # server answers the post with 422).
    expected_answers.append(f"/ui/tasks/{task['id']}/approvals/")
    page.find_element(By.CSS_SELECTOR, "details.edit summary").click()
    args = page.find_element(By.CSS_SELECTOR, "textarea[name=args]")
    args.clear()
    args.send_keys('{"source": "print(1)"}')
    page.find_element(By.XPATH, "//button[contains(., 'Run with these arguments')]").click()
    error = wait_for(
        page,
        lambda d: [
            e for e in d.find_elements(By.CSS_SELECTOR, "details.edit .form-error") if e.text
        ],
    )[0]
    assert "source" in error.text and "run_python" in error.text
    assert args.get_attribute("aria-invalid") == "true"
    check_state(page, stage, "approval")
    assert text_of(page, "#section-summary [data-status]") == "interrupted"
    paused_trace = text_of(page, "[data-otel-trace-id]")

    page.find_element(By.XPATH, "//button[normalize-space()='Approve']").click()
    wait_for(page, status_is("succeeded"))
    assert page.execute_script("return window.notReloaded") is True
    decided = wait_for(page, lambda d: d.find_element(By.CSS_SELECTOR, ".decided-approve"))
    assert "approve" in decided.text and "research" in decided.text
    assert "waiting for you" not in text_of(page, "#section-approvals")
    assert not page.find_elements(By.CSS_SELECTOR, "#section-approvals form")
    assert "41 checkpoints" in text_of(page, "#section-answer")
    # The resumed run is a trace of its own; the paused run's is listed as an earlier one.
    wait_for(page, lambda d: text_of(d, "[data-otel-trace-id]") != paused_trace)
    [earlier] = page.find_elements(By.CSS_SELECTOR, "[data-trace-run]")
    assert paused_trace in earlier.get_attribute("textContent")
    # The call held for approval says so, the wait is a bar of its own in the waterfall,
    # and the team's time is the time worked, the wait shown apart.
    held = page.find_element(By.CSS_SELECTOR, '.tl-tool[data-outcome="held"]')
    assert "held for a person" in held.text
    assert page.find_elements(By.CSS_SELECTOR, '.wf-bar[data-bar="wait"] rect')
    assert "waiting for a person" in text_of(page, "#section-summary")
    check_state(page, stage, "task-approved")


def test_a_refused_tool_is_highlighted_and_counted(page: WebDriver, stage: Stage) -> None:
    task = stage.run(input="Look it up; no code", model="scripted:refusing.json")
    sign_in(page, stage)
    row = wait_for(page, lambda d: d.find_element(By.CSS_SELECTOR, f'tr[data-task="{task["id"]}"]'))
    assert row.find_element(By.CSS_SELECTOR, ".count-bad").text == "1"
    page.get(f"{stage.url}/ui/tasks/{task['id']}")
    violation = wait_for(page, lambda d: d.find_element(By.CSS_SELECTOR, ".tl-violation"))
    assert violation.get_attribute("data-violation") == "tool_not_allowed"
    assert "run_python" in violation.text
    assert violation.value_of_css_property("background-color") not in (
        "rgba(0, 0, 0, 0)",
        "transparent",
    )
    # Refused, not "error" like a tool that crashed; the rule that refused it is named,
    # and marked in the policy's text.
    refused = page.find_element(By.CSS_SELECTOR, ".tl-tool.tl-status-refused")
    assert "run_python" in refused.text and "refused" in refused.text
    rule = page.find_element(By.CSS_SELECTOR, '[data-violation-row="tool_not_allowed"]')
    assert "agents.researcher.tools" in rule.text
    rule.find_element(By.LINK_TEXT, "agents.researcher.tools").click()
    marked = page.find_element(By.CSS_SELECTOR, "mark[data-refusing]")
    assert marked.is_displayed() and marked.text.startswith("tools = ")
    check_state(page, stage, "violation")


def test_another_projects_key_cannot_see_the_task(
    page: WebDriver, stage: Stage, expected_answers: list[str]
) -> None:
    task = stage.run(input="When are checkpoints written? (research's own)")
    sign_in(page, stage, project="other")
    assert task["id"] not in page.page_source
    address = f"{stage.url}/ui/tasks/{task['id']}"
    expected_answers.append(address)  # Its 404 is the point.
    page.get(address)
    assert "Not found" in page.find_element(By.TAG_NAME, "h1").text
    assert "research's own" not in page.page_source
    check_state(page, stage, "not-found")


def test_an_eval_runs_cases_with_expected_and_actual(page: WebDriver, stage: Stage) -> None:
    sign_in(page, stage, path="/ui/evals")
    runs = wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-run]"))
    assert len(runs) == 2
    check_state(page, stage, "evals")
    runs[-1].find_element(By.TAG_NAME, "a").click()  # The first run: both cases pass.
    cases = wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, "li.case"))
    assert [c.get_attribute("data-case") for c in cases] == ["refused-tool", "relay"]
    relay = page.find_element(By.CSS_SELECTOR, 'li.case[data-case="relay"]')
    relay.find_element(By.TAG_NAME, "summary").click()
    first_agent = relay.find_element(By.CSS_SELECTOR, 'tr[data-check="first_agent"]')
    assert first_agent.find_element(By.CSS_SELECTOR, ".expected").text == "researcher"
    assert first_agent.find_element(By.CSS_SELECTOR, ".actual").text == "researcher"
    check_state(page, stage, "eval-run")
    # The later run against it: the relay case regressed, and comes first.
    page.find_element(By.LINK_TEXT, "Eval runs").click()
    wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-run]"))
    page.find_element(By.XPATH, "//button[contains(., 'Compare side by side')]").click()
    changes = wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-change]"))
    assert [(c.get_attribute("data-case"), c.get_attribute("data-change")) for c in changes] == [
        ("relay", "regressed"),
        ("refused-tool", "passing"),
    ]
    check_state(page, stage, "eval-compare")


def test_usage_per_day_as_a_chart(page: WebDriver, stage: Stage) -> None:
    stage.run(input="When are checkpoints written? (for the usage chart)")
    sign_in(page, stage, path="/ui/usage")
    bars = wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".chart rect"))
    assert bars and "writer" in text_of(page, ".legend")
    # The same figures as a table, opened from the keyboard; today's row is the last.
    table = page.find_element(By.CSS_SELECTOR, "[data-usage-days]")
    assert not table.is_displayed()
    summary = page.find_element(By.CSS_SELECTOR, ".day-table summary")
    page.execute_script("arguments[0].focus()", summary)
    page.switch_to.active_element.send_keys(Keys.ENTER)
    wait_for(page, lambda d: table.is_displayed())
    rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 14 and "writer" in table.find_element(By.TAG_NAME, "thead").text.lower()
    assert rows[-1].find_elements(By.TAG_NAME, "td")[0].text != "0"  # today's tasks
    page.execute_script("document.activeElement.blur()")
    check_state(page, stage, "usage")
    page.find_element(By.CSS_SELECTOR, "input[name=metric][value=cost]").click()
    page.find_element(By.XPATH, "//button[normalize-space()='Show']").click()
    wait_for(page, lambda d: "Cost per day" in d.page_source)


def test_sign_out_ends_the_session(page: WebDriver, stage: Stage) -> None:
    sign_in(page, stage)
    wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-task]"))
    check_state(page, stage, "tasks")  # Last: the list with every task the tests ran.
    # Readable at 1366 px: nothing is wider than the window or cut off in the list.
    overflow = page.execute_script(
        "const t = document.getElementById('task-rows');"
        "return [document.documentElement.scrollWidth, t.scrollWidth - t.clientWidth];"
    )
    assert overflow[0] <= DESKTOP[0] and overflow[1] <= 0, overflow
    page.find_element(By.XPATH, "//button[normalize-space()='Sign out']").click()
    wait_for(page, lambda d: "signed out" in d.page_source)
    page.get(f"{stage.url}/ui")
    wait_for(page, lambda d: d.find_element(By.NAME, "key"))


def test_the_accessibility_scan_reports_a_serious_violation(page: WebDriver) -> None:
    """The scan the page states go through finds what it must: text without contrast and
    a scroll area the keyboard cannot reach are serious."""
    page.get(
        "data:text/html,<!doctype html><html lang=en><title>t</title><main>"
        "<p style='color:%23aaa;background:%23fff'>faint</p>"
        "<div style='overflow:auto;width:60px;height:30px'><p style='width:400px'>wide "
        "text</p></div></main>"
    )
    found = axe_violations(page)
    assert any(v.startswith("color-contrast (serious)") for v in found), found
    assert any(v.startswith("scrollable-region-focusable") for v in found), found
