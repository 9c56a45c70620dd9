"""Recent prompt encodings, kept on the CPU between jobs: a new seed with the same prompt skips the text encoder."""
from __future__ import annotations

from collections import OrderedDict

from engine.models.spec import TEXT_TOKENS
from engine.run.apply_plan import encoder_device, encoder_visiting, torch_dtype
from engine.run.job import Job
from engine.run.loaded import LoadedModel
from engine.settings.request import GenerationRequest

PROMPT_CACHE_SIZE = 4   # encodings are 512 x 4096 x 2 bytes each: 4 MB


class PromptCache:
    """The last ``size`` encodings, by model, version, prompts, guidance and dtype (the oldest dropped first)."""

    def __init__(self, size: int = PROMPT_CACHE_SIZE):
        self.size = size
        self._kept: OrderedDict[tuple, tuple] = OrderedDict()

    def encode(self, loaded: LoadedModel, request: GenerationRequest, job: Job):
        """(positive, negative) on the plan's device: a recent encoding again, or the text encoder's."""
        pipe, plan = loaded.pipe, loaded.plan
        key = (loaded.model.ref, loaded.model.revision, request.prompt, request.negative_prompt or "",
               request.settings.guidance > 1.0, plan.dtype)
        if key in self._kept:
            job.info("Same prompt as a recent run: its encoding is reused, the text encoder is not run.")
            self._kept.move_to_end(key)
            positive, negative = self._kept[key]
        else:
            warn_if_truncated(pipe, request, job)
            with encoder_visiting(pipe, "text_encoder", plan):
                positive, negative = pipe.encode_prompt(
                    prompt=request.prompt, negative_prompt=request.negative_prompt or "",
                    do_classifier_free_guidance=request.settings.guidance > 1.0, max_sequence_length=TEXT_TOKENS,
                    device=encoder_device(plan), dtype=torch_dtype(plan.dtype))
            positive = positive.to("cpu")
            negative = negative.to("cpu") if negative is not None else None
            self._kept[key] = (positive, negative)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return positive.to(plan.device), negative.to(plan.device) if negative is not None else None


def warn_if_truncated(pipe, request: GenerationRequest, job: Job) -> None:
    """Say so when the text encoder will see only the first TEXT_TOKENS tokens of a prompt."""
    for name, text in (("prompt", request.prompt), ("negative prompt", request.negative_prompt)):
        if not text:
            continue
        count = len(pipe.tokenizer(text, add_special_tokens=True, truncation=False).input_ids)
        if count > TEXT_TOKENS:
            job.info(f"The {name} is {count} tokens long; only the first {TEXT_TOKENS} are used, so its end has no "
                     "effect. Shorten it to keep every part.")
