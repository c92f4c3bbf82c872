"""`trainfit report RUN_DIR`: a real tiny CPU run (plus synthetic monitor samples and events) in,
PNG plots and one self-contained report.html out; malformed run directories refused with exit 2
and nothing written."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainfit.cli.cmd_report import report
from trainfit.cli.main import main

from .conftest import GIB, append, synthetic_records

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
IMG = re.compile(r'<img class="plot" src="data:image/png;base64,([A-Za-z0-9+/=]*)" alt="([^"]*)" '
                 r'width="(\d+)" height="(\d+)">')


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _strict_json(text: str):
    def no_constant(name):
        raise AssertionError(f"{name} in --json output")

    return json.loads(text, parse_constant=no_constant)


def _fake_run(d: Path, lines: list[str] | None = None, *, summary: dict | None = None) -> Path:
    """A run directory written by hand (no training): config.yaml, metrics.jsonl, summary.json."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text("version: 1\nmethod: pretrain\n")
    if lines is None:
        lines = [json.dumps({"step": s, "loss": 6.0 - s / 10, "learning_rate": 1e-3, "tokens_per_second": 900.0 + s,
                             "step_seconds": 0.2, "time": 1_700_000_000.0 + s, "peak_rss_bytes": GIB // 2})
                 for s in range(1, 6)]
    (d / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    return d


# --------------------------------------------------------------------------------------------
def test_report_of_a_monitored_run(monitored_run):
    result = report(str(monitored_run))
    out = monitored_run / "report"
    assert result["out"] == str(out) and result["html"] == str(out / "report.html")
    assert set(result["plots"]) == {"memory", "loss", "throughput", "thermal", "events"}
    assert result["plots_left_out"] == {}
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["report.html", "memory.png", "loss.png", "throughput.png", "thermal.png", "events.png"])

    page = (out / "report.html").read_text(encoding="utf-8")
    images = IMG.findall(page)
    assert len(images) == 5
    for name, (data, alt, width, height) in zip(["memory", "loss", "throughput", "thermal", "events"], images):
        png = base64.b64decode(data, validate=True)
        assert png == (out / f"{name}.png").read_bytes()
        w, h = _png_size(png)
        assert (w, h) == (int(width), int(height))
        assert 800 <= w <= 2000 and 300 <= h <= 1500, (name, w, h)
        assert len(png) > 10_000, name  # lines, labels and a legend, not a blank canvas
        assert len(alt) > 40, name
    # Self-contained: no script, no stylesheet link, nothing fetched from anywhere.
    assert "<script" not in page and "<link" not in page
    assert not re.search(r'(src|href)="(?!data:)', page)
    # The summary, the events table (escaped) and the config.
    assert "Summary" in page and "thermal_pause" in page and "oom_recovered" in page
    assert "stopping &lt;now&gt;" in page and "<now>" not in page
    assert "method: pretrain" in page

    s = result["summary"]
    losses = [json.loads(x)["loss"] for x in (monitored_run / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in x]
    assert s["steps"]["logged"] == 6 and s["steps"]["last"] == 6 and s["finished"]
    assert s["loss"]["first"] == losses[0] and s["loss"]["last"] == losses[-1] and s["loss"]["min"] == min(losses)
    assert s["memory"]["predicted_total_bytes"] > 0 and s["memory"]["measured_peak_bytes"] > 0
    assert s["memory"]["measured_over_predicted_total"] == pytest.approx(
        s["memory"]["measured_peak_bytes"] / s["memory"]["predicted_total_bytes"])
    assert s["samples"] == 40
    assert s["thermal"]["cpu_temperature_max_c"] == pytest.approx(79.5)
    assert [g["temperature_max_c"] for g in s["thermal"]["gpus"]] == [84.0, 85.0]
    assert [g["power_max_watts"] for g in s["thermal"]["gpus"]] == [300.0, 301.0]
    assert all(g["throttled_samples"] == 13 for g in s["thermal"]["gpus"])  # gpu_idle is not a throttle
    assert s["thermal"]["cpu_throttle_events"] == 2 and s["thermal"]["battery_min_percent"] == 95.0
    synthetic = {"checkpoint": 1, "memory_leak": 1, "oom_recovered": 1, "precision_fallback": 1,
                 "signal": 1, "thermal_pause": 1, "thermal_resume": 1}
    # the run itself also notes its checkpoint cadence (train/monitor/safety.py)
    # (and what it was planned to do when it started: run_plan)
    assert {k: v for k, v in s["events"].items() if k not in ("checkpoint_cadence", "run_plan")} == synthetic


def test_a_plain_run_leaves_out_what_it_has_no_data_for(run_copy, capsys):
    code, out, err = _cli(capsys, "report", str(run_copy), "--out", str(run_copy.parent / "rep"), "--json")
    assert code == 0, err
    doc = _strict_json(out)  # exactly one JSON document, no NaN
    # (the events plot is there when the safety policies noted something, e.g. the checkpoint cadence)
    assert {"memory", "loss", "throughput"} <= set(doc["plots"]) <= {"memory", "loss", "throughput", "events"}
    assert "thermal" in doc["plots_left_out"]
    assert "no machine samples" in doc["plots_left_out"]["thermal"]
    assert doc["summary"]["thermal"]["gpus"] == []
    assert "thermal" in doc["summary"]["unavailable"]
    page = Path(doc["html"]).read_text(encoding="utf-8")
    assert len(IMG.findall(page)) == len(doc["plots"])
    assert "Temperature and power</b> left out" in page
    assert all(Path(p).is_file() for p in doc["plots"].values())
    assert not (run_copy / "report").exists()


def test_human_output_and_refusing_to_overwrite(monkeypatch, tmp_path, capsys):
    run = _fake_run(tmp_path / "run")
    code, out, err = _cli(capsys, "report", str(run))
    assert code == 0, err
    assert "wrote" in out and "report.html" in out and "tokens/s" in out
    assert "summary.json is absent" in out  # a run that has not finished is still reported
    before = _digest(run / "report")
    code, out, err = _cli(capsys, "report", str(run))
    assert code == 2 and "already holds a report" in err and "--force" in err and "Traceback" not in err
    assert _digest(run / "report") == before
    code, out, err = _cli(capsys, "report", str(run), "--force")
    assert code == 0, err
    # --force replaces an earlier report only: a folder holding anything else is never replaced.
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    code, out, err = _cli(capsys, "report", str(run), "--out", str(other), "--force")
    assert code == 2 and "not a trainfit report" in err and "notes.txt" in err
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]
    code, out, err = _cli(capsys, "report", str(run), "--out", str(run), "--force")
    assert code == 2 and (run / "metrics.jsonl").is_file()
    # A new nested directory is created; a file is refused.
    code, out, err = _cli(capsys, "report", str(run), "--out", str(tmp_path / "a" / "b" / "rep"))
    assert code == 0, err
    assert (tmp_path / "a" / "b" / "rep" / "report.html").is_file()
    code, out, err = _cli(capsys, "report", str(run), "--out", str(run / "config.yaml"))
    assert code == 2 and "is a file" in err


@pytest.mark.parametrize("case, expected", [
    ("missing", "does not exist"),
    ("file", "is a file, not a run directory"),
    ("empty", "not a trainfit run directory: config.yaml and metrics.jsonl are missing"),
    ("no-metrics", "metrics.jsonl is missing (the run has not logged a step yet)"),
    ("no-records", "holds no records yet"),
    ("bad-json", "line 2: not valid JSON"),
    ("not-object", "line 3: a JSON list, expected an object"),
    ("bad-loss", "line 2: \"loss\" must be a number or null, got \"abc\""),
    ("bad-step", "line 1: \"step\" must be a whole number"),
    ("bad-sample", "line 6: \"gpus\" must be a list of objects"),
    ("bad-gpu-field", "line 6: gpus[0]: \"temperature_c\" must be a number or null"),
    ("bad-event", "line 6: \"event\" must be a non-empty string"),
    ("no-kind", "line 6: neither a logged step"),
    ("binary", "line 6: not UTF-8 text"),
    ("bad-summary", "summary.json: not valid JSON"),
    ("summary-list", "summary.json: expected a JSON object, got a list"),
])
def test_bad_run_dirs_exit_2_and_write_nothing(tmp_path, capsys, case, expected):
    good = [json.dumps({"step": s, "loss": 5.0, "time": 1_700_000_000.0 + s}) for s in range(1, 6)]
    d = tmp_path / "run"
    if case == "missing":
        pass
    elif case == "file":
        d.write_text("x")
    elif case == "empty":
        d.mkdir()
    elif case == "no-metrics":
        d.mkdir()
        (d / "config.yaml").write_text("version: 1\n")
    elif case == "bad-summary":
        _fake_run(d, good)
        (d / "summary.json").write_text("{\"method\": ")
    elif case == "summary-list":
        _fake_run(d, good, summary=[1])  # type: ignore[arg-type]
    else:
        lines = {
            "no-records": [],
            "bad-json": [good[0], '{"step": 2, "loss": 5.0,, "time": 1}', *good[2:]],
            "not-object": [*good[:2], "[1, 2]", *good[3:]],
            "bad-loss": [good[0], json.dumps({"step": 2, "loss": "abc"}), *good[2:]],
            "bad-step": [json.dumps({"step": -1, "loss": 5.0}), *good[1:]],
            "bad-sample": [*good, json.dumps({"event": "sample", "time": 1_700_000_001.0, "gpus": {"0": {}}})],
            "bad-gpu-field": [*good, json.dumps({"event": "sample", "time": 1_700_000_001.0, "host": {},
                                                 "gpus": [{"index": 0, "temperature_c": "hot"}]})],
            "bad-event": [*good, json.dumps({"event": 7, "time": 1_700_000_001.0})],
            "no-kind": [*good, json.dumps({"loss": 5.0})],
            "binary": good,
        }[case]
        _fake_run(d, lines)
        if case == "binary":
            (d / "metrics.jsonl").write_bytes(b"".join(x.encode() + b"\n" for x in good) + b'{"event": "caf\xe9"}\n'
                                              + good[0].encode() + b"\n")
    before = _digest(tmp_path)
    code, out, err = _cli(capsys, "report", str(d), "--json")
    assert code == 2, err
    assert expected in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert out == ""
    assert _digest(tmp_path) == before and not (d / "report").exists()


def test_a_last_line_cut_short_is_skipped_with_a_note(tmp_path, capsys):
    d = _fake_run(tmp_path / "run")
    with open(d / "metrics.jsonl", "ab") as fh:
        fh.write(b'{"step": 6, "loss": 4.1, "learning_ra')  # the crash came mid-write: no newline
    code, out, err = _cli(capsys, "report", str(d), "--json")
    assert code == 0, err
    doc = _strict_json(out)
    assert doc["summary"]["steps"]["last"] == 5
    assert any("line 6 is cut short" in n for n in doc["summary"]["notes"])
    # The same line anywhere else is a broken file.
    with open(d / "metrics.jsonl", "ab") as fh:
        fh.write(b"\n" + json.dumps({"step": 7, "loss": 4.0}).encode() + b"\n")
    code, out, err = _cli(capsys, "report", str(d), "--out", str(tmp_path / "r2"))
    assert code == 2 and "line 6: not valid JSON" in err and not (tmp_path / "r2").exists()


def test_a_diverged_loss_is_reported_not_refused(tmp_path, capsys):
    lines = [json.dumps({"step": s, "loss": v, "tokens_per_second": 100.0, "time": 1_700_000_000.0 + s})
             for s, v in [(1, 6.0), (2, 5.0), (3, float("nan")), (4, float("inf"))]]
    d = _fake_run(tmp_path / "run", lines)
    code, out, err = _cli(capsys, "report", str(d), "--json")
    assert code == 0, err
    s = _strict_json(out)["summary"]
    assert s["loss"] == {"first": 6.0, "last": 5.0, "min": 5.0, "min_step": 2, "non_finite_steps": 2}
    assert any("not a finite number at 2 logged step(s), first at step 3" in n for n in s["notes"])


def test_a_run_without_summary_uses_the_logged_peaks(tmp_path):
    d = _fake_run(tmp_path / "run")
    append(d, synthetic_records(1_700_000_000.0, 1_700_000_006.0, gpus=0, n=5))
    # The record train/run_dir.trim_metrics writes on --resume, and an event without a time.
    append(d, [{"event": "resume", "from_step": 3, "dropped_records": 2, "time": 1_700_000_003.5},
               {"event": "device_lost", "step": None, "reason": "GPU 0 fell off the bus"}])
    result = report(str(d), out=str(tmp_path / "rep"))
    page = Path(result["html"]).read_text(encoding="utf-8")
    assert "resumed from the checkpoint of step 3; 2 later records dropped" in page
    assert "GPU 0 fell off the bus" in page and "device_lost ×1" in page
    s = result["summary"]
    assert not s["finished"] and s["memory"]["measured_peak_bytes"] == GIB // 2
    assert s["memory"]["measured_peak_kind"] == "peak_rss" and s["memory"]["predicted_total_bytes"] is None
    assert s["memory"]["predicted_total_bytes"] is None and "memory.predicted_total_bytes" in s["unavailable"]
    assert s["thermal"]["gpus"] == [] and s["thermal"]["cpu_temperature_max_c"] == 62.0
    assert set(result["plots"]) == {"memory", "loss", "throughput", "thermal", "events"}


def test_missing_matplotlib_is_exit_4_naming_the_extra(tmp_path, capsys, monkeypatch):
    d = _fake_run(tmp_path / "run")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    code, out, err = _cli(capsys, "report", str(d))
    assert code == 4 and "trainfit[report]" in err and "Traceback" not in err
    assert not (d / "report").exists()


def test_a_refused_report_imports_no_plotting_or_training_library(tmp_path):
    code = ("import sys; from trainfit.cli.main import main; rc = main(['report', sys.argv[1]]); "
            "heavy = [m for m in ('matplotlib', 'numpy', 'torch') if m in sys.modules]; print(rc, heavy)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "missing")], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split() == ["2", "[]"], done.stdout + done.stderr
    assert "does not exist" in done.stderr and "Traceback" not in done.stderr


# --------------------------------------------------------------------------------------------
BROWSERS = ("chromium", "chromium-browser")
# Added to a copy of the page: after load, write what the browser made of each plot into the DOM.
_PROBE = """<script>
window.addEventListener("load", function () {
  for (const img of document.querySelectorAll("img.plot")) {
    const box = img.getBoundingClientRect(), style = getComputedStyle(img);
    img.setAttribute("data-natural", img.naturalWidth + "x" + img.naturalHeight);
    img.setAttribute("data-shown", (img.complete && style.display !== "none" && style.visibility !== "hidden"
                                    && box.width > 100 && box.height > 50) ? "yes" : "no");
  }
  document.body.setAttribute("data-probed", document.querySelectorAll("img.plot").length);
});
</script></body>"""


def _browser() -> str | None:
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


@pytest.mark.skipif(_browser() is None, reason="no chromium or chromium-browser binary on PATH (Debian: apt-get "
                                                  "install chromium); the report's page is checked without a browser")
def test_the_page_shows_every_plot_in_a_headless_browser(monitored_run, tmp_path):
    """Chromium loads report.html from disk with no network: each plot decodes (naturalWidth > 0)
    and is displayed at a real size; a screenshot of the page is not blank."""
    result = report(str(monitored_run), out=str(tmp_path / "rep"))
    page = Path(result["html"]).read_text(encoding="utf-8")
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", _PROBE), encoding="utf-8")
    flags = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,900"]
    done = subprocess.run([*flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert 'data-probed="5"' in dom, dom[:500]
    natural = re.findall(r'data-natural="(\d+)x(\d+)"', dom)
    shown = re.findall(r'data-shown="(\w+)"', dom)
    expected = [(str(p_w), str(p_h)) for p_w, p_h in
                (_png_size(Path(p).read_bytes()) for p in result["plots"].values())]
    assert natural == expected and all(int(w) > 0 for w, _ in natural)
    assert shown == ["yes"] * 5

    shot = tmp_path / "shot.png"
    done = subprocess.run([*flags, f"--screenshot={shot}", Path(result["html"]).as_uri()], capture_output=True,
                          text=True, timeout=90)
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    from PIL import Image

    with Image.open(shot) as im:
        colors = im.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 50  # text and plot lines, not a blank or single-colour page
    white = max(count for count, _ in colors) / sum(count for count, _ in colors)
    assert white < 0.97, f"the page looks empty: {white:.1%} one colour"
