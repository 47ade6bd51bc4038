"""The GRPO stage's parts wired from one training config: `build_grpo` -> `GRPOSetup` (learner, rollouts, trainer,
monitor).

`bapsql.train.recipe.pipeline.run_grpo_stage` and the learning regression slice (`tests/train/learning_slice.py`) both
build their loop here, so the test exercises exactly the wiring the recipe runs:

- the learner: a local `bapsql.train.learner.core.Learner`, or a `RemoteLearner` actor with ``model.remote_learner``;
- the rollouts (`build_rollouts`, which `bapsql.train.experiments.headroom` also uses alone):
  `bapsql.train.loop.rollouts.TrainingRollouts` on Ray actors (``rollout.use_ray``) or in-process, with the HF/vLLM
  engine of `engine_setup.engine_config` serving LoRA adapters of ``base``, the condition's env options and the terse
  or full prompt of ``prompt_style``;
- the trainer: `bapsql.train.loop.overlap.make_trainer` (synchronous, or pipelined at ``grpo.max_staleness > 0``), its
  sync probe rendered with the config's chat-template options;
- the monitor of ``monitor.kind`` (W&B offline when there is no key; ``none`` for tests).

`GRPOSetup.close` closes what was opened (monitor, rollouts' actors, a remote learner), in that order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from bapsql.train.config import TrainConfig
from bapsql.train.loop.engine_setup import engine_config


@dataclass
class GRPOSetup:
    """The parts of one GRPO run; ``trainer`` holds the others too (see the module docstring)."""

    learner: Any
    rollouts: Any
    trainer: Any
    monitor: Any

    def close(self) -> None:
        """Close the monitor, the rollouts and a remote learner (the parts that exist and can close); each runs even
        when one before it raised."""
        _close_all([p for p in (self.monitor, self.rollouts, self.learner) if p is not None and hasattr(p, "close")])


def _close_all(parts: list[Any]) -> None:
    if parts:
        try:
            parts[0].close()
        finally:
            _close_all(parts[1:])


def build_grpo(cfg: TrainConfig, seed: int, *, base: Path, tasks: Sequence[Any], run_dir: Path, run_name: str,
               total_updates: int, monitor_run: str | None = None,
               validation: Sequence[Any] = ()) -> GRPOSetup:
    """Wire the GRPO loop of ``cfg`` (module docstring) training a fresh LoRA on ``base`` over ``tasks``.

    ``run_dir``: the stage's folder (checkpoints, rollout logs with ``rollout.write_trajectories``, the monitor's
    files); ``run_name``: the rollouts' run name in the logs; ``total_updates``: the scheduler's horizon;
    ``monitor_run``: the monitor's run name (default ``run_name``); ``validation``: held-out tasks the rollouts can
    also play by the evaluation's decoding (``TrainingRollouts.validate``, method ``<rollout.method>.val``), for
    `bapsql.train.loop.validation.Validator`."""
    from bapsql.logs.monitor import make_monitor
    from bapsql.models.chat_template import ChatTemplate
    from bapsql.train.learner.weight_sync import make_probe
    from bapsql.train.loop.overlap import make_trainer

    lcfg = cfg.learner_config(base, "grpo", seed=seed, total_steps=max(1, total_updates))
    if cfg.model.remote_learner:
        from bapsql.rollout.ray_shell.learner import RemoteLearner

        learner: Any = RemoteLearner(lcfg, num_gpus=cfg.model.learner_gpus, num_cpus=cfg.model.learner_cpus,
                                     placement_timeout_s=cfg.rollout.placement_timeout_s)
    else:
        from bapsql.train.learner.core import Learner

        learner = Learner(lcfg)
    template_kwargs = dict(cfg.model.chat_template_kwargs)
    monitor = None
    rollouts = None
    try:
        rollouts = build_rollouts(cfg, base=base, tasks=tasks, run_dir=run_dir, run_name=run_name,
                                  validation=validation)
        monitor = make_monitor(cfg.monitor.kind, project=cfg.monitor.project, run_name=monitor_run or run_name,
                               config=dataclasses.asdict(cfg), dir=run_dir)
        trainer = make_trainer(cfg, seed=seed, learner=learner, rollouts=rollouts, tasks=tasks,
                               probe=make_probe(ChatTemplate.from_dir(base), cfg.sync.probe_completion_tokens,
                                                **template_kwargs),
                               run_dir=run_dir, monitor=monitor)
        trainer.total_updates = total_updates  # pipelined rollouts are never generated past the last update
    except BaseException:
        GRPOSetup(learner=learner, rollouts=rollouts, trainer=None, monitor=monitor).close()
        raise
    return GRPOSetup(learner=learner, rollouts=rollouts, trainer=trainer, monitor=monitor)


def build_rollouts(cfg: TrainConfig, *, base: Path, tasks: Sequence[Any], run_dir: Path, run_name: str,
                   validation: Sequence[Any] = ()) -> Any:
    """The `TrainingRollouts` of ``cfg`` (module docstring) serving LoRA adapters of ``base``: the rollout agent
    samples at ``grpo.temperature`` / ``grpo.top_p``; with ``validation`` tasks, an ``eval_agent`` decodes as the
    evaluation does (``eval.temperature``), under the method ``<rollout.method>.val``. `build_grpo` wires these into
    the loop; `bapsql.train.experiments.headroom` plays them without a learner."""
    from bapsql.env.conditions import method_name
    from bapsql.env.records import EnvOptions
    from bapsql.rollout.agent import AgentConfig
    from bapsql.rollout.driver import DriverConfig
    from bapsql.train.loop.rollouts import TrainingRollouts

    r = cfg.rollout
    if r.use_ray:
        from bapsql.rollout.placement import TRAIN_KEYS
        from bapsql.rollout.ray_shell import RayBackend

        backend: Any = RayBackend(placement_timeout_s=r.placement_timeout_s, config_keys=TRAIN_KEYS)
    else:
        from bapsql.rollout.backend import LocalBackend

        backend = LocalBackend()
    template_kwargs = dict(cfg.model.chat_template_kwargs)
    engine = engine_config(cfg, base, lora=True)
    # completions also stop where the engine's window ends (a model window below the largest budget's context)
    agent = AgentConfig(model_dir=str(base), max_tokens=cfg.grpo.max_new_tokens, temperature=cfg.grpo.temperature,
                        top_p=cfg.grpo.top_p, max_model_len=engine.max_model_len, template_kwargs=template_kwargs)
    eval_agent = None
    if validation:
        e = cfg.eval
        eval_agent = AgentConfig(model_dir=str(base), max_tokens=e.max_new_tokens, temperature=e.temperature,
                                 top_p=e.top_p, max_model_len=engine.max_model_len, template_kwargs=template_kwargs)
    return TrainingRollouts(
        backend, run_name=run_name, method=method_name(r.method, cfg.condition), agent=agent,
        engine=engine, tasks=[*tasks, *validation], group_size=cfg.filter.group_size,
        env_workers=max(1, min(r.env_workers, len({t.db_id for t in tasks}))), engine_replicas=r.engine_replicas,
        env_options=EnvOptions(prompt_style=cfg.prompt_style).under(cfg.condition),
        writer_dir=str(run_dir / "rollouts") if r.write_trajectories else None,
        driver_config=DriverConfig(in_flight=r.in_flight), engine_threads=r.engine_threads,
        engine_gpus=r.engine_gpus, worker_cpus=r.env_worker_cpus, env_resources=r.env_resources,
        calibration=cfg.calibration,
        eval_agent=eval_agent, eval_method=method_name(f"{r.method}.val", cfg.condition) if validation else None,
        log_text=r.log_text)
