"""The replan-trace benchmark replays the shipped availability traces faithfully."""

from arachne.spec.cluster import cluster_from_dict


def test_trace_replay_follows_the_shipped_availability_trace():
    from benchmarks import replan_trace as mod

    points = mod.load_traces()["a100_trace_original"]["points"]
    segs = mod.spot_segments(seed=3)
    assert [sum(1 for n in nodes if n["gpu"] == "A100-40") for _, nodes in segs] == [n for _, n in points]
    assert all(d > 0 for d, _ in segs)
    for (_, before), (_, after) in zip(segs, segs[1:]):  # a VM that stays keeps its name
        a = {n["name"] for n in before if n["gpu"] == "A100-40"}
        b = {n["name"] for n in after if n["gpu"] == "A100-40"}
        assert a <= b or b <= a
    grow = mod.grow_segments()
    assert [cluster_from_dict({"name": "g", "nodes": n}).num_gpus for _, n in grow] == [128, 320, 512]
