"""Headless Chromium, driven by selenium: the browser the report page is tested in.

Debian's ``chromium`` and ``chromium-driver`` packages and selenium from PyPI; `.ci/run`
installs what is missing and sets ``TOKENTAPE_REQUIRE_BROWSER=1``, which turns their absence
into a failure instead of a skip. Nothing here reaches the network: the page is a local file
and the browser is told to use no proxy and no background services.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = "chromedriver"


def _found() -> tuple[str, str] | None:
    browser = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    driver = shutil.which(DRIVER)
    return (browser, driver) if browser and driver else None


def need_browser() -> tuple[str, str]:
    """Chromium and its driver, or a skip (a failure where CI requires them)."""
    required = os.environ.get("TOKENTAPE_REQUIRE_BROWSER") == "1"
    try:
        import selenium  # noqa: F401
    except ImportError:
        if required:
            pytest.fail("selenium is not installed (TOKENTAPE_REQUIRE_BROWSER=1)")
        pytest.skip("selenium is not installed")
    found = _found()
    if found is None:
        if required:
            pytest.fail("chromium and chromedriver are not installed (TOKENTAPE_REQUIRE_BROWSER=1)")
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium "
                    "chromium-driver)")  # fmt: skip
    return found


@contextmanager
def chromium(scripts: bool = True, width: int = 1040, height: int = 1200) -> Iterator[Any]:
    """A headless Chromium whose console and network events can be read back
    (``driver.get_log("browser")``, ``driver.get_log("performance")``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = need_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--no-proxy-server",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--disable-extensions"):  # fmt: skip
        options.add_argument(arg)
    if not scripts:
        options.add_argument("--blink-settings=scriptEnabled=false")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def page_screenshot(driver: Any, out: Path) -> None:
    """The whole page as a PNG (the window grown to the page's height first)."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1040, int(height) + 120)
    driver.save_screenshot(str(out))
