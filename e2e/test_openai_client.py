"""The official `openai` Python client against a real `tidegate-engine serve` process.

Environment:
  TIDEGATE_ENGINE_BIN   path to the tidegate-engine binary (default: target/debug/tidegate-engine)
  TIDEGATE_TEST_MODEL   model directory to serve; unset → the deterministic fake backend
Run: pip install openai pytest && pytest e2e/test_openai_client.py
"""

import hashlib
import json
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
    yield {"base": base, "admin": f"http://127.0.0.1:{admin_port}"}
    proc.terminate()  # SIGTERM drains, then exits 0
    assert proc.wait(timeout=60) == 0


@pytest.fixture(scope="module")
def client(engine):
    return OpenAI(base_url=f"{engine['base']}/v1", api_key="sk-e2e", max_retries=0, timeout=120)


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


def push_policy(engine, policy):
    req = urllib.request.Request(
        f"{engine['admin']}/admin/v1/policy",
        data=json.dumps(policy).encode(),
        method="PUT",
        headers={"authorization": "Bearer e2e-admin-token", "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 204


def test_paused_admission_is_a_clear_refusal_for_new_tenants(engine, client):
    import openai

    digest = lambda key: hashlib.sha256(key.encode()).hexdigest()  # noqa: E731
    policy = {
        "tierPolicy": {
            "tiers": [
                {"name": "enterprise", "priority": 100, "admission": {"pausable": False}},
                {"name": "free", "priority": 1},
            ],
            "defaultTier": "free",
        },
        "apiKeys": [
            {"keySha256": digest("sk-new"), "tenant": "new-tenant", "tier": "free"},
            {"keySha256": digest("sk-old"), "tenant": "old-tenant", "tier": "free"},
            {"keySha256": digest("sk-ent"), "tenant": "ent-tenant", "tier": "enterprise"},
        ],
        "admission": {"state": "PausedNewTenants", "pausedTiers": ["free", "enterprise"],
                      "retryAfterSeconds": 17, "reason": "pool at its ceiling"},
        "admittedTenants": ["old-tenant"],
    }
    push_policy(engine, policy)
    try:
        base = f"{engine['base']}/v1"
        msg = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.APIStatusError) as e:
            OpenAI(base_url=base, api_key="sk-new", max_retries=0).chat.completions.create(
                model=model_id(client), messages=msg, max_tokens=4)
        assert e.value.status_code == 503
        assert e.value.response.headers["retry-after"] == "17"
        assert e.value.body["type"] == "new_tenant_admission_paused"
        for key in ("sk-old", "sk-ent"):
            out = OpenAI(base_url=base, api_key=key, max_retries=0).chat.completions.create(
                model=model_id(client), messages=msg, max_tokens=4)
            assert out.choices[0].message.content
    finally:
        push_policy(engine, {})
