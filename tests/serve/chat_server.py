"""A scripted OpenAI-compatible chat-completions server on loopback, for fast tests and the serving benchmark.

`ScriptedChatServer(plans)` answers ``POST /v1/chat/completions``: it finds the plan whose key occurs in the
conversation's first user message, counts the assistant messages already in the conversation, and answers that
turn of the plan (tool-call text; `FALLBACK` past the plan's end). ``GET /v1/models`` lists the model. Knobs:
``usage`` (send ``usage`` numbers or not), ``native`` (answer with ``message.tool_calls`` instead of text),
``fail`` (status codes to answer the next requests with, in order, e.g. ``[503, 429]``), ``delay_s`` (sleep
before answering: a stand-in for generation time). Every request body is kept in ``requests``.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FALLBACK = '<tool_call>\n{"name": "abstain", "arguments": {"reason": "no plan for this question"}}\n</tool_call>'


def call(name: str, **arguments) -> str:
    """Tool-call text of one action."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class ScriptedChatServer:
    def __init__(self, plans: dict[str, list[str]], *, model: str = "scripted", usage: bool = True,
                 native: bool = False, delay_s: float = 0.0):
        self.plans, self.model, self.usage, self.native, self.delay_s = plans, model, usage, native, delay_s
        self.fail: list[int] = []
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "ScriptedChatServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, body: dict) -> tuple[int, dict]:
        messages = body.get("messages") or []
        first_user = next((m["content"] for m in messages if m.get("role") == "user"), "")
        turn = sum(m.get("role") == "assistant" for m in messages)
        plan = next((p for key, p in self.plans.items() if key in first_user), [])
        text = plan[turn] if turn < len(plan) else FALLBACK
        message: dict = {"role": "assistant", "content": text}
        if self.native and text.startswith("<tool_call>"):
            call_json = json.loads(text.split("\n", 1)[1].rsplit("\n", 1)[0])
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{turn}", "type": "function",
                 "function": {"name": call_json["name"], "arguments": json.dumps(call_json["arguments"])}}]}
        out = {"id": "chatcmpl-1", "object": "chat.completion", "model": body.get("model"),
               "choices": [{"index": 0, "message": message,
                            "finish_reason": "tool_calls" if self.native else "stop"}]}
        if self.usage:
            out["usage"] = {"prompt_tokens": sum(len(m.get("content") or "") for m in messages) // 4,
                            "completion_tokens": len(text) // 4, "total_tokens": 0}
        return 200, out

    def _handler(self):
        srv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": srv.model, "object": "model"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with srv._lock:
                    srv.requests.append(body)
                    status = srv.fail.pop(0) if srv.fail else None
                if status is not None:
                    self._send(status, {"error": {"message": f"scripted {status}"}}, {"Retry-After": "0"})
                    return
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": "not found"})
                    return
                if srv.delay_s:
                    time.sleep(srv.delay_s)
                self._send(*srv.answer(body))

        return Handler
