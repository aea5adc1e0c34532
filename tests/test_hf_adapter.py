"""The generic Hugging Face adapter (model=hf): presets, where a model comes from, which models it can drive, text and
image inputs, vision stages, and the session's explicit loop on its models (all local, tiny, CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from transformers import AutoModelForCausalLM, CLIPVisionConfig, MambaConfig, T5Config

from hf_fixtures import (
    LLAVA_IMAGE_TOKENS,
    preset_config,
    save_tiny_causal_lm,
    save_tiny_llava,
    word_tokenizer,
)
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.data.prompts import bundled_prompts_dir
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.flops import count_stage_flops
from llm_perf_opt.session.adapters.hf import HfAdapter, detect_vision_stages
from llm_perf_opt.session.adapters.hf_arch import classify
from llm_perf_opt.session.adapters.hf_inputs import stand_in_ids
from llm_perf_opt.session.adapters.hf_source import hf_label, preset_names
from llm_perf_opt.session.adapters.registry import make_adapter
from llm_perf_opt.session.session import InferenceSession

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

CPU = torch.device("cpu")
QUESTION = bundled_prompts_dir() / "question_short.txt"


def hf_cfg(*overrides: str) -> Any:
    return compose_config("stage1", "model=hf", *overrides).model


def hf_greedy(session: InferenceSession, prepared: Any, new_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = session.model.generate(
            **prepared.model_inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
        )
    return [int(t) for t in out[0, prepared.prompt_tokens :]]


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llava(tmp_path_factory.mktemp("llava"))


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_causal_lm(tmp_path_factory.mktemp("qwen2"))


# ---- presets ------------------------------------------------------------------------------------------------
def test_presets_ship_two_tiny_families_and_real_sizes() -> None:
    assert set(preset_names()) >= {"qwen2_tiny", "llama_tiny", "qwen2_0_5b", "llama3_2_1b"}
    assert {preset_config(p).model_type for p in ("qwen2_tiny", "llama_tiny")} == {"qwen2", "llama"}


@pytest.mark.parametrize(
    ("preset", "parameters"),
    [
        # deepseek-ocr-facts §3.2: 24 Qwen2-0.5B-shaped layers + final norm = 357,898,112; + the 151,936 x 896
        # embedding (the lm_head is tied to it)
        ("qwen2_0_5b", 357_898_112 + 151_936 * 896),
        # Llama-3.2-1B: 16 layers x 60,821,504 + norm 2,048 + the tied 128,256 x 2,048 embedding
        ("llama3_2_1b", 16 * 60_821_504 + 2_048 + 128_256 * 2_048),
    ],
)
def test_real_size_presets_count_their_parameters_on_meta(preset: str, parameters: int) -> None:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(preset_config(preset))
    assert sum(p.numel() for p in model.parameters()) == parameters
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    if preset == "qwen2_0_5b":
        assert layer == 14_912_384 and model.config.tie_word_embeddings


def test_model_name_is_the_preset_or_folder() -> None:
    assert hf_cfg("model.config=qwen2_tiny").name == "qwen2_tiny"
    assert hf_cfg("model.name_or_path=/models/Qwen2.5-0.5B").name == "Qwen2.5-0.5B"
    assert hf_label(None, "/x/my-model/config.json") == "my-model"
    assert hf_label(None, None) == "hf"


# ---- where the model comes from: every problem a UserError before anything is built ---------------------------
@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        ([], ["neither model.name_or_path nor model.config", "qwen2_tiny"]),
        (["model.config=qwen2_tiny", "model.name_or_path=/x"], ["both set"]),
        (["model.config=no_such_preset"], ["no_such_preset", "llama_tiny, qwen2_0_5b"]),
        (["model.name_or_path=Qwen/Qwen2-0.5B"], ["not a local folder", "hf download"]),
        (["model.name_or_path=__EMPTY__"], ["holds no config.json"]),
        (["model.config=__BAD_JSON__"], ["not a readable JSON config"]),
        (["model.config=__NO_TYPE__"], ["has no model_type"]),
        (["model.config=__UNKNOWN_TYPE__"], ["'my_private_lm'", "not known to transformers"]),
        (["model.config=__BAD_VALUES__"], ["not a valid llama config (The hidden size (10) is not a multiple"]),
        (["model.config=qwen2_tiny", "model.tokenizer=/no/such/tok"], ["model.tokenizer=/no/such/tok"]),
    ],
)
def test_bad_sources_are_user_errors(tmp_path: Path, overrides: list[str], needles: list[str]) -> None:
    (tmp_path / "empty").mkdir()
    files = {
        "__BAD_JSON__": "{not json",
        "__NO_TYPE__": json.dumps({"hidden_size": 8}),
        "__UNKNOWN_TYPE__": json.dumps({"model_type": "my_private_lm"}),
        "__BAD_VALUES__": json.dumps({"model_type": "llama", "hidden_size": 10, "num_attention_heads": 3}),
    }
    for key, text in files.items():
        (tmp_path / f"{key}.json").write_text(text)
    resolved = []
    for o in overrides:
        o = o.replace("__EMPTY__", str(tmp_path / "empty"))
        for key in files:
            o = o.replace(key, str(tmp_path / f"{key}.json"))
        resolved.append(o)
    adapter = make_adapter(hf_cfg(*resolved))
    with pytest.raises(UserError) as err:
        _ = adapter.input_kind
    for needle in needles:
        assert needle in str(err.value)


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (MambaConfig(hidden_size=16, num_hidden_layers=1), "recurrent-state model"),
        (T5Config(), "encoder-decoder"),
        (CLIPVisionConfig(), "neither a causal LM nor an image-text-to-text model"),
    ],
)
def test_models_the_loop_cannot_drive_are_refused(config: Any, needle: str) -> None:
    with pytest.raises(UserError) as err:
        classify(config)
    assert needle in str(err.value) and "AutoModelForCausalLM" in err.value.fix


def test_an_undrivable_config_fails_before_building(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba", "hidden_size": 16, "num_hidden_layers": 1}))
    with pytest.raises(UserError, match="Mamba"):
        InferenceSession.load(hf_cfg(f"model.config={path}"), CPU)


# ---- text models ----------------------------------------------------------------------------------------------
def test_stand_in_ids_are_one_per_word_or_mark_within_the_vocabulary() -> None:
    ids = stand_in_ids("Hello, world! Hello", 97, 1)
    assert len(ids) == 1 + 5 and ids[0] == 1 and ids[1] == ids[5] and all(0 <= i < 97 for i in ids)
    assert stand_in_ids("a b", 97, None) == stand_in_ids("a  b", 97, None)


@pytest.mark.parametrize("preset", ["qwen2_tiny", "llama_tiny"])
def test_explicit_loop_matches_generate_on_the_tiny_presets(preset: str) -> None:
    session = InferenceSession.load(hf_cfg(f"model.config={preset}"), CPU)
    assert session.adapter.input_kind == "text" and session.vision_stages == ()
    assert session.loaded.weights == "random" and session.loaded.tokenizer is None
    prepared = session.prepare(QUESTION)
    assert (prepared.image_tokens, prepared.tiles, prepared.views) == (0, 0, ())
    assert prepared.prompt_tokens == 1 + 21  # BOS + 19 words + "," + "?"
    measured = session.run_image(QUESTION, 4)
    assert list(measured.token_ids) == hf_greedy(session, prepared, 4)
    assert measured.prompt_tokens == prepared.prompt_tokens and measured.stage_calls["decode/step"] == 3
    info = session.adapter.describe(session.model)
    assert info.architecture["model_type"] == preset.split("_")[0] and info.architecture["input"] == "text"
    assert info.experts_implementation is None  # dense: no MoE backend to report


def test_checkpoint_folder_loads_with_its_tokenizer(qwen_dir: Path, tmp_path: Path) -> None:
    session = InferenceSession.load(hf_cfg(f"model.name_or_path={qwen_dir}"), CPU)
    assert session.loaded.weights == "checkpoint" and str(qwen_dir) in session.loaded.weights_detail
    assert f"prompts tokenized by {type(session.loaded.tokenizer).__name__} from {qwen_dir}" in (
        session.loaded.weights_detail
    )
    reference = AutoModelForCausalLM.from_pretrained(qwen_dir)
    assert torch.equal(session.model.lm_head.weight, reference.lm_head.weight)
    # transformers picks the tokenizer class by model type (Qwen2Tokenizer, whose byte-level split does not suit the
    # test's word vocabulary): the same word tokenizer from its own folder (model.tokenizer) tokenizes exactly.
    word_tokenizer().save_pretrained(tmp_path)
    session = InferenceSession.load(hf_cfg(f"model.name_or_path={qwen_dir}", f"model.tokenizer={tmp_path}"), CPU)
    prepared = session.prepare(QUESTION)
    tokens = session.loaded.tokenizer.convert_ids_to_tokens(prepared.input_ids[0].tolist())
    assert tokens[:3] == ["<s>", "What", "is"] and "<unk>" not in tokens and tokens[-1] == "?"
    measured = session.run_image(QUESTION, 3)
    assert list(measured.token_ids) == hf_greedy(session, prepared, 3)


def test_random_weights_with_a_tokenizer_folder(tmp_path: Path) -> None:
    word_tokenizer().save_pretrained(tmp_path)
    session = InferenceSession.load(hf_cfg("model.config=qwen2_tiny", f"model.tokenizer={tmp_path}"), CPU)
    assert session.loaded.weights == "random" and "prompts tokenized by" in session.loaded.weights_detail
    assert session.prepare(QUESTION).prompt_tokens == 22  # BOS + 21 words and marks


def test_chat_template_and_truncation() -> None:
    templated = word_tokenizer(chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %} .")
    plain = make_adapter(hf_cfg("model.config=qwen2_tiny"))
    chat = make_adapter(hf_cfg("model.config=qwen2_tiny", "model.preprocess.chat_template=true"))
    short = make_adapter(hf_cfg("model.config=qwen2_tiny", "model.preprocess.max_prompt_tokens=5"))
    assert plain.prepare_file(QUESTION, templated).prompt_tokens == 22  # the template is not used
    ids = chat.prepare_file(QUESTION, templated).input_ids[0].tolist()
    assert templated.convert_ids_to_tokens(ids)[-3:] == ["other", "?", "."]  # the template's trailing "."
    assert short.prepare_file(QUESTION, templated).prompt_tokens == 5


def test_a_prompt_longer_than_the_model_takes_is_a_user_error(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**preset_config("llama_tiny").to_dict(), "max_position_embeddings": 8}))
    adapter = make_adapter(hf_cfg(f"model.config={config}"))
    with pytest.raises(UserError, match=r"has 22 tokens, more than model .* takes \(max_position_embeddings=8\)"):
        adapter.prepare_file(QUESTION, None)


def test_text_models_take_no_images_or_vision_stages() -> None:
    adapter = make_adapter(hf_cfg("model.config=llama_tiny"))
    with pytest.raises(UserError, match="text-only model: it takes text prompts"):
        adapter.prepare(Image.new("RGB", (8, 8)), None)
    configured = make_adapter(hf_cfg("model.config=llama_tiny", "model.vision_stage_modules={enc: model.layers}"))
    with pytest.raises(UserError, match="text-only model without a vision side"):
        configured.stage_modules(torch.nn.Module())


# ---- image-text-to-text models ------------------------------------------------------------------------------------
def test_tiny_llava_runs_with_its_processor_and_vision_stages(llava_dir: Path) -> None:
    session = InferenceSession.load(hf_cfg(f"model.name_or_path={llava_dir}"), CPU)
    assert session.adapter.input_kind == "image"
    assert session.vision_stages == ("vision/encoder", "vision/projector")
    assert isinstance(session.adapter, HfAdapter)
    assert session.adapter.vision_stage_paths(session.model) == {
        "vision/encoder": "model.vision_tower",
        "vision/projector": "model.multi_modal_projector",
    }
    page = Path(llava_dir) / "page.png"
    Image.new("RGB", (120, 90), "white").save(page)
    prepared = session.prepare(page)
    assert prepared.image_tokens == LLAVA_IMAGE_TOKENS and prepared.views == (("image", 32, 32),)
    assert prepared.prompt_tokens == 1 + LLAVA_IMAGE_TOKENS + 4  # BOS, image, "Describe this image ."
    measured = session.run_image(page, 3)
    assert list(measured.token_ids) == hf_greedy(session, prepared, 3)
    assert measured.stage_calls["vision/encoder"] == 1 and measured.stage_calls["vision/projector"] == 1
    assert 0 < measured.stage_ms["vision/encoder"] + measured.stage_ms["vision/projector"] <= measured.prefill_ms
    flops = count_stage_flops(session, prepared)
    assert 0 < flops.vision["vision/projector"] < flops.vision["vision/encoder"] < flops.prefill
    assert session.adapter.analytic_costs(session.model, prepared, 3, 4) is None  # no formula for a VLM
    assert session.adapter.describe(session.model).architecture["text_model_type"] == "llama"


def test_configured_vision_stages_are_checked(llava_dir: Path) -> None:
    model = InferenceSession.load(hf_cfg(f"model.name_or_path={llava_dir}"), CPU).model
    stages = "model.vision_stage_modules={tower: model.vision_tower}"
    ok = make_adapter(hf_cfg(f"model.name_or_path={llava_dir}", stages))
    assert list(ok.stage_modules(model)) == ["vision/tower"]
    bad = make_adapter(hf_cfg(f"model.name_or_path={llava_dir}", "model.vision_stage_modules={x: model.nope}"))
    with pytest.raises(UserError, match=r"'model\.nope', which is no submodule .* top-level modules: model, lm_head"):
        bad.stage_modules(model)
    assert detect_vision_stages(torch.nn.Linear(2, 2)) == {}


def test_a_vlm_without_processor_files_fails_before_building(tmp_path: Path) -> None:
    save_tiny_llava(tmp_path, processor=False)
    with pytest.raises(UserError, match="has no processor files"):
        InferenceSession.load(hf_cfg(f"model.name_or_path={tmp_path}"), CPU)


def test_the_checkpoint_config_name_is_transformers() -> None:
    """hf_source spells transformers' CONFIG_NAME itself, to stay importable without transformers."""
    from transformers.utils import CONFIG_NAME

    from llm_perf_opt.session.adapters import hf_source

    assert hf_source.CONFIG_NAME == CONFIG_NAME
