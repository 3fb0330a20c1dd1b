"""A local OpenAI-compatible chat server for tests: the LLM provider that cannot exist here.

It speaks POST /v1/chat/completions (non-streaming); any other path is a 404, as on a real
server. Like a provider, it can check the key (`key`: a request with another bearer token gets
401) and the model (`models`: another model gets `unknown_model`, vLLM's 404 by default, or
OpenRouter's 400), or refuse every request (`refuse`: e.g. 403). Scripted faults are served
next, in order (a status code with a body, a delay, a raw answer); after them every request
gets `answer(request)`. Every request is recorded, headers included, so tests can assert what
the harness sent and how often.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PICK_PLACE = json.loads((ROOT / "examples/workflows/pick_place/workflow.json").read_text())
STAGES = {"stages": [{"name": "pick", "goal": "grasp the target", "skills": ["pick"]}]}


def reference_answer(request: dict) -> str:
    """The coordinator gets stages; the writer gets the pick_place reference graph."""
    system = request["messages"][0]["content"]
    return json.dumps(STAGES if "You plan robot" in system else PICK_PLACE)


VLLM_NO_MODEL = (404, "The model `{model}` does not exist.")
OPENROUTER_NO_MODEL = (400, "{model} is not a valid model ID")


class ChatDouble:
    def __init__(
        self,
        answer=reference_answer,
        *,
        key: str | None = None,
        models: set[str] | None = None,
        unknown_model: tuple[int, str] = VLLM_NO_MODEL,
        refuse: tuple[int, str] | None = None,
    ):
        self.answer = answer
        self.key, self.models, self.unknown_model = key, models, unknown_model
        self.refuse = refuse
        self.script: list[dict] = []  # {"status": 429, "body": ..., "delay": s, "content": ...}
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with double._lock:
                    double.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body}
                    )
                    refusal = double._refusal(self.path, self.headers, body)
                    step = {} if refusal else (double.script.pop(0) if double.script else {})
                if refusal:
                    status, message = refusal
                    self._send(status, {"error": {"message": message, "code": status}})
                    return
                time.sleep(step.get("delay", 0))
                status = step.get("status", 200)
                if status != 200:
                    payload = {"error": {"message": step.get("body", "scripted failure")}}
                    self._send(status, payload, {"retry-after": "0"})
                    return
                content = step.get("content", None)
                if content is None:
                    content = double.answer(body)
                self._send(
                    200,
                    {
                        "id": "chatcmpl-test",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "test-model"),
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": content},
                            }
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    },
                )

            def _send(self, status, payload, headers=None):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _refusal(self, path: str, headers, body: dict) -> tuple[int, str] | None:
        if path != "/v1/chat/completions":
            return 404, "Not Found"
        if self.key is not None and headers.get("authorization") != f"Bearer {self.key}":
            return 401, "Incorrect API key provided"
        if self.models is not None and body.get("model") not in self.models:
            status, message = self.unknown_model
            return status, message.format(model=body.get("model"))
        return self.refuse

    def __enter__(self) -> ChatDouble:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
