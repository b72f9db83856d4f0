"""Plan tables: equal pipelines shown once, pipeline shapes summarised."""

from __future__ import annotations

from rich.console import Console

from arachne.cost import CostModel
from arachne.plan import Pipeline, Plan, Stage
from arachne.report.tables import micro_batch_sizes, pipeline_shapes, stage_table
from arachne.spec.cluster import cluster_from_dict


def render(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_equal_pipelines_are_one_block_of_rows_and_the_shapes_are_counted():
    cl = cluster_from_dict({"name": "t", "nodes": [{"name": "a{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 4}]})
    two = [Pipeline(micro_batches=2, stages=[Stage(layers=(0, 12), devices=(f"a0:{2 * i}",)),
                                             Stage(layers=(12, 24), devices=(f"a0:{2 * i + 1}",))]) for i in range(2)]
    one = Pipeline(micro_batches=4, stages=[Stage(layers=(0, 24), devices=("a1:0", "a1:1"), tp=2)])
    plan = Plan(model="GPT-3-1.3B", global_batch_size=8, sequence_length=1024, micro_batch_size=1,
                pipelines=[*two, one])
    est = CostModel(cl).estimate(plan)
    assert pipeline_shapes(plan) == "2 x 2 + 1 x 1"
    lines = [ln for ln in render(stage_table(plan, est)).splitlines() if "A100" in ln]
    assert len(lines) == 3  # the two equal pipelines once (2 stages), then the tp 2 pipeline
    assert lines[0].split("│")[1].strip() == "0-1" and lines[1].split("│")[1].strip() == ""
    assert lines[2].split("│")[1].strip() == "2"


def test_pipelines_with_their_own_micro_batch_size_are_shown_with_it():
    cl = cluster_from_dict({"name": "t", "nodes": [{"name": "a{i}", "count": 1, "gpu": "A100-40", "gpus_per_node": 4}]})
    pipes = [Pipeline(micro_batches=3, stages=[Stage(layers=(0, 24), devices=(f"a0:{i}",))]) for i in range(2)]
    pipes += [Pipeline(micro_batches=2, micro_batch_size=1, stages=[Stage(layers=(0, 24), devices=(f"a0:{i}",))])
              for i in (2, 3)]
    plan = Plan(model="GPT-3-1.3B", global_batch_size=16, sequence_length=1024, micro_batch_size=2, pipelines=pipes)
    est = CostModel(cl).estimate(plan)
    assert micro_batch_sizes(plan) == "micro-batches of 2 (2 pipelines), 1 (2)"
    lines = [ln for ln in render(stage_table(plan, est)).splitlines() if "A100" in ln]
    assert [ln.split("│")[2].strip() for ln in lines] == ["3 x 2", "2 x 1"]
    assert micro_batch_sizes(plan.model_copy(update={"pipelines": tuple(pipes[:2]), "global_batch_size": 12})) \
        == "micro-batch 2"
