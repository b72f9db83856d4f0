"""``cost-model collectives``: arachne's network model against published NCCL measurements.

Reads ``data/nccl/measurements.json`` (nccl-tests bus bandwidth vs message size, each record with its source;
see ``data/nccl/README.md``), builds for each record the cluster it ran on (``cluster_from_dict``: the GPU type
from the catalog, the stated NIC rate per node and, where stated, the intra-node link), prices the collective with
``arachne.cost.network.Network`` -- the calls ``CostModel`` makes: ``all_reduce_time`` (tensor-parallel and
gradient sync), ``all_to_all_time`` (expert parallelism), ``p2p_time`` (pipeline sends) -- converts the time to bus
bandwidth with nccl-tests' conventions and prints the error per row, record, collective and fabric, at sizes
>= 1 MB. Beside it, the flat ring: one ring over all GPUs at the slowest link's per-GPU share (what a planner
that ignores the node hierarchy charges), so the report shows which of the two the data supports.

nccl-tests conventions (its doc/PERFORMANCE.md): ``size`` is the per-rank buffer of an all-reduce, the total
(all ranks) buffer of an all-gather / reduce-scatter / all-to-all, and the message of a send/recv; algbw = size /
time; busbw = algbw x 2(n-1)/n (all-reduce), (n-1)/n (all-gather, reduce-scatter, all-to-all), 1 (send/recv).
All-gather and reduce-scatter are priced with ``all_gather_time`` / ``reduce_scatter_time``; a record that pins
``NCCL_ALGO=RING`` is priced with the ring alone.

Hold-out: every record carries ``held_out`` (per ``batch`` of records added together, sorted by id, odd positions
held out; ``SPLIT_RULE``), and ``degraded`` where its own thread says the fabric under-delivers. The fitted constants
(``FITTED``: ``NetworkCalibration.efa_nic_efficiency`` and ``p2p_intra_share``) are refitted here on the calibration
half (not held out, not degraded, rows >= ``FIT_MIN_BYTES``) and printed beside the shipped values; errors are
reported per half, per collective (every one of ``COLLECTIVES``, with or without a healthy record) and per fabric.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import common

DATA = common.ROOT / "data" / "nccl" / "measurements.json"
MIN_BYTES = 1_000_000  # the target applies at sizes >= 1 MB
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
# fabric kinds: nvlink = GPUs joined directly by NVLink links (no switch); slingshot = HPE Slingshot (RDMA through
# the aws-ofi-nccl plugin), priced at the efficiency of a node that names no network (NETWORK_OF_KIND has no entry)
FABRICS = ("nvswitch", "nvlink-bridge", "nvlink", "pcie", "infiniband", "roce", "cloud-efa", "ethernet",
           "slingshot")
GB = 1e9
FIT_MIN_BYTES = 64 * 2**20  # efficiencies are fitted where the bandwidth term dominates the latency
SPLIT_RULE = "per batch (records added together), records sorted by id; odd positions (0-based) held out"
NETWORK_OF_KIND = {"infiniband": "infiniband", "roce": "roce", "cloud-efa": "efa", "ethernet": "ethernet"}


# ---- nccl-tests conventions ----------------------------------------------------------------------------------
def bus_factor(collective: str, n: int) -> float:
    """busbw / algbw for ``n`` ranks, as nccl-tests reports it."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "send_recv":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def busbw_from_time(collective: str, n: int, nbytes: float, seconds: float) -> float:
    """Bus bandwidth, bytes/s, of a collective of nccl-tests ``size`` ``nbytes`` that took ``seconds``."""
    return nbytes / seconds * bus_factor(collective, n)


# ---- the data file -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    """One published measurement: a collective on one fabric, several message sizes."""

    id: str
    source: dict[str, Any]       # url, title, date, where (which table/row of the source)
    fabric: dict[str, Any]       # kind, gpu, nodes, gpus_per_node, inter_node_gbps (GB/s per node), ...
    collective: str              # one of COLLECTIVES
    rows: tuple[dict[str, float], ...]  # bytes, busbw_gbps (GB/s), algbw_gbps when the source gives it
    approximate: bool = False    # the source gives rounded figures ("~100")
    held_out: bool = False       # in the check half: no fitted constant sees it
    degraded: bool = False       # its own thread says the fabric under-delivers (``degraded_why``)
    algorithm: str | None = None  # NCCL_ALGO the source pinned ("ring", "nvls"), None: NCCL's choice
    batch: int = 1               # records added together; the split is drawn within each batch (SPLIT_RULE)

    @property
    def ranks(self) -> int:
        return int(self.fabric["nodes"]) * int(self.fabric["gpus_per_node"])


def _check(cond: bool, path: Path, field: str, why: str) -> None:
    if not cond:
        common.fail(f"{path}: {field}: {why}")


def load(path: Path = DATA) -> list[Record]:
    """Read and validate the data file; bad input exits 2 with one line naming file and field."""
    from arachne.spec.gpus import gpu_catalog

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        common.fail(f"{path}: not readable JSON ({type(e).__name__}: {e})")
    _check(isinstance(doc, dict) and isinstance(doc.get("records"), list) and doc["records"], path, "records",
           "a non-empty list is required")
    out, seen = [], set()
    for i, r in enumerate(doc["records"]):
        f = f"records[{i}]"
        _check(isinstance(r, dict), path, f, "must be an object")
        _check(isinstance(r.get("id"), str) and r["id"] and r["id"] not in seen, path, f"{f}.id",
               "a unique non-empty string is required")
        seen.add(r["id"])
        src = r.get("source")
        _check(isinstance(src, dict), path, f"{f}.source", "an object with url, date and where is required")
        for k in ("url", "date", "where"):
            _check(isinstance(src.get(k), str) and src[k].strip() != "", path, f"{f}.source.{k}", "required")
        fab = r.get("fabric")
        _check(isinstance(fab, dict), path, f"{f}.fabric", "an object is required")
        _check(fab.get("kind") in FABRICS, path, f"{f}.fabric.kind", f"one of {', '.join(FABRICS)}")
        _check(isinstance(fab.get("gpu"), str) and gpu_catalog().get(fab["gpu"]) is not None, path,
               f"{f}.fabric.gpu", "a GPU type of arachne's catalog is required")
        for k in ("nodes", "gpus_per_node"):
            _check(isinstance(fab.get(k), int) and not isinstance(fab[k], bool) and fab[k] >= 1, path,
                   f"{f}.fabric.{k}", "a positive integer is required")
        _check(fab["nodes"] * fab["gpus_per_node"] >= 2, path, f"{f}.fabric", "a collective needs 2+ GPUs")
        if fab["nodes"] > 1:
            _check(isinstance(fab.get("inter_node_gbps"), (int, float)) and fab["inter_node_gbps"] > 0, path,
                   f"{f}.fabric.inter_node_gbps", "the NIC rate per node, GB/s, is required on several nodes")
        if "intra_node_gbps" in fab:
            _check(isinstance(fab["intra_node_gbps"], (int, float)) and fab["intra_node_gbps"] > 0, path,
                   f"{f}.fabric.intra_node_gbps", "a positive number (GB/s, bidirectional per GPU)")
        coll = r.get("collective")
        _check(coll in COLLECTIVES, path, f"{f}.collective", f"one of {', '.join(COLLECTIVES)}")
        rows = r.get("rows")
        _check(isinstance(rows, list) and rows, path, f"{f}.rows", "a non-empty list is required")
        n = fab["nodes"] * fab["gpus_per_node"]
        prev = 0
        for j, row in enumerate(rows):
            g = f"{f}.rows[{j}]"
            _check(isinstance(row, dict), path, g, "must be an object")
            b = row.get("bytes")
            _check(isinstance(b, int) and not isinstance(b, bool) and b > prev, path, f"{g}.bytes",
                   "a positive integer, sizes strictly increasing")
            prev = b
            bus = row.get("busbw_gbps")
            _check(isinstance(bus, (int, float)) and bus > 0 and math.isfinite(bus), path, f"{g}.busbw_gbps",
                   "a positive number is required")
            alg = row.get("algbw_gbps")
            if alg is not None:
                _check(isinstance(alg, (int, float)) and alg > 0, path, f"{g}.algbw_gbps", "a positive number")
                want = alg * bus_factor(coll, n)
                _check(abs(want - bus) <= max(0.02 * bus, 0.02), path, f"{g}.busbw_gbps",
                       f"{bus} disagrees with algbw x the nccl-tests factor ({want:.3g}) for {n} ranks")
        for k in ("held_out", "degraded"):
            _check(isinstance(r.get(k), bool), path, f"{f}.{k}", "true or false is required")
        if r["degraded"]:
            _check(isinstance(r.get("degraded_why"), str) and r["degraded_why"].strip() != "", path,
                   f"{f}.degraded_why", "a degraded record says why")
        alg = r.get("algorithm")
        _check(alg in (None, "ring", "tree", "nvls"), path, f"{f}.algorithm", "null, ring, tree or nvls")
        batch = r.get("batch", 1)
        _check(isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1, path, f"{f}.batch",
               "a positive integer (records added together share one)")
        out.append(Record(r["id"], src, fab, coll, tuple(rows), bool(r.get("approximate", False)),
                          r["held_out"], r["degraded"], alg, batch))
    return out


def split_ok(recs: list[Record]) -> bool:
    """The stored ``held_out`` flags follow :data:`SPLIT_RULE`: within each batch, sorted by id, odd positions held
    out (a batch is split when it is added, so adding records never moves an earlier record between halves)."""
    for b in {r.batch for r in recs}:
        order = sorted((r for r in recs if r.batch == b), key=lambda r: r.id)
        if not all(r.held_out == (i % 2 == 1) for i, r in enumerate(order)):
            return False
    return True


# ---- pricing -------------------------------------------------------------------------------------------------
def cluster_of(rec: Record):
    """The arachne cluster the record ran on: catalog GPU, stated NIC rate and (if stated) intra-node link."""
    from arachne.spec.cluster import cluster_from_dict

    fab = rec.fabric
    group: dict[str, Any] = {"name": "n{i}" if fab["nodes"] > 1 else "n0", "count": fab["nodes"],
                             "gpu": fab["gpu"], "gpus_per_node": fab["gpus_per_node"]}
    if fab.get("inter_node_gbps"):
        group["inter_node_gbps"] = float(fab["inter_node_gbps"])
    if fab.get("intra_node_gbps"):
        group["intra_node_gbps"] = float(fab["intra_node_gbps"])
    if fab["kind"] in NETWORK_OF_KIND and fab["nodes"] > 1:
        group["network"] = NETWORK_OF_KIND[fab["kind"]]
    return cluster_from_dict({"name": rec.id, "nodes": [group]}, f"{DATA.name}:{rec.id}")


def _devices(cluster) -> list[str]:
    return [f"{n.name}:{i}" for n in cluster.nodes for i in range(n.num_gpus)]


def model_time(net, collective: str, devices: list[str], nbytes: float, algorithm: str | None = None) -> float:
    """arachne's time for a collective of nccl-tests ``size`` ``nbytes`` over ``devices`` (``algorithm``: the
    one the source pinned: a pinned ring all-reduce is priced as the ring, a pinned NVLS all-gather/reduce-scatter
    as NVLS; NVLS all-reduce is NCCL's own choice where it applies)."""
    if collective == "all_reduce":
        return net.all_reduce_time(devices, nbytes, algorithm="ring" if algorithm == "ring" else None)
    if collective == "all_gather":
        return net.all_gather_time(devices, nbytes, algorithm=algorithm)
    if collective == "reduce_scatter":
        return net.reduce_scatter_time(devices, nbytes, algorithm=algorithm)
    if collective == "all_to_all":
        return net.all_to_all_time(devices, nbytes)
    if collective == "send_recv":  # rank 0 to the last rank (across nodes when there are several)
        return net.p2p_time([devices[0]], [devices[-1]], nbytes)
    raise ValueError(collective)


def flat_share(cluster) -> float:
    """Per-GPU bandwidth of one flat ring over every GPU: the slowest link's per-GPU share, bytes/s."""
    bw = min(n.intra_node_bw for n in cluster.nodes)
    if len(cluster.nodes) > 1:
        bw = min(bw, min(n.inter_node_bw / n.num_gpus for n in cluster.nodes))
    return bw


def flat_time(cluster, cal, collective: str, n: int, nbytes: float) -> float:
    """The flat-ring alternative: ring algorithms over ``n`` GPUs, every hop at :func:`flat_share`."""
    bw = flat_share(cluster)
    lat = cal.inter_node_latency_s if len(cluster.nodes) > 1 else cal.intra_node_latency_s
    if collective == "all_reduce":
        return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n * nbytes / bw + (n - 1) * lat
    if collective == "send_recv":
        return nbytes / bw + lat
    raise ValueError(collective)


def price(rec: Record, min_bytes: float = MIN_BYTES, cal=None) -> list[dict[str, Any]]:
    """One row per measured size >= ``min_bytes``: measured, hierarchical (arachne) and flat busbw, errors."""
    from arachne.cost.calibration import NetworkCalibration
    from arachne.cost.network import Network

    cluster, cal = cluster_of(rec), cal or NetworkCalibration()
    net, devs, n = Network(cluster, cal), _devices(cluster), rec.ranks
    out = []
    for row in rec.rows:
        b = row["bytes"]
        if b < min_bytes:
            continue
        meas = row["busbw_gbps"]
        hier = busbw_from_time(rec.collective, n, b, model_time(net, rec.collective, devs, b, rec.algorithm)) / GB
        flat = busbw_from_time(rec.collective, n, b, flat_time(cluster, cal, rec.collective, n, b)) / GB
        out.append({"record": rec.id, "fabric": rec.fabric["kind"], "collective": rec.collective,
                    "gpu": cluster.nodes[0].gpu.name, "nodes": rec.fabric["nodes"],
                    "gpus_per_node": rec.fabric["gpus_per_node"], "bytes": b, "measured_busbw": meas,
                    "arachne_busbw": hier, "flat_busbw": flat,
                    "arachne_error_pct": 100 * (hier - meas) / meas, "flat_error_pct": 100 * (flat - meas) / meas,
                    "approximate": rec.approximate, "held_out": rec.held_out, "degraded": rec.degraded,
                    "source": rec.source["url"]})
    return out


def p2p_intra(rec: Record) -> bool:
    """A single-node send/recv or all-to-all record: what ``NetworkCalibration.p2p_intra_share`` is fitted on."""
    return rec.collective in ("send_recv", "all_to_all") and rec.fabric["nodes"] == 1


# the fitted NetworkCalibration constants and the records each is fitted on (their calibration half)
FITTED = {"efa_nic_efficiency": lambda r: r.fabric["kind"] == "cloud-efa", "p2p_intra_share": p2p_intra}


def fit_efficiency(recs: list[Record], field: str, kind: str | Any) -> float | None:
    """The ``NetworkCalibration`` efficiency ``field`` that minimises the mean squared log error of busbw over
    the calibration records of fabric ``kind`` (or those a predicate ``kind(record)`` selects; not held out, not
    degraded, rows >= FIT_MIN_BYTES), each record weighed once; None when no such row exists. A grid of 0.005
    steps over [0.2, 1.0]."""
    from arachne.cost.calibration import NetworkCalibration

    pick = kind if callable(kind) else (lambda r: r.fabric["kind"] == kind)
    fit_on = [r for r in recs if pick(r) and not r.held_out and not r.degraded
              and any(row["bytes"] >= FIT_MIN_BYTES for row in r.rows)]
    if not fit_on:
        return None

    return min((0.2 + 0.005 * i for i in range(161)),
               key=lambda e: _fit_loss(fit_on, dataclasses.replace(NetworkCalibration(), **{field: e}), FIT_MIN_BYTES))


def _fit_loss(recs: list[Record], cal, min_bytes: float) -> float:
    """Mean over ``recs`` (each record weighed once) of the mean squared log busbw error of its rows."""
    tot = 0.0
    for rec in recs:
        rows = price(rec, min_bytes, cal)
        tot += sum(_log_ratio(r["arachne_error_pct"]) ** 2 for r in rows) / len(rows)
    return tot


def fit_a2a_latency(recs: list[Record]) -> dict[str, float] | None:
    """``NetworkCalibration.a2a_base_latency_inter_s`` and ``a2a_peer_latency_inter_s`` that minimise the busbw
    error of the multi-node all-to-all records of the calibration half (not held out, not degraded, rows >=
    MIN_BYTES: the latency matters at the small end), and ``a2a_peer_latency_intra_s`` on the single-node ones;
    grids of 5 us x 0.5 us and 0.25 us. None without a multi-node record."""
    from arachne.cost.calibration import NetworkCalibration

    fit_on = [r for r in recs if r.collective == "all_to_all" and not r.held_out and not r.degraded
              and any(row["bytes"] >= MIN_BYTES for row in r.rows)]
    multi = [r for r in fit_on if r.fabric["nodes"] > 1]
    if not multi:
        return None
    base = NetworkCalibration()

    def cal(b: float, inter: float, intra: float | None = None):
        return dataclasses.replace(base, a2a_base_latency_inter_s=b * 1e-6, a2a_peer_latency_inter_s=inter * 1e-6,
                                   **({} if intra is None else {"a2a_peer_latency_intra_s": intra * 1e-6}))

    b, inter = min(((5.0 * i, 0.5 * j) for i in range(41) for j in range(61)),
                   key=lambda bj: _fit_loss(multi, cal(*bj), MIN_BYTES))
    single = [r for r in fit_on if r.fabric["nodes"] == 1]
    intra = base.a2a_peer_latency_intra_s * 1e6
    if single:
        intra = min((0.25 * k for k in range(81)), key=lambda x: _fit_loss(single, cal(b, inter, x), MIN_BYTES))
    return {"a2a_base_latency_inter_s": b * 1e-6, "a2a_peer_latency_inter_s": inter * 1e-6,
            "a2a_peer_latency_intra_s": intra * 1e-6}


def _mape(rows: list[dict[str, Any]], key: str) -> float:
    return sum(abs(r[key]) for r in rows) / len(rows) if rows else float("nan")


def summarize(rows: list[dict[str, Any]], by: tuple[str, ...]) -> list[dict[str, Any]]:
    """MAPE of both models per group, and the factor each is off by (geometric mean of max(model/measured,
    measured/model)); each record weighs once (its rows' mean), however many sizes it has."""
    per_rec: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        per_rec.setdefault(r["record"], []).append(r)
    recs = []
    for rid, rs in per_rec.items():
        recs.append({**{k: rs[0][k] for k in by}, "record": rid,
                     "arachne": sum(r["arachne_error_pct"] for r in rs) / len(rs),
                     "flat": sum(r["flat_error_pct"] for r in rs) / len(rs),
                     "arachne_log": sum(abs(_log_ratio(r["arachne_error_pct"])) for r in rs) / len(rs),
                     "flat_log": sum(abs(_log_ratio(r["flat_error_pct"])) for r in rs) / len(rs)})
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in recs:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    out = []
    for key, rs in sorted(groups.items()):
        fa = math.exp(sum(r["arachne_log"] for r in rs) / len(rs))
        ff = math.exp(sum(r["flat_log"] for r in rs) / len(rs))
        out.append({**dict(zip(by, key)), "records": len(rs),
                    "arachne_mape_pct": _mape(rs, "arachne"),
                    "arachne_mean_error_pct": sum(r["arachne"] for r in rs) / len(rs), "arachne_factor": fa,
                    "flat_mape_pct": _mape(rs, "flat"), "flat_mean_error_pct": sum(r["flat"] for r in rs) / len(rs),
                    "flat_factor": ff, "closer": "same" if abs(fa - ff) < 1e-9 else "arachne" if fa < ff else "flat"})
    return out


def _log_ratio(error_pct: float) -> float:
    """ln(model / measured): symmetric, unlike a percentage error (a model 10x too slow is -90%, 10x too fast
    +900%), so it is what decides which model is closer."""
    return math.log(1 + error_pct / 100)


SHORT = {"all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS", "all_to_all": "A2A", "send_recv": "SR"}


def _size(b: int) -> str:
    for unit, f in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if b >= 0.999 * f:  # nccl-tests rounds sizes down to a multiple of the ranks: 1073740800 B is 1G
            v = b / f
            return f"{v:.0f}{unit}" if abs(v - round(v)) < 0.05 else f"{v:.3g}{unit}"
    return str(b)


def _pct(x: float) -> int:
    return round(x)


def _half(r: dict[str, Any]) -> str:
    return ("chk" if r["held_out"] else "cal") + ("*" if r["degraded"] else "")


def _group_rows(rows: list[dict[str, Any]], by: tuple[str, ...]) -> list[dict[str, Any]]:
    """Compact per-group rows (80 columns): records, arachne MAPE on each half, flat MAPE, which is closer."""
    out = []
    healthy = [r for r in rows if not r["degraded"]]
    for g in summarize(healthy, by):
        key = {k: g[k] for k in by}
        sel = [r for r in healthy if all(r[k] == v for k, v in key.items())]
        cal = summarize([{**r, "g": 0} for r in sel if not r["held_out"]], ("g",))
        chk = summarize([{**r, "g": 0} for r in sel if r["held_out"]], ("g",))
        label = " ".join(SHORT.get(str(v), str(v)) for v in key.values())
        out.append({"group": label, "recs": g["records"],
                    "cal %": _pct(cal[0]["arachne_mape_pct"]) if cal else None,
                    "chk %": _pct(chk[0]["arachne_mape_pct"]) if chk else None,
                    "flat %": _pct(g["flat_mape_pct"]), "x model": round(g["arachne_factor"], 2),
                    "x flat": round(g["flat_factor"], 2), "closer": g["closer"]})
    return out


def _collective_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per collective of :data:`COLLECTIVES`, also those without a healthy record (shown as such): healthy
    records, arachne MAPE on each half, flat MAPE, arachne's factor, and how many degraded records there are."""
    got = {g["group"]: g for g in _group_rows(rows, ("collective",))}
    out = []
    for c in COLLECTIVES:
        g = got.get(SHORT[c], {"recs": 0, "cal %": None, "chk %": None, "flat %": None, "x model": None})
        degraded = len({r["record"] for r in rows if r["collective"] == c and r["degraded"]})
        out.append({"collective": c, "recs": g["recs"], "cal %": g["cal %"], "chk %": g["chk %"],
                    "flat %": g["flat %"], "x model": g["x model"], "degraded": degraded})
    return out


def _by_collective(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per collective: MAPE of the healthy records on each half (None where the half has none), for the summary."""
    out: dict[str, Any] = {}
    for c in COLLECTIVES:
        sel = [{**r, "g": 0} for r in rows if r["collective"] == c and not r["degraded"]]
        half = {}
        for name, keep in (("calibration", False), ("check", True)):
            s = summarize([r for r in sel if r["held_out"] == keep], ("g",))
            half[name] = {"records": s[0]["records"] if s else 0,
                          "arachne_mape_pct": s[0]["arachne_mape_pct"] if s else None}
        out[c] = half
    return out


def _halves(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """MAPE and within-15% counts for the calibration half, the check half (healthy records) and the degraded."""
    out: dict[str, Any] = {}
    for name, sel in (("calibration", [r for r in rows if not r["held_out"] and not r["degraded"]]),
                      ("check", [r for r in rows if r["held_out"] and not r["degraded"]]),
                      ("degraded", [r for r in rows if r["degraded"]])):
        per = summarize(sel, ("record",))
        s = summarize([{**r, "g": 0} for r in sel], ("g",))
        out[name] = {"records": len(per), "arachne_mape_pct": s[0]["arachne_mape_pct"] if s else None,
                     "flat_mape_pct": s[0]["flat_mape_pct"] if s else None,
                     "arachne_factor": s[0]["arachne_factor"] if s else None,
                     "records_within_15pct": sum(r["arachne_mape_pct"] <= 15 for r in per)}
    return out


def run(a) -> None:
    from arachne.cost.calibration import NetworkCalibration

    path = Path(a.data)
    recs = load(path)
    if not split_ok(recs):
        common.fail(f"{path}: records: held_out does not follow the split rule ({SPLIT_RULE})")
    rows = [r for rec in recs for r in price(rec, a.min_bytes)]
    if not rows:
        common.fail(f"{path}: records: no row at or above {a.min_bytes:g} bytes")
    show = [{"record": r["record"], "half": _half(r), "size": _size(r["bytes"]),
             "GB/s": round(r["measured_busbw"]) if r["measured_busbw"] >= 10 else round(r["measured_busbw"], 1),
             "err %": _pct(r["arachne_error_pct"]), "flat %": _pct(r["flat_error_pct"])} for r in rows]
    common.print_table("busbw measured; err: arachne (> 0: too fast); half: cal/chk, *: degraded", show)
    by_cf = summarize(rows, ("collective", "fabric"))
    common.print_table("per collective: healthy MAPE % (cal/chk), factor, degraded recs",
                       _collective_rows(rows))
    common.print_table("healthy records per collective and fabric: MAPE % (cal/chk halves), factor",
                       _group_rows(rows, ("collective", "fabric")))
    by_f = summarize(rows, ("fabric",))
    common.print_table("healthy records per fabric", _group_rows(rows, ("fabric",)))
    halves = _halves(rows)
    overall = summarize([{**r, "all": "all"} for r in rows], ("all",))[0]
    fits = {f: {"shipped": getattr(NetworkCalibration(), f), "refit_on_calibration_half": fit_efficiency(recs, f, sel)}
            for f, sel in FITTED.items()}
    lat = fit_a2a_latency(recs)
    for f, v in (lat or {}).items():
        fits[f] = {"shipped": getattr(NetworkCalibration(), f), "refit_on_calibration_half": v}
    multi = [r for r in rows if r["nodes"] > 1]
    single = [r for r in rows if r["nodes"] == 1]
    summary = {"records": len(recs), "rows": len(rows), "min_bytes": a.min_bytes, "split_rule": SPLIT_RULE,
               "fabric_kinds": sorted({r["fabric"] for r in rows}),
               "arachne_mape_pct": overall["arachne_mape_pct"], "flat_mape_pct": overall["flat_mape_pct"],
               "target_mape_pct": 15.0, **halves,
               "fitted": fits, "by_collective": _by_collective(rows),
               "multi_node": summarize([{**r, "all": "multi"} for r in multi], ("all",))[0] if multi else None,
               "single_node": summarize([{**r, "all": "single"} for r in single], ("all",))[0] if single else None,
               "by_collective_fabric": by_cf, "by_fabric": by_f}
    per_record = summarize(rows, ("record",))
    summary["records_within_15pct"] = sum(r["arachne_mape_pct"] <= 15 for r in per_record)
    con = common.console
    for name in ("calibration", "check", "degraded"):
        h = halves[name]
        if h["records"]:
            con.print(f"{name}: {h['records']} records, MAPE arachne {h['arachne_mape_pct']:.1f}% (within 15% on "
                      f"{h['records_within_15pct']}), flat ring {h['flat_mape_pct']:.1f}%", highlight=False)
    con.print(f"all {len(recs)} records, {len(rows)} sizes >= {a.min_bytes:g} B: MAPE arachne "
              f"{overall['arachne_mape_pct']:.1f}%, flat {overall['flat_mape_pct']:.1f}%", highlight=False)
    con.print(f"off by a factor of {overall['arachne_factor']:.2f} (arachne) vs {overall['flat_factor']:.2f} (flat)",
              highlight=False)
    for f, v in fits.items():
        refit = v["refit_on_calibration_half"]
        con.print(f"{f}: shipped {v['shipped']:g}, calibration-half refit"
                  f" {'-' if refit is None else f'{refit:.3g}'}", highlight=False)
    common.write_result(a.out, "collectives", rows, summary, {"data": str(path), "min_bytes": a.min_bytes},
                        benchmark="cost-model-collectives")
