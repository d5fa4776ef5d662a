"""Draw a report page into a PNG with headless Chromium: ``python tests/tools/report_screenshot.py
demo-out/report.html docs/report.png`` (how docs/report.png is made)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the browser helper

from browser import chromium, page_screenshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("png", type=Path)
    args = parser.parse_args(argv)
    with chromium() as driver:
        driver.get(args.page.resolve().as_uri())
        page_screenshot(driver, args.png)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
