"""Shared test fixtures (kept small: each test module builds what it needs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml


@pytest.fixture
def write_doc(tmp_path: Path) -> Callable[[str, Any], Path]:
    """``write_doc("c.yaml", doc)`` writes ``doc`` as YAML or JSON (by suffix), or a str verbatim."""

    def write(name: str, doc: Any) -> Path:
        path = tmp_path / name
        if isinstance(doc, str):
            path.write_text(doc)
        elif path.suffix == ".json":
            path.write_text(json.dumps(doc))
        else:
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    return write
