"""Where a pretrained tiny model's copies go wrong: two teacher-forced copy measures on held-out episodes.

    python benchmarks/copy_measures.py --heldout RUN/cpu-learn-seed0/pretrain/heldout.parquet MODEL_DIR [MODEL_DIR ...]

On the first ``--limit`` episodes of ``--heldout`` (a recipe run's `pretrain/heldout.parquet`: whole episodes of
real `train` tasks the pretraining corpus never saw), one forward pass each, argmax at every position:
- question -> SQL: each quoted value of the prompt (the tokens between `` '`` and a token starting with ``'``)
  that a completion repeats inside quotes; exact when every one of its tokens is the argmax;
- result -> answer: each number of >= 2 digit tokens in the final completion (the answer) that a tool response
  shows; exact likewise;
plus `bapsql.train.recipe.pretrain.heldout_metrics` (completion NLL per token, token accuracy, exact completions).
"""

from __future__ import annotations

import argparse


def quoted_spans(texts: list[str], ids: list[int], stop: int, max_len: int = 8) -> list[tuple[int, int]]:
    out = []
    for k in range(stop - 1):
        if texts[ids[k]] == " '":
            for e in range(k + 1, min(k + 2 + max_len, stop)):
                if texts[ids[e]].startswith("'"):
                    if e > k + 1:
                        out.append((k + 1, e))
                    break
    return out


def digit_runs(texts: list[str], ids: list[int]) -> list[tuple[int, int]]:
    out, a = [], None
    for k, t in enumerate(ids):
        if texts[t].isdigit() and len(texts[t]) == 1:
            a = k if a is None else a
        elif a is not None:
            out.append((a, k))
            a = None
    return out + ([(a, len(ids))] if a is not None else [])


def measure(model_dir: str, rows: list[dict]) -> dict:
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from bapsql.train.recipe.pretrain import heldout_metrics

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = tok.batch_decode([[i] for i in range(len(tok))])
    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    q_ok = q_n = a_ok = a_n = 0
    with torch.no_grad():
        for r in rows:
            ids, mask = r["input_ids"], r["loss_mask"]
            pred = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
            right = lambda a, b: all(pred[k - 1] == ids[k] for k in range(a, b))  # noqa: E731
            first = mask.index(1)
            copied = {tuple(ids[a:b]) for a, b in quoted_spans(texts, ids, len(ids)) if mask[a] == 1}
            for a, b in quoted_spans(texts, ids, first):
                if tuple(ids[a:b]) in copied:
                    for c, d in quoted_spans(texts, ids, len(ids)):
                        if mask[c] == 1 and ids[c:d] == ids[a:b]:
                            q_n += 1
                            q_ok += right(c, d)
            start = max(k for k in range(len(mask)) if mask[k] == 1)
            while start > 0 and mask[start - 1] == 1:
                start -= 1
            runs = digit_runs(texts, ids)
            shown = {tuple(ids[a:b]) for a, b in runs if mask[a] == 0}
            for a, b in runs:
                if a >= start and b - a >= 2 and tuple(ids[a:b]) in shown:
                    a_n += 1
                    a_ok += right(a, b)
    m = heldout_metrics(model, rows, pad=model.config.pad_token_id)
    return {"model": model_dir, "question_to_sql": [q_ok, q_n], "result_to_answer": [a_ok, a_n],
            "nll": round(m["nll"], 4), "token_acc": round(m["token_acc"], 4), "exact": round(m["exact"], 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="model folders (e.g. RUN/cpu-learn-seed0/pretrain/model)")
    ap.add_argument("--heldout", required=True, help="a recipe run's pretrain/heldout.parquet")
    ap.add_argument("--limit", type=int, default=64)
    args = ap.parse_args()
    import torch

    from bapsql.train.recipe.pretrain import read_rows

    torch.set_num_threads(1)
    rows = read_rows(args.heldout)[:args.limit]
    print("| model | question -> SQL values exact | result -> answer numbers exact | NLL | exact |")
    print("|---|---|---|---|---|")
    for path in args.models:
        m = measure(path, rows)
        q, a = m["question_to_sql"], m["result_to_answer"]
        print(f"| {path} | {q[0]}/{q[1]} | {a[0]}/{a[1]} | {m['nll']} | {m['exact']} |", flush=True)


if __name__ == "__main__":
    main()
