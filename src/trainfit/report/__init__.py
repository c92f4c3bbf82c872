"""`trainfit report RUN_DIR`: read a run directory written by `trainfit train` and write a
report of it: a summary, PNG plots (matplotlib, the `report` extra) and one self-contained
report.html.

    run_data.py   load and check the run dir (config.yaml, summary.json, metrics.jsonl)
    summary.py    the figures (pure)
    plots.py      the PNG plots, each left out with a reason when its data is absent
    html_page.py  report.html

The output directory (default RUN_DIR/report) is written whole into a temporary sibling and
renamed into place (trainfit.files.atomic_dir), so it holds a complete report or nothing new. An
existing one is replaced only with force=True, and only when it holds nothing but a report's own
files: `--out ~/Documents --force` can never delete a folder of the user's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainfit.errors import BadInputError

REPORT_HTML = "report.html"


def report_files() -> frozenset[str]:
    """The names a report directory holds."""
    from trainfit.report.plots import PLOT_NAMES

    return frozenset({REPORT_HTML, *(f"{name}.png" for name in PLOT_NAMES)})


def check_out_dir(out: Path, *, force: bool, flag: str = "--out") -> None:
    """BadInputError unless the report may be written to `out` (see the module doc)."""
    if not out.exists():
        return
    try:
        entries = sorted(os.listdir(out))
    except OSError as exc:
        raise BadInputError(f"{flag}: {out} cannot be read: {exc.strerror or exc}") from None
    foreign = [e for e in entries if e not in report_files()]
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise BadInputError(f"{flag}: {out} holds files that are not a trainfit report ({shown}); nothing was written",
                            hint="choose a new or empty directory; --force replaces only an earlier report")
    if entries and not force:
        raise BadInputError(f"{flag}: {out} already holds a report",
                            hint="pass --force to replace it, or choose another --out")


def make_report(run_dir: str | os.PathLike, out: str | os.PathLike | None = None, *, force: bool = False,
                generated_by: str | None = None) -> dict[str, Any]:
    """Write the report; returns {"run_dir", "out", "html", "plots": {name: path}, "plots_left_out":
    {name: reason}, "summary"}. Every input is checked before anything is written."""
    from trainfit.errors import require_extra
    from trainfit.report.run_data import check_run_dir, load_run
    from trainfit.validate import output_dir

    run_path = check_run_dir(run_dir)
    flag = "--out" if out is not None else "--out (default RUN_DIR/report)"
    out_path = output_dir(out if out is not None else run_path / "report", flag)
    check_out_dir(out_path, force=force, flag=flag)
    require_extra("matplotlib", "report")

    from trainfit.report.html_page import render_html
    from trainfit.report.plots import render_plots
    from trainfit.report.summary import summarize

    run = load_run(run_path)
    summary = summarize(run)
    plots, left_out = render_plots(run, summary)
    if generated_by is None:
        from trainfit import __version__

        generated_by = f"trainfit {__version__}"
    page = render_html(run, summary, plots, left_out, generated_by=generated_by)
    files = {REPORT_HTML: page.encode("utf-8"), **{f"{p.name}.png": p.png for p in plots}}
    _write_dir(out_path, files, flag)
    return {
        "run_dir": str(run_path),
        "out": str(out_path),
        "html": str(out_path / REPORT_HTML),
        "plots": {p.name: str(out_path / f"{p.name}.png") for p in plots},
        "plots_left_out": left_out,
        "summary": summary,
    }


def _write_dir(out: Path, files: dict[str, bytes], flag: str) -> None:
    """Write `files` as the directory `out`, atomically (parents created as needed, and removed
    again when the write fails)."""
    from trainfit.files import atomic_dir, clean_stale_dirs, write_error

    created = []
    p = out.parent
    while not p.exists() and p != p.parent:
        created.append(p)
        p = p.parent
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_dirs(out.parent, [out.name])  # what an interrupted report left
        with atomic_dir(out, replace=out.exists()) as tmp:
            for name, data in files.items():
                (tmp / name).write_bytes(data)
    except FileExistsError:
        _remove_empty(created)
        raise BadInputError(f"{flag}: {out} was created by someone else while the report was written; "
                            "nothing was written") from None
    except OSError as exc:
        _remove_empty(created)
        raise write_error(out, exc) from None
    except BaseException:
        _remove_empty(created)
        raise


def _remove_empty(created: list[Path]) -> None:
    for d in created:  # deepest first
        try:
            d.rmdir()
        except OSError:
            break
