"""Pipeline schedules simulated as a timeline of stages x micro-batches.

Each stage runs its operations in schedule order (1F1B: warm-up forwards, then one forward /
one backward, then cool-down backwards; GPipe: all forwards, then all backwards). An operation
starts when its stage is free and its input has arrived; sending the output to the neighbour
stage occupies the sender (blocking point-to-point, as in Megatron/DeepSpeed). Long runs are
extrapolated from two shorter simulations once the timeline is periodic, which it is after a
transient of a few pipeline depths (checked against full simulation in the tests).
"""

from __future__ import annotations

from functools import lru_cache

FWD, BWD = 0, 1


@lru_cache(maxsize=4096)
def stage_ops(num_stages: int, m: int, schedule: str) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per stage, the ordered (kind, micro-batch) operations."""
    out = []
    for s in range(num_stages):
        if schedule == "gpipe":
            ops = [(FWD, j) for j in range(m)] + [(BWD, j) for j in range(m)]
        else:
            w = min(num_stages - s - 1, m)
            ops = [(FWD, j) for j in range(w)]
            for i in range(m - w):
                ops.append((FWD, w + i))
                ops.append((BWD, i))
            ops += [(BWD, j) for j in range(m - w, m)]
        out.append(tuple(ops))
    return tuple(out)


def simulate(fwd: tuple[float, ...], bwd: tuple[float, ...], send_fwd: tuple[float, ...],
             send_bwd: tuple[float, ...], m: int, schedule: str = "1f1b") -> float:
    """Makespan of one pipeline: ``fwd[s]``/``bwd[s]`` per micro-batch, ``send_fwd[s]`` = s -> s+1,
    ``send_bwd[s]`` = s -> s-1 transfer times (0 for the ends)."""
    S = len(fwd)
    ops = stage_ops(S, m, schedule)
    f_done = [[-1.0] * m for _ in range(S)]   # arrival time of F(s, j)'s output at stage s+1
    b_done = [[-1.0] * m for _ in range(S)]   # arrival time of B(s, j)'s output at stage s-1
    free = [0.0] * S
    ptr = [0] * S
    remaining = sum(len(o) for o in ops)
    last = S - 1
    while remaining:
        progressed = False
        for s in range(S):
            o = ops[s]
            p = ptr[s]
            t = free[s]
            fs, bs = fwd[s], bwd[s]
            sf, sb = send_fwd[s], send_bwd[s]
            fd_prev = f_done[s - 1] if s else None
            bd_next = b_done[s + 1] if s < last else None
            fd_s, bd_s = f_done[s], b_done[s]
            n = len(o)
            while p < n:
                kind, j = o[p]
                if kind == FWD:
                    if s:
                        ready = fd_prev[j]
                        if ready < 0:
                            break
                        if ready > t:
                            t = ready
                    t += fs
                    fd_s[j] = t + sf
                    t += sf
                else:
                    if s < last:
                        ready = bd_next[j]
                        if ready < 0:
                            break
                        if ready > t:
                            t = ready
                    t += bs
                    bd_s[j] = t + sb
                    t += sb
                p += 1
            if p != ptr[s]:
                remaining -= p - ptr[s]
                ptr[s] = p
                free[s] = t
                progressed = True
        if not progressed:  # pragma: no cover - schedules above are deadlock-free
            raise RuntimeError("pipeline schedule deadlocked")
    return max(free)


def pipeline_time(fwd: tuple[float, ...], bwd: tuple[float, ...], send_fwd: tuple[float, ...],
                  send_bwd: tuple[float, ...], m: int, schedule: str = "1f1b") -> float:
    """Makespan for ``m`` micro-batches; long runs extrapolated from the periodic regime."""
    S = len(fwd)
    m1 = max(48, 6 * S + 16)
    m2 = 2 * m1
    if m <= m2:
        return _cached(fwd, bwd, send_fwd, send_bwd, m, schedule)
    t1 = _cached(fwd, bwd, send_fwd, send_bwd, m1, schedule)
    t2 = _cached(fwd, bwd, send_fwd, send_bwd, m2, schedule)
    return t2 + (m - m2) * (t2 - t1) / (m2 - m1)


@lru_cache(maxsize=65536)
def _cached(fwd, bwd, send_fwd, send_bwd, m, schedule) -> float:
    return simulate(fwd, bwd, send_fwd, send_bwd, m, schedule)


def in_flight(stage: int, num_stages: int, m: int, schedule: str) -> int:
    """Micro-batches whose activations a stage holds at its peak."""
    if schedule == "gpipe":
        return m
    return min(num_stages - stage, m)
