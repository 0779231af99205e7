"""How long ``torchcomms-trace view``'s page takes to become usable in headless Chromium.

    python3 benchmarks/diagnostics/trace_page_timing.py /tmp/tr1024.html

Prints the page size, its lanes and bars, the seconds from navigation to the page's ``ready``
mark (data parsed, every bar laid out), and the seconds a zoom-in click and a reset take (each
re-lays out every bar). Needs chromium, chromedriver and selenium (``scripts/setup.sh``).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page")
    args = parser.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        print("needs chromium and chromedriver", file=sys.stderr)
        return 2
    page = Path(args.page).resolve()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    with tempfile.TemporaryDirectory(prefix="tc-chromium-") as profile:
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--no-first-run", f"--user-data-dir={profile}", "--window-size=1400,900"):
            opts.add_argument(flag)
        drv = webdriver.Chrome(service=Service(driver), options=opts)
        try:
            drv.set_page_load_timeout(600)
            start = time.monotonic()
            drv.get(page.as_uri())
            WebDriverWait(drv, 600).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
            ready = time.monotonic() - start
            lanes = drv.execute_script("return document.querySelectorAll('.lane').length")
            bars = drv.execute_script("return document.querySelectorAll('.op').length")
            timings = []
            for button in ("zoom-in", "zoom-reset"):
                t = time.monotonic()
                drv.find_element(By.ID, button).click()
                drv.execute_script("return document.body.offsetHeight")  # wait for the layout
                timings.append(time.monotonic() - t)
        finally:
            drv.quit()
    print(f"{page.name}: {page.stat().st_size / 2**20:.1f} MiB, {lanes} lanes, {bars} bars; ready after {ready:.2f} s; "
          f"zoom in {timings[0]:.2f} s, reset {timings[1]:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
