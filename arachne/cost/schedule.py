"""Pipeline schedules simulated as a timeline of stages x micro-batches.

Each stage runs its operations in schedule order (1F1B: warm-up forwards, then one forward /
one backward, then cool-down backwards; GPipe: all forwards, then all backwards). An operation
starts when its stage is free and its input has arrived; sending the output to the neighbour
stage occupies the sender (blocking point-to-point, as in Megatron/DeepSpeed). Which operation can
run after which depends on the schedule's shape only, so the order they run in is worked out once per
shape (stages, micro-batches) and replayed on each pipeline's times. Long runs are
extrapolated from two shorter simulations once the timeline is periodic, which it is after a
transient of a few pipeline depths (checked against full simulation in the tests).
"""

from __future__ import annotations

from functools import lru_cache

FWD, BWD = 0, 1


@lru_cache(maxsize=256)
def stage_ops(num_stages: int, m: int, schedule: str) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per stage, the ordered (kind, micro-batch) operations (every stage runs 2m; the stages share the
    operation tuples)."""
    F = [(FWD, j) for j in range(m)]
    B = [(BWD, j) for j in range(m)]
    out = []
    for s in range(num_stages):
        if schedule == "gpipe":
            ops = F + B
        else:
            w = min(num_stages - s - 1, m)
            ops = F[:w]
            for i in range(m - w):
                ops.append(F[w + i])
                ops.append(B[i])
            ops += B[m - w:]
        out.append(tuple(ops))
    return tuple(out)


@lru_cache(maxsize=256)
def positions(num_stages: int, m: int, schedule: str) -> tuple[tuple[tuple[int, int], ...], ...]:
    """:func:`stage_ops` by position: entry p holds every stage's p-th operation. Run position by position, the
    stages in order for the first m positions and in reverse after, every operation's input is produced
    first. An input comes from the position before on the neighbour stage, or from the same position: a
    forward's from the stage before, only while it is among the first m (warm-up: ``F(s, j)`` at j, j < m),
    a backward's from the stage after, only from position m on (cool-down: ``B(s, j)`` at m + j; the gpipe
    order is the same). Durations never change this order, so :func:`simulate` replays it on any times."""
    return tuple(zip(*stage_ops(num_stages, m, schedule)))


def simulate(fwd: tuple[float, ...], bwd: tuple[float, ...], send_fwd: tuple[float, ...],
             send_bwd: tuple[float, ...], m: int, schedule: str = "1f1b", record: list | None = None) -> float:
    """Makespan of one pipeline: ``fwd[s]``/``bwd[s]`` per micro-batch, ``send_fwd[s]`` = s -> s+1,
    ``send_bwd[s]`` = s -> s-1 transfer times (0 for the ends). Operations run in the order of
    :func:`positions`; each starts when its stage is free and its input has arrived.

    With ``record`` (a list), every operation is appended to it as it is simulated: ``(stage, kind, chunk,
    micro-batch, start, compute end, send end)`` (chunk 0; each stage's in its order; :mod:`arachne.cost.timeline`
    turns them into events). Off (``None``) it costs one ``is None`` test per operation."""
    S = len(fwd)
    f_done = [[0.0] * m for _ in range(S)]   # arrival time of F(s, j)'s output at stage s+1
    b_done = [[0.0] * m for _ in range(S)]   # arrival time of B(s, j)'s output at stage s-1
    free = [0.0] * S
    last = S - 1
    up, down = range(S), range(last, -1, -1)
    for p, column in enumerate(positions(S, m, schedule)):
        for s in up if p < m else down:
            kind, j = column[s]
            t = free[s]
            if kind == FWD:
                if s:
                    ready = f_done[s - 1][j]
                    if ready > t:
                        t = ready
                if record is not None:
                    record.append((s, FWD, 0, j, t, t + fwd[s], t + fwd[s] + send_fwd[s]))
                t += fwd[s]
                f_done[s][j] = t + send_fwd[s]
                t += send_fwd[s]
            else:
                if s < last:
                    ready = b_done[s + 1][j]
                    if ready > t:
                        t = ready
                if record is not None:
                    record.append((s, BWD, 0, j, t, t + bwd[s], t + bwd[s] + send_bwd[s]))
                t += bwd[s]
                b_done[s][j] = t + send_bwd[s]
                t += send_bwd[s]
            free[s] = t
    return max(free)


def periodic_lengths(num_stages: int, virtual_stages: int = 1) -> tuple[int, int]:
    """The two run lengths (micro-batches) a long schedule is extrapolated from: by the first the timeline is
    periodic (a transient of a few pipeline depths), the second is twice it. An interleaved pipeline's are
    multiples of its stages (it runs micro-batches in groups of S)."""
    S, v = num_stages, virtual_stages
    if v == 1:
        m1 = max(48, 6 * S + 16)
    else:
        m1 = S * max(1, -(-max(48, 6 * S * v + 16) // S))
    return m1, 2 * m1


def pipeline_time(fwd: tuple[float, ...], bwd: tuple[float, ...], send_fwd: tuple[float, ...],
                  send_bwd: tuple[float, ...], m: int, schedule: str = "1f1b") -> float:
    """Makespan for ``m`` micro-batches; long runs extrapolated from the periodic regime."""
    m1, m2 = periodic_lengths(len(fwd))
    if m <= m2:
        return _cached(fwd, bwd, send_fwd, send_bwd, m, schedule)
    t1 = _cached(fwd, bwd, send_fwd, send_bwd, m1, schedule)
    t2 = _cached(fwd, bwd, send_fwd, send_bwd, m2, schedule)
    return t2 + (m - m2) * (t2 - t1) / (m2 - m1)


@lru_cache(maxsize=65536)
def _cached(fwd, bwd, send_fwd, send_bwd, m, schedule) -> float:
    return simulate(fwd, bwd, send_fwd, send_bwd, m, schedule)


def pairs_micro_batches(model, plan) -> bool:
    """Whether ``plan`` pairs micro-batches' forwards and backwards to hide an MoE model's expert all-to-alls
    (``overlap_moe_comm``; on a dense model the flag pairs nothing)."""
    return bool(getattr(plan, "overlap_moe_comm", False)) and model.is_moe


def in_flight(stage: int, num_stages: int, m: int, schedule: str, paired: bool = False, blocks: int = 1) -> float:
    """Micro-batches whose activations a stage holds at its peak. ``paired``: forwards and backwards of different
    micro-batches run together (a plan's ``overlap_moe_comm``, Megatron-Core's combined 1F1B): with pipelining
    the warm-up runs one more forward (one more micro-batch at the peak); without, micro-batch i's forward runs
    block by block beside micro-batch i-1's backward, which frees a block as the forward fills one, so the peak
    is one micro-batch and one block of ``blocks``."""
    if schedule == "gpipe":
        return m
    n = min(num_stages - stage, m)
    if not paired or m < 2:
        return n
    if num_stages == 1:
        return 1 + 1 / max(1, blocks)
    return min(n + 1, m)


# ---- interleaved 1F1B (Megatron's virtual pipeline) ---------------------------------------------

@lru_cache(maxsize=256)
def interleaved_ops(num_stages: int, v: int, m: int) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """Per stage, the ordered (kind, chunk, micro-batch) operations of Megatron-LM's interleaved 1F1B
    (``megatron/core/pipeline_parallel/schedules.py``, forward_backward_pipelining_with_interleaving):
    the k-th forward of a stage runs chunk ``(k // S) % v`` of micro-batch ``(k // (S v)) S + k % S``,
    backwards likewise with the chunks reversed; stage s warms up with ``(S - s - 1) * 2 + (v - 1) * S``
    forwards, then alternates one forward / one backward, then cools down. ``m`` is a multiple of S."""
    S = num_stages
    total = m * v

    def mb(k: int) -> int:
        return (k // (S * v)) * S + k % S

    out = []
    for s in range(S):
        w = min((S - s - 1) * 2 + (v - 1) * S, total)
        fw = [(FWD, (k // S) % v, mb(k)) for k in range(total)]
        bw = [(BWD, v - 1 - (k // S) % v, mb(k)) for k in range(total)]
        ops = fw[:w]
        for i in range(total - w):
            ops.append(fw[w + i])
            ops.append(bw[i])
        ops += bw[total - w:]
        out.append(tuple(ops))
    return tuple(out)


@lru_cache(maxsize=256)
def interleaved_run_order(num_stages: int, v: int, m: int) -> tuple[tuple[int, int, int, int], ...]:
    """Every operation of an interleaved pipeline as ``(stage, kind, chunk, micro-batch)``, in an order in which
    each one's input has already been produced, as :func:`run_order` does for :func:`interleaved_ops`."""
    S, last = num_stages, num_stages - 1
    ops = interleaved_ops(S, v, m)
    f_done = [[[False] * m for _ in range(v)] for _ in range(S)]
    b_done = [[[False] * m for _ in range(v)] for _ in range(S)]
    ptr = [0] * S
    out: list[tuple[int, int, int, int]] = []
    total = sum(len(o) for o in ops)
    while len(out) < total:
        before = len(out)
        for s in range(S):
            o, p = ops[s], ptr[s]
            while p < len(o):
                kind, c, j = o[p]
                if kind == FWD:
                    if (s or c) and not (f_done[s - 1][c][j] if s else f_done[last][c - 1][j]):
                        break
                    f_done[s][c][j] = True
                else:
                    if (s < last or c < v - 1) and not (b_done[s + 1][c][j] if s < last else b_done[0][c + 1][j]):
                        break
                    if not f_done[s][c][j]:  # pragma: no cover - the order above never does this
                        raise RuntimeError("backward before its forward")
                    b_done[s][c][j] = True
                out.append((s, kind, c, j))
                p += 1
            ptr[s] = p
        if len(out) == before:  # pragma: no cover - the schedule is deadlock-free
            raise RuntimeError("interleaved pipeline schedule deadlocked")
    return tuple(out)


def simulate_interleaved(fwd: tuple[tuple[float, ...], ...], bwd: tuple[tuple[float, ...], ...],
                         send_fwd: tuple[tuple[float, ...], ...], send_bwd: tuple[tuple[float, ...], ...],
                         m: int, record: list | None = None) -> float:
    """Makespan of one interleaved pipeline. ``fwd[s][c]``/``bwd[s][c]``: chunk c of stage s per
    micro-batch; ``send_fwd[s][c]``: its output to the next chunk in model order (stage s+1 chunk c, or,
    from the last stage, stage 0 chunk c+1: the transfer that crosses back); ``send_bwd[s][c]``: its input
    gradient to the previous chunk (stage s-1 chunk c, or from stage 0 to stage S-1 chunk c-1). Sends do
    not occupy the sender: Megatron-LM overlaps point-to-point communication with computation in its
    interleaved schedule (``overlap_p2p_comm``, on by default there: isend/irecv posted before the next
    chunk's compute, waited for when its input is needed), so a transfer only delays its receiver.
    Operations run in :func:`interleaved_run_order`. ``record`` as in :func:`simulate`, with the chunk of
    each operation."""
    S, v = len(fwd), len(fwd[0])
    f_done = [[[0.0] * m for _ in range(v)] for _ in range(S)]  # arrival of F(s, c, j)'s output downstream
    b_done = [[[0.0] * m for _ in range(v)] for _ in range(S)]  # arrival of B(s, c, j)'s output upstream
    free = [0.0] * S
    last = S - 1
    for s, kind, c, j in interleaved_run_order(S, v, m):
        t = free[s]
        if kind == FWD:
            if s or c:
                ready = f_done[s - 1][c][j] if s else f_done[last][c - 1][j]
                if ready > t:
                    t = ready
            if record is not None:
                record.append((s, FWD, c, j, t, t + fwd[s][c], t + fwd[s][c] + send_fwd[s][c]))
            t += fwd[s][c]
            f_done[s][c][j] = t + send_fwd[s][c]
        else:
            if s < last or c < v - 1:
                ready = b_done[s + 1][c][j] if s < last else b_done[0][c + 1][j]
                if ready > t:
                    t = ready
            if record is not None:
                record.append((s, BWD, c, j, t, t + bwd[s][c], t + bwd[s][c] + send_bwd[s][c]))
            t += bwd[s][c]
            b_done[s][c][j] = t + send_bwd[s][c]
        free[s] = t
    return max(free)


def interleaved_time(fwd: tuple[tuple[float, ...], ...], bwd: tuple[tuple[float, ...], ...],
                     send_fwd: tuple[tuple[float, ...], ...], send_bwd: tuple[tuple[float, ...], ...],
                     m: int) -> float:
    """Makespan for ``m`` micro-batches (a multiple of S); long runs extrapolated from two shorter
    simulations once periodic, as :func:`pipeline_time` does."""
    m1, m2 = periodic_lengths(len(fwd), len(fwd[0]))
    if m <= m2:
        return _cached_interleaved(fwd, bwd, send_fwd, send_bwd, m)
    t1 = _cached_interleaved(fwd, bwd, send_fwd, send_bwd, m1)
    t2 = _cached_interleaved(fwd, bwd, send_fwd, send_bwd, m2)
    return t2 + (m - m2) * (t2 - t1) / (m2 - m1)


@lru_cache(maxsize=16384)
def _cached_interleaved(fwd, bwd, send_fwd, send_bwd, m) -> float:
    return simulate_interleaved(fwd, bwd, send_fwd, send_bwd, m)


def interleaved_in_flight(stage: int, num_stages: int, v: int, m: int, paired: bool = False) -> tuple[int, ...]:
    """Per chunk, the micro-batches whose activations stage ``stage`` holds at its peak (the end of its
    warm-up plus the first steady forward: ``(S - s - 1) * 2 + (v - 1) * S + 1`` chunk forwards, as
    Megatron's interleaved schedule runs them; the first stage holds the most). ``paired`` (the plan's
    ``overlap_moe_comm``): Megatron-Core's combined 1F1B warms up with one more chunk forward.
    The forwards run in :func:`interleaved_ops`'s order (the k-th runs chunk ``(k // S) % v``), so the count
    reads the first ones off that order, in time independent of ``m``."""
    S = num_stages
    w = min((S - stage - 1) * 2 + (v - 1) * S + 1 + (1 if paired else 0), m * v)
    counts = [0] * v
    for k in range(w):
        counts[(k // S) % v] += 1
    return tuple(counts)
