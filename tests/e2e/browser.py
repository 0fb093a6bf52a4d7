"""Debian's headless Chromium driven by selenium through Debian's chromedriver (nothing downloaded):
opens pages of a running ``dagster dev``, waits for their text, counts elements and keeps a screenshot
of every page it checked."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


class Browser:
    def __init__(self, base_url: str, screenshots: Path) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service

        if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
            pytest.fail("the browser test needs Debian's chromium and chromium-driver: apt-get install -y chromium "
                        "chromium-driver (scripts/test.sh installs them)")
        options = Options()
        options.binary_location = str(CHROMIUM)
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1200"):
            options.add_argument(arg)
        self.base_url = base_url
        self.screenshots = screenshots
        screenshots.mkdir(parents=True, exist_ok=True)
        self.driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)

    def open(self, path: str, expect: str, shot: str, timeout: float = 60) -> str:
        """The page's text once it shows ``expect`` (Dagster's welcome dialog dismissed); screenshot ``shot``."""
        self.driver.get(self.base_url + path)
        text = self.wait_text(expect, timeout)
        self.shot(shot)
        return text

    def wait_text(self, expect: str, timeout: float = 60) -> str:
        from selenium.webdriver.common.by import By

        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            self._dismiss_welcome()
            text = self.driver.find_element(By.TAG_NAME, "body").text
            if expect in text:
                return text
            time.sleep(0.5)
        self.shot("timeout")
        pytest.fail(f"{self.driver.current_url} never showed {expect!r}; it showed:\n{text[:2000]}")

    def count(self, css: str, at_least: int, timeout: float = 30) -> int:
        """How many elements match ``css``, once at least ``at_least`` do (or at the timeout)."""
        from selenium.webdriver.common.by import By

        deadline = time.monotonic() + timeout
        found = 0
        while time.monotonic() < deadline:
            found = len(self.driver.find_elements(By.CSS_SELECTOR, css))
            if found >= at_least:
                break
            time.sleep(0.5)
        return found

    def click(self, label: str, timeout: float = 30) -> None:
        """Click the button ``label`` once nothing covers it."""
        from selenium.common.exceptions import ElementClickInterceptedException
        from selenium.webdriver.common.by import By

        deadline = time.monotonic() + timeout
        while True:
            self._dismiss_welcome()
            try:
                self.driver.find_element(By.XPATH, f"//button[normalize-space()='{label}']").click()
                return
            except ElementClickInterceptedException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _dismiss_welcome(self) -> None:
        """"Join the Dagster community" covers the page of a fresh instance, a moment after it loads."""
        from selenium.webdriver.common.by import By

        for skip in self.driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):
            skip.click()

    def shot(self, name: str) -> Path:
        time.sleep(1.5)  # the welcome dialog comes a moment after a page loads: not in the picture
        self._dismiss_welcome()
        path = self.screenshots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def close(self) -> None:
        self.driver.quit()
