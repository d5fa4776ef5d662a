"""The report page in a real browser (headless Chromium): it loads nothing and logs no error,
every section draws, every number it shows is the one in ``--json``, text from the stores is
text (a crafted id cannot add an element), and it draws with JavaScript off too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from browser import chromium, need_browser, page_screenshot
from helpers import cli, report_run

import tokentape
from tokentape._src.program import main

SECTIONS = ("identity", "timeline", "mixture", "repetition", "loss", "commands")
HOSTILE = '<img src=x onerror="document.title=1"></td><script>document.title=2</script>'


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    need_browser()
    root = tmp_path_factory.mktemp("report_page")
    report_run(root)
    out = root / "report.html"
    assert main(["report", str(root), "--out", str(out)]) == 0
    data = tokentape.report(root / "steps.jsonl", root / "plan.json", loss_log=root / "loss.jsonl")
    return out, json.loads(json.dumps(data))


def _at(data, path: str):
    for part in path.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def _requests(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_the_page_draws_every_section_and_matches_the_json(page, tmp_path):
    out, data = page
    with chromium() as driver:
        driver.get(out.as_uri())
        found = driver.execute_script(
            "return [...document.querySelectorAll('[data-path]')]"
            ".map(e => [e.dataset.path, e.dataset.value, e.textContent])"
        )
        charts = driver.execute_script(
            "const c = {}; for (const s of document.querySelectorAll('svg[data-chart]')) {"
            " const r = s.getBoundingClientRect();"
            " c[s.dataset.chart] = {w: r.width, h: r.height,"
            "  polylines: s.querySelectorAll('polyline.series').length,"
            "  passes: s.querySelectorAll('rect.passes').length,"
            "  spikes: s.querySelectorAll('circle.spike').length,"
            "  events: s.querySelectorAll('line.event').length,"
            "  shapes: s.querySelectorAll('rect.shape').length}} return c;"
        )
        sections = {s: driver.execute_script(f"return !!document.getElementById('{s}')")
                    for s in SECTIONS}  # fmt: skip
        scripts = driver.execute_script("return document.scripts.length")
        console = driver.get_log("browser")
        requests = _requests(driver)
        page_screenshot(driver, tmp_path / "report.png")
    assert all(sections.values()), sections
    assert scripts == 0
    assert [e for e in console if e["level"] in ("SEVERE", "WARNING")] == []
    assert set(requests) <= {out.as_uri()}, requests  # the page itself, nothing else
    # every number shown is the JSON's, at the place it names
    assert len(found) > 50
    for path, value, text in found:
        assert json.loads(value) == _at(data, path), path
        assert text.strip(), path
    n = len(data["identity"]["sources"])
    assert set(charts) == {"timeline", "progress", "mixture", "repetition", "loss"}
    assert all(c["w"] > 100 and c["h"] > 50 for c in charts.values()), charts
    assert charts["mixture"]["polylines"] == 2 * n  # realised and planned per source
    assert charts["repetition"]["passes"] == 2 * n  # so far and at the horizon
    assert charts["loss"]["spikes"] == len(data["loss"]["spikes"]) == 1
    assert charts["loss"]["polylines"] == 1 + len(data["loss"]["by_source"])
    assert charts["timeline"]["events"] == len(data["timeline"]["events"]) - 1  # not "start"
    assert charts["timeline"]["shapes"] == len(data["timeline"]["shapes"])
    png = (tmp_path / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_the_charts_draw_with_javascript_off(page, tmp_path):
    out, _ = page
    with chromium(scripts=False) as driver:
        driver.get(out.as_uri())
        charts = driver.find_elements("css selector", "svg[data-chart]")
        sizes = [(c.size["width"], c.size["height"]) for c in charts]
        driver.save_screenshot(str(tmp_path / "no-js.png"))
    assert len(sizes) == 5 and all(w > 100 and h > 50 for w, h in sizes), sizes


def test_a_crafted_id_stays_text(tmp_path, capsys):
    need_browser()
    rows = [{"id": HOSTILE if i % 2 else f"rec-{i}", "text": "spam line " * (40 + i)}
            for i in range(40)]  # fmt: skip
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokentape.tokenize(tmp_path / "in.jsonl", tmp_path / "store")
    plan = tokentape.Plan.build({"web": {"path": str(tmp_path / "store"), "weight": 1,
                                         "max_repeats": 100}},
                                seq_len=16, seed=5, total_samples=400)  # fmt: skip
    plan.save(tmp_path / "plan.json")
    with tokentape.Loader(plan, 0, tokentape.BatchConfig(1, 4),
                          step_log=tmp_path / "steps.jsonl") as loader:  # fmt: skip
        for _ in range(6):
            loader.step()
            loader.commit()
    out = tmp_path / "report.html"
    code, _, err = cli(capsys, "report", tmp_path, "--out", out)
    assert code == 0, err
    with chromium() as driver:
        driver.get(out.as_uri())
        title = driver.title
        images = driver.execute_script("return document.images.length")
        scripts = driver.execute_script("return document.scripts.length")
        shown = driver.execute_script("return document.body.textContent")
        requests = _requests(driver)
    assert images == 0 and scripts == 0 and title.startswith("tokentape report")
    assert HOSTILE in shown  # the id, as text
    assert set(requests) <= {out.as_uri()}, requests


def test_the_demo_screenshot_in_the_docs_is_a_png():
    shot = Path(__file__).resolve().parents[2] / "docs" / "report.png"
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and 50_000 < len(data) < 3_000_000
