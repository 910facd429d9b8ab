"""A peft adapter written for llama.cpp: the file's contents, what is refused, and the real effect.

The file tests read the written GGUF back with `gguf`'s reader. The real-model tests train
nothing: they give Gemma 3 270M a random adapter with peft, and check that llama.cpp, given the
converted file, moves the next-token distribution the way torch does with the adapter itself.
"""

from __future__ import annotations

import json
import statistics
import urllib.request
from pathlib import Path

import pytest

from dphil.io.errors import DataError, NoInputError

np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from dphil.serving.lora_gguf import write_lora_gguf  # noqa: E402

MODULES = {"self_attn.q_proj": (64, 64), "mlp.down_proj": (64, 96)}  # (out, in)


def peft_dir(path: Path, *, rank: int = 4, alpha: float = 8.0, layers: int = 2, **config) -> Path:
    """A peft save_pretrained directory in Qwen2's naming, with seeded random A and B."""
    rng = np.random.default_rng(0)
    tensors = {}
    for i in range(layers):
        for module, (out, inp) in MODULES.items():
            stem = f"base_model.model.model.layers.{i}.{module}"
            tensors[f"{stem}.lora_A.weight"] = rng.standard_normal((rank, inp)).astype("float32")
            tensors[f"{stem}.lora_B.weight"] = rng.standard_normal((out, rank)).astype("float32")
    path.mkdir()
    safetensors_numpy.save_file(tensors, str(path / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "bias": "none", **config}
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    return path


def read_back(path: Path) -> tuple[dict, dict]:
    reader = gguf.GGUFReader(str(path))
    fields = {}
    for key in ("general.architecture", "general.type", "adapter.type", "adapter.lora.alpha"):
        f = reader.fields[key]
        value = f.parts[f.data[0]]
        fields[key] = bytes(value).decode() if f.types[0] == gguf.GGUFValueType.STRING else float(value[0])
    return fields, {t.name: np.array(t.data) for t in reader.tensors}


def test_every_a_and_b_under_the_base_gguf_names_with_alpha(tmp_path):
    adapter = peft_dir(tmp_path / "adapter")
    out = write_lora_gguf(adapter, tmp_path / "a.gguf", architecture="qwen2")
    fields, tensors = read_back(out)
    assert fields == {
        "general.architecture": "qwen2",
        "general.type": "adapter",
        "adapter.type": "lora",
        "adapter.lora.alpha": 8.0,
    }
    assert set(tensors) == {
        f"blk.{i}.{name}.weight.lora_{ab}" for i in range(2) for name in ("attn_q", "ffn_down") for ab in "ab"
    }
    source = safetensors_numpy.load_file(str(adapter / "adapter_model.safetensors"))
    # llama.cpp wants A as [r, in] and B as [out, r], as peft stores them: copied, not transposed.
    np.testing.assert_array_equal(
        tensors["blk.1.ffn_down.weight.lora_a"], source["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"]
    )
    np.testing.assert_array_equal(
        tensors["blk.0.attn_q.weight.lora_b"], source["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "adapter"]  # no temporary left


def test_rslora_scale_is_written_as_the_alpha_llama_cpp_divides_by_r(tmp_path):
    # peft scales by alpha / sqrt(r) with rsLoRA; llama.cpp by alpha / r: alpha' = alpha * sqrt(r).
    adapter = peft_dir(tmp_path / "adapter", rank=4, alpha=8.0, use_rslora=True)
    fields, _ = read_back(write_lora_gguf(adapter, tmp_path / "a.gguf", architecture="qwen2"))
    assert fields["adapter.lora.alpha"] == pytest.approx(16.0)


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"use_dora": True}, "DoRA"),
        ({"rank_pattern": {"q_proj": 2}}, "per-module ranks"),
        ({"modules_to_save": ["lm_head"]}, "modules saved whole"),
        ({"bias": "all"}, "trains biases"),
        ({"peft_type": "IA3"}, "not LoRA"),
    ],
)
def test_what_llama_cpp_cannot_compute_is_65_and_nothing_written(tmp_path, config, says):
    adapter = peft_dir(tmp_path / "adapter", **config)
    with pytest.raises(DataError, match=says) as e:
        write_lora_gguf(adapter, tmp_path / "a.gguf", architecture="qwen2")
    assert e.value.exit_code == 65 and str(adapter) in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]


def test_an_a_without_its_b_and_a_foreign_tensor_are_65(tmp_path):
    adapter = peft_dir(tmp_path / "adapter")
    weights = adapter / "adapter_model.safetensors"
    tensors = safetensors_numpy.load_file(str(weights))
    del tensors["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"]
    safetensors_numpy.save_file(tensors, str(weights))
    with pytest.raises(DataError, match=r"blk\.0\.ffn_down\.weight has no lora_b"):
        write_lora_gguf(adapter, tmp_path / "a.gguf", architecture="qwen2")
    tensors["base_model.model.model.layers.0.mlp.down_proj.bias"] = np.zeros(4, dtype="float32")
    safetensors_numpy.save_file(tensors, str(weights))
    with pytest.raises(DataError, match="not a LoRA A or B weight"):
        write_lora_gguf(adapter, tmp_path / "a.gguf", architecture="qwen2")


def test_no_adapter_is_66_and_damaged_weights_65(tmp_path):
    with pytest.raises(NoInputError, match="not a peft adapter directory") as e:
        write_lora_gguf(tmp_path, tmp_path / "a.gguf", architecture="qwen2")
    assert e.value.exit_code == 66
    adapter = peft_dir(tmp_path / "adapter")
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(DataError, match="cannot read the adapter weights"):
        write_lora_gguf(adapter, tmp_path / "a.gguf", architecture="qwen2")
    assert not (tmp_path / "a.gguf").exists()


# -- the real model: llama.cpp with the file against torch with the adapter ------------------------


def next_token_logprobs_llamacpp(gguf_path: Path, ids: list[int], lora: Path | None) -> dict[int, float]:
    """Top next-token log-probabilities from llama.cpp's server, before sampling."""
    from dphil.serving.processes import llamacpp_server

    with llamacpp_server(gguf_path, threads=2, lora=lora) as server:
        body = {"prompt": ids, "n_predict": 1, "n_probs": 40, "temperature": 0, "cache_prompt": False}
        req = urllib.request.Request(
            server.url.removesuffix("/v1") + "/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as resp:
            out = json.load(resp)
    return {p["id"]: p["logprob"] for p in out["completion_probabilities"][0]["top_logprobs"]}


@pytest.fixture(scope="module")
def random_adapter(real_model, tmp_path_factory):
    """(GGUF, transformers dir, adapter dir, prompt ids, torch's base and adapted log-probabilities)."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    import transformers

    gguf_path, hf_dir = real_model
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, local_files_only=True)
    ids = tok("You are philosopher 2 of five. Your left fork is free. You", add_special_tokens=True)["input_ids"]

    def logprobs(m):
        with torch.no_grad():
            return torch.log_softmax(m(torch.tensor([ids])).logits[0, -1].float(), -1)

    base = logprobs(model)
    torch.manual_seed(0)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: no effect to compare
            p.data.normal_(0, 0.05)
    adapted = logprobs(model)
    adapter = tmp_path_factory.mktemp("adapter") / "step-0001"
    model.save_pretrained(str(adapter))
    return gguf_path, hf_dir, adapter, ids, base, adapted


@pytest.mark.real_model
def test_llama_cpp_with_the_file_moves_the_distribution_as_torch_with_the_adapter(random_adapter, tmp_path):
    from dphil.serving.llamacpp import gguf_architecture

    gguf_path, _, adapter, ids, base, adapted = random_adapter
    arch, _ = gguf_architecture(gguf_path)
    lora = write_lora_gguf(adapter, tmp_path / "adapter.gguf", architecture=arch)
    plain = next_token_logprobs_llamacpp(gguf_path, ids, None)
    with_lora = next_token_logprobs_llamacpp(gguf_path, ids, lora)
    common = [i for i in plain if i in with_lora]
    assert len(common) >= 10
    torch_shift = [float(adapted[i] - base[i]) for i in common]
    llama_shift = [with_lora[i] - plain[i] for i in common]
    # The adapter's effect is large against the quantised base's own error, and the same in both.
    quantisation = statistics.mean(abs(float(adapted[i]) - with_lora[i]) for i in common)
    assert statistics.mean(map(abs, torch_shift)) > 3 * quantisation
    assert statistics.correlation(torch_shift, llama_shift) > 0.9


EMBEDDED_GEMMA = """
[models.gemma-embedded]
model = "hosted_vllm/gemma-3-270m"
local = "gemma-3-270m"
tools = false
timeout = 600
params = { max_tokens = 8, temperature = 0.0 }
"""


@pytest.mark.real_model
def test_rollout_plays_an_embedded_model_with_the_adapter_and_records_it(random_adapter, tmp_path):
    from tests.serving.test_embedded import server_pids, started
    from tests.support.commands import run

    _, _, adapter, *_ = random_adapter
    reg = tmp_path / "reg.toml"
    reg.write_text(EMBEDDED_GEMMA)
    args = ["dphil-rollout", "-m", "gemma-embedded", "--models", str(reg), "-n", "2", "--rounds", "1"]
    args += ["--concurrency", "2"]  # two slots: the server starts in seconds
    r = run([*args, "--episodes", "1", "--adapter", str(adapter), "--prompt", "minimal"], timeout=900)
    assert r.returncode == 0, r.stderr.decode()
    assert f"applying the adapter {adapter}".encode() in r.stderr
    _, port = started(r.stderr)
    assert server_pids(port) == []
    (episode,) = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    assert episode["status"] == "complete" and episode["adapter"] == str(adapter)
    assert episode["usage"]["calls"] == 2 and all("raw" in t for t in episode["turns"])


@pytest.mark.real_model
def test_an_adapter_of_another_model_is_65_before_any_server(random_adapter):
    from tests.support.commands import run

    _, _, adapter, *_ = random_adapter
    r = run(["dphil-rollout", "-m", "qwen2.5-0.5b", "--adapter", str(adapter), "--episodes", "1"], timeout=300)
    assert r.returncode == 65, r.stderr.decode()
    assert b"which is not qwen2.5-coder-0.5b-instruct" in r.stderr
    assert b"starting llama.cpp" not in r.stderr


def test_an_adapter_trained_on_another_conversion_is_65_before_anything_is_written(tmp_path):
    from dphil.serving import catalogue, weights
    from dphil.serving.embedded import adapter_for

    qwen = catalogue.find("qwen2.5-coder-0.5b-instruct")
    base = tmp_path / "gemma-3-270m"
    base.mkdir()
    (base / weights.MARKER).write_text(json.dumps({"gguf_sha256": catalogue.find("gemma-3-270m").sha256}))
    adapter = peft_dir(tmp_path / "adapter", base_model_name_or_path=str(base))
    with pytest.raises(DataError, match=f"trained on {base}, which is not {qwen.name}"):
        adapter_for(qwen, tmp_path / "absent.gguf", adapter, tmp_path / "a.gguf")
    assert not (tmp_path / "a.gguf").exists()
