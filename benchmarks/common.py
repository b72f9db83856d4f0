"""What every benchmark subcommand shares: thread settings, provenance, the result writer and table
printer, the ONE loader of stored sweeps (``benchmarks/stored/``, append-only) and the problem generators.

Subcommand modules import this module and nothing of each other.
"""

from __future__ import annotations

import os

THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
for _var in THREAD_VARS:  # as the CLI does: tiny matrices, threads only add contention
    os.environ.setdefault(_var, "1")

# the rest after the thread settings, before numpy is imported anywhere
import csv
import datetime
import gzip
import hashlib
import json
import math
import platform
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
STORED = Path(os.environ.get("BENCHMARKS_STORED") or ROOT / "benchmarks" / "stored")  # the env: tests' fixtures
SWEEPS = STORED / "sweeps"
MANIFEST = STORED / "MANIFEST.json"
RESULTS = Path("results")
RESULT_FORMAT = "arachne-bench-result/1"
STORED_FORMAT = "arachne-bench-sweep/1"

console = Console(stderr=True)  # tables and progress on stderr; rich folds wide tables to the terminal


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


# ---- provenance ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def git_commit() -> str:
    """The checkout's short commit, with ``+`` when tracked files differ from it ("" outside git)."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+" if head and dirty else "")


def command_line() -> str:
    return "python -m benchmarks " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def today() -> str:
    return datetime.date.today().isoformat()


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    """This machine, as the results record it (versions read without importing torch)."""
    cpu = platform.processor()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                   if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cores": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "numpy": version("numpy"), "torch": version("torch"), "scipy": version("scipy"),
            "threads": {v: os.environ.get(v) for v in THREAD_VARS}}


# ---- writing and printing -----------------------------------------------------------------------------------
def repo_relative(value: Any) -> Any:
    """A path inside the repository as a path relative to it (a stored result names no machine's folders);
    anything else as it is."""
    if isinstance(value, (str, Path)) and str(value).startswith(str(ROOT) + os.sep):
        return str(Path(value).relative_to(ROOT))
    return value


def write_result(out: Path, name: str, rows: list[dict[str, Any]], summary: Any = None,
                 params: dict[str, Any] | None = None, benchmark: str | None = None) -> Path:
    """``out/name.json`` (rows with the command, commit, date and machine that produced them) and
    ``out/name.csv`` (the rows' scalar columns). The report reads the JSON."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {"format": RESULT_FORMAT, "benchmark": benchmark or name, "command": command_line(),
           "commit": git_commit(), "date": today(), "machine": machine(),
           "params": {k: repo_relative(v) for k, v in (params or {}).items()},
           "summary": summary if summary is not None else {}, "rows": rows}
    path = out / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    if rows:
        cols = [k for k in rows[0] if not isinstance(rows[0][k], (list, dict))]
        with open(out / f"{name}.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
    console.print(f"wrote {path}", highlight=False)
    return path


def read_result(path: Path) -> dict[str, Any]:
    """A JSON result (a bare list of rows, as older scripts wrote, becomes ``{"rows": ...}``)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        fail(f"{path}: not a benchmark result ({type(e).__name__}: {e})")
    return {"rows": doc} if isinstance(doc, list) else doc


def cell(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 0.01 else f"{v:.3f}"
    return str(v)


LABELS = {"at_least_0.99": ">= 0.99x", "at_least_1.0": ">= 1.0x", "arachne_median_wall_s": "arachne median wall s",
          "block_ms": "block ms", "fused_pct": "fused %", "eager_pct": "eager %", "head_ms": "head ms",
          "head_pct": "head %", "err_pct": "error %", "time_pct": "time %", "memory_pct": "memory %",
          "measured_s": "measured s", "estimated_s": "estimate s", "measured_gib": "measured GiB",
          "estimated_gib": "estimate GiB", "measured_tflops": "measured TFLOP/s", "model_tflops": "model TFLOP/s",
          "gpus_used": "GPUs used", "tokens_per_s": "tokens/s", "ratio_to_best": "vs best",
          "planning_time_s": "planning s", "timed_out": "timed out"}
"""Column headers for keys whose JSON name reads badly in a table."""


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str] | None = None) -> None:
    if not rows:
        console.print(f"{title}: no rows")
        return
    columns = columns or [k for k in rows[0] if not isinstance(rows[0][k], (list, dict))]
    t = Table(title=title, title_justify="left")
    for i, k in enumerate(columns):  # the first column names the row: never folded
        t.add_column(LABELS.get(k, k), justify="left" if isinstance(rows[0].get(k), str) else "right",
                     overflow="fold", no_wrap=i == 0)
    for r in rows:
        t.add_row(*[cell(r.get(k)) for k in columns])
    console.print(t)


def gmean(xs: list[float]) -> float:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def ratio_stats(ratios: list[float | None]) -> dict[str, Any]:
    """arachne over the best baseline, over the cases where both found a plan."""
    xs = [r for r in ratios if r is not None and r > 0]
    return {"cases": len(xs), "geomean": gmean(xs), "min": min(xs, default=float("nan")),
            "at_least_0.99": sum(x >= 0.99 for x in xs), "at_least_1.0": sum(x >= 1.0 for x in xs)}


def ratio_line(s: dict[str, Any]) -> str:
    if not s["cases"]:
        return "arachne vs the best baseline: no case where both found a plan"
    n = s["cases"]
    return (f"arachne vs the best baseline over {n} cases: geomean {s['geomean']:.3f}, min {s['min']:.3f}, "
            f">= 0.99x on {s['at_least_0.99']}/{n}, >= 1.0x on {s['at_least_1.0']}/{n}")


# ---- stored sweeps: one loader ----------------------------------------------------------------------------
@dataclass
class Sweep:
    """A robustness sweep (``runs.json``: args, cases, runs, with the cluster YAML of every case) or the
    planners grid (``rows`` of every planner on every case), read from ``benchmarks/stored/`` or ``results/``."""

    name: str
    kind: str  # "robustness" or "grid"
    doc: dict[str, Any]
    clusters: dict[str, str]  # case name -> cluster YAML text, exactly as the sweep wrote it
    source: str
    rechecked: list[dict[str, Any]] = field(default_factory=list)
    """Baseline runs of a stored miss run again on a later commit (``sweep recheck``, stored under
    ``rechecks/``): the fastest baseline counts them (a plan a fixed baseline finds raises the bar)."""

    @property
    def cases(self) -> list[dict[str, Any]]:
        return self.doc.get("cases", [])

    @property
    def runs(self) -> list[dict[str, Any]]:
        return self.doc["runs"] if self.kind == "robustness" else self.doc["rows"]

    def cluster(self, case: str):
        from arachne.errors import InputError, load_yaml
        from arachne.spec.cluster import cluster_from_dict

        text = self.clusters.get(case)
        if text is None:
            fail(f"{self.source}: the sweep's cluster is missing ({case})")
        try:
            return cluster_from_dict(load_yaml(text), f"{self.source}:{case}")
        except InputError as e:
            fail(f"{self.source}: the sweep's cluster is bad ({e})")

    def best_baselines(self) -> dict[str, tuple[float, str]]:
        """Case -> (tokens/s, planner) of the fastest baseline with a plan."""
        best: dict[str, tuple[float, str]] = {}
        for r in [*self.runs, *self.rechecked]:
            tok = r.get("tokens_per_s") or 0.0
            if r["planner"] not in ("arachne", "exhaustive") and tok > best.get(r["case"], (0.0, ""))[0] \
                    and r.get("status", "ok") == "ok":
                best[r["case"]] = (tok, r["planner"])
        return best

    def arachne_runs(self) -> dict[str, dict[str, Any]]:
        return {r["case"]: r for r in self.runs if r["planner"] == "arachne"}

    def ratios(self) -> dict[str, float | None]:
        """arachne (as stored) over the best stored baseline, per case (None where either has no plan)."""
        best, mine = self.best_baselines(), self.arachne_runs()
        out = {}
        for case in dict.fromkeys(r["case"] for r in self.runs):
            a = (mine.get(case) or {}).get("tokens_per_s")
            ok = (mine.get(case) or {}).get("status", "ok") == "ok"
            out[case] = a / best[case][0] if a and ok and case in best else None
        return out


def read_manifest() -> dict[str, Any]:
    if not MANIFEST.exists():
        return {"format": "arachne-bench-manifest/1", "sweeps": []}
    return json.loads(MANIFEST.read_text())


def stored_names(pattern: str = "*") -> list[str]:
    return [e["name"] for e in read_manifest()["sweeps"] if fnmatchcase(e["name"], pattern)]


def newest_stored(kind: str) -> str:
    """The name of the last stored sweep of ``kind`` ("grid", "robustness"): the store is append-only, so the
    manifest lists them in the order they were stored. Stops with one line when there is none."""
    names = [e["name"] for e in read_manifest()["sweeps"] if e.get("kind") == kind]
    if not names:
        fail(f"{MANIFEST}: no stored {kind} sweep")
    return names[-1]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _from_stored_file(path: Path, entry: dict[str, Any] | None) -> Sweep:
    try:
        data = path.read_bytes()
        if entry is not None and _sha256(data) != entry["sha256"]:
            fail(f"{path}: its sha256 is not the manifest's: stored sweeps are never rewritten (restore it from git)")
        doc = json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)
        assert doc["format"] == STORED_FORMAT
        sweep = Sweep(doc["name"], doc["kind"], doc["doc"], doc.get("clusters", {}), doc["name"])
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as e:
        fail(f"{path}: not a stored sweep ({type(e).__name__}: {e})")
    if entry is not None:
        sweep.rechecked = stored_rechecks().get(sweep.name, [])
    return sweep


def stored_rechecks() -> dict[str, list[dict[str, Any]]]:
    """Sweep name -> the baseline runs that stored rechecks (``rechecks/*.json``, manifest ``rechecks``) found a
    plan with, as ``{"case", "planner", "tokens_per_s", "status", "commit"}``; each file's sha256 checked."""
    out: dict[str, list[dict[str, Any]]] = {}
    for e in read_manifest().get("rechecks", []):
        path = STORED / e["file"]
        try:
            data = path.read_bytes()
            if _sha256(data) != e["sha256"]:
                fail(f"{path}: its sha256 is not the manifest's: stored rechecks are never rewritten")
            doc = json.loads(data)
            for r in doc["rows"]:
                if r["status"] == "ok" and r.get("tok_s"):
                    out.setdefault(r["sweep"], []).append({"case": r["case"], "planner": r["planner"],
                                                           "tokens_per_s": r["tok_s"], "status": "ok",
                                                           "commit": doc.get("commit")})
        except (OSError, ValueError, KeyError, TypeError) as err:
            fail(f"{path}: not a stored recheck ({type(err).__name__}: {err})")
    return out


def store_recheck(path: Path, name: str) -> Path:
    """Add a ``sweep recheck`` result (``recheck.json``) to ``benchmarks/stored/rechecks/<name>.json`` and the
    manifest's ``rechecks``. Append-only, as sweeps."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name):
        fail(f"--name {name!r}: lower-case letters, digits, '.', '_' and '-' only")
    try:
        data = path.read_bytes()
        doc = json.loads(data)
        assert doc.get("benchmark") == "sweep-recheck" and isinstance(doc.get("rows"), list)
        for r in doc["rows"]:  # what stored_rechecks reads
            assert all(isinstance(r.get(k), str) for k in ("sweep", "case", "planner", "status"))
            assert r.get("tok_s") is None or isinstance(r["tok_s"], (int, float))
    except (OSError, ValueError, AssertionError, AttributeError) as err:
        fail(f"{path}: not a `sweep recheck` result ({type(err).__name__})")
    manifest = read_manifest()
    dest = STORED / "rechecks" / f"{name}.json"
    if dest.exists() or any(e["name"] == name for e in manifest.get("rechecks", [])):
        fail(f"{dest}: already stored; stored rechecks are append-only, store under a new --name")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "xb") as fh:
        fh.write(data)
    manifest.setdefault("rechecks", []).append({
        "name": name, "file": str(dest.relative_to(STORED)), "command": doc.get("command", ""),
        "commit": doc.get("commit", ""), "date": doc.get("date", ""), "sha256": _sha256(data),
        "rows": len(doc["rows"]), "found": sum(r["status"] == "ok" for r in doc["rows"])})
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    return dest


def _from_results(path: Path) -> Sweep:
    """A sweep as a benchmark wrote it: ``runs.json`` with ``clusters/`` beside it, or the grid's JSON."""
    try:
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and doc.get("format") == STORED_FORMAT:
            return _from_stored_file(path, None)
        if isinstance(doc, dict) and "args" in doc and "runs" in doc:
            folder = path.parent / "clusters"
            clusters = {p.stem: p.read_text() for p in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}
            return Sweep(path.parent.name, "robustness", doc, clusters, str(path))
        if isinstance(doc, dict) and "rows" in doc and doc["rows"] and "planner" in doc["rows"][0]:
            return Sweep(path.parent.name, "grid", doc, {}, str(path))
        raise KeyError("args/runs or rows")
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        fail(f"{path}: not a runs.json written by a sweep, nor a grid result ({type(e).__name__}: {e})")


def load_sweeps(refs: list[str | Path], kind: str | None = None) -> list[Sweep]:
    """Each ref: a stored sweep's name or a pattern over the names (``seed3[1-6]``, ``odd*``), a stored file,
    a sweep's ``runs.json`` or its folder. Stops with one line on anything else."""
    entries = {e["name"]: e for e in read_manifest()["sweeps"]}
    out: list[Sweep] = []
    for ref in refs:
        path = Path(ref)
        if path.is_dir():
            path = next((path / n for n in ("runs.json", "grid.json", "planners.json") if (path / n).exists()),
                        path / "runs.json")
        if path.suffix in (".json", ".gz") and (path.exists() or "/" in str(ref)):
            if not path.exists():
                fail(f"{path}: no such file")
            out.append(_from_stored_file(path, None) if path.suffix == ".gz" else _from_results(path))
            continue
        names = [n for n in entries if fnmatchcase(n, str(ref))]
        if not names:
            fail(f"{ref}: neither a stored sweep (see benchmarks/stored/MANIFEST.json) nor a runs.json")
        out += [_from_stored_file(STORED / entries[n]["file"], entries[n]) for n in names]
    if kind:
        wrong = [s.source for s in out if s.kind != kind]
        if wrong:
            fail(f"{', '.join(wrong)}: not a {kind} sweep")
    return out


def store_sweep(sweep: Sweep, name: str, command: str, commit: str, date: str, note: str = "") -> Path:
    """Add ``sweep`` to ``benchmarks/stored/`` as ``sweeps/<name>.json.gz`` and a manifest entry.
    Append-only: an existing name or file is refused, never replaced."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name):
        fail(f"--name {name!r}: lower-case letters, digits, '.', '_' and '-' only")
    manifest = read_manifest()
    path = SWEEPS / f"{name}.json.gz"
    if path.exists() or any(e["name"] == name for e in manifest["sweeps"]):
        fail(f"{path}: already stored; stored sweeps are append-only, store under a new --name")
    if sweep.kind == "robustness":
        missing = sorted({c["name"] for c in sweep.cases} - set(sweep.clusters))
        if missing:
            fail(f"{sweep.source}: clusters missing for {', '.join(missing[:5])}: store the folder with clusters/")
    body = {"format": STORED_FORMAT, "name": name, "kind": sweep.kind, "doc": sweep.doc, "clusters": sweep.clusters}
    blob = gzip.compress(json.dumps(body, separators=(",", ":")).encode(), compresslevel=9, mtime=0)
    SWEEPS.mkdir(parents=True, exist_ok=True)
    with open(path, "xb") as fh:  # exclusive: never overwrite
        fh.write(blob)
    cases = len(sweep.cases) if sweep.kind == "robustness" else len({r["case"] for r in sweep.runs})
    manifest["sweeps"].append({
        "name": name, "file": str(path.relative_to(STORED)), "kind": sweep.kind, "command": command,
        "commit": commit, "date": date, "sha256": _sha256(blob), "cases": cases, "runs": len(sweep.runs),
        "planners": sorted({r["planner"] for r in sweep.runs}), "note": note})
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    return path


# ---- problem generators (in ``benchmarks/problems.py``, re-exported here) ----------------------------------
from benchmarks.problems import (  # noqa: E402, F401
    GRID_CASES,
    GRID_QUICK,
    LATENCY_TYPES,
    NIC_CASES,
    NODE_SIZES,
    SCALE_CASES,
    STARVED_CASES,
    SWEEP_PLANNERS,
    TIERS,
    TIMING_PLANNERS,
    TIMING_SIZES,
    GridCase,
    RandomCase,
    grid_cluster,
    latency_clusters,
    random_case,
    random_cases,
    triples_cluster,
)


