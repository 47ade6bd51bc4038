"""Shared pieces of the slow Ray tests: a private local Ray per test module and a tiny model folder.

The local Ray has its own temp dir under pytest's tmp path, ``num_cpus`` set explicitly (logical CPUs: actors
reserve fractions), binds to 127.0.0.1, and is shut down after the module — never ``ray stop``. Its workers get the
repository on PYTHONPATH so they can import the test fakes. Test modules import the fixture functions
(``from tests.rollout.ray_fixtures import local_ray_fixture``); pytest finds them by their names ``local_ray`` and
``tiny_model``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", name="local_ray")
def local_ray_fixture(tmp_path_factory):
    pytest.importorskip("ray")
    from bapsql.rollout.ray_shell import local_ray as start, short_temp_dir

    tmp = short_temp_dir(tmp_path_factory.mktemp("ray"))
    with start(num_cpus=4, temp_dir=tmp, env_vars={"PYTHONPATH": str(REPO)}) as info:
        yield info


@pytest.fixture(scope="module", name="tiny_model")
def tiny_model_fixture(tmp_path_factory) -> Path:
    """The tiny model without pretraining (seconds to build), with room for the L budget's context."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from bapsql.models.tiny import TinySpec, make_tiny_model

    out = tmp_path_factory.mktemp("tiny") / "model"
    make_tiny_model(out, seed=0, spec=TinySpec(max_position_embeddings=16_384))
    return out
