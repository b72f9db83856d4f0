"""The network model (arachne/cost/network.py): properties that hold on any cluster (hypothesis), and the
NCCL behaviours it prices, each against the figure its source states."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost.calibration import NetworkCalibration
from arachne.cost.network import Network, nic_efficiency
from arachne.errors import InputError
from arachne.spec.cluster import cluster_from_dict

CAL = NetworkCalibration()
GPUS = ["A100-SXM4-40GB", "H100-SXM5-80GB", "V100-SXM2-16GB", "RTX-3090", "L40S"]
NETS = [None, "infiniband", "roce", "efa", "ethernet"]


def cluster(gpu: str, nodes: int, per_node: int, gbps: float = 50.0, network: str | None = None):
    g = {"name": "n{i}" if nodes > 1 else "n0", "count": nodes, "gpu": gpu, "gpus_per_node": per_node,
         "inter_node_gbps": gbps}
    if network:
        g["network"] = network
    return cluster_from_dict({"name": "t", "nodes": [g]})


def devices(cl, per_node: int | None = None) -> list[str]:
    return [f"{n.name}:{i}" for n in cl.nodes for i in range(per_node or n.num_gpus)]


shapes = st.tuples(st.sampled_from(GPUS), st.integers(1, 4), st.integers(1, 8), st.floats(1.0, 400.0),
                   st.sampled_from(NETS))


# ---- properties ----------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(shapes, st.floats(1e3, 1e10), st.floats(1.01, 10.0), st.integers(1, 4))
def test_times_grow_with_bytes(shape, nbytes, factor, concurrent):
    gpu, nodes, per, gbps, net_kind = shape
    cl = cluster(gpu, nodes, per, gbps, net_kind)
    net, devs = Network(cl, CAL), devices(cl)
    for f in (net.all_reduce_time, net.all_gather_time, net.reduce_scatter_time, net.all_to_all_time):
        a, b = f(devs, nbytes, concurrent), f(devs, nbytes * factor, concurrent)
        assert b >= a >= 0
        if len(devs) > 1:
            assert b > a
    a = net.p2p_time([devs[0]], [devs[-1]], nbytes)
    assert net.p2p_time([devs[0]], [devs[-1]], nbytes * factor) > a > 0


@settings(max_examples=60, deadline=None)
@given(shapes, st.floats(1e6, 1e11))
def test_never_faster_than_the_links_line_rate(shape, nbytes):
    """algbw of an all-reduce (NVLS and tree included) and a send never exceed the slowest hop's line rate: the
    intra-node line rate per direction where a node holds 2+ members, the NIC line rate across nodes."""
    gpu, nodes, per, gbps, net_kind = shape
    cl = cluster(gpu, nodes, per, gbps, net_kind)
    net, devs = Network(cl, CAL), devices(cl)
    if len(devs) < 2:
        return
    line = float("inf")
    n0 = cl.nodes[0]
    if per > 1:
        line = min(line, (n0.intra_node_gbps or n0.gpu.intra_node_gbps) / 2 * 1e9, n0.intra_node_bw / 0.7)
    if nodes > 1:
        line = min(line, n0.inter_node_bw)
    assert nbytes / net.all_reduce_time(devs, nbytes) <= line * (1 + 1e-9)
    ring = net.all_reduce_time(devs, nbytes, algorithm="ring")
    n = len(devs)
    assert 2 * (n - 1) / n * nbytes / ring <= line * (1 + 1e-9)  # the ring's busbw
    if nodes > 1:
        assert nbytes / net.p2p_time([devs[0]], [devs[-1]], nbytes) <= n0.per_flow_bw * (1 + 1e-9)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(GPUS), st.integers(2, 8), st.integers(2, 4), st.floats(0.01, 1.0), st.sampled_from(NETS),
       st.floats(1e5, 1e10))
def test_spreading_members_over_nodes_never_helps(gpu, members, nodes, share, net_kind, nbytes):
    """The same members on one node vs spread over several nodes of the same type whose NIC is no faster than
    one GPU's intra-node link: never faster spread."""
    one = cluster(gpu, 1, members)
    many = cluster(gpu, nodes, members, share * one.nodes[0].intra_node_bw / 1e9, net_kind)
    spread = [f"n{i % nodes}:{i // nodes}" for i in range(members)]
    t_one = Network(one, CAL).all_reduce_time(devices(one), nbytes)
    t_many = Network(many, CAL).all_reduce_time(spread, nbytes)
    assert t_many >= t_one * (1 - 1e-12)
    assert Network(many, CAL).all_gather_time(spread, nbytes) >= Network(one, CAL).all_gather_time(devices(one), nbytes)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(GPUS), st.integers(2, 4), st.integers(1, 8), st.floats(0.2, 0.95), st.floats(1e6, 1e10))
def test_a_more_efficient_fabric_is_never_slower(gpu, nodes, per, eff, nbytes):
    cl = cluster(gpu, nodes, per, 100.0, "efa")
    lo = Network(cl, dataclasses.replace(CAL, efa_nic_efficiency=eff))
    hi = Network(cl, dataclasses.replace(CAL, efa_nic_efficiency=min(1.0, eff + 0.05)))
    devs = devices(cl)
    assert hi.all_reduce_time(devs, nbytes) <= lo.all_reduce_time(devs, nbytes)
    assert hi.all_to_all_time(devs, nbytes) <= lo.all_to_all_time(devs, nbytes)


# ---- the NCCL behaviours, against their sources ------------------------------------------------------------------
def busbw_ar(t: float, n: int, nbytes: float) -> float:
    return nbytes / t * 2 * (n - 1) / n / 1e9


def test_nvls_on_an_hgx_h100_board_and_the_ring_below_five_gpus():
    cl = cluster("H100-SXM5-80GB", 1, 8)
    net = Network(cl, CAL)
    S = 4 * 2**30
    assert busbw_ar(net.all_reduce_time(devices(cl), S), 8, S) == pytest.approx(480, rel=0.02)   # nccl-tests#212
    assert busbw_ar(net.all_reduce_time(devices(cl), S, algorithm="ring"), 8, S) == pytest.approx(360, rel=0.01)
    four = devices(cl)[:4]
    assert net.all_reduce_time(four, S) == net.all_reduce_time(four, S, algorithm="ring")    # nccl#1455


def test_nvls_check_on_h800_not_a_record():
    """8x H800 (NVLink 400 GB/s): NVLS all-reduce busbw 215 GB/s (NVIDIA/nccl#1374); no size given, so not a record."""
    cl = cluster("H800-SXM5-80GB", 1, 8)
    S = 8 * 2**30
    assert busbw_ar(Network(cl, CAL).all_reduce_time(devices(cl), S), 8, S) == pytest.approx(215, rel=0.05)


def test_no_nvls_on_a100_or_pcie_boards():
    for gpu in ("A100-SXM4-40GB", "H100-PCIE-80GB", "L40S"):
        cl = cluster(gpu, 1, 8)
        net = Network(cl, CAL)
        assert net.rates["n0"].nvls == 0
        assert net.all_reduce_time(devices(cl), 1e9) == net.all_reduce_time(devices(cl), 1e9, algorithm="ring")


def test_two_node_tree_beats_the_nic_rate_and_the_ring_does_not():
    """p4d-like 2x8 A100 on EFA 400 Gb/s: the tree's busbw exceeds the NIC's effective rate (NCCL on two nodes,
    nccl-tests#196); the ring's equals it; three nodes use the ring."""
    S = 2**30
    two = cluster("A100-SXM4-40GB", 2, 8, 50.0, "efa")
    net = Network(two, CAL)
    nic = 50 * CAL.efa_nic_efficiency
    assert busbw_ar(net.all_reduce_time(devices(two), S, algorithm="ring"), 16, S) == pytest.approx(nic, rel=0.01)
    assert busbw_ar(net.all_reduce_time(devices(two), S), 16, S) > 1.8 * nic
    three = cluster("A100-SXM4-40GB", 3, 8, 50.0, "efa")
    n3 = Network(three, CAL)
    assert n3.all_reduce_time(devices(three), S) == n3.all_reduce_time(devices(three), S, algorithm="ring")


def test_pipelined_ring_is_paced_by_the_slowest_hop_not_the_sum_of_phases():
    """Ring all-reduce over 3x8 H100 on 8x400G IB: busbw = min(NVLink ring rate, NIC share), not the sum of an
    intra-node and an inter-node phase."""
    cl = cluster("H100-SXM5-80GB", 3, 8, 400.0, "infiniband")
    S = 8 * 2**30
    bus = busbw_ar(Network(cl, CAL).all_reduce_time(devices(cl), S, algorithm="ring"), 24, S)
    assert bus == pytest.approx(min(360, 400 * CAL.infiniband_nic_efficiency), rel=0.02)  # latency: ~1%


def test_all_to_all_across_nodes_runs_at_one_nic_per_gpu():
    """'Alltoall cannot aggregate the bandwidth of multiple NICs' (nccl-tests#267): 2x8 H100 with 8 NICs of
    50 GB/s, half the bytes stay on the node over NVLink at the same time."""
    cl = cluster("H100-SXM5-80GB", 2, 8, 400.0, "roce")
    S = 2**30
    t = Network(cl, CAL).all_to_all_time(devices(cl), S)
    per_gpu_nic = 50e9 * CAL.roce_nic_efficiency
    lat = CAL.a2a_base_latency_inter_s + 15 * CAL.a2a_peer_latency_inter_s
    assert t == pytest.approx(S / 2 / per_gpu_nic + lat, rel=1e-9)


def test_fabric_kind_sets_the_nic_efficiency_and_the_document_field():
    assert nic_efficiency(CAL, None) == CAL.unspecified_nic_efficiency
    assert nic_efficiency(CAL, "efa") == CAL.efa_nic_efficiency
    ib, efa = cluster("A100-SXM4-40GB", 3, 8, 50.0, "infiniband"), cluster("A100-SXM4-40GB", 3, 8, 50.0, "efa")
    assert Network(efa, CAL).all_reduce_time(devices(efa), 1e9) > Network(ib, CAL).all_reduce_time(devices(ib), 1e9)
    assert efa.to_spec()["nodes"][0]["network"] == "efa"
    assert cluster_from_dict(efa.to_spec()).nodes[0].network == "efa"
    with pytest.raises(InputError) as e:
        cluster("A100-SXM4-40GB", 2, 8, 50.0, "token-ring")
    assert "network" in str(e.value)


def test_sharded_optimizer_sync_is_priced_as_rings():
    """ZeRO's reduce-scatter + all-gather are rings: on two nodes they cannot use the all-reduce's tree, so the
    sync of a zero_stage-1 plan is slower than the same plan's all-reduce sync; it is the ring's time for the
    fp32 gradients' reduce-scatter (half of an fp32 ring all-reduce) plus the bf16 parameters' all-gather
    (half of a bf16 one)."""
    from arachne.cost import CostModel
    from arachne.plan import Pipeline, Plan, Stage
    from arachne.spec.model import model_catalog

    cl = cluster("A100-SXM4-40GB", 2, 8, 50.0, "efa")
    stage = Stage(layers=(0, 24), devices=tuple(devices(cl)), tp=1)
    plan = Plan(model="GPT-3-1.3B", global_batch_size=64, sequence_length=2048, micro_batch_size=4,
                pipelines=(Pipeline(micro_batches=1, stages=(stage,)),))
    zero = plan.model_copy(update={"zero_stage": 1})
    model = model_catalog().get("GPT-3-1.3B")
    cm = CostModel(cl)
    t_ar, t_zero = cm._sync(model, plan)[0], cm._sync(model, zero)[0]
    assert t_zero > 1.2 * t_ar
    grads = sum(model.block_params(i) for i in range(24)) + model.embedding_params(1) + model.head_params(1)
    want = 0.75 * Network(cl, CAL).all_reduce_time(devices(cl), grads * 4, algorithm="ring")
    assert t_zero == pytest.approx(want, rel=1e-9)


# ---- all-gather / reduce-scatter, send/recv, all-to-all inside a node, NVLS by generation ---------------------
def busbw_half(t: float, n: int, nbytes: float) -> float:
    return nbytes / t * (n - 1) / n / 1e9


def test_all_gather_and_reduce_scatter_are_one_ring_phase_and_nvls_is_slower():
    """8x H100: all-gather / reduce-scatter busbw is the NVLink ring rate (~360 GB/s, nccl#1047, #1506); pinned NVLS
    moves the whole size one way (sjeaugey, nccl#1083): busbw 7/8 of it (~315; ~300 reported in nccl#1506), so
    NCCL's default stays the ring. A board without NVLS ignores the pin."""
    cl = cluster("H100-SXM5-80GB", 1, 8)
    net, devs, S = Network(cl, CAL), devices(cl), 8 * 2**30
    for op in (net.all_gather_time, net.reduce_scatter_time):
        ring, nvls = op(devs, S), op(devs, S, algorithm="nvls")
        assert busbw_half(ring, 8, S) == pytest.approx(360, rel=0.01)
        assert busbw_half(nvls, 8, S) == pytest.approx(360 * 7 / 8, rel=0.01)
        assert nvls > ring
    assert net.all_reduce_time(devs, S, algorithm="ring") == pytest.approx(2 * net.all_gather_time(devs, S), rel=1e-3)
    a100 = cluster("A100-SXM4-40GB", 1, 8)
    na = Network(a100, CAL)
    assert na.all_gather_time(devices(a100), S, algorithm="nvls") == na.all_gather_time(devices(a100), S)


def test_send_recv_inside_a_node_runs_at_the_p2p_share_and_across_nodes_on_one_nic():
    """Send/recv is one link: inside a node NCCL's p2p channels reach ``p2p_intra_share`` of the ring's NVLink
    bandwidth (8x A100 send/recv 195 of 243 GB/s); across nodes, one NIC's share (24.2 GB/s of a 25 GB/s
    Slingshot NIC, nccl#1272)."""
    S = 2**30
    one = cluster("A100-SXM4-40GB", 1, 8)
    t = Network(one, CAL).p2p_time(["n0:0"], ["n0:1"], S)
    assert t == pytest.approx(CAL.intra_node_latency_s + S / (one.nodes[0].intra_node_bw * CAL.p2p_intra_share))
    two = cluster("H100-SXM5-80GB", 2, 8, 400.0, "infiniband")
    t2 = Network(two, CAL).p2p_time(["n0:0"], ["n1:0"], S)
    assert t2 == pytest.approx(CAL.inter_node_latency_s + S / (50e9 * CAL.infiniband_nic_efficiency))
    # an intra-node collective ring is not affected by the p2p share
    slow = dataclasses.replace(CAL, p2p_intra_share=0.5)
    assert Network(one, slow).all_reduce_time(devices(one), S) == Network(one, CAL).all_reduce_time(devices(one), S)
    assert Network(one, slow).p2p_time(["n0:0"], ["n0:1"], S) > t


def test_all_to_all_inside_a_node_runs_at_the_p2p_share():
    """One node: each member sends (n-1)/n of its buffer over NVLink at NCCL's p2p share, so busbw is that share
    of the ring rate (GB200 all-to-all 615-662 of 720 GB/s, OCI quick start)."""
    cl = cluster("H100-SXM5-80GB", 1, 8)
    S = 8 * 2**30
    t = Network(cl, CAL).all_to_all_time(devices(cl), S)
    assert busbw_half(t, 8, S) == pytest.approx(360 * CAL.p2p_intra_share, rel=0.01)


def test_nvls_on_blackwell_is_scaled_by_nccls_own_efficiency_ratio():
    """NCCL's tuning model gives NVLS an efficiency of 0.85 on Hopper and 0.74 on Blackwell (nvlsEfficiency): the
    H100-derived algbw/line ratio is scaled by 0.74/0.85 on B200; Hopper keeps the maintainer's figure."""
    h, b = Network(cluster("H100-SXM5-80GB", 1, 8), CAL), Network(cluster("B200", 1, 8), CAL)
    assert h.rates["n0"].nvls == pytest.approx(CAL.nvls_algbw_over_line * 450e9)
    assert b.rates["n0"].nvls == pytest.approx(CAL.nvls_algbw_over_line * 900e9 * 0.74 / 0.85)
    cl = cluster("B200", 1, 8)
    S = 8 * 2**30
    # ~830 GB/s busbw reported for 8x B200 all-reduce (NVIDIA/nccl#1807; no size given, so a check, not a record)
    assert busbw_ar(b.all_reduce_time(devices(cl), S), 8, S) == pytest.approx(830, rel=0.05)
