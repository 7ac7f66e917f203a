"""What the GPU check's parts share: the model shapes with random weights, the players' prompts, host copies of
weights compared bitwise, device-drained clocks, deterministic kernels, memory given back, the capacity plan's peak,
and :class:`Unit`, the frame of the paper and one-GPU units.

Qwen3-4B-Base's shape is its Hugging Face config.json's (4,022,468,096 parameters). Qwen3-1.7B-Base's is read from
conf/model/arch/qwen3_1_7b_base.json, the file the capacity plan reads; rope_theta, rms_norm_eps and the activation,
which that file does not hold, are the 4B's (the two config.json files agree on them).
"""
from __future__ import annotations

import contextlib
import gc
import json
import shutil
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import torch

GIB = 1024**3
PLAYERS = ("planning", "execution", "evaluation")
MEMORY_BAND = (0.5, 1.1)  # measured peak against the plan: above, the plan under-counts; below, it over-counts
QWEN3_4B = dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1_000_000.0,
                max_position_embeddings=32768, tie_word_embeddings=True, rms_norm_eps=1e-6, attention_bias=False,
                hidden_act="silu")
_ARCH = json.loads((Path(__file__).resolve().parents[1] / "conf/model/arch/qwen3_1_7b_base.json").read_text())
QWEN3_1_7B = dict(QWEN3_4B, **{k: _ARCH[k] for k in QWEN3_4B if k in _ARCH})
# Same structure (GQA, q/k norms, tied head), 2 layers, the byte tokenizer's vocabulary: every id decodes.
TINY = dict(QWEN3_4B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=259)
SHAPES = {"qwen3_4b": QWEN3_4B, "qwen3_1_7b": QWEN3_1_7B, "tiny": TINY}
# What each shape runs by default: (prompts, samples per prompt, new tokens, micro-batch size).
SHAPE_DEFAULTS = {"qwen3_4b": (4, 4, 128, 2), "qwen3_1_7b": (4, 4, 128, 2), "tiny": (4, 4, 24, 4)}
# A system line and four tasks per player (115-131 byte tokens each, rendered).
PROMPTS = {
    "planning": ("You write short math word problems with one numeric answer.",
                 ["Write a problem about trains.", "Write a problem about apples.",
                  "Write a problem about savings.", "Write a problem about areas."]),
    "execution": ("Solve it with a ```python block that prints the answer.",
                  ["A pen costs 3. What do 7 pens cost?", "What is 17 * 23 - 5?",
                   "A car drives 60 km/h for 3 h. How far?", "How many days are in 5 weeks?"]),
    "evaluation": ("Write def check(answer) that returns True if the answer is right.",
                   ["Question: 7 pens at 3 each. Answer: 21", "Question: 17 * 23 - 5. Answer: 386",
                    "Question: 60 km/h for 3 h. Answer: 180", "Question: days in 5 weeks. Answer: 35"]),
}


def qwen3_config(shape: str, num_layers: Optional[int] = None, tokenizer: Any = None):
    """A transformers ``Qwen3Config`` of ``shape`` (optionally cut to ``num_layers``), with the tokenizer's ids."""
    from transformers import Qwen3Config

    values = dict(SHAPES[shape], **({"num_hidden_layers": num_layers} if num_layers else {}))
    if tokenizer is not None:
        values.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id)
    return Qwen3Config(**values)


def count_parameters(config) -> int:
    """Parameters of a ``Qwen3ForCausalLM`` of ``config``, built on the meta device (tied embeddings once)."""
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in Qwen3ForCausalLM(config).parameters())


# A full-parameter torch-backend player of the Qwen3-4B shape peaked at 84.2 GiB on one H200 (4.02B parameters,
# 22.5 bytes each: fp32 weights, gradients and AdamW state, the reference and activations): over an 80 GB H100.
PLAYER_BYTES_PER_PARAMETER = 24


def layers_that_fit(shape: str, memory_bytes: float) -> int:
    """The most layers (at least 2, at most the shape's own) whose torch-backend player fits 90 % of
    ``memory_bytes`` at :data:`PLAYER_BYTES_PER_PARAMETER`: the players' steps keep the shape's width and vocabulary
    on a GPU too small for the whole model."""
    layers = SHAPES[shape]["num_hidden_layers"]
    while layers > 2 and count_parameters(qwen3_config(shape, layers)) * PLAYER_BYTES_PER_PARAMETER > 0.9 * memory_bytes:
        layers -= 1
    return layers


def build_model(config, device, seed: int):
    """A float32 ``Qwen3ForCausalLM`` with random weights, seeded, initialised on ``device``."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return model.float().eval()


def render_prompts(tokenizer, role: str, count: int) -> list[str]:
    system, tasks = PROMPTS[role]
    return [tokenizer.apply_chat_template([{"role": "system", "content": system},
                                           {"role": "user", "content": tasks[i % len(tasks)]}],
                                          add_generation_prompt=True, tokenize=False) for i in range(count)]


def prompt_length(tokenizer, role: str, count: int) -> int:
    """The longest of the role's rendered prompts in tokens (a micro-batch pads to its longest)."""
    return max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in render_prompts(tokenizer, role, count))


def parameters_label(n: int) -> str:
    """A parameter count as the check prints it: 4.022B, 0.590B, 1.234M."""
    return f"{n / 1e9:.3f}B" if n >= 1e8 else f"{n / 1e6:.3f}M"


class Clock:
    """Wall seconds of a block, the device drained at both ends (CUDA work is asynchronous)."""

    def __init__(self, device) -> None:
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.seconds = 0.0

    @contextlib.contextmanager
    def __call__(self):
        self.sync()
        t0 = time.perf_counter()
        try:
            yield self
        finally:
            self.sync()
            self.seconds = time.perf_counter() - t0


def tensors_on_host(named) -> dict:
    """``(name, tensor)`` pairs copied to the host, each view of a storage once (a tied embedding and head once)."""
    seen, out = set(), {}
    for name, t in named:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            out[name] = t.detach().to("cpu", copy=True)
    return out


def weights_on_host(trainer) -> dict:
    """The policy's full weights (gathered under ZeRO-3) copied to the host."""
    with trainer.gathered_weights():
        return tensors_on_host(trainer.model.state_dict().items())


def compare(a: dict, b: dict) -> tuple[bool, float]:
    """(bitwise equal, max |a - b|) over two host state dicts."""
    equal, diff = set(a) == set(b), 0.0
    for name in a.keys() & b.keys():
        x, y = a[name], b[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, float("inf")
        if not torch.equal(x, y):
            equal = False
            diff = max(diff, float((x.float() - y.float()).abs().max()))
    return equal, diff


@contextlib.contextmanager
def deterministic(cuda: bool):
    """``torch.use_deterministic_algorithms`` on GPU for the exact-step checks (warn_only: a kernel without a
    deterministic version warns); yields a list that holds those warnings when the block ends."""
    previous, caught = torch.are_deterministic_algorithms_enabled(), []
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if cuda:
                torch.use_deterministic_algorithms(True, warn_only=True)
            yield caught
            caught.extend(sorted({str(w.message)[:200] for w in seen if "determinis" in str(w.message).lower()}))
    finally:
        torch.use_deterministic_algorithms(previous)


def release(*objects) -> None:
    """Drop trainers (a DeepSpeed engine is destroyed first) and give their GPU memory back."""
    for obj in objects:
        engine = getattr(obj, "engine", None)
        if engine is not None and hasattr(engine, "destroy"):
            with contextlib.suppress(Exception):
                engine.destroy()
    del objects
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def disk_short(args, need: float, margin: float) -> Optional[str]:
    """Why the scratch folder (``--ckpt-dir``, else the temp dir) cannot hold ``need`` bytes x ``margin``, or None."""
    root = Path(args.ckpt_dir or tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if free < margin * need:
        return f"needs about {need / GIB:.1f} GiB under {root}, {free / GIB:.1f} GiB free (--ckpt-dir, --resume-layers)"
    return None


@contextlib.contextmanager
def scratch(args, prefix: str):
    """A temporary folder under ``--ckpt-dir`` (else the temp dir), removed when the block ends."""
    root = Path(args.ckpt_dir or tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def planned_peak(check, cfg, config, prompts: dict[str, int], passes: tuple[str, ...], **setup) -> dict:
    """The capacity plan's largest instant among ``passes`` on one GPU, for ``config``'s shape and ``cfg``'s settings,
    each role of ``prompts`` training --prompts x --samples rows of its prompt + --max-new-tokens tokens. The figure
    compared with ``max_memory_allocated`` is its total without the fixed CUDA-context item, which that does not see."""
    from dataclasses import replace

    from unifiedplayers import capacity

    a = check.args
    memory = torch.cuda.get_device_properties(check.device).total_memory if check.cuda else 24 * GIB
    machine = capacity.Hardware(gpus=1, gpu_memory=float(memory), bf16=check.dtype_name == "bfloat16",
                                name="the check's GPU")
    arch = capacity.arch_from_config({**config.to_dict(), "model_type": "qwen3"}, "benchmarks/gpu_check.py shape")
    base, lora = capacity.setup_of(cfg, machine), cfg.trainer.get("lora") or {}
    adapter = arch.adapter_parameters(int(lora.rank), lora.target_modules) if base.adapter else 0
    plan = replace(base, arch=arch, n=arch.parameters, trained=tuple(prompts), adapter=adapter, **setup)
    loads = {**capacity.role_loads(cfg), **{r: capacity.RoleLoad(r, a.prompts * a.samples, p, a.max_new_tokens, 0)
                                           for r, p in prompts.items()}}
    peak = max((i for i in capacity.device_instants(plan, loads) if i.name.split(" ")[0] in passes),
               key=lambda i: i.total)
    fixed = sum(i.bytes for i in peak.items if i.name.startswith("CUDA context"))
    return {"instant": peak.name, "plan_bytes": peak.total, "compared_bytes": peak.total - fixed,
            "items": {i.name: i.bytes for i in peak.items}, "plan_parameters": arch.parameters,
            "plan_adapter_parameters": adapter, "gpu_memory_bytes": float(memory)}


def memory_verdict(plan: dict, measured: Optional[int], cuda: bool, **extra) -> dict:
    """PASS when the measured peak lies within :data:`MEMORY_BAND` of the plan's figure; on CPU, NOT RUN."""
    compared = plan["compared_bytes"]
    if not cuda:
        return {"status": "NOT RUN", "reason": f"not measured on CPU; the plan for one GPU: {compared / GIB:.3f} GiB "
                f"({plan['plan_bytes'] / GIB:.3f} GiB with the CUDA context) at its '{plan['instant']}' instant",
                **plan}
    low, high = MEMORY_BAND
    return {"status": "PASS" if low * compared <= measured <= high * compared else "FAIL", "measured_bytes": measured,
            "band": [low, high], "ratio": measured / compared if compared else float("inf"), **plan, **extra}


def memory_detail(item: dict, what: str = "max_memory_allocated") -> str:
    low, high = item["band"]
    return (f"{what} {item['measured_bytes'] / GIB:.2f} GiB vs the plan's {item['compared_bytes'] / GIB:.2f} GiB "
            f"({item['plan_bytes'] / GIB:.2f} GiB with the CUDA context) at its '{item['instant']}' instant: "
            f"x {item['ratio']:.2f}, PASS within x {low} .. x {high}")


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


class Unit:
    """A unit beside the player runs: its parts run one by one, each under :meth:`guard`, and each of its
    :attr:`ITEMS` is decided from the parts it needs, ``{"status": PASS | FAIL | NOT RUN, ...}``, and printed as
    ``<NAME> <item>: <status> (<detail or reason>)``, then the :attr:`NOT_CHECKED` ones."""

    NAME = WHAT = ""
    ITEMS: tuple[str, ...] = ()
    NOT_CHECKED: dict[str, str] = {}
    DETAILS: dict[str, Callable[[dict], str]] = {}

    def __init__(self, check) -> None:
        self.check, self.args, self.cuda = check, check.args, check.cuda
        self.parts: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.skipped: dict[str, str] = {}  # parts not run, with the reason

    def guard(self, part: str, fn: Callable[[], Any]) -> None:
        """Run one part; an exception is recorded against it (the items that need it FAIL) and the next goes on."""
        try:
            self.parts[part] = fn()
        except Exception as exc:  # noqa: BLE001 - report it, go on with the next part
            traceback.print_exc()
            self.errors[part] = f"{type(exc).__name__}: {exc}"[:1000]
        release()

    def blocked(self, *parts: str) -> Optional[dict]:
        """FAIL when a part the item needs raised or is missing, NOT RUN when it was skipped; else None."""
        failed = [f"{p}: {self.errors[p]}" for p in parts if p in self.errors]
        if failed:
            return {"status": "FAIL", "reason": "; ".join(failed)}
        skipped = dict.fromkeys(self.skipped[p] for p in parts if p in self.skipped)
        if skipped:
            return {"status": "NOT RUN", "reason": "; ".join(skipped)}
        missing = [p for p in parts if p not in self.parts]
        return {"status": "FAIL", "reason": f"not run: {', '.join(missing)}"} if missing else None

    def peak(self, reset: bool = False) -> Optional[int]:
        """``max_memory_allocated`` (after a reset of it, with ``reset``); None on CPU."""
        if not self.cuda:
            return None
        torch.cuda.synchronize()
        if reset:
            torch.cuda.reset_peak_memory_stats(self.check.device)
        return torch.cuda.max_memory_allocated(self.check.device)

    @staticmethod
    def headline(unit: dict) -> str:
        raise NotImplementedError

    @classmethod
    def print_items(cls, unit: dict) -> None:
        from benchmarks import cuda_peak

        items = unit.get("items")
        if items is None:  # the unit did not start, or stopped on an error
            status = "FAIL" if unit.get("status") == "error" else "NOT RUN"
            items = {name: {"status": status, "reason": unit.get("reason", "")} for name in cls.ITEMS}
        else:
            print(f"{cls.NAME}: {cls.headline(unit)}")
        for name in cls.ITEMS:
            item = items[name]
            detail = cls.DETAILS[name](item) if item["status"] in ("PASS", "FAIL") and "reason" not in item else ""
            reason = item.get("reason") or detail
            print(f"{cls.NAME} {name}: {item['status']}" + (f" ({reason})" if reason else ""), flush=True)
            replay = item.get("breakdown")
            if replay:  # what was live at the peak
                shown = cuda_peak.lines(replay) if "error" not in replay else [
                    f"allocator replay failed: {replay['error']}"]
                print("\n".join(f"  {name} {line}" for line in shown), flush=True)
        for name, why in cls.NOT_CHECKED.items():
            print(f"{cls.NAME} {name}: NOT CHECKED ({why})")
