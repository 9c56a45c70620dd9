"""The light VAE (decoder "vae_light": LightX2V's lightvaew2_1 layout, Wan2.1's VAE at a quarter of its width) against
the model's own VAE and the fast decoder, decoding Wan2.1 latents of 832x480x81 in bfloat16 with cuDNN's defaults (the
plan's set-up on CUDA), random weights; and what the time model (engine/planning/vae_time.py) predicts for each from
a calibration made in the same run, which gives the light VAE's measured factor (LIGHT_VAE_DECODE_FACTOR).

    python bench/light_vae.py OUT.json
    python bench/light_vae.py OUT.json --tiny      # the same code on the CPU with the self-test VAE

The light VAE is written as a file in the original layout and read back through engine/models/light_vae_file.py, as
a user's download is. Each decode is the engine's (engine/run/decoding.py decode_stream, one latent frame a call).
Nothing asserts.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIZE = (832, 480, 81)
TINY_SIZE = (96, 64, 17)
MODEL = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"


def _vaes(tiny: bool, folder: Path):
    """(the model's VAE, the light VAE read back from its file, the light VAE's width) in bfloat16 on the device."""
    import torch

    from engine.models.light_vae_file import (build_light_vae, light_vae_config, random_light_vae, read_light_vae,
                                              write_light_vae)

    if tiny:
        from engine.models.selftest import _vae

        vae, width = _vae().to(torch.bfloat16), 2
    else:
        from bench import realsize

        vae, width = realsize.vae(False, torch.bfloat16), 24
    config = dict(vae.config)
    path = write_light_vae(folder / "lightvaew2_1.safetensors", random_light_vae(config, width))
    info, state = read_light_vae(path, config)
    light = build_light_vae(light_vae_config(config, info.base_dim), state, torch.bfloat16)
    return vae, light.to(vae.device), info


def _fast_decoder(folder: Path, device: str):
    import torch

    from engine.models.fast_decoder_file import random_fast_decoder_state, write_fast_decoder
    from engine.run.fast_decoder import load_fast_decoder

    path = write_fast_decoder(folder / "taew2_1.safetensors", random_fast_decoder_state(16, 1))
    return load_fast_decoder(path, device, torch.bfloat16)


def predicted(cal, size: tuple[int, int, int]) -> dict:
    """The time model's decode seconds for the VAE, the light VAE (before its measured factor) and the fast decoder."""
    from engine.models.spec import KNOWN_MODELS
    from engine.planning.vae_time import LIGHT_VAE21, fast_decode_seconds, vae_decode_seconds

    spec = KNOWN_MODELS[MODEL]
    vae, _ = vae_decode_seconds(spec, *size, "bfloat16", None, cal, "default")
    light, _ = vae_decode_seconds(spec, *size, "bfloat16", None, cal, "default", LIGHT_VAE21)
    fast, _ = fast_decode_seconds(spec, *size, "bfloat16", cal)
    return {"vae": round(vae, 3), "vae_light_modelled": round(light, 3), "fast": round(fast, 3)}


def run(out: Path, tiny: bool) -> dict:
    import torch

    from bench.decode_windows import measure, timed
    from engine.device.calibrate import calibrate
    from engine.outputs.export_rates import export_rates

    device = "cpu" if tiny else "cuda"
    repeats = 1 if tiny else 2   # after the warm-up run: --tiny checks the code, its times are no one's figures
    width, height, frames = TINY_SIZE if tiny else SIZE
    results = {"machine": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d"), "size": f"{width}x{height}x{frames}", "dtype": "bfloat16"}
    torch.backends.cudnn.benchmark = False
    cal = calibrate(device, torch.bfloat16, quick=tiny, export_rates=export_rates)
    results["calibration"] = cal.to_dict()
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        vae, light, info = _vaes(tiny, Path(tmp))
        if tiny:   # past the libraries' objects at the exit
            from bench.speed_setup import leave_libraries_out_of_collections

            leave_libraries_out_of_collections(engine=False)
        results["light_vae"] = {"base_dim": info.base_dim, "parameters": info.parameters,
                                "vae_parameters": sum(p.numel() for p in vae.parameters())}
        torch.manual_seed(0)
        latents = torch.randn(1, 16, (frames - 1) // 4 + 1, height // 8, width // 8, device=device)
        measured = {}
        for name, model in (("vae", vae), ("vae_light", light)):
            measured[name] = measure(model, latents, 1, device, repeats)[0]
            print(name, json.dumps(measured[name]), flush=True)
        fast = _fast_decoder(Path(tmp), device)
        zeros, ones = [0.0] * 16, [1.0] * 16
        measured["fast"] = timed(lambda: [f.cpu() for f in fast.stream(latents, 1, zeros, ones)], device, repeats)[0]
        print("fast", json.dumps(measured["fast"]), flush=True)
    results["measured"] = measured
    model = results["predicted"] = predicted(cal, (width, height, frames))
    results["light_vae_factor"] = round(measured["vae_light"]["seconds"] / model["vae_light_modelled"], 3)
    results["light_vs_vae"] = round(measured["vae_light"]["seconds"] / measured["vae"]["seconds"], 3)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps({k: results[k] for k in ("predicted", "light_vae_factor", "light_vs_vae")}), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    run(args.out, args.tiny)


if __name__ == "__main__":
    main()
