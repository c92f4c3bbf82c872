"""Writing a benchmark's results: `<name>.json` (the figures) and `<name>.md` (the report) side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_results(out_dir: Path, name: str, doc: dict[str, Any], markdown: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out_dir / f"{name}.md").write_text(markdown)
