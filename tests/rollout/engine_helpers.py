"""Shared helpers of the engine tests: the tiny model on disk, peft adapters with nonzero B, prompts, and an
OpenAI-compatible HTTP server (127.0.0.1 only, bounded in requests and lifetime) that serves any engine."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

QUESTIONS = (
    "How many singers are there?",
    "List the names of all stadiums with capacity above 5000.",
    "What is the average age of employees in each department?",
    "Which airport has the most flights?",
)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def chat_prompt(question: str) -> str:
    """The chat-formatted prompt text of one user question (Qwen layout)."""
    return (f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


def prompt_ids(model_dir: Path) -> list[list[int]]:
    """Token ids of the chat prompts of `QUESTIONS` (different lengths, so batches need padding)."""
    from bapsql.rollout.engines.codec import ModelCodec

    codec = ModelCodec.from_dir(model_dir)
    return [codec.encode(chat_prompt(q)) for q in QUESTIONS]


def write_lora(model_dir: Path, out_dir: Path, seed: int, rank: int = 8) -> Path:
    """Save a peft LoRA adapter for ``model_dir`` whose A and B matrices are both random (nonzero), so it changes
    the model's outputs. Same seed → same adapter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from bapsql.rollout.engines.codec import quiet_transformers

    with quiet_transformers():
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=LORA_TARGETS, lora_dropout=0.0,
                     init_lora_weights=False, task_type="CAUSAL_LM")
    model = get_peft_model(base, cfg)
    model.save_pretrained(out_dir)
    return out_dir


def add_eos(model_dir: Path, token_id: int) -> None:
    """Make ``token_id`` an extra end-of-sequence token of the model folder (generation_config.json)."""
    path = model_dir / "generation_config.json"
    cfg = json.loads(path.read_text())
    eos = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], list) else [cfg["eos_token_id"]]
    cfg["eos_token_id"] = sorted(set(eos) | {token_id})
    path.write_text(json.dumps(cfg, indent=2))


class EngineServer:
    """Serve ``engine`` as ``POST /v1/completions`` on 127.0.0.1 (a free port), for at most ``max_requests``
    requests and ``lifetime_s`` seconds; then it stops by itself. ``token_prompts`` / ``token_ids`` switch the vLLM
    extensions (token-id prompts, ``return_token_ids``, ``prompt_logprobs``) on or off to mimic other servers."""

    def __init__(self, engine, codec, model_name: str, *, token_prompts: bool = True, token_ids: bool = True,
                 max_requests: int = 200, lifetime_s: float = 120.0):
        self.engine, self.codec, self.model_name = engine, codec, model_name
        self.token_prompts, self.token_ids = token_prompts, token_ids
        self.max_requests = max_requests
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._timer = threading.Timer(lifetime_s, self.stop)
        self._timer.daemon = True

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> "EngineServer":
        self._thread.start()
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._timer.cancel()
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()

    def _complete(self, body: dict) -> tuple[int, dict]:
        from bapsql.rollout.engines.base import SamplingParams

        if body.get("model") != self.model_name:
            return 404, {"error": {"message": f"model {body.get('model')!r} not found"}}
        prompt = body["prompt"]
        if isinstance(prompt, list):
            if not self.token_prompts:
                return 400, {"error": {"message": "prompt must be a string"}}
            ids = [int(t) for t in prompt]
        else:
            ids = self.codec.encode(prompt)
        want_lp = body.get("logprobs") is not None
        sp = SamplingParams(max_tokens=int(body.get("max_tokens", 16)),
                            temperature=float(body.get("temperature", 1)), top_p=float(body.get("top_p", 1)),
                            seed=body.get("seed"), stop=tuple(body.get("stop") or ()), logprobs=True)
        with self._lock:
            gen = self.engine.generate([ids], [sp])[0]
            scored = (self.engine.logprobs_of(ids[:1], ids[1:]) if body.get("prompt_logprobs") is not None
                      and self.token_ids and len(ids) > 1 else None)
        choice: dict = {"index": 0, "text": gen.text, "finish_reason": gen.finish_reason}
        if want_lp:
            toks = [self.codec.decode_raw([t]) for t in gen.completion_ids]
            choice["logprobs"] = {"tokens": toks, "token_logprobs": list(gen.logprobs)}
        if self.token_ids and body.get("return_token_ids"):
            choice["token_ids"] = list(gen.completion_ids)
        if scored is not None:
            choice["prompt_logprobs"] = [None] + [{str(t): {"logprob": lp, "rank": 1}}
                                                  for t, lp in zip(ids[1:], scored)]
        return 200, {"object": "text_completion", "model": self.model_name, "choices": [choice]}

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.requests.append(body)
                    over = len(server.requests) > server.max_requests
                if over or self.path != "/v1/completions":
                    status, payload = (429 if over else 404), {"error": {"message": "unavailable"}}
                else:
                    status, payload = server._complete(body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
