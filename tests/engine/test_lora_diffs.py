"""LoRA files in Wan's original layer names with whole-tensor differences (``.diff``, ``.diff_b``, ``diff_m``,
``head.modulation.diff``), and Wan2.2-Lightning's two-expert files, against the same changes merged by hand.

The audit's method: the LoRA's changes are merged by hand into the transformer's own tensors (each factor pair as
W + strength x alpha / rank x up @ down, each difference as T + strength x diff, as ComfyUI and lightx2v apply
them), the result saved as a single transformer file and run with ``transformer=``; the LoRA run with the same
seed must give the same latents. The files are written here for the tiny self-test models.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.events import Info, JobFailed, JobFinished, LatentsSaved
from engine.models.loras import Lora
from engine.models.lora_layout import diffusers_layer, split_original_lora
from engine.models.single_file import PREFIX
from engine.outputs.latents import load_latents
from engine.run.engine import Engine
from tests.conftest import CPU, run_engine, tiny_request
from tests.helpers.weights import original_name, original_state

RANK, ALPHA = 4, 2.0
RUN = dict(width=32, height=32, frames=5, steps=2, seed=7)


def latents_of(events):
    return load_latents(Path(next(e.path for e in events if isinstance(e, LatentsSaved))))[0]


def said(events) -> str:
    return " ".join(e.message for e in events if isinstance(e, Info))


def diff_lora(state: dict, seed: int, factors_on_head: bool = False) -> dict:
    """A LoRA as lightx2v's distillation LoRAs are laid out, for the model of ``state`` (original names): factors
    with an alpha for the linear layers, and a whole-tensor difference for every other tensor: norms (``.diff``),
    biases (``.diff_b``), block modulation (``diff_m``), the head's modulation (``head.modulation.diff``), the
    head's weight and the patch embedding (``.diff``)."""
    generator, lora = torch.Generator().manual_seed(seed), {}

    def noise(*shape, scale=0.05):
        return scale * torch.randn(*shape, generator=generator)

    for name, tensor in state.items():
        key = "diffusion_model." + name
        if name.endswith(".modulation") and name.startswith("blocks."):
            lora[key.removesuffix(".modulation") + ".diff_m"] = noise(*tensor.shape)
        elif name == "head.modulation":
            lora[key + ".diff"] = noise(*tensor.shape)
        elif name.endswith(".bias"):
            lora[key.removesuffix(".bias") + ".diff_b"] = noise(*tensor.shape)
        elif tensor.ndim == 2 and (name != "head.head.weight" or factors_on_head):
            layer = key.removesuffix(".weight")
            lora[layer + ".lora_down.weight"] = noise(RANK, tensor.shape[1], scale=0.3)
            lora[layer + ".lora_up.weight"] = noise(tensor.shape[0], RANK, scale=0.3)
            lora[layer + ".alpha"] = torch.tensor(ALPHA)
        elif name.endswith(".weight"):   # norms, the head's weight, the patch embedding
            lora[key.removesuffix(".weight") + ".diff"] = noise(*tensor.shape)
    return lora


def merged_by_hand(state: dict, lora: dict, strength: float) -> dict:
    """``state`` with ``lora`` applied as ComfyUI applies it, in float32."""
    merged = {name: tensor.to(torch.float32).clone() for name, tensor in state.items()}
    for key, value in lora.items():
        name = key.removeprefix("diffusion_model.")
        if name.endswith(".lora_down.weight"):
            layer = name.removesuffix(".lora_down.weight")
            up, alpha = lora[f"diffusion_model.{layer}.lora_up.weight"], float(lora[f"diffusion_model.{layer}.alpha"])
            merged[layer + ".weight"] += strength * (alpha / RANK) * (up.float() @ value.float())
        elif name.endswith(".diff_m"):
            merged[name.removesuffix(".diff_m") + ".modulation"] += strength * value
        elif name.endswith(".diff_b"):
            merged[name.removesuffix(".diff_b") + ".bias"] += strength * value
        elif name.endswith(".diff"):
            base = name.removesuffix(".diff")
            merged[base if base in merged else base + ".weight"] += strength * value
    return merged


def transformer_output(model):
    """One forward of a tiny text-to-video transformer on fixed inputs."""
    inputs = (torch.randn(1, 16, 1, 4, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([500]),
              torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1)))
    with torch.inference_mode():
        return model(*inputs, return_dict=False)[0]


def save_transformer(state: dict, path: Path) -> Path:
    save_file({PREFIX + name: tensor.contiguous() for name, tensor in state.items()}, str(path))
    return path


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("lora-diff-models"), CPU)
    yield engine
    engine.unload()


def test_every_wan_tensor_name_maps_to_the_diffusers_one(model_dirs, tmp_path):
    from diffusers import WanTransformer3DModel

    from engine.models.selftest import SELFTEST_I2V, build_selftest_pipeline

    flf = tmp_path / "flf"
    build_selftest_pipeline(SELFTEST_I2V, first_last=True).save_pretrained(flf)
    for folder in (model_dirs["tiny-t2v"], model_dirs["tiny-i2v"], flf):
        names = [name for name, _ in WanTransformer3DModel.from_pretrained(folder / "transformer").named_parameters()]
        for name in names:
            module, _, part = original_name(name).rpartition(".")
            ours = diffusers_layer(original_name(name)) or f"{diffusers_layer(module)}.{part}"
            assert ours == name, (original_name(name), ours)


@pytest.mark.parametrize("strength", [1.0, 0.6])
def test_a_lora_with_whole_tensor_differences_equals_the_same_changes_merged_by_hand(
        engine, presets, model_dirs, image_file, tmp_path, strength):
    """On the image-to-video model (its image embedder's norms and the image cross-attention have differences
    too): every difference is applied with the strength, as a hand merge loaded with transformer= gives; a run
    without the LoRA afterwards is the model's own, bit for bit."""
    state = original_state(model_dirs["tiny-i2v"])
    lora = diff_lora(state, seed=11)
    assert {k.rsplit(".", 1)[-1] for k in lora} >= {"diff", "diff_b", "diff_m", "alpha"}
    assert "diffusion_model.head.modulation.diff" in lora and "diffusion_model.img_emb.proj.0.diff" in lora
    lora_file = tmp_path / "distill.safetensors"
    save_file(lora, str(lora_file))
    hand = save_transformer(merged_by_hand(state, lora, strength), tmp_path / "hand-merged.safetensors")
    run = dict(mode="i2v", image=str(image_file), **RUN)
    own, own_events = run_engine(engine, tiny_request(presets, model_dirs["tiny-i2v"], tmp_path / "o", **run))
    assert isinstance(own, JobFinished), own
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-i2v"], tmp_path / "o",
                                                     loras=(Lora(str(lora_file), strength),), **run))
    assert isinstance(result, JobFinished), result
    with_lora = latents_of(events)
    assert "tensors changed by their whole-tensor differences" in said(events)
    after, after_events = run_engine(engine, tiny_request(presets, model_dirs["tiny-i2v"], tmp_path / "o", **run))
    assert torch.equal(latents_of(after_events), latents_of(own_events))   # taken out exactly
    merged, merged_events = run_engine(engine, tiny_request(presets, model_dirs["tiny-i2v"], tmp_path / "o",
                                                            transformer=str(hand), **run))
    assert isinstance(merged, JobFinished), merged
    expected, base = latents_of(merged_events), latents_of(own_events)
    gap = float((with_lora - expected).abs().max())
    assert gap < 1e-4 * float(expected.abs().max()), gap
    assert float((with_lora - base).abs().max()) > 100 * gap   # the LoRA did change the output


def test_differences_reach_weights_the_offload_hooks_stream(engine, presets, model_dirs, tmp_path):
    """Group and leaf offloading keep copies of each tensor to move: the differences are in what they move, and
    taken out of it again."""
    state = original_state(model_dirs["tiny-t2v"])
    lora_file = tmp_path / "distill.safetensors"
    save_file(diff_lora(state, seed=12), str(lora_file))
    base = tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "o", mode="t2i", width=32, height=32, frames=1,
                        steps=1, guidance=1.0, seed=5)
    runs = {}
    for strategy in ("all_on_device", "group_offload", "leaf_offload"):
        for loras in ((), (Lora(str(lora_file), 0.8),)):
            result, events = run_engine(engine, base.with_values(strategy=strategy, loras=loras))
            assert isinstance(result, JobFinished), (strategy, result)
            runs[strategy, bool(loras)] = latents_of(events)
    for strategy in ("group_offload", "leaf_offload"):
        assert torch.allclose(runs[strategy, True], runs["all_on_device", True], atol=1e-5), strategy
        assert torch.equal(runs[strategy, False], runs["all_on_device", False]), strategy
    assert not torch.allclose(runs["all_on_device", True], runs["all_on_device", False], atol=1e-3)


def lightning_lora(state: dict, seed: int) -> dict:
    """A file in Wan2.2-Lightning's layout (its own merge code, wan/utils/utils.py of ModelTC/Wan2.2-Lightning,
    reads it): for every linear layer of the original model, ``diffusion_model.<layer>.lora_down.weight`` (rank x
    in), ``.lora_up.weight`` (out x rank), both float32, and an ``.alpha``; the embeddings and the head included."""
    generator, lora = torch.Generator().manual_seed(seed), {}
    for name, tensor in state.items():
        if tensor.ndim == 2 and name.endswith(".weight"):
            layer = "diffusion_model." + name.removesuffix(".weight")
            lora[layer + ".lora_down.weight"] = 0.3 * torch.randn(RANK, tensor.shape[1], generator=generator)
            lora[layer + ".lora_up.weight"] = 0.3 * torch.randn(tensor.shape[0], RANK, generator=generator)
            lora[layer + ".alpha"] = torch.tensor(ALPHA)
    return lora


def expert_state(folder: Path, name: str) -> dict:
    from safetensors.torch import load_file

    tensors = load_file(str(folder / name / "diffusion_pytorch_model.safetensors"))
    return {original_name(key): tensor for key, tensor in tensors.items()}


def test_the_lightning_layout_goes_into_the_expert_each_file_is_for(engine, presets, two_experts, tmp_path):
    """Wan2.2-Lightning's two files (one per expert, every linear layer with an alpha, the embeddings and the head
    too): each goes into its expert only, and the run equals both experts merged by hand and loaded as files."""
    from engine.run.lora import apply_loras  # noqa: F401  (the path the engine takes below)

    high_state, low_state = expert_state(two_experts, "transformer"), expert_state(two_experts, "transformer_2")
    high_lora, low_lora = lightning_lora(high_state, seed=21), lightning_lora(low_state, seed=22)
    assert any(key.startswith("diffusion_model.time_projection.1.") for key in high_lora)
    assert any(key.startswith("diffusion_model.head.head.") for key in high_lora)
    split = split_original_lora(high_lora, "high_noise_model.safetensors")
    assert not split.diffs and not split.unknown and len(split.factors) == 2 * sum(
        key.endswith(".alpha") for key in high_lora)
    files = {}
    for name, lora in (("high", high_lora), ("low", low_lora)):
        files[name] = tmp_path / f"{name}_noise_model.safetensors"
        save_file(lora, str(files[name]))
    hand = [save_transformer(merged_by_hand(s, lora, 1.0), tmp_path / f"{name}-merged.safetensors")
            for name, s, lora in (("high", high_state, high_lora), ("low", low_state, low_lora))]
    run = dict(mode="t2v", guidance=1.0, **RUN)
    loras = (Lora(str(files["high"]), 1.0, "high"), Lora(str(files["low"]), 1.0, "low"))
    result, events = run_engine(engine, tiny_request(presets, two_experts, tmp_path / "o", loras=loras, **run))
    assert isinstance(result, JobFinished), result
    pipe = engine.loaded.pipe
    assert [len(getattr(m, "peft_config", {}) or {}) for m in (pipe.transformer, pipe.transformer_2)] == [1, 1]
    with_loras = latents_of(events)
    files_merged = dict(transformer=str(hand[0]), transformer_2=str(hand[1]))
    merged, merged_events = run_engine(engine, tiny_request(presets, two_experts, tmp_path / "o", **files_merged, **run))
    assert isinstance(merged, JobFinished), merged
    expected = latents_of(merged_events)
    assert float((with_loras - expected).abs().max()) < 1e-4 * float(expected.abs().max())
    # the wrong way round (each file in the other expert) is another video: the routing matters
    swapped, swapped_events = run_engine(engine, tiny_request(presets, two_experts, tmp_path / "o", loras=(
        Lora(str(files["high"]), 1.0, "low"), Lora(str(files["low"]), 1.0, "high")), **run))
    assert isinstance(swapped, JobFinished), swapped
    assert not torch.allclose(latents_of(swapped_events), expected, atol=1e-3)


def test_a_lora_of_a_kind_the_app_does_not_apply_is_refused_and_layers_the_model_lacks_are_named(
        engine, presets, model_dirs, tmp_path):
    state = original_state(model_dirs["tiny-t2v"])
    loha = {"diffusion_model.blocks.0.self_attn.q.hada_w1_a": torch.zeros(2, 24),
            "diffusion_model.blocks.0.self_attn.q.hada_w1_b": torch.zeros(2, 24)}
    path = tmp_path / "loha.safetensors"
    save_file(loha, str(path))
    request = tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "o", mode="t2i", width=32, height=32,
                           frames=1, steps=1, guidance=1.0)
    result, _ = run_engine(engine, request.with_values(loras=(Lora(str(path), 1.0),)))
    assert isinstance(result, JobFailed) and result.kind == "input", result
    assert "'loha.safetensors' holds LoHa tensors, which the app does not apply" in result.message
    # An image-to-video LoRA (k_img, v_img, norm_k_img) on the text-to-video model: those layers are left out, said
    i2v = diff_lora(original_state(model_dirs["tiny-i2v"]), seed=13)
    path = tmp_path / "i2v-lora.safetensors"
    save_file(i2v, str(path))   # its patch embedding's difference has 36 input channels, the model's 16
    result, _ = run_engine(engine, request.with_values(loras=(Lora(str(path), 1.0),)))
    assert isinstance(result, JobFailed) and result.kind == "input", result
    assert "changes patch_embedding.weight with a tensor of shape [24, 36, 1, 2, 2], but the model's is [24, 16, " \
           "1, 2, 2]: it is made for another Wan model" in result.message
    save_file({k: v for k, v in i2v.items() if "patch_embedding" not in k}, str(path))
    result, events = run_engine(engine, request.with_values(loras=(Lora(str(path), 1.0),)))
    assert isinstance(result, JobFinished), result
    assert "this model does not have (" in said(events) and "they are left out, as ComfyUI" in said(events)
    assert state   # the text-to-video model's own tensors are what the rest changed


def test_on_a_gguf_transformer_differences_go_into_its_plain_tensors_and_quantised_ones_are_refused(
        engine, presets, model_dirs, tmp_path):
    """A GGUF file keeps its norms, biases and modulation as plain tensors (F32), which take differences; its
    quantised weights (Q8_0 blocks of bytes) cannot, and a LoRA changing one is refused with what to use."""
    from tests.helpers.weights import write_gguf

    state = original_state(model_dirs["tiny-t2v"])
    gguf = write_gguf(state, tmp_path / "tiny-Q8_0.gguf")
    small = {k: v for k, v in diff_lora(state, seed=14).items() if not k.endswith((".weight", ".alpha"))
             and "head.head" not in k and "patch_embedding" not in k}
    assert small and all(k.endswith((".diff", ".diff_b", ".diff_m")) for k in small)
    norms = tmp_path / "norms.safetensors"
    save_file(small, str(norms))
    request = tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "o", mode="t2i", width=32, height=32,
                           frames=1, steps=1, guidance=1.0, transformer=str(gguf))
    plain, plain_events = run_engine(engine, request)
    result, events = run_engine(engine, request.with_values(loras=(Lora(str(norms), 1.0),)))
    assert isinstance(result, JobFinished), result
    assert "tensors changed by their whole-tensor differences" in said(events)
    assert not torch.allclose(latents_of(events), latents_of(plain_events), atol=1e-4)
    whole = tmp_path / "whole.safetensors"
    save_file({**small, "diffusion_model.blocks.0.ffn.2.diff": 0.01 * torch.ones(24, 32)}, str(whole))
    result, _ = run_engine(engine, request.with_values(loras=(Lora(str(whole), 1.0),)))
    assert isinstance(result, JobFailed) and result.kind == "input", result
    assert "adds whole-tensor changes to blocks.0.ffn.net.2.weight, which this GGUF transformer keeps quantised" \
        in result.message


def test_a_lora_of_differences_alone_runs_with_the_factors_of_earlier_runs_off(model_dirs, tmp_path):
    """A file holding only whole-tensor differences (no factor pair) is a LoRA too: after a run with another
    LoRA's factors, only its differences are in the weights, equal to the hand merge; none on gives the model's
    own, bit for bit."""
    from diffusers import WanPipeline, WanTransformer3DModel

    from engine.run.lora import apply_loras, loaded_adapters

    state = original_state(model_dirs["tiny-t2v"])
    full, only = diff_lora(state, seed=15), {k: v for k, v in diff_lora(state, seed=16).items()
                                             if k.endswith((".diff", ".diff_b", ".diff_m"))}
    files = {name: tmp_path / f"{name}.safetensors" for name in ("full", "only")}
    save_file(full, str(files["full"]))
    save_file(only, str(files["only"]))
    hand = WanTransformer3DModel.from_single_file(
        str(save_transformer(merged_by_hand(state, only, 0.5), tmp_path / "hand.safetensors")),
        config=str(model_dirs["tiny-t2v"]), subfolder="transformer")
    pipe = WanPipeline.from_pretrained(model_dirs["tiny-t2v"])
    base = transformer_output(pipe.transformer)
    apply_loras(pipe, [(str(files["full"]), 1.0)])
    setup = apply_loras(pipe, [(str(files["only"]), 0.5)])
    assert setup.diffs and not setup.merged and len(loaded_adapters(pipe)) == 2
    expected = transformer_output(hand)
    got = transformer_output(pipe.transformer)
    assert float((got - expected).abs().max()) < 1e-5 * float(expected.abs().max()) + 1e-6
    apply_loras(pipe, [])
    assert torch.equal(transformer_output(pipe.transformer), base)


def test_a_layer_with_both_a_factor_pair_and_a_difference_keeps_both_when_another_lora_comes_and_goes(
        model_dirs, tmp_path):
    """The head's weight takes one LoRA's factors (merged into it) and another's difference: adding and removing
    the second leaves the first one's merge in place, and each state equals its hand merge."""
    from diffusers import WanPipeline, WanTransformer3DModel

    from engine.run.lora import apply_loras

    state = original_state(model_dirs["tiny-t2v"])
    first = diff_lora(state, seed=17, factors_on_head=True)   # factors on head.head, differences elsewhere
    second = {"diffusion_model.head.head.diff": 0.05 * torch.randn(state["head.head.weight"].shape,
                                                                   generator=torch.Generator().manual_seed(18))}
    files = {name: tmp_path / f"{name}.safetensors" for name in ("first", "second")}
    save_file(first, str(files["first"]))
    save_file(second, str(files["second"]))
    pipe = WanPipeline.from_pretrained(model_dirs["tiny-t2v"])
    def hand(*loras):
        merged = state
        for lora in loras:
            merged = merged_by_hand(merged, lora, 1.0)
        path = save_transformer(merged, tmp_path / f"hand-{len(loras)}.safetensors")
        return transformer_output(WanTransformer3DModel.from_single_file(
            str(path), config=str(model_dirs["tiny-t2v"]), subfolder="transformer"))

    both, one = ((files["first"], files["second"]), hand(first, second)), ((files["first"],), hand(first))
    for loras, expected in (both, one, both):
        setup = apply_loras(pipe, [(str(file), 1.0) for file in loras])
        assert setup.merged and setup.diffs
        got = transformer_output(pipe.transformer)
        assert float((got - expected).abs().max()) < 1e-5 * float(expected.abs().max()) + 1e-6, len(loras)
