"""The pure parts of actor placement (`bapsql.rollout.placement`): keeping env workers off the head, the message of
an actor no node places, and the tensor-parallel GPU check of sweep and training configs."""

from __future__ import annotations

import pytest

from bapsql.errors import ConfigError
from bapsql.rollout.placement import (SWEEP_KEYS, TRAIN_KEYS, NodeOffer, avoid_head, check_engine_gpus,
                                      describe_node, fits, placement_message, usable)

HEAD = NodeOffer("h" * 56, "head-host", True, {"CPU": 1.0, "memory": 1e9, "node:__internal_head__": 1.0},
                 {"CPU": 0.0})
W1 = NodeOffer("a" * 56, "w1", False, {"CPU": 2.0, "object_store_memory": 1e8, "node:10.0.0.2": 1.0}, {"CPU": 1.0})
W2 = NodeOffer("b" * 56, "w2", False, {"CPU": 2.0, "GPU": 1.0, "env_node": 2.0}, {"CPU": 2.0, "GPU": 1.0,
                                                                                 "env_node": 2.0})


def test_env_workers_asking_only_for_cpus_stay_off_the_head_of_a_multi_node_cluster():
    assert avoid_head({"CPU": 1.0, "GPU": 0.0}, [HEAD, W1, W2]) == HEAD.node_id
    assert avoid_head({"CPU": 1.0}, [HEAD]) is None  # one node: the head is all there is
    assert avoid_head({"CPU": 1.0}, [W1, W2]) is None  # no head among the nodes (e.g. a head-less view)
    assert avoid_head({"CPU": 4.0}, [HEAD, W1]) is None  # no other node could ever host one: no use avoiding it


def test_custom_resources_decide_by_themselves():
    """Env workers asking for a custom resource go where it is: a head that offers it was meant to host them, a head
    that does not never gets one anyway — no extra constraint either way."""
    head_with_env = NodeOffer(HEAD.node_id, "head-host", True, {"CPU": 4.0, "env_node": 4.0})
    assert avoid_head({"CPU": 1.0, "env_node": 1.0}, [head_with_env, W2]) is None
    assert avoid_head({"CPU": 1.0, "env_node": 1.0}, [HEAD, W2]) is None


def test_usable_resources_and_fits():
    assert usable(HEAD.total) == {"CPU": 1.0}
    assert fits({"CPU": 2.0, "GPU": 0.0}, W1.total) and not fits({"CPU": 2.0, "GPU": 1.0}, W1.total)
    assert fits({"CPU": 0.0, "env_node": 1.0}, W2.total) and not fits({"env_node": 1.0}, W1.total)


def test_the_placement_message_names_actor_asks_nodes_and_keys():
    msg = placement_message("env/3", {"CPU": 3.0, "GPU": 0.0}, "spread across nodes and kept off the head hhhhhhhh",
                            [HEAD, W1, W2], SWEEP_KEYS, 60.4, others=["env/2"])
    assert msg.startswith("actor env/3 was not placed on any node within 60 s (also unplaced: env/2): "
                          "it asks for CPU 3, spread across nodes and kept off the head hhhhhhhh.")
    assert "hhhhhhhh (head, head-host): CPU 1 (0 free)" in msg
    assert "aaaaaaaa (w1): CPU 2 (1 free)" in msg and "memory" not in msg and "node:" not in msg
    assert "bbbbbbbb (w2): CPU 2 (2 free), GPU 1 (1 free), env_node 2 (2 free)" in msg
    assert "workers.env_worker_cpus / workers.env_resources" in msg and "workers.placement_timeout_s" in msg
    learner = placement_message("learner", {"CPU": 1.0, "GPU": 2.0}, "on any node", [HEAD], TRAIN_KEYS, 61)
    assert "model.learner_gpus" in learner and "rollout.placement_timeout_s" in learner
    assert "CPU 1, GPU 2, on any node" in learner


def test_describe_node_without_resources():
    assert describe_node(NodeOffer("c" * 56, "x", False, {"memory": 1.0})) == "cccccccc (x): no resources"


@pytest.mark.parametrize("gpus,tp", [(0.0, 1), (0.5, 1), (1.0, 1), (2.0, 2), (4.0, 4)])
def test_engine_gpus_that_fit_the_tensor_parallel_size_pass(gpus, tp):
    check_engine_gpus(gpus, tp, ("workers.engine_gpus", "engines.q.tensor_parallel_size"))


@pytest.mark.parametrize("gpus,tp,fix", [(1.0, 2, "workers.engine_gpus: 2 (or engines.q.tensor_parallel_size: 1)"),
                                         (0.0, 2, "workers.engine_gpus: 2 (or engines.q.tensor_parallel_size: 1)"),
                                         (2.0, 1, "workers.engine_gpus: 1 (or engines.q.tensor_parallel_size: 2)")])
def test_engine_gpus_that_differ_from_the_tensor_parallel_size_are_refused_with_the_fix(gpus, tp, fix):
    with pytest.raises(ConfigError, match="must be equal") as err:
        check_engine_gpus(gpus, tp, ("workers.engine_gpus", "engines.q.tensor_parallel_size"))
    assert str(err.value).endswith(f"Set {fix}")


def test_sweep_and_training_configs_refuse_a_tensor_parallel_mismatch_at_load(tmp_path):
    from bapsql.experiment import ExperimentConfig, WorkersConfig, validate
    from bapsql.train.config import RolloutSection

    engines = {"q": {"kind": "vllm", "model": str(tmp_path), "tensor_parallel_size": 2, "max_model_len": 12288}}
    cfg = ExperimentConfig(run="tp", methods=("model:q",), engines=engines, workers=WorkersConfig(engine_gpus=1.0))
    with pytest.raises(ConfigError, match=r"Set workers.engine_gpus: 2 \(or engines.q.tensor_parallel_size: 1\)"):
        validate(cfg)
    validate(ExperimentConfig(run="tp", methods=("model:q",), engines=engines, workers=WorkersConfig(engine_gpus=2.0)))
    with pytest.raises(ConfigError, match="rollout.engine_gpus: 2"):
        RolloutSection(engine={"kind": "vllm", "tensor_parallel_size": 2}, engine_gpus=1.0)
    RolloutSection(engine={"kind": "hf"}, engine_gpus=2.0)  # not vLLM: no tensor parallelism to match
    assert RolloutSection(env_resources={"env_node": 1.0}).env_resources == {"env_node": 1.0}
    with pytest.raises(ConfigError, match="rollout.env_resources.CPU"):
        RolloutSection(env_resources={"CPU": 1.0})
    with pytest.raises(ConfigError, match="placement_timeout_s"):
        WorkersConfig(placement_timeout_s=0)
