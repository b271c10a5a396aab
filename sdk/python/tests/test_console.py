"""The web console (`/ui/`) in a real browser: Debian's headless Chromium, driven by
Selenium through Debian's chromedriver, against a daemon holding a parent sandbox, 10
children forked from it, a branch and a 3-link diff chain. The page must draw every
node and edge of that tree, and its terminal must run what is typed into it.

The browser may reach nothing but the daemon: every host name resolves to nothing and
any other address goes to a dead proxy, so a page that loaded a script, a font or a
style from elsewhere would fail here. A screenshot is kept as the run's artifact
(`$FORKVM_ARTIFACTS`, default `<repo>/target/artifacts/`: `console-lineage.png`, the tree;
`console.png`, the page at the end, its terminal).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List, Set, Tuple

import pytest

from daemon_proc import FORKVM_BIN, REPO, Daemon, serving

from forkvm import Controller

TEMPLATE_TIMEOUT_S = 900
TOKEN = "console+test/token=0123456789abcdef"  # base64 characters, raw in the fragment
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
REQUIRED = os.environ.get("FORKVM_SDK_REQUIRE_DAEMON") == "1"


def _missing() -> List[str]:
    out = [p for p in (FORKVM_BIN, CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        out.append("the selenium package")
    return out


if REQUIRED and _missing():
    raise RuntimeError(f"FORKVM_SDK_REQUIRE_DAEMON=1 but missing: {_missing()} (.ci/run installs them)")

pytestmark = pytest.mark.skipif(bool(_missing()), reason=f"missing: {_missing()}")


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """`check()`'s first truthy value, polled; fails naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as e:  # a stale element while the page redraws: try again
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with serving(
        ["--bind", "127.0.0.1:0", "--token-file", "{root}/token"],
        wait_for=("forkvmd listening on unix:", "forkvmd console on http://"),
        files={"token": TOKEN + "\n"},
    ) as d:
        yield d


@pytest.fixture(scope="module")
def console_url(daemon: Daemon) -> str:
    line = daemon.line_with("forkvmd console on ")
    assert line is not None
    return line.split("forkvmd console on ", 1)[1].strip()


@pytest.fixture(scope="module")
def ctl(daemon: Daemon) -> Iterator[Controller]:
    with Controller(daemon.url, timeout=300) as c:
        yield c


Edge = Tuple[str, str, str]


@pytest.fixture(scope="module")
def tree(ctl: Controller) -> Tuple[Set[str], Set[Edge], str]:
    """Builds the tree: `py` → parent → 10 forks; parent → branch `snap`; a chain
    py → d1 → d2 → d3 (each a diff branch of a sandbox spawned from the link before).
    Returns the node ids, the edges, and the parent's id."""
    ctl.create_snapshot("py", "python", timeout=TEMPLATE_TIMEOUT_S)
    parent = ctl.spawn_sandboxes("py")[0].id
    children = [c.id for c in ctl.fork_sandbox(parent, n=10)]
    assert len(children) == 10
    ctl.branch_sandbox(parent, tag="snap", mode="live")
    ctl.branch_sandbox(parent, tag="d1", mode="diff", parent_tag="py")
    s2 = ctl.spawn_sandboxes("d1")[0].id
    ctl.branch_sandbox(s2, tag="d2", mode="diff", parent_tag="d1")
    s3 = ctl.spawn_sandboxes("d2")[0].id
    ctl.branch_sandbox(s3, tag="d3", mode="diff", parent_tag="d2")
    assert ctl.snapshot_info("d3").chain_depth == 3
    sb = lambda i: f"sandbox:{i}"  # noqa: E731
    sn = lambda t: f"snapshot:{t}"  # noqa: E731
    nodes = {sb(i) for i in [parent, s2, s3, *children]} | {sn(t) for t in ["py", "snap", "d1", "d2", "d3"]}
    edges: Set[Edge] = {(sb(parent), sb(c), "fork") for c in children}
    edges |= {
        (sn("py"), sb(parent), "spawn"),
        (sb(parent), sn("snap"), "branch"),
        (sb(parent), sn("d1"), "branch"),
        (sn("py"), sn("d1"), "chain"),
        (sn("d1"), sb(s2), "spawn"),
        (sb(s2), sn("d2"), "branch"),
        (sn("d1"), sn("d2"), "chain"),
        (sn("d2"), sb(s3), "spawn"),
        (sb(s3), sn("d3"), "branch"),
        (sn("d2"), sn("d3"), "chain"),
    }
    return nodes, edges, parent


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in [
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1600,1100",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        # Nothing but the daemon: no name resolves, and every address but loopback (which
        # Chromium never proxies) meets a dead proxy.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--proxy-server=http://127.0.0.1:9",
    ]:
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def artifact_path(name: str) -> Path:
    d = Path(os.environ.get("FORKVM_ARTIFACTS") or REPO / "target" / "artifacts")
    d.mkdir(parents=True, exist_ok=True)
    return d / name


def test_the_console_draws_the_tree_and_its_terminal_runs_a_command(
    browser: Any, console_url: str, tree: Tuple[Set[str], Set[Edge], str], ctl: Controller
) -> None:
    from selenium.webdriver.common.by import By

    nodes, edges, parent = tree
    browser.get(console_url + "#token=" + TOKEN)
    try:
        drawn_nodes = lambda: {e.get_attribute("data-node") for e in browser.find_elements(By.CSS_SELECTOR, "#lineage g.node")}  # noqa: E731

        def drawn_edges() -> Set[Edge]:
            found = browser.find_elements(By.CSS_SELECTOR, "#lineage path.edge")
            return {(e.get_attribute("data-from"), e.get_attribute("data-to"), e.get_attribute("data-kind")) for e in found}

        wait_until("every node drawn", lambda: nodes <= drawn_nodes())
        assert drawn_nodes() == nodes, "exactly the daemon's sandboxes and snapshots"
        wait_until("every edge drawn", lambda: edges <= drawn_edges())
        assert drawn_edges() == edges, f"extra edges: {drawn_edges() - edges}"
        assert "#token" not in browser.current_url, "the token is taken out of the address"
        shot = artifact_path("console-lineage.png")
        browser.save_screenshot(str(shot))
        print(f"console screenshot: {shot}")

        rows = {r.get_attribute("data-sandbox-id") for r in browser.find_elements(By.CSS_SELECTOR, "#sandboxes tr[data-sandbox-id]")}
        assert {n.split(":", 1)[1] for n in nodes if n.startswith("sandbox:")} == rows
        tags = {r.get_attribute("data-snapshot-tag") for r in browser.find_elements(By.CSS_SELECTOR, "#snapshots tr[data-snapshot-tag]")}
        assert tags == {"py", "snap", "d1", "d2", "d3"}

        # The terminal: open one on the parent, type a command, see its output.
        browser.find_element(By.CSS_SELECTOR, f'#sandboxes tr[data-sandbox-id="{parent}"]').click()
        wait_until("the parent selected", lambda: browser.find_element(By.ID, "detail").get_attribute("data-sandbox-id") == parent)
        browser.find_element(By.ID, "open-terminal").click()
        screen = lambda: browser.find_element(By.CSS_SELECTOR, "#terminal .xterm-rows").get_attribute("textContent")  # noqa: E731
        term = browser.find_element(By.ID, "terminal")
        browser.execute_script("arguments[0].scrollIntoView()", term)
        try:
            wait_until("a shell prompt", lambda: "#" in screen() or "$" in screen(), timeout=90)
        except AssertionError:
            procs = [(p.pid, p.argv, p.output_end, p.running) for p in ctl.list_processes(parent)]
            raise AssertionError(f"no prompt: terminal {term.get_attribute('data-state')}, screen {screen()!r}, processes {procs}")
        browser.find_element(By.CSS_SELECTOR, "#terminal .xterm-helper-textarea").send_keys("echo forkvm-$((6*7))\n")
        wait_until("the command's output", lambda: "forkvm-42" in screen(), timeout=90)
        procs = [p for p in ctl.list_processes(parent) if p.tag == "web-console"]
        assert procs and procs[0].pty is not None, "the terminal is a process on a pty, tagged by the console"

        # Actions: fork one more child from the page, then kill it (two clicks).
        fork_n = browser.find_element(By.ID, "fork-n")
        fork_n.clear()
        fork_n.send_keys("1")
        browser.find_element(By.ID, "fork").click()
        wait_until("the fork reported", lambda: "forked" in browser.find_element(By.ID, "status").text, timeout=120)
        kids = {i for i in (sb.id for sb in ctl.list_sandboxes()) if f"sandbox:{i}" not in nodes}
        assert len(kids) == 1, kids
        [kid] = kids
        wait_until("the new child drawn", lambda: (f"sandbox:{parent}", f"sandbox:{kid}", "fork") in drawn_edges())
        row = f'#sandboxes tr[data-sandbox-id="{kid}"]'
        wait_until("the new child listed", lambda: browser.find_elements(By.CSS_SELECTOR, row))
        browser.find_element(By.CSS_SELECTOR, row).click()
        wait_until("the child selected", lambda: browser.find_element(By.ID, "detail").get_attribute("data-sandbox-id") == kid)
        browser.find_element(By.ID, "kill").click()
        assert kid in {sb.id for sb in ctl.list_sandboxes()}, "one click does not kill"
        browser.find_element(By.ID, "kill").click()
        wait_until("the child killed", lambda: kid not in {sb.id for sb in ctl.list_sandboxes()}, timeout=60)
        wait_until("the child gone from the graph", lambda: f"sandbox:{kid}" not in drawn_nodes())

        # Nothing but the daemon was asked for anything; nothing was refused.
        origin = console_url.split("/ui/", 1)[0]
        urls = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert urls and all(u.startswith(origin) for u in urls), urls
        # The killed child's own calls may fail as it goes (its panel was open): those
        # are 404s naming it; nothing else may fail.
        logged = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
        severe = [e for e in logged if not (kid in e.get("message", "") and "status of 404" in e.get("message", ""))]
        assert not severe, f"the page logged errors: {severe}"
    finally:
        shot = artifact_path("console.png")
        browser.save_screenshot(str(shot))
        print(f"console screenshot: {shot}")


def test_the_console_is_refused_to_other_origins_and_off_in_forkd_compat(console_url: str) -> None:
    import urllib.error
    import urllib.request

    origin = console_url.split("/ui/", 1)[0]
    with urllib.request.urlopen(console_url, timeout=30) as r:
        assert r.headers["Content-Security-Policy"].startswith("default-src 'self'")
        assert b"app.js" in r.read()
    req = urllib.request.Request(origin + "/v1/lineage", headers={"Authorization": f"Bearer {TOKEN}", "Origin": "http://evil.example"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 403
    req = urllib.request.Request(origin + "/v1/lineage", headers={"Origin": origin})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 401, "same origin still needs the token"
