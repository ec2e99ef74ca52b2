"""The official `openai` Python client against a real `tidegate-engine serve` process.

Environment:
  TIDEGATE_ENGINE_BIN   path to the tidegate-engine binary (default: target/debug/tidegate-engine)
  TIDEGATE_TEST_MODEL   model directory to serve; unset → the deterministic fake backend
Run: pip install openai pytest && pytest e2e/test_openai_client.py
"""

import os
import socket
import subprocess
import time
import urllib.request

import pytest
from openai import OpenAI

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("TIDEGATE_ENGINE_BIN", os.path.join(ROOT, "target", "debug", "tidegate-engine"))
MODEL = os.environ.get("TIDEGATE_TEST_MODEL")
READY_TIMEOUT_S = float(os.environ.get("TIDEGATE_READY_TIMEOUT", "300"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def engine():
    port, admin_port = free_port(), free_port()
    args = [BIN, "serve", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}"]
    args += ["--model", MODEL] if MODEL else ["--fake-model"]
    env = dict(os.environ, TIDEGATE_ADMIN_TOKEN="e2e-admin-token")
    proc = subprocess.Popen(args, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode} before becoming ready")
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError("engine not ready in time")
        time.sleep(0.2)
    yield base
    proc.terminate()  # SIGTERM drains, then exits 0
    assert proc.wait(timeout=60) == 0


@pytest.fixture(scope="module")
def client(engine):
    return OpenAI(base_url=f"{engine}/v1", api_key="sk-e2e", max_retries=0, timeout=120)


def model_id(client):
    models = client.models.list().data
    assert models, "the engine lists its model"
    return models[0].id


def test_streams_a_chat_completion(client):
    stream = client.chat.completions.create(
        model=model_id(client),
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=32,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text.strip(), "a non-empty answer"
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens > 0 and usage.prompt_tokens > 0
    if not MODEL:
        assert text == "What is the capital of France?"  # the fake backend echoes


def test_non_streaming_completion(client):
    out = client.completions.create(model=model_id(client), prompt="The tide", max_tokens=8, temperature=0)
    assert out.choices[0].text
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_unknown_model_is_a_clear_error(client):
    import openai

    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert "no-such-model" in str(e.value)
