"""The model-backed post-hoc controller (bapsql/rollout/posthoc_engine.py) with a scripted engine and a real one."""

from __future__ import annotations

import pytest

from bapsql.env.posthoc import ResultShape
from bapsql.models.chat_template import ChatTemplate
from bapsql.rollout.engines.base import Generation
from bapsql.rollout.posthoc_engine import EngineController, shape_prompt
from bapsql.tokens import DEFAULT_TOKENIZER_DIR

SHAPE = ResultShape(600, ("id", "name"), 6, 6, 4200, 35, 70, "result_tokens")


class _Says:
    def __init__(self, template, text):
        self.template, self.text, self.prompts = template, text, []

    def generate(self, prompts, params, *, adapter=None):
        self.prompts.append(self.template.decode(list(prompts[0])))
        ids = tuple(self.template.encode(self.text))
        return [Generation(tuple(prompts[0]), ids, self.text, None, "stop")]


@pytest.fixture
def people_task(tmp_path):
    from bapsql.types import Task
    from tests.env.people_db import build_people_db

    db = build_people_db(tmp_path / "people.sqlite")
    return Task(task_id="p1", db_id="people", db_path=str(db), question="How many people are there?",
                gold_sql="SELECT count(*) FROM person")


@pytest.fixture(scope="module")
def template():
    return ChatTemplate.from_dir(DEFAULT_TOKENIZER_DIR)


def test_the_prompt_states_the_shape_and_the_answer_is_parsed(template):
    engine = _Says(template, "Profile.")
    ctl = EngineController(engine, template)
    choice = ctl.choose(SHAPE)
    assert choice.control == "profile" and choice.prompt_tokens > 20 and choice.completion_tokens >= 1
    assert "600 rows x 2 columns" in engine.prompts[0] and "allowance: 70" in engine.prompts[0]
    assert shape_prompt(SHAPE) in engine.prompts[0] and ctl.unparsed == 0


def test_an_answer_naming_no_control_falls_back(template):
    ctl = EngineController(_Says(template, "I am not sure"), template)
    assert ctl.choose(SHAPE).control == "truncate" and ctl.unparsed == 1
    with pytest.raises(ValueError, match="fallback"):
        EngineController(None, template, fallback="shrug")


def test_the_prompt_is_rendered_with_the_engines_chat_template_options(tmp_path):
    """Qwen3 with thinking off: the controller's prompt ends in the empty think block, as the engine's other prompts
    do; without the options the model would open a think block and name no control within ``max_tokens``."""
    from tests.models.chat_families import make_family_dir

    template = ChatTemplate.from_dir(make_family_dir(tmp_path, "qwen3"))
    engine = _Says(template, "limit")
    ctl = EngineController(engine, template, template_kwargs={"enable_thinking": False})
    assert ctl.choose(SHAPE).control == "limit"
    assert engine.prompts[0].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    EngineController(engine, template).choose(SHAPE)
    assert engine.prompts[1].endswith("<|im_start|>assistant\n")  # the template's default: no block


@pytest.mark.slow
def test_a_real_engine_controls_an_episode(tmp_path, people_task):
    """The tiny model (untrained) behind the HF engine decides the control of a real episode; its tokens are
    charged as controller tokens whatever it says."""
    pytest.importorskip("torch")
    from bapsql.budgets import get_budget
    from bapsql.env.actions import ExecuteQuery, render_action
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.env.records import EnvOptions
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.engines.factory import make_engine
    from bapsql.models.tiny import TinySpec, make_tiny_model
    from bapsql.tokens import load_token_counter

    model = make_tiny_model(tmp_path / "tiny", seed=0, spec=TinySpec(max_position_embeddings=4096)).out_dir
    engine = make_engine(EngineConfig(kind="hf", model=str(model), max_model_len=4096, num_threads=1))
    try:
        ctl = EngineController(engine, ChatTemplate.from_dir(model))
        env = BudgetedSQLEnv(token_counter=load_token_counter("default"), options=EnvOptions().under("adaptive_posthoc"),
                             controller=ctl)
        env.reset(people_task, get_budget("XS"))
        r = env.step(render_action(ExecuteQuery("SELECT * FROM person")))
        assert ctl.calls == 1 and r.info["posthoc"] in ("pass", "truncate", "limit", "profile")
        assert env.ledger.controller_tokens > 20 and env.ledger.feasible
    finally:
        engine.close()
