"""How one job's denoise is split across several GPUs (context parallel): a pure choice, no torch.

Context parallel divides the sequence of video tokens between the devices; every device keeps the whole
transformer. diffusers offers two ways to compute attention over the divided sequence:

- Ulysses: an all-to-all hands each device whole sequences of a share of the attention heads, so the number
  of devices must divide the head count (12 for Wan 1.3B, 40 for 14B, 24 for the 5B). Any attention backend
  that diffusers allows under context parallel works, plain SDPA ("native") included.
- Ring: the devices pass their keys and values around a ring and merge partial results, which needs the
  attention backend to return the log-sum-exp of each row; plain SDPA does not.

Either way the sequence itself is cut in equal pieces, so the token count must be a multiple of the devices.
"""
from __future__ import annotations

from dataclasses import dataclass

# diffusers' attention backends (of those the planner chooses among) that run under context parallel.
CONTEXT_PARALLEL_BACKENDS = ("native", "_native_cudnn", "_native_flash", "flash", "sage")
# Of those, the ones that return the log-sum-exp Ring attention merges with (diffusers' "native" cannot).
RING_BACKENDS = ("_native_cudnn", "_native_flash", "flash", "sage")
SPLIT_KINDS = ("ulysses", "ring")
# Step caches that decide from the transformer's own output whether to skip a step: split, each GPU sees only its
# part of the sequence and could decide otherwise than the others, and a GPU that skips leaves the others waiting.
SELF_DECIDING_CACHES = ("first_block", "mag")
# Why nothing splits where PyTorch has no collective backend for the device (hardware.collectives_here).
NO_COLLECTIVES = ("this PyTorch build has no NCCL, which GPUs need to share one job (PyTorch for Windows has none), "
                  "so it runs on one GPU; each GPU still serves its own jobs")


@dataclass(frozen=True)
class Split:
    """How a job uses several GPUs: ``ranks`` engine processes, one per GPU, computing attention by ``kind``
    ("ulysses" or "ring"; "" when it cannot be split, ``reason`` then says why and what to do)."""
    ranks: int
    kind: str
    reason: str

    @property
    def possible(self) -> bool:
        return self.kind in SPLIT_KINDS


def choose_split(ranks: int, heads: int, tokens: int, backend: str, step_cache: str | None = None,
                 on_gpus: bool = True) -> Split:
    """Ulysses over ``ranks`` devices when they divide the ``heads``, else Ring when the attention ``backend``
    returns the log-sum-exp (those backends run on GPUs only: not for CPU engines, ``on_gpus`` False); otherwise
    why neither works, with the device counts that would."""
    if step_cache in SELF_DECIDING_CACHES:
        return Split(ranks, "", f"step cache '{step_cache}' decides from each GPU's part of the sequence which "
                                "steps to skip, and the GPUs must run every step together; turn the step cache "
                                "off or run on one GPU")
    divisors = [n for n in range(2, heads + 1) if heads % n == 0 and tokens % n == 0]
    fewer = f"use {_listed(divisors[:6])} GPUs" if divisors else "run it on one GPU"
    if tokens % ranks:
        return Split(ranks, "", f"the video's {tokens} tokens do not split into {ranks} equal parts; {fewer}, "
                                "or change the size or frames")
    if backend not in CONTEXT_PARALLEL_BACKENDS:
        return Split(ranks, "", f"attention backend '{backend}' cannot run split across GPUs; choose one of "
                                f"{', '.join(CONTEXT_PARALLEL_BACKENDS)}")
    if heads % ranks == 0:
        return Split(ranks, "ulysses", f"{ranks} GPUs divide the model's {heads} attention heads: each computes "
                                       f"{heads // ranks} of them over the whole sequence (Ulysses)")
    if backend in RING_BACKENDS and not on_gpus:
        return Split(ranks, "", f"{ranks} engines do not divide the model's {heads} attention heads, and Ring "
                                f"attention's backends run only on GPUs; use a number of engines that divides "
                                f"the heads")
    if backend in RING_BACKENDS:
        return Split(ranks, "ring", f"{ranks} GPUs do not divide the model's {heads} attention heads, so they "
                                    f"pass keys and values around a ring (Ring attention, with '{backend}')")
    return Split(ranks, "", f"{ranks} GPUs do not divide the model's {heads} attention heads, and attention "
                            f"backend '{backend}' cannot pass them around a ring (it does not return the "
                            f"log-sum-exp Ring attention needs); {fewer}, or choose attention "
                            f"{' or '.join(repr(name) for name in RING_BACKENDS[:3])} for Ring")


def _listed(numbers: list[int]) -> str:
    words = [str(n) for n in numbers]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
