"""The Ray shell: the ONLY package of bapsql that imports ray.

Everything else (env workers, engines, writer, driver, learner, SFT loop) is plain Python, importable and testable
without Ray; this package wraps it:

- `session`: `local_ray` / `join_ray` / `ray_session` — start a private local Ray or join a cluster, and on exit
  only disconnect (never ``ray stop``);
- `actors`: `RayBackend`, the rollout driver's backend over Ray actors (restarts, node loss → ``Outcome.died``,
  real restart counts);
- `nodes`: placement of actors on nodes (custom resources, spread and kept off the head, pinned to the driver's
  node), the bounded wait for it (`PlacementError` instead of a hang), where they run, and the storage `preflight`
  every cluster job runs at start;
- `learner`: `RemoteLearner`, the learner in an actor on a GPU node (it saves and loads its own checkpoint state);
- `train`: `fit_data_parallel`, Ray Train's `TorchTrainer` around a plain per-worker function (SFT);
- `jobs`: `submit_job` / `load_runtime_env`, jobs sent to a cluster's dashboard.

Importing it imports ray (and so does nothing else in bapsql).
"""

from bapsql.rollout.ray_shell.actors import RayBackend
from bapsql.rollout.ray_shell.jobs import JobOutcome, load_runtime_env, submit_job
from bapsql.rollout.ray_shell.session import join_ray, local_ray, ray_session, short_temp_dir

__all__ = ["JobOutcome", "RayBackend", "join_ray", "load_runtime_env", "local_ray", "ray_session", "short_temp_dir",
           "submit_job"]
