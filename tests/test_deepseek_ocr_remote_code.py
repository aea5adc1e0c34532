"""`model.trust_remote_code=true`: the checkpoint folder's own modeling code runs behind the session's interface.

The vendor's code needs transformers 4.46, so a stand-in "vendor" module with the vendor's forward signature
(``images=[(crops, global)]``, ``images_seq_mask``, ``images_spatial_crop``) and submodule names
(``model.sam_model``, ``model.vision_model``, ``model.projector``) is written into a checkpoint folder with an
``auto_map``, as on the hub.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from llm_perf_opt.config_data import plain
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.timing import StageRecorder
from llm_perf_opt.session.adapters.deepseek_ocr import VendorModel
from llm_perf_opt.session.session import DeepSeekOCRSession

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

VENDOR_CODE = textwrap.dedent(
    """
    import torch
    from transformers import PreTrainedConfig, PreTrainedModel

    from llm_perf_opt.models.deepseek_ocr.configuration import DeepseekOcrConfig
    from llm_perf_opt.models.deepseek_ocr.modeling import DeepseekOcrForConditionalGeneration


    class StandInOcrConfig(PreTrainedConfig):
        model_type = "stand_in_deepseek_ocr"

        def __init__(self, architecture=None, **kwargs):
            self.architecture = architecture or {}
            super().__init__(**kwargs)


    class StandInOcrForCausalLM(PreTrainedModel):
        config_class = StandInOcrConfig
        base_model_prefix = "model"
        _supports_sdpa = True

        def __init__(self, config):
            super().__init__(config)
            ours = DeepseekOcrForConditionalGeneration(DeepseekOcrConfig.from_architecture(config.architecture))
            self.model, self.lm_head = ours.model, ours.lm_head
            self.image_token_id = ours.config.image_token_id
            self.post_init()

        def _init_weights(self, module):
            pass

        def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None, images=None,
                    images_seq_mask=None, images_spatial_crop=None, return_dict=True):
            self.calls.append({"images": images is not None, "grid": None if images_spatial_crop is None
                               else images_spatial_crop.tolist()})
            embeds = self.model.language_model.embed_tokens(input_ids)
            if images is not None:
                crops, global_view = images[0]
                local = crops if bool(crops.abs().sum() != 0) else None
                features = self.model.image_features(global_view, local, images_spatial_crop[0].tolist())
                embeds = embeds.masked_scatter(images_seq_mask.unsqueeze(-1), features)
            out = self.model.language_model(inputs_embeds=embeds, attention_mask=attention_mask,
                                            past_key_values=past_key_values, use_cache=use_cache)
            from transformers.modeling_outputs import CausalLMOutputWithPast
            return CausalLMOutputWithPast(logits=self.lm_head(out.last_hidden_state),
                                          past_key_values=out.past_key_values)

        calls = []
    """
)


@pytest.fixture(scope="module")
def vendor_folder(tmp_path_factory: pytest.TempPathFactory, compose_model: Any) -> Path:
    """A checkpoint folder whose config.json points AutoModel at the stand-in vendor module."""
    folder = tmp_path_factory.mktemp("vendor_ckpt")
    (folder / "modeling_stand_in.py").write_text(VENDOR_CODE)
    arch = plain(compose_model("model=deepseek_ocr_tiny").architecture)
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("modeling_stand_in", folder / "modeling_stand_in.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["modeling_stand_in"] = module
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.StandInOcrForCausalLM(module.StandInOcrConfig(architecture=arch))
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {
        "AutoConfig": "modeling_stand_in.StandInOcrConfig",
        "AutoModel": "modeling_stand_in.StandInOcrForCausalLM",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def vendor_session(vendor_folder: Path, compose_model: Any) -> DeepSeekOCRSession:
    cfg = compose_model("model=deepseek_ocr_tiny", f"model.path={vendor_folder}", "model.trust_remote_code=true")
    return DeepSeekOCRSession.load(cfg, torch.device("cpu"))


def test_vendor_code_is_loaded_and_wrapped(vendor_session: DeepSeekOCRSession) -> None:
    assert isinstance(vendor_session.model, VendorModel)
    assert type(vendor_session.model.inner).__name__ == "StandInOcrForCausalLM"
    assert "vendor's own code" in vendor_session.loaded.weights_detail
    assert vendor_session.vision_stages == ("vision/sam", "vision/clip", "vision/projector")


def test_vendor_inputs_and_stages(vendor_session: DeepSeekOCRSession, page_images: dict[str, Path]) -> None:
    inner: Any = vendor_session.model.inner
    inner.calls.clear()
    measured = vendor_session.run_image(page_images["a4"], 3, nvtx=False)
    # prefill gets the views in the vendor's format, the decode steps only ids and the cache
    assert inner.calls[0] == {"images": True, "grid": [[2, 3]]}
    assert [c["images"] for c in inner.calls[1:]] == [False, False]
    assert measured.image_tokens == 903
    for stage in ("vision/sam", "vision/clip", "vision/projector"):
        assert measured.stage_calls[stage] == 2


def test_vendor_code_gives_the_same_tokens_as_this_implementation(
    vendor_session: DeepSeekOCRSession, page_images: dict[str, Path], compose_model: Any
) -> None:
    """The same weights run by the stand-in vendor code and by the wrapper's own path agree token for token."""
    prepared = vendor_session.prepare(page_images["small"])
    recorder = StageRecorder(torch.device("cpu"), nvtx=False)
    through_vendor = vendor_session.generate(prepared, 4, recorder)
    inner: Any = vendor_session.model.inner
    ours = DeepSeekOCRSession.load(compose_model("model=deepseek_ocr_tiny"), torch.device("cpu"))
    ours.model.model.load_state_dict(inner.model.state_dict())
    ours.model.lm_head.load_state_dict(inner.lm_head.state_dict())
    assert ours.generate(prepared, 4, recorder) == through_vendor


def test_vendor_code_failure_is_one_user_error(tmp_path: Path, compose_model: Any) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": "missing_module.Model"}}))
    cfg = compose_model("model=deepseek_ocr_tiny", f"model.path={tmp_path}", "model.trust_remote_code=true")
    with pytest.raises(UserError, match=r"trust_remote_code=true.*transformers 4\.46"):
        DeepSeekOCRSession.load(cfg, torch.device("cpu"))


def test_vendor_code_has_no_static_cache(vendor_session: DeepSeekOCRSession) -> None:
    from llm_perf_opt.session.runtime import RuntimeSettings

    with pytest.raises(UserError, match=r"runtime\.kv_cache=static is not supported.*vendor's own code") as info:
        vendor_session.with_runtime(RuntimeSettings(kv_cache="static"))
    assert "runtime.kv_cache=dynamic" in info.value.fix
