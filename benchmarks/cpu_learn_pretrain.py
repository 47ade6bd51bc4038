"""The pretraining lever of the CPU learning recipe on one training database, with its curve.

    python benchmarks/cpu_learn_pretrain.py --db football --rounds 8 --steps 1400 --out /tmp/cpu_learn_pretrain

Builds augmented tasks of ``--db`` (`bapsql.data.augment`, excluding every `test` question), exports one
whole direct-aggregation episode per task (terse prompt, XS or S, successes only), builds a fresh tiny model
(``--hidden``, 4 layers) and trains all its parameters on those episodes
(`bapsql.train.recipe.pretrain.train_sequences`, batch 8, lr 3e-3 cosine, loss on completion tokens). Every 100 steps
it prints the batch loss and, on up to 32 episodes of the database's *held-out* `test` tasks, the completion NLL per
token and the teacher-forced exact-completion share; every 200 steps it saves a checkpoint (``OUT/ck<step>``).
``OUT/curve.json`` holds the curve.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    import torch
    from transformers import Qwen2ForCausalLM

    from bapsql.data.augment import augment_tasks
    from bapsql.data.tasks import load_tasks, resolve_benchmark
    from bapsql.env.records import EnvOptions
    from bapsql.models.tiny import TinySpec, make_tiny_model
    from bapsql.policies.sft_export import export_sft
    from bapsql.train.recipe.pretrain import read_rows, train_sequences

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default="football")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1400)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--out", default="/tmp/cpu_learn_pretrain")
    a = ap.parse_args()
    root = resolve_benchmark("demo")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    options = EnvOptions(prompt_style="terse")
    test = [t for t in load_tasks(root, "test") if t.db_id == a.db]
    held_path = out / "heldout.parquet"
    if not held_path.is_file():
        export_sft(root, "test", 200, held_path, workflows=("workflow.direct_aggregation",), budgets=("XS", "S"),
                   env_options=options, per_episode=True, tasks=test, only_successes=True)
    corpus = out / "corpus.parquet"
    if not corpus.is_file():
        aug = augment_tasks(root, "train", a.rounds, exclude=load_tasks(root, "test"), db_ids=[a.db])
        t = time.perf_counter()
        res = export_sft(root, "train", int(0.8 * len(aug)), corpus, workflows=("workflow.direct_aggregation",),
                         budgets=("XS", "S"), env_options=options, per_episode=True, tasks=aug, only_successes=True)
        print(f"{len(aug)} augmented tasks -> {res.pairs} episodes in {time.perf_counter() - t:.0f} s", flush=True)
    rows, held = read_rows(corpus), read_rows(held_path)[:32]
    model_dir = out / "model"
    make_tiny_model(model_dir, spec=TinySpec(hidden_size=a.hidden, intermediate_size=3 * a.hidden,
                                             num_heads=a.hidden // 32, num_kv_heads=max(1, a.hidden // 64)))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM.from_pretrained(model_dir)
    pad = json.loads((model_dir / "config.json").read_text())["pad_token_id"]

    def log(point: dict) -> None:
        print(point, flush=True)
        if point["step"] and point["step"] % 200 == 0:
            model.save_pretrained(out / f"ck{point['step']}")

    curve, tokens, seconds = train_sequences(model, rows, steps=a.steps, batch=8, lr=3e-3, seed=0, pad=pad,
                                             heldout=held, log_every=100, on_log=log)
    model.save_pretrained(model_dir)
    (out / "curve.json").write_text(json.dumps(curve, indent=1))
    print(f"{tokens} tokens in {seconds:.0f} s ({tokens / seconds:.0f} tok/s)")


if __name__ == "__main__":
    main()
