"""The image encoder's input made the way the official Wan code makes it, and the encoding made from it.

Official Wan (wan/modules/clip.py, ``CLIPModel.visual``) squashes the whole frame to the encoder's square with a
bicubic interpolation (no crop, no antialiasing, no clamp) and normalises it with CLIP's mean and std. diffusers'
``WanImageToVideoPipeline.encode_image`` runs ``CLIPImageProcessor`` instead: the shortest side resized to 224,
then a centre crop of 224x224, so a landscape frame loses its left and right edges before the encoder sees it.
"""
from __future__ import annotations

# CLIP's normalisation, the official code's (and the published image_processor's): used when a pipeline has no
# image processor to read it from.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def encoder_square(image_encoder, processor=None) -> int:
    """The side of the square image ``image_encoder`` takes: its config's ``image_size`` (224 for Wan's CLIP
    ViT-H), else the processor's crop height."""
    size = getattr(getattr(image_encoder, "config", None), "image_size", None)
    if size is None:
        size = processor.crop_size["height"]
    return int(size)


def clip_pixel_values(images: list, size: int, processor=None):
    """The encoder's pixel values (N, 3, size, size), float32, from the RGB PIL ``images``, the official way.

    Each image to a tensor in [-1, 1] (the official code's frame), bicubic-interpolated as a whole to ``size`` x
    ``size`` (align_corners False, no antialiasing, not clamped), back to [0, 1], then normalised with the
    processor's image_mean and image_std (CLIP's without a processor): the official steps in their order, so the
    values are the official code's to the last bit.
    """
    import numpy as np
    import torch
    import torch.nn.functional as F

    mean = getattr(processor, "image_mean", None) or CLIP_MEAN
    std = getattr(processor, "image_std", None) or CLIP_STD
    squares = []
    for image in images:
        frame = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1).float().div(255).sub(0.5).div(0.5)
        squares.append(F.interpolate(frame[None], size=(size, size), mode="bicubic", align_corners=False))
    batch = torch.cat(squares).mul(0.5).add(0.5)
    shape = (1, 3, 1, 1)
    return (batch - torch.tensor(mean).view(shape)) / torch.tensor(std).view(shape)


def clip_image_embeds(pipe, images: list, device):
    """The image conditioning of ``images`` (the first frame, and the last one for first-and-last-frame models)
    for the transformer: the penultimate hidden states of ``pipe.image_encoder`` on :func:`clip_pixel_values`,
    as diffusers' ``encode_image`` takes them, on ``device``."""
    from diffusers.utils.torch_utils import get_module_execution_device

    encoder, processor = pipe.image_encoder, getattr(pipe, "image_processor", None)
    pixels = clip_pixel_values(images, encoder_square(encoder, processor), processor)
    output = encoder(pixel_values=pixels.to(get_module_execution_device(encoder)), output_hidden_states=True)
    return output.hidden_states[-2].to(device)
