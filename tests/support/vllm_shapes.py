"""vLLM 0.33's output classes, field for field, so the adapter is tested without importing vllm.

`Logprob`, `FlatLogprobs`, `WeightVersionSpan`, `CompletionOutput` and `RequestOutput` here have
exactly the field names, order and types of `vllm.logprobs` / `vllm.outputs` in vLLM 0.33.0.
With ``REPLAYLAKE_REAL_VLLM=1`` (set by ``make test-vllm``, which installs vllm 0.33 into its own
environment) the factory `vllm_classes()` returns vLLM's real classes instead, and the very same
tests run against them; `test_vllm_shapes_match_vllm` then also compares the fields.
"""
from __future__ import annotations

import os
from collections.abc import Sequence as GenericSequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

REAL = os.environ.get("REPLAYLAKE_REAL_VLLM") == "1"


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FlatLogprobs:
    """The flat container's fields; positions are read through these lists only."""

    start_indices: list[int] = field(default_factory=list)
    end_indices: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int | None] = field(default_factory=list)
    decoded_tokens: list[str | None] = field(default_factory=list)

    def append(self, position: dict[int, Logprob] | None) -> None:
        self.start_indices.append(len(self.logprobs))
        for tok, lp in (position or {}).items():
            self.token_ids.append(tok)
            self.logprobs.append(lp.logprob)
            self.ranks.append(lp.rank)
            self.decoded_tokens.append(lp.decoded_token)
        self.end_indices.append(len(self.logprobs))

    def __len__(self) -> int:
        return len(self.start_indices)


@dataclass
class WeightVersionSpan:
    version: str
    start: int
    end: int


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: GenericSequence[int]
    cumulative_logprob: float | None
    logprobs: Any | None
    routed_experts: Any | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: Any | None = None
    sampling_mask: Any | None = None
    spec_decode_metrics: Any | None = None
    weight_versions: list[WeightVersionSpan] | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestOutput:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int] | None,
                 prompt_logprobs: Any | None, outputs: list[CompletionOutput], finished: bool,
                 metrics: Any | None = None, lora_request: Any | None = None,
                 encoder_prompt: str | None = None,
                 encoder_prompt_token_ids: list[int] | None = None,
                 num_cached_tokens: int | None = None,
                 num_cache_creation_tokens: int | None = None, *,
                 prompt_token_id_logprobs: Any | None = None,
                 kv_transfer_params: dict[str, Any] | None = None,
                 ec_transfer_params: dict[str, Any] | None = None) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.prompt_token_id_logprobs = prompt_token_id_logprobs
        self.outputs = outputs
        self.finished = finished
        self.metrics = metrics
        self.lora_request = lora_request
        self.encoder_prompt = encoder_prompt
        self.encoder_prompt_token_ids = encoder_prompt_token_ids
        self.num_cached_tokens = num_cached_tokens
        self.num_cache_creation_tokens = num_cache_creation_tokens
        self.kv_transfer_params = kv_transfer_params
        self.ec_transfer_params = ec_transfer_params


def vllm_classes() -> SimpleNamespace:
    """The classes the tests build outputs from: vLLM's own with REPLAYLAKE_REAL_VLLM=1."""
    if REAL:
        from vllm.logprobs import FlatLogprobs as F
        from vllm.logprobs import Logprob as L
        from vllm.outputs import CompletionOutput as C
        from vllm.outputs import RequestOutput as R
        from vllm.outputs import WeightVersionSpan as W
        return SimpleNamespace(Logprob=L, FlatLogprobs=F, WeightVersionSpan=W,
                               CompletionOutput=C, RequestOutput=R, real=True)
    return SimpleNamespace(Logprob=Logprob, FlatLogprobs=FlatLogprobs,
                           WeightVersionSpan=WeightVersionSpan, CompletionOutput=CompletionOutput,
                           RequestOutput=RequestOutput, real=False)


class Outputs:
    """Builds vLLM-shaped outputs the way vLLM's output processor fills them."""

    def __init__(self, classes: SimpleNamespace | None = None):
        self.k = classes or vllm_classes()

    def logprobs(self, tokens: list[int], values: list[float], *, flat: bool = False,
                 top: int = 1) -> Any:
        """Per position: the sampled token (rank 1) plus ``top - 1`` alternatives."""
        positions = []
        for tok, lp in zip(tokens, values):
            pos = {tok: self.k.Logprob(logprob=lp, rank=1, decoded_token=None)}
            for alt in range(1, top):
                pos[10_000 + alt] = self.k.Logprob(logprob=lp - alt, rank=alt + 1)
            positions.append(pos)
        if not flat:
            return positions
        out = self.k.FlatLogprobs()
        for pos in positions:
            out.append(pos)
        return out

    def completion(self, tokens: list[int], *, index: int = 0, logprobs: list[float] | None = None,
                   spans: list[tuple[str, int, int]] | None = None, finish_reason: str = "stop",
                   stop_reason: int | str | None = None, flat: bool = False,
                   top: int = 1) -> Any:
        lps = None if logprobs is None else self.logprobs(tokens, logprobs, flat=flat, top=top)
        wv = None if spans is None else [self.k.WeightVersionSpan(v, s, e) for v, s, e in spans]
        return self.k.CompletionOutput(
            index=index, text="", token_ids=list(tokens),
            cumulative_logprob=None if logprobs is None else float(sum(logprobs)),
            logprobs=lps, finish_reason=finish_reason, stop_reason=stop_reason,
            weight_versions=wv)

    def request(self, prompt: list[int], completions: list[Any],
                request_id: str = "req-0") -> Any:
        return self.k.RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=prompt,
                                    prompt_logprobs=None, outputs=completions, finished=True)
