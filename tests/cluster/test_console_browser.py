"""The web console in a real browser: headless Chromium (Debian's chromium and
chromium-driver, scripts/install-chromium.sh) driven by Selenium loads the console of a live
three-node cluster, finds three members and every pchannel's owner, then sees a killed
node marked DOWN within a bound and its pchannels moved to other owners; on a cluster with
TLS and tokens it asks for a token, refuses the node role's and shows the cluster with a
reader's.

Screenshots are saved as test artefacts in $RAFTWAL_TEST_ARTIFACTS (default
build/test-artifacts/console/): console-healthy.png, console-node-down.png and
console-with-token.png.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftwal.cli import dev, devcerts
from rpc.protos import coordinator_pb2 as api
from tests.cluster.conftest import Api, running_cluster
from tests.cluster.wal_helpers import setup_channels, wait_assigned
from tests.timing import wait_for

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("RAFTWAL_TEST_ARTIFACTS", ROOT / "build" / "test-artifacts"))
NODE_TIMEOUT_MS = 2000
# From the kill to the console's row saying DOWN: the node timeout, the leader's next look,
# one console refresh and one poll, with room for a loaded machine.
DOWN_WITHIN_S = 30.0
MOVED_WITHIN_S = 60.0
LOAD_WITHIN_S = 30.0
PCHANNELS = 3
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1500,1300",
)


def chromium_paths() -> tuple[str, str]:
    browser = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    assert browser and driver, (
        "chromium and chromium-driver are missing: run scripts/install-chromium.sh"
    )
    return browser, driver


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    settings = dict(os.environ)
    settings["RAFTWAL_NODE_TIMEOUT_MS"] = str(NODE_TIMEOUT_MS)
    with running_cluster(tmp_path_factory.mktemp("console"), settings) as running:
        yield running


@pytest.fixture
def browser(tmp_path: Path):
    # Offline: Selenium must not try to download a driver or a browser.
    os.environ["SE_OFFLINE"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


# One script reads a table at once: the console replaces its rows every second, so
# elements found one by one would go stale in between.
READ_TABLE = """
const [table, key] = arguments;
return Array.from(document.querySelectorAll('#' + table + ' tbody tr[data-' + key + ']')).map(
  (tr) => ({key: tr.getAttribute('data-' + key), text: tr.innerText,
            state: tr.getAttribute('data-state') || '', owner: tr.getAttribute('data-owner') || '',
            reachable: tr.getAttribute('data-reachable') || ''}));
"""


def table_rows(driver, table: str, key: str) -> dict[str, dict[str, str]]:
    """Rows of a console table by their data-<key>, each with its data-* attributes
    (state, owner, reachable) and its text."""
    return {row["key"]: row for row in driver.execute_script(READ_TABLE, table, key)}


def screenshot(driver, name: str) -> Path:
    directory = ARTIFACTS / "console"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    # The whole page: grow the window to the document's height for the shot.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1500, max(900, min(int(height) + 40, 4000)))
    assert driver.save_screenshot(str(path)), f"no screenshot saved at {path}"
    print(f"screenshot: {path}")
    return path


def owners(client: Api) -> dict[str, str]:
    status = client.call(
        "ClusterStatus", api.ClusterStatusRequest(consistency=api.CONSISTENCY_LINEARIZABLE)
    )
    return {c.name: c.owner_node_id for c in status.pchannels}


def test_the_console_shows_the_cluster_and_a_killed_node(env, browser) -> None:
    cluster, client = env
    names = setup_channels(client, "console", {f"console_v{k}": k for k in range(PCHANNELS)})
    for name in names:
        wait_assigned(client, name)
    client.call(
        "CreateSubscription",
        api.CreateSubscriptionRequest(name="console-sub", vchannels=["console_v0"]),
    )
    ids = [n.id for n in cluster.config.nodes]
    placed = owners(client)
    # The victim owns a pchannel; the console is read from another node.
    victim = next(owner for owner in placed.values() if owner)
    viewer = next(n for n in ids if n != victim)
    port = cluster.node(viewer).metrics_port
    browser.get(f"http://127.0.0.1:{port}/console")

    members = wait_for(
        "three members in the console",
        lambda: (rows := table_rows(browser, "members", "node")) and len(rows) == 3 and rows,
        LOAD_WITHIN_S,
    )
    assert sorted(members) == sorted(ids)
    assert all(m["state"] == "UP" and m["reachable"] == "true" for m in members.values())
    shown = wait_for(
        "every pchannel with its owner in the console",
        lambda: (
            (rows := table_rows(browser, "pchannels", "pchannel"))
            and all(rows.get(n, {}).get("owner") for n in names)
            and rows
        ),
        LOAD_WITHIN_S,
    )
    assert {n: shown[n]["owner"] for n in names} == {n: placed[n] for n in names}
    freshness = browser.find_element("id", "freshness").text
    assert freshness.startswith(f"data from {viewer} at"), freshness
    assert "console-sub" in browser.find_element("id", "subscriptions").text
    screenshot(browser, "console-healthy.png")

    moved = [n for n in names if placed[n] == victim]
    cluster.kill(victim)
    killed_at = time.monotonic()
    down = wait_for(
        f"{victim} marked DOWN in the console",
        lambda: table_rows(browser, "members", "node").get(victim, {}).get("state") == "DOWN",
        DOWN_WITHIN_S,
    )
    assert down
    down_after_s = time.monotonic() - killed_at
    row = table_rows(browser, "members", "node")[victim]
    assert "DOWN" in row["text"] and row["reachable"] == "false"
    wait_for(
        f"pchannels of {victim} moved in the console",
        lambda: all(
            (row := table_rows(browser, "pchannels", "pchannel").get(n, {})).get("owner")
            not in (None, "", victim)
            and row.get("state") == "ASSIGNED"
            for n in moved
        ),
        MOVED_WITHIN_S,
    )
    print(f"{victim} shown DOWN {down_after_s:.1f} s after the kill; moved: {moved}")
    screenshot(browser, "console-node-down.png")
    cluster.start_node(victim)


def test_with_tokens_the_console_asks_for_a_read_token(
    tmp_path_factory: pytest.TempPathFactory, browser
) -> None:
    """A cluster with TLS and tokens (`dev up --secure`): the console shows no member
    without a token, refuses the node role's, and shows the cluster with a reader's."""
    from selenium.webdriver.common.by import By

    cluster = dev.up(tmp_path_factory.mktemp("console_secure"), 3, timeout_s=60, secure=True)
    try:
        assert cluster.security is not None
        # Every role's token, the node role's included (dev up writes it only to the
        # cluster's auth_tokens_file).
        tokens = dict(
            line.split(" ", 1)
            for line in (cluster.directory / devcerts.TOKENS_FILE).read_text().splitlines()
            if line.strip()
        )
        port = cluster.node(cluster.config.nodes[0].id).metrics_port
        browser.get(f"http://127.0.0.1:{port}/console")
        form = browser.find_element(By.ID, "token-form")
        wait_for("the token form", form.is_displayed, LOAD_WITHIN_S)
        assert table_rows(browser, "members", "node") == {}
        assert "no bearer token" in browser.find_element(By.ID, "token-error").text

        def use(token: str) -> None:
            field = browser.find_element(By.ID, "token")
            field.clear()
            field.send_keys(token)
            form.find_element(By.CSS_SELECTOR, "button").click()

        if "node" in tokens:
            use(tokens["node"])
            wait_for(
                "the node role refused",
                lambda: (
                    "may not read the console" in browser.find_element(By.ID, "token-error").text
                ),
                LOAD_WITHIN_S,
            )
            assert table_rows(browser, "members", "node") == {}
        use(tokens["reader"])
        members = wait_for(
            "three members with a reader's token",
            lambda: (rows := table_rows(browser, "members", "node")) and len(rows) == 3 and rows,
            LOAD_WITHIN_S,
        )
        assert sorted(members) == sorted(n.id for n in cluster.config.nodes)
        assert not form.is_displayed()
        screenshot(browser, "console-with-token.png")
    finally:
        cluster.stop_all()
