"""``store``: add a sweep to ``benchmarks/stored/`` (append-only), list what is stored, verify it.

A stored sweep is one gzipped JSON file, ``sweeps/<name>.json.gz``, holding the sweep's own document
(``runs.json`` of ``sweep run``, or the grid's JSON) and the YAML of every cluster it planned, plus an entry
in ``MANIFEST.json``: what command produced it, the commit, the date, its sha256 and case count. A stored
file is never rewritten: ``add`` refuses a name that exists, and every read checks the sha256. ``add`` of a
``sweep recheck`` result stores it under ``rechecks/``: the baselines' plans it found count as those sweeps'
runs in every later report and replay (``common.stored_rechecks``).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import common


def _is_recheck(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("benchmark") == "sweep-recheck"
    except (OSError, ValueError, AttributeError):
        return False


def add(a) -> None:
    path = Path(a.path)
    if path.suffix == ".json" and path.exists() and _is_recheck(path):
        dest = common.store_recheck(path, a.name)
        common.console.print(f"stored {path} as {dest} (a recheck: its baselines' plans count in every report and "
                             "replay of the sweeps it names)", highlight=False)
        return
    (sweep,) = common.load_sweeps([a.path])
    command = a.command or sweep.doc.get("command") or ""
    commit = a.commit or sweep.doc.get("commit") or ""
    date = a.date or sweep.doc.get("date") or common.today()
    if not command:
        common.fail(f"{a.path}: the sweep does not say which command produced it: pass --command")
    path = common.store_sweep(sweep, a.name, command, commit, date, a.note)
    common.console.print(f"stored {sweep.source} as {path} ({path.stat().st_size:,} bytes)",
                         highlight=False)


def list_(a) -> None:
    rows = [{"name": e["name"], "kind": e["kind"], "cases": e["cases"], "commit": e["commit"], "date": e["date"]}
            for e in common.read_manifest()["sweeps"]]
    common.print_table(f"stored sweeps ({common.MANIFEST})", rows)


def verify(a) -> None:
    """Read every stored sweep (the loader checks each file's sha256) and count its cases."""
    sweeps = common.load_sweeps(common.stored_names())
    for s in sweeps:
        if s.kind == "robustness":
            missing = {c["name"] for c in s.cases} - set(s.clusters)
            if missing:
                common.fail(f"{s.name}: clusters missing for {sorted(missing)[:5]}")
    print(f"{len(sweeps)} stored sweeps, every file as its manifest entry says")
