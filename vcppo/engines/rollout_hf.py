"""The transformers rollout engine (``rollout.engine=hf``): the sampler where vLLM cannot be
installed (a new CUDA, a laptop, a platform vLLM does not ship for).

Same interface and contract as :class:`vcppo.engines.rollout.RolloutEngine`, so the driver does
not branch: ``generate`` (n samples per prompt, temperature, top-p, top-k, stop strings, max
tokens, the sampled tokens' logprobs, seeded), ``sync_weights`` (HF-named full tensors: the
actor's ZeRO-3-gathered weights, LoRA merged), ``sync_adapter`` (``rollout.lora_sync=adapter``:
peft's adapter directory), ``sleep`` / ``wake_up`` (no-ops: the model is the size of the actor's
weights and the KV cache lives only inside a ``generate`` call), ``close``.

Sampling is transformers' ``generate`` with its KV cache. The truncation (temperature, top-k,
top-p) is this module's :class:`_Truncate`, the one logits processor ``generate`` runs, so the
distribution sampled from is the one whose logprobs are returned: ``processed`` (after
truncation, vLLM's ``processed_logprobs``; with top-p = 1 and no top-k they equal the trainer's
``log_softmax(logits / temperature)``) or ``raw`` (``log_softmax`` of the model's logits, vLLM's
``raw_logprobs``). A response ends at the first stop id -- the tokenizer's EOS and the generation
config's EOS ids (Qwen's: ``<|im_end|>`` and ``<|endoftext|>``), what vLLM stops on -- at the first
stop string (kept in the text, which ends with it, as vLLM's ``include_stop_str_in_output``), or at
``max_tokens``.

Batching: the n x prompts rows are sorted by prompt length and cut into batches of at most
``rollout.hf_batch_tokens`` padded (prompt + max_tokens) tokens, so short prompts are not padded
to the longest and one long row holds only its own batch. Determinism: the process's torch
generator is reseeded with :meth:`sampler_seed` per call (restored afterwards) and the batches are
a function of the request, so the same call redraws the same samples.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Iterable

import torch

from vcppo.runtime.dist import DistInfo
from vcppo.engines.rollout import RolloutEngine, RolloutSample
from vcppo.engines.rollout_groups import RolloutGroups
from vcppo.config.schema import RolloutConfig

LOGPROBS_MODES = ("processed", "raw")


def stop_ids(model, tokenizer) -> list[int]:
    """The ids a response ends on: the tokenizer's EOS and the generation config's EOS id(s)."""
    ids = [tokenizer.eos_token_id]
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += list(eos) if isinstance(eos, (list, tuple)) else [eos]
    return sorted({int(i) for i in ids if i is not None})


def truncate(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """(B, V) float logits -> the scores sampled from: divided by ``temperature``, all but the
    ``top_k`` largest (0: off) and then all outside the smallest set holding ``top_p`` of the mass
    set to -inf (the most likely token always stays)."""
    scores = logits / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(scores, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above each
        drop = before > top_p
        drop[:, 0] = False
        scores = scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    return scores


class _Truncate:
    """``generate``'s one logits processor: returns :func:`truncate`'s scores and keeps, one step
    late, each row's logprob of the token sampled from them (at call t, ``input_ids[:, -1]`` is the
    token drawn at call t - 1); :meth:`finish` adds the last step's."""

    def __init__(self, temperature: float, top_k: int, top_p: float, mode: str, keep: bool):
        self.temperature, self.top_k, self.top_p, self.mode, self.keep = temperature, top_k, top_p, mode, keep
        self.prev: torch.Tensor | None = None  # (B, V) logprobs of the last call
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        scores = truncate(logits, self.temperature, self.top_k, self.top_p)
        if self.keep:
            self._take(input_ids[:, -1])
            self.prev = torch.log_softmax(scores if self.mode == "processed" else logits, dim=-1)
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        if self.prev is not None:
            self.logprobs.append(self.prev.gather(-1, tokens[:, None])[:, 0])

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """(B, steps) float32 logprobs of the sampled tokens."""
        self._take(last_tokens)
        self.prev = None
        return torch.stack(self.logprobs, 1).float() if self.logprobs else torch.zeros(len(last_tokens), 0)


class _StopStrings:
    """Stopping criterion: a row is done once its response text holds a stop string; records the
    response length at that token (the tokens are kept up to it, as vLLM keeps them)."""

    def __init__(self, stop: list[str], tokenizer, prompt_len: int, rows: int):
        self.stop, self.tokenizer, self.prompt_len = stop, tokenizer, prompt_len
        self.window = max(len(s) for s in stop) + 1  # a string of m chars spans at most m tokens
        self.length = [0] * rows  # 0: not stopped by a string

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        n = input_ids.shape[1] - self.prompt_len
        tails = input_ids[:, max(self.prompt_len, input_ids.shape[1] - self.window):].tolist()
        for row, tail in enumerate(tails):
            if self.length[row] == 0:
                text = self.tokenizer.decode(tail, skip_special_tokens=False)
                if any(s in text for s in self.stop):
                    self.length[row] = n
            done[row] = self.length[row] > 0
        return done


def length_batches(lengths: list[int], max_tokens: int, budget: int) -> list[list[int]]:
    """Row indices sorted by length (stable), cut into batches whose padded size, rows x (longest
    prompt + ``max_tokens``), stays within ``budget`` (a batch holds at least one row)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * (lengths[i] + max_tokens) > budget:
            batches.append(cur)
            cur = []
        cur.append(i)
    return batches + [cur] if cur else batches


def cut_response(tokens: list[int], stops: set[int], string_len: int) -> tuple[list[int], bool]:
    """(the response up to and including its first stop id or stop-string token, whether it stopped)."""
    end = next((k + 1 for k, t in enumerate(tokens) if t in stops), None)
    if string_len and (end is None or string_len < end):
        end = string_len
    return (tokens, False) if end is None else (tokens[:end], True)


def text_to_stop(text: str, stop: list[str] | None) -> str:
    """``text`` ending right after its first stop string (vLLM's ``include_stop_str_in_output``).
    With stop strings vLLM's text is its incremental detokenizer's, which holds back a trailing
    incomplete UTF-8 character ("\ufffd") until the next token completes it: so is this one."""
    if not stop:
        return text
    ends = [text.find(s) + len(s) for s in stop if s in text]
    return text[:min(ends)] if ends else text.rstrip("\ufffd")


class HFRolloutEngine:
    sampler_seed = RolloutEngine.sampler_seed  # the same seeds per call and rollout group as vLLM's

    def __init__(self, model_path: str, cfg: RolloutConfig, dist: DistInfo, seed: int, max_model_len: int,
                 dtype: str = "auto", lora_rank: int = 0, logprobs_mode: str = "processed"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
        self.cfg, self.dist, self.seed, self.model_path = cfg, dist, int(seed), model_path
        self.replica = RolloutGroups(dist.world_size, cfg.tensor_parallel_size).group_of(dist.rank)
        self.on_gpu = dist.device.type == "cuda"
        self.max_model_len, self.logprobs_mode = int(max_model_len), logprobs_mode
        if dtype == "auto":
            dtype = "bfloat16" if self.on_gpu else "float32"
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(dist.device)
        self.model.eval().requires_grad_(False)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.stop_ids = stop_ids(self.model, self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.lora_rank, self._adapter = int(lora_rank), None

    # --- sampling --------------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[list[int]], n: int, temperature: float, top_p: float,
                 max_tokens: int | list[int], stop: list[str] | None = None, seed: int | None = None,
                 logprobs: bool = True, top_k: int = 0, reset_cache: bool = True) -> list[RolloutSample]:
        """n samples per prompt, prompt-major (temperature 0: greedy, the n samples identical);
        the same call with the same ``seed`` (on this engine or a fresh one) redraws the same samples.
        ``max_tokens``: one budget for all, or one per prompt (a batch decodes to its largest, each
        response is then cut at its own). ``reset_cache``: vLLM's prefix cache; this engine keeps none."""
        rows = [i for i in range(len(prompt_token_ids)) for _ in range(n)]
        limits = [int(max_tokens[i] if isinstance(max_tokens, list) else max_tokens) for i in rows]
        out: list[RolloutSample | None] = [None] * len(rows)
        budget = max(int(self.cfg.hf_batch_tokens), 1)
        state = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)
        torch.manual_seed(self.sampler_seed(seed))
        try:
            for batch in length_batches([len(prompt_token_ids[i]) for i in rows], max(limits), budget):
                done = self._generate_batch([prompt_token_ids[rows[b]] for b in batch], temperature, top_p, top_k,
                                            max(limits[b] for b in batch), stop, logprobs)
                for b, (resp, lps, stopped) in zip(batch, done):
                    if len(resp) > limits[b]:  # past this prompt's own budget: cut there
                        resp, lps, stopped = resp[:limits[b]], lps[:limits[b]], False
                    text = self.tokenizer.decode(resp, skip_special_tokens=False)
                    out[b] = RolloutSample(prompt_index=rows[b], prompt_ids=list(prompt_token_ids[rows[b]]),
                                           response_ids=resp, logprobs=lps, finish_reason="stop" if stopped else "length",
                                           text=text_to_stop(text, stop))
        finally:
            torch.set_rng_state(state[0])
            if state[1] is not None:
                torch.cuda.set_rng_state_all(state[1])
        return out

    def _generate_batch(self, prompts: list[list[int]], temperature: float, top_p: float, top_k: int,
                        max_tokens: int, stop: list[str] | None, logprobs: bool) -> list[tuple[list[int], list[float], bool]]:
        """One left-padded ``generate`` call: (response ids, their logprobs, stopped) per prompt."""
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):
            ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[r, width - len(p):] = 1
        greedy = temperature == 0
        proc = _Truncate(1.0 if greedy else float(temperature), 0 if greedy else int(top_k),
                         1.0 if greedy else float(top_p), "raw" if greedy else self.logprobs_mode, logprobs)
        criteria = _StopStrings(list(stop), self.tokenizer, width, len(prompts)) if stop else None
        # a clean config: no sampling defaults of the checkpoint's (top_k=50, repetition penalty, ...)
        sampling = {} if greedy else dict(temperature=1.0, top_k=0, top_p=1.0)  # _Truncate does all three
        gen = GenerationConfig(do_sample=not greedy, num_beams=1, use_cache=True, **sampling,
                               max_new_tokens=max(1, min(max_tokens, self.max_model_len - width)),
                               eos_token_id=self.stop_ids, pad_token_id=self.pad_id)
        with torch.inference_mode():
            seqs = self.model.generate(ids.to(self.dist.device), attention_mask=mask.to(self.dist.device),
                                       generation_config=gen, logits_processor=LogitsProcessorList([proc]),
                                       stopping_criteria=StoppingCriteriaList([criteria] if criteria else []))
        resp = seqs[:, width:]
        lps = proc.finish(resp[:, -1]).tolist() if logprobs and resp.shape[1] else [[] for _ in prompts]
        stops, out = set(self.stop_ids), []
        for r, tokens in enumerate(resp.tolist()):
            kept, stopped = cut_response(tokens, stops, criteria.length[r] if criteria else 0)
            out.append((kept, lps[r][:len(kept)] if logprobs else [], stopped))
        return out

    # --- weights -----------------------------------------------------------------------------
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Copy HF-named full tensors into the model; every parameter must receive one (a tied LM
        head shares the embedding's), and an unknown name is an error. Returns seconds."""
        t0 = time.perf_counter()
        params = dict(self.model.named_parameters())
        seen = set()
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in params:
                    raise RuntimeError(f"weight sync: the hf rollout model has no parameter {name!r}")
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
                seen.add(name)
        missing = sorted(set(params) - seen)
        if missing:
            raise RuntimeError(f"weight sync: no tensor for {missing[:5]} (kept the old weights)")
        return time.perf_counter() - t0

    @property
    def uses_adapters(self) -> bool:
        """Built for ``rollout.lora_sync=adapter``: syncs send the actor's adapters, not weights."""
        return self.lora_rank > 0

    def sync_adapter(self, write: Callable[[str], None]) -> float:
        """``write(directory)`` puts the actor's adapter (peft's format) there; the model samples with
        it from now on (the first sync wraps the model in peft, later ones load the new tensors)."""
        import tempfile

        from peft import PeftModel
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="vcppo-adapter-") as directory:
            write(directory)
            if self._adapter is None:
                self._adapter = PeftModel.from_pretrained(self.model, directory).eval()
                self._adapter.requires_grad_(False)
            else:
                state = load_file(os.path.join(directory, "adapter_model.safetensors"))
                set_peft_model_state_dict(self._adapter, state)
        self.model = self._adapter
        return time.perf_counter() - t0

    # --- memory ----------------------------------------------------------------------------------
    def sleep(self) -> bool:
        """A no-op: returns False, not asleep (the run logs it as ``rollout/asleep_while_training``
        0). The model is one copy of the policy's weights; the KV cache exists only inside ``generate``."""
        return False

    def wake_up(self) -> None:
        pass

    def close(self, final: bool = False) -> None:
        self.model = self._adapter = None
        if self.on_gpu:
            torch.cuda.empty_cache()

