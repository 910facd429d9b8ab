"""Local models are offline, and a broken or hostile model directory is one line with a documented code.

* A hub id (from `-m hf:ID`, a checkpoint record's `base_model`, or `--merge`) that is not a
  local directory nor in the local cache is exit 66 naming it, with no request to the hub: a
  logging HTTP server on 127.0.0.1 stands in for the hub (`HF_ENDPOINT`) and must see nothing.
* A corrupt adapter (a truncated safetensors file, a pickle torch's weights-only loader refuses)
  is exit 65, one line naming the file.
* A chat template that Jinja's sandbox refuses (reaching for Python's internals) is exit 65, one
  line naming the model: at load, and when only a later, longer conversation reaches it.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from tests.support.commands import run

pytest.importorskip("torch")
pytest.importorskip("peft")

LOCAL = ["-n", "3", "--rounds", "1", "--episodes", "1", "--memory", "none", "--threads", "1"]
HUB_ID = "some-org/some-model"


class LoggingHub:
    """An HTTP server on 127.0.0.1 that answers 404 to everything and records every request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        log = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                log.append((self.command, self.path))
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_POST = do_PUT = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LoggingHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub(tmp_path):
    """(the logging hub, an environment pointing transformers at it with an empty cache, online)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    with LoggingHub() as server:
        env["HF_ENDPOINT"] = server.url
        env["HF_HOME"] = str(tmp_path / "hf-home")  # an empty cache: nothing to find locally
        env.pop("HF_HUB_CACHE", None)
        env.pop("TRANSFORMERS_CACHE", None)
        yield server, env


def one_line(proc, code: int, *words: str) -> str:
    err = proc.stderr.decode()
    assert proc.returncode == code, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


@pytest.fixture(scope="module")
def adapter(tiny, tmp_path_factory) -> Path:
    """A rank-4 LoRA adapter of the tiny model, saved by peft."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    out = tmp_path_factory.mktemp("adapter") / "a"
    peft_model.save_pretrained(out)
    return out


def fake_adapter(d: Path, base: str) -> Path:
    """An adapter directory whose config names `base` (its weights are never reached)."""
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base, "r": 8, "peft_type": "LORA"}))
    (d / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    return d


# -- offline --------------------------------------------------------------------------------


def test_a_hub_id_is_no_input_and_the_hub_is_never_asked(hub):
    server, env = hub
    proc = run(["dphil-rollout", "-m", f"hf:{HUB_ID}", *LOCAL], env=env)
    one_line(proc, 66, HUB_ID, "downloads nothing")
    assert proc.stdout == b""
    assert server.requests == []


def test_a_checkpoint_record_naming_a_hub_model_makes_no_request(hub, tmp_path):
    server, env = hub
    adapter = fake_adapter(tmp_path / "run" / "0001", HUB_ID)
    ck = tmp_path / "ck.jsonl"
    ck.write_text(json.dumps({"kind": "checkpoint", "run": "r", "step": 1, "path": str(adapter), "base_model": HUB_ID}))
    args = ["-n", "3", "--rounds", "1", "--memory", "none", "--threads", "1"]
    proc = run(["dphil-rollout", "--checkpoints", str(ck), "--seeds", "1", *args], env=env)
    one_line(proc, 66, HUB_ID)
    assert server.requests == []


def test_merging_into_a_hub_base_model_makes_no_request(hub, tmp_path):
    server, env = hub
    adapter = fake_adapter(tmp_path / "run" / "0001", HUB_ID)
    ck = tmp_path / "ck.jsonl"
    rec = {"kind": "checkpoint", "run": "r", "step": 1, "path": str(adapter), "base_model": HUB_ID, "train_reward": 1}
    ck.write_text(json.dumps(rec) + "\n")
    dest = tmp_path / "merged"
    proc = run(["dphil-ckpt-select", str(ck), "--by", "train", "--export", str(dest), "--merge"], env=env)
    one_line(proc, 66, HUB_ID)
    assert server.requests == [] and not dest.exists()


def test_a_local_model_still_loads_offline(hub, tiny, adapter):
    server, env = hub
    proc = run(["dphil-rollout", "-m", f"hf:{tiny}", "--adapter", str(adapter), *LOCAL], env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout)["status"] == "complete"
    assert server.requests == []


# -- corrupt adapters -------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "garbled", "pickle"])
def test_a_corrupt_adapter_is_a_data_error_on_one_line(tiny, adapter, tmp_path, damage):
    bad = tmp_path / damage
    shutil.copytree(adapter, bad)
    weights = bad / "adapter_model.safetensors"
    data = weights.read_bytes()
    if damage == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "garbled":
        weights.write_bytes(b"\xff" * 8 + data[8:])
    else:  # a pickle that is not plain tensors: torch's weights-only loader refuses it
        weights.unlink()
        weights = bad / "adapter_model.bin"
        weights.write_bytes(b"\x80\x04" + b"cos\nsystem\n" * 40)
    proc = run(["dphil-rollout", "-m", f"hf:{tiny}", "--adapter", str(bad), *LOCAL])
    err = one_line(proc, 65, str(weights), "cannot load the adapter")
    assert "weights_only` set to `False`" not in err  # torch's advice to turn the safety off is not relayed


# -- chat templates ---------------------------------------------------------------------------


def with_template(tiny: Path, dest: Path, template: str) -> Path:
    shutil.copytree(tiny, dest)
    jinja = dest / "chat_template.jinja"
    if jinja.exists():
        jinja.write_text(template)
    else:
        cfg_path = dest / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["chat_template"] = template
        cfg_path.write_text(json.dumps(cfg))
    return dest


ESCAPE = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
PLAIN = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_a_chat_template_the_sandbox_refuses_is_a_data_error(tiny, tmp_path):
    evil = with_template(tiny, tmp_path / "evil", ESCAPE + PLAIN)
    proc = run(["dphil-rollout", "-m", f"hf:{evil}", *LOCAL])
    one_line(proc, 65, str(evil), "chat template", "sandbox")
    assert proc.stdout == b""


def test_a_template_that_escapes_only_later_in_a_conversation_is_caught_then(tiny, tmp_path):
    # Harmless on the short conversation checked at load; reaches for internals from the 6th message.
    late = with_template(tiny, tmp_path / "late", "{% if messages|length > 5 %}" + ESCAPE + "{% endif %}" + PLAIN)
    args = ["-n", "3", "--rounds", "4", "--episodes", "1", "--memory", "full", "--threads", "1"]
    proc = run(["dphil-rollout", "-m", f"hf:{late}", *args])
    one_line(proc, 65, str(late), "sandbox")
