"""The contract with the LiteLLM proxy, the gateway many companies put before their models,
in front of llama-cpp-python's server (the SmolLM2 weights), on loopback.

LiteLLM is not in relaygraph's environment (its pins conflict with ours): it runs from a
venv of its own, ``$RELAYGRAPH_LITELLM`` (the ``litellm`` command) or
``~/.cache/relaygraph/litellm-venv/bin/litellm``, which ``.ci/run`` makes when it is
missing. A machine without it skips these tests. Several minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._service import stop_process, wait_answering
from .test_model_llama_cpp_server import MODEL_ALIAS, SPEC, UsageProxy, _honest, _llama

pytestmark = pytest.mark.slow

LITELLM_ENV = "RELAYGRAPH_LITELLM"
LITELLM_DEFAULT = Path.home() / ".cache" / "relaygraph" / "litellm-venv" / "bin" / "litellm"
READY_SECONDS = 180
MASTER_KEY = f"sk-{secrets.token_hex(32)}"
"""The proxy's key (it refuses to start without one): the API key relaygraph sends."""


def _litellm() -> Path:
    found = Path(os.environ.get(LITELLM_ENV) or LITELLM_DEFAULT)
    if not found.is_file():
        pytest.skip(f"no LiteLLM proxy at {found} (set {LITELLM_ENV}; .ci/run installs it)")
    return found


@pytest.fixture(scope="module")
def litellm_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """LiteLLM's base URL, ``http://127.0.0.1:<port>/v1``, serving ``smollm2`` from a
    llama-cpp-python server behind it."""
    command = _litellm()
    folder = tmp_path_factory.mktemp("litellm")
    for backend in _llama(tmp_path_factory, None):
        config = folder / "config.yaml"
        config.write_text(
            json.dumps(  # JSON is YAML.
                {
                    "model_list": [
                        {
                            "model_name": MODEL_ALIAS,
                            "litellm_params": {
                                "model": f"openai/{MODEL_ALIAS}",
                                "api_base": backend,
                                "api_key": "none",
                            },
                        }
                    ],
                    "litellm_settings": {"telemetry": False},
                }
            )
        )
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        log = folder / "litellm.log"
        env = {
            **os.environ,
            # The cost map is shipped in the package: no fetch from the internet at start.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_MASTER_KEY": MASTER_KEY,
            "NO_PROXY": "127.0.0.1,localhost",
        }
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(command), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        base_url = f"http://127.0.0.1:{port}/v1"
        try:
            liveliness = f"http://127.0.0.1:{port}/health/liveliness"
            wait_answering(
                process, liveliness, log, seconds=READY_SECONDS, name="litellm", pause=0.5
            )
            yield base_url
        finally:
            stop_process(process, 20)


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", MASTER_KEY)


def test_a_run_through_litellm_records_the_tokens_the_proxy_reported(
    home: Path, litellm_proxy: str, no_proxy_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the 135M model makes of the task (it often ends ``degraded``, its answer
    cut at the token limit), the run ends honestly and the ledger's tokens are the ones
    LiteLLM reported for each call (or marked estimated where it reported none)."""
    from relaygraph.runner import run_task

    counter = UsageProxy(litellm_proxy)
    try:
        monkeypatch.setenv("OPENAI_BASE_URL", counter.url)
        result = run_task("When are checkpoints written?", model=SPEC)
    finally:
        counter.close()
    _honest(result)
    roles = result.usage.values()
    recorded = (sum(u["input_tokens"] for u in roles), sum(u["output_tokens"] for u in roles))
    assert counter.answers > 0
    if counter.unreported == 0:
        assert not any(u["estimated"] for u in roles), result.usage
        assert recorded == (counter.input_tokens, counter.output_tokens)
    else:
        assert any(u["estimated"] for u in roles), (counter.unreported, result.usage)


def test_doctor_through_litellm_sends_empty_content_and_says_why(
    litellm_proxy: str,
    no_proxy_env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """LiteLLM drops ``content: null`` beside tool calls and llama-cpp-python then fails
    with a bare 500: the doctor knows the proxy by its headers, probes with ``""`` and
    recommends ``tool_call_content=empty``; the team can run on it."""
    from relaygraph.cli._doctor import add_doctor_parser
    from relaygraph.models._doctor import run_doctor

    monkeypatch.setenv("OPENAI_BASE_URL", litellm_proxy)
    parser = argparse.ArgumentParser(prog="relaygraph")
    add_doctor_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["doctor", "--model", f"openai:{MODEL_ALIAS}", "--json"])
    code = run_doctor(args)
    report = json.loads(capsys.readouterr().out)
    found = {p["name"]: p for p in report["probes"]}
    assert found["chat"]["status"] == "ok", found
    assert found["tool round trip"]["status"] == "weak", found["tool round trip"]
    assert "behind LiteLLM" in found["tool round trip"]["detail"]
    assert report["options"].get("tool_call_content") == "empty", report
    assert report["usable"] is True and code == 0, report
