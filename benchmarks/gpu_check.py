"""GPU check: the paper preset's model shape with random weights, through our rollout, sandbox and trainer.

For a machine with one GPU (an H200), torch and an older transformers only and no network
(``experiments/gpu_check.sh`` sends the missing packages and our transformers as wheels). Per player and trainer
backend (``--backends torch,deepspeed_zero2,...``):

1. a ``Qwen3ForCausalLM`` of Qwen3-4B-Base's architecture (``--shape qwen3_4b``) or a 2-layer toy of it
   (``--shape tiny``), random weights initialised on the device, seeded; no download;
2. the byte-level tokenizer built in code (``unifiedplayers.models.build_byte_tokenizer``, 259 ids; the 4B
   shape keeps its 151,936-row vocabulary, so most sampled ids decode to nothing: the text is not the point);
3. each step: sample ``--prompts`` x ``--samples`` completions with our ``hf`` rollout engine (fixed length,
   eos ignored), run the Execution player's completions as Python through our sandbox (its python block, else
   the whole text; reported as not run, with the reason, when the sandbox cannot start), build TrainSamples
   with made-up advantages (+1 / -1 alternating within each group) and take one optimizer step
   (``build_trainer(TrainerConfig(...))``, beta = 0.04, so the second step has a reference pass).

Printed and written to ``--out``/gpu_check.json: generation tokens/s (generated tokens / sampling seconds,
after one untimed warm-up call), the time split (generation; sandbox; log-prob passes = the trainer's
``perf/time_ref`` + ``perf/time_forward``; update = ``perf/time_backward`` + ``perf/time_optimizer`` (+
``perf/time_weight_sync`` where the trainer reports it)), peak memory (``torch.cuda.max_memory_allocated``
on GPU, per player; ``ru_maxrss`` of the process on CPU) and an exact-resume check: after step k the trainer
saves a checkpoint, takes step k+1 and its weights are recorded; a fresh trainer on a differently seeded
model loads the checkpoint and repeats step k+1 on the same batch; PASS when the weights are bitwise equal
(and did move in that step) and the loss and grad norm are equal. On GPU it runs under
``torch.use_deterministic_algorithms(True)`` with ``CUBLAS_WORKSPACE_CONFIG=:4096:8``; a difference is
reported as the largest absolute one. A 4B checkpoint (fp32 weights, AdamW state, reference) is about 60 GB,
more than the machine's disk holds comfortably and minutes to write, so by default the resume check runs on
the same shape cut to 2 layers (every kernel and the full vocabulary; ``--resume-layers`` to choose).
vLLM is not run: its CUDA wheel alone is far over the 64 MiB that can be carried to such a machine.

``--backends ...,paper_zero3``: the paper preset's trainer path (``benchmarks/gpu_check_paper.py``, its docstring
says how): the trainer settings of ``experiment=paper_qwen3_4b`` (DeepSpeed ZeRO-3, the optimizer offloaded to the
host with DeepSpeed's CPU Adam, JIT-built there, ref_mode precompute, gradient checkpointing, π_old recomputed,
β_p > 0) on the shape cut to 2 layers with the full vocabulary (``--resume-layers``), one player, a phase of 3
updates; printed as one line per item, ``paper_zero3 <item>: PASS | FAIL | NOT RUN (reason)``: offload_state (an
idle spell leaves the next update bitwise equal to a twin's that stayed active), reference (KL > 0 after the first
update, π_ref held on the host), save_cadence (``schedule.save_due`` with the preset's save_every, and a
checkpoint written and loaded through the ZeRO-3 engine), exact_resume (a fresh trainer loads the checkpoint and
repeats the update bitwise), peak_memory (``torch.cuda.max_memory_allocated`` within x 0.5 .. x 1.1 of the capacity
plan's figure for the same update; on CPU the plan's figure only); and NOT CHECKED (needs 2 GPUs): device pinning
per rank, NCCL collectives, ZeRO-3 sharding across ranks; vLLM (its wheel is too large to carry). The exit status
is 1 when an exact-resume check or a paper item fails.

Qwen3-4B-Base's architecture, from the ``config.json`` of the Hugging Face repository Qwen/Qwen3-4B-Base
(the Qwen3-4B card: 4.0B parameters, 3.6B without embeddings, 36 layers, 32 query / 8 key-value heads,
32,768 context): hidden 2560, intermediate 9728, 36 layers, 32 heads, 8 kv heads, head_dim 128 (so the
query projection is 4096 wide, not 2560), vocab 151,936, rope_theta 1e6, max_position_embeddings 32,768,
tied embeddings, rms_norm_eps 1e-6, no attention bias: 4,022,468,096 parameters.

Run time, estimated for one H200 with the defaults of ``experiments/gpu_check.sh run`` (``--backends
torch,paper_zero3``, --steps 2, 4 prompts x 4 samples of about 120 + 128 tokens, micro-batches of 2, bf16 compute
with fp32 master weights): imports and CUDA start 15-30 s; per player about 5 s to build the model and the
trainer, 2 x 4-6 s of sampling (128 decoding steps of a 36-layer model, launch-bound at about 30-40 ms a step),
2 x 2-4 s of update, under 2 s of sandbox: about 25 s, 75 s for the three players; the resume check on the
2-layer cut (0.59B parameters, a checkpoint of about 9 GB) 30-60 s, mostly writing and reading it; the paper
unit 2-3.5 min: JIT-building the CPU Adam op 40-90 s, three ZeRO-3 trainers on the 2-layer cut (engine start,
3 updates with the π_ref swap and CPU Adam over 0.59B parameters: 15-30 s each), a 9.5 GB checkpoint written
and read and as much parked and brought back (30-60 s), host copies of the states compared (10-20 s). About
5-6 minutes in all, under the 480-s timeout of ``gpu_check.sh run`` and the machine's 10 minutes; DeepSpeed
ZeRO-2 player runs (``deepspeed_zero2``) would add about 2 minutes, so they are not in the default.
``--budget-s`` skips what would start after that many seconds (the JSON is rewritten after every unit, so a run
cut short keeps what it measured).
Peak GPU memory with the torch backend, estimated: fp32 master 16 GB + AdamW 32 GB + fp32 gradients 16 GB +
bf16 compute copy 8 GB + bf16 reference 8 GB + activations of a micro-batch (a few GB): 85-95 GB of the 139.

    python benchmarks/gpu_check.py --device cpu --shape tiny                   # the CPU half, about 20 s
    python benchmarks/gpu_check.py --device cpu --shape tiny --backends paper_zero3    # about 25 s
    python benchmarks/gpu_check.py --device cuda --shape qwen3_4b --backends torch,paper_zero3
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("unifiedplayers") is None:  # a GPU machine: the working tree, not installed
    sys.path.insert(0, str(ROOT / "src"))
# gpu_check_paper.py (the paper_zero3 unit) imports this module by name, run as a script or loaded from a path
# (a loader that does not register the module registers it as "gpu_check" itself: tests/benchmarks_gpu).
if __name__ in sys.modules:
    sys.modules.setdefault("gpu_check", sys.modules[__name__])

GIB = 1024**3
PLAYERS = ("planning", "execution", "evaluation")
VLLM_NOTE = "vLLM: not run (its CUDA wheel is far over the 64 MiB that can be carried to the GPU machine)"
PAPER_UNIT = "paper_zero3"  # a --backends entry: the paper preset's trainer path (gpu_check_paper.py)

# Qwen/Qwen3-4B-Base config.json (see the module docstring); bos/eos/pad are set to the byte tokenizer's.
QWEN3_4B = dict(
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    rope_theta=1_000_000.0,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
    attention_bias=False,
    hidden_act="silu",
)
# Same structure (GQA, q/k norms, tied head), 2 layers, the byte tokenizer's vocabulary: every id decodes.
TINY = dict(QWEN3_4B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=259)
SHAPES = {"qwen3_4b": QWEN3_4B, "tiny": TINY}
# What each shape runs by default: (prompts, samples per prompt, new tokens, micro-batch size).
SHAPE_DEFAULTS = {"qwen3_4b": (4, 4, 128, 2), "tiny": (4, 4, 24, 4)}
RESUME_MAX_BYTES = 12 * GIB  # a larger checkpoint: the resume check runs on the shape cut to 2 layers

# Our own short prompts, a system line and four tasks per player (115-131 byte tokens each, rendered).
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
CODE_BLOCK = re.compile(r"```python\n(.*?)(?:```|$)", re.S)


# ---------------------------------------------------------------------------------------------- model
def qwen3_config(shape: str, num_layers: Optional[int] = None, tokenizer: Any = None):
    """A transformers ``Qwen3Config`` of ``shape`` (optionally cut to ``num_layers``)."""
    from transformers import Qwen3Config

    values = dict(SHAPES[shape])
    if num_layers:
        values["num_hidden_layers"] = num_layers
    ids = {}
    if tokenizer is not None:
        ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    return Qwen3Config(**values, **ids)


def count_parameters(config) -> int:
    """Parameters of a ``Qwen3ForCausalLM`` of ``config``, built on the meta device (nothing allocated)."""
    import torch
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    return sum(p.numel() for p in model.parameters())  # tied embeddings counted once


def build_model(config, device, seed: int):
    """A float32 ``Qwen3ForCausalLM`` with random weights, allocated and initialised on ``device``."""
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return model.float().eval()


# ---------------------------------------------------------------------------------------------- helpers
class Clock:
    """Wall seconds of a block, the device drained at both ends (CUDA work is asynchronous)."""

    def __init__(self, device) -> None:
        import torch

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


def sampling_module(trainer, dtype):
    """The module the hf engine samples from: ``trainer.rollout_model`` where the trainer has one, else its
    ``sampling_model(dtype)``, else ``trainer.model``."""
    module = getattr(trainer, "rollout_model", None)
    if module is not None:
        return module
    if callable(getattr(trainer, "sampling_model", None)):
        return trainer.sampling_model(dtype)
    return trainer.model


def render_prompts(tokenizer, role: str, count: int) -> list[str]:
    system, tasks = PROMPTS[role]
    return [tokenizer.apply_chat_template([{"role": "system", "content": system},
                                           {"role": "user", "content": tasks[i % len(tasks)]}],
                                          add_generation_prompt=True, tokenize=False) for i in range(count)]


def weights_on_host(trainer) -> dict:
    """The policy's full weights copied to the host, once per storage (the tied embedding and head once)."""
    seen, out = set(), {}
    with trainer.gathered_weights():
        for name, t in trainer.model.state_dict().items():
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
            if key not in seen:
                seen.add(key)
                out[name] = t.detach().to("cpu", copy=True)
    return out


def checksum(state: dict) -> str:
    import torch

    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def compare(a: dict, b: dict) -> tuple[bool, float]:
    """(bitwise equal, max |a - b|) over two host state dicts with the same keys."""
    import torch

    equal, diff = set(a) == set(b), 0.0
    for name in a.keys() & b.keys():
        x, y = a[name], b[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, float("inf")
        if not torch.equal(x, y):
            equal = False
            diff = max(diff, float((x.float() - y.float()).abs().max()))
    return equal, diff


def drain_after_backward(trainer, cuda: bool):
    """CUDA runs asynchronously, and the trainer's clocks are host clocks: a micro-batch's backward would finish
    inside the next one's forward timing. A hook on the input embedding's weight, whose gradient is the last one
    a backward pass accumulates, waits for the device there, so perf/time_backward holds the backward's work.
    (The reference pass's work still lands in the first forward's timing: both count as log-prob passes.)
    On CPU the hook does nothing."""
    import torch

    module = getattr(trainer, "compute_model", None) or trainer.model
    weight = module.get_input_embeddings().weight
    drain = torch.cuda.synchronize if cuda else (lambda: None)
    return weight.register_post_accumulate_grad_hook(lambda _: drain())


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


@contextlib.contextmanager
def deterministic(cuda: bool):
    """``torch.use_deterministic_algorithms`` on GPU for the exact-step checks (warn_only: a kernel without a
    deterministic version warns); yields a list that holds those warnings when the block ends."""
    import torch

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
    """Drop a trainer (a DeepSpeed engine is destroyed first) and give its GPU memory back."""
    import torch

    for obj in objects:
        engine = getattr(obj, "engine", None)
        if engine is not None and hasattr(engine, "destroy"):
            with contextlib.suppress(Exception):
                engine.destroy()
    del objects
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- the check
class Check:
    def __init__(self, args) -> None:
        import torch

        from unifiedplayers.models import build_byte_tokenizer

        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.dtype_name = args.dtype
        if args.dtype == "auto":
            self.dtype_name = "bfloat16" if self.cuda and torch.cuda.is_bf16_supported() else "float32"
        self.dtype = getattr(torch, self.dtype_name)
        self.tokenizer = build_byte_tokenizer()
        self.config = qwen3_config(args.shape, tokenizer=self.tokenizer)
        self.sandbox = None
        self.start = time.perf_counter()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.report: dict[str, Any] = {
            "device": self._device_info(),
            "args": vars(args),
            "dtype": self.dtype_name,
            "shape": {"name": args.shape, "parameters": count_parameters(self.config), **SHAPES[args.shape]},
            "runs": [],
            "resume": {},
            "sandbox": {"status": "not run", "reason": "no execution player in --players"},
            "deepspeed": {"status": "not requested"},
            PAPER_UNIT: {"status": "not requested"},
            "vllm": {"status": "not run", "reason": VLLM_NOTE.split("(", 1)[1].rstrip(")")},
        }

    def _device_info(self) -> dict:
        import torch
        import transformers

        info = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "device": self.args.device, "cpu_count": os.cpu_count()}
        if self.cuda:
            props = torch.cuda.get_device_properties(self.device)
            info.update(name=props.name, total_memory_bytes=props.total_memory, cuda=torch.version.cuda,
                        capability=f"{props.major}.{props.minor}")
        return info

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def over_budget(self) -> bool:
        return bool(self.args.budget_s) and self.elapsed() > self.args.budget_s

    def save(self) -> None:
        self.report["wall_s"] = round(self.elapsed(), 2)
        self.report.update(self.summary())
        path = self.out / "gpu_check.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.report, indent=2, default=str))
        tmp.replace(path)

    # ------------------------------------------------------------------ pieces
    def trainer_config(self, backend: str):
        from unifiedplayers.config import TrainerConfig

        a = self.args
        return TrainerConfig(backend=backend, lr=a.lr, kl_coef=a.kl_coef, micro_batch_size=a.micro_batch,
                             dtype=self.dtype_name, entropy_every=0, temperature=1.0)

    def make_trainer(self, backend: str, role: str, config, seed: int):
        from unifiedplayers.trainer import build_trainer

        model = build_model(config, self.device, seed)
        return build_trainer(self.trainer_config(backend), model, role=role,
                             pad_token_id=self.tokenizer.pad_token_id)

    def engine_for(self, trainer):
        from unifiedplayers.config import RolloutConfig
        from unifiedplayers.rollout import build_rollout

        cfg = RolloutConfig(backend="hf", temperature=1.0, top_p=1.0, max_new_tokens=self.args.max_new_tokens,
                            batch_size=0)
        return build_rollout(cfg, sampling_module(trainer, self.dtype), self.tokenizer)

    def sample(self, engine, trainer, prompts: list[str], seed: int):
        engine.update_weights(sampling_module(trainer, self.dtype))
        clock = Clock(self.device)
        with clock():
            groups = engine.generate(prompts, n=self.args.samples, max_new_tokens=self.args.max_new_tokens,
                                     ignore_eos=True, seed=seed)
        return groups, clock.seconds

    @staticmethod
    def train_samples(groups) -> list:
        from unifiedplayers.trainer import sample_from_completion

        return [sample_from_completion(c, 1.0 if j % 2 == 0 else -1.0, g)
                for g, group in enumerate(groups) for j, c in enumerate(group)]

    def run_sandbox(self, groups) -> dict:
        """The Execution player's completions as programs: their python block, else the whole text."""
        info = self.report["sandbox"]
        if info.get("status") == "failed to start":
            return {"seconds": 0.0, "programs": 0}
        if self.sandbox is None:
            from unifiedplayers.sandbox import Sandbox, SandboxConfig

            t0 = time.perf_counter()
            try:
                self.sandbox = Sandbox(SandboxConfig(timeout_s=5.0, memory_mb=512))
                self.sandbox.start()
            except Exception as exc:  # noqa: BLE001 - Landlock, namespaces or anything else missing there
                self.sandbox = None
                self.report["sandbox"] = {"status": "failed to start", "reason": f"{type(exc).__name__}: {exc}"}
                print(f"sandbox: not run ({type(exc).__name__}: {exc})", flush=True)
                return {"seconds": 0.0, "programs": 0}
            self.report["sandbox"] = {"status": "ran", "start_s": round(time.perf_counter() - t0, 3),
                                      "isolation": self.sandbox.isolation, "programs": 0, "ok": 0, "failed": 0,
                                      "timed_out": 0, "seconds": 0.0}
        programs = []
        for group in groups:
            for c in group:
                block = CODE_BLOCK.search(c.text)
                programs.append(block.group(1) if block else c.text)
        t0 = time.perf_counter()
        results = self.sandbox.run_many(programs)
        seconds = time.perf_counter() - t0
        info = self.report["sandbox"]
        info["programs"] += len(results)
        info["ok"] += sum(r.ok for r in results)
        info["failed"] += sum(not r.ok for r in results)
        info["timed_out"] += sum(r.timed_out for r in results)
        info["seconds"] = round(info["seconds"] + seconds, 4)
        return {"seconds": seconds, "programs": len(results), "ok": sum(r.ok for r in results)}

    def warm_up(self, engine) -> None:
        """One short untimed generation: kernel selection and the first-call costs stay out of tokens/s."""
        engine.generate([render_prompts(self.tokenizer, "planning", 1)[0]], n=2, max_new_tokens=4,
                        ignore_eos=True, seed=0)

    # ------------------------------------------------------------------ one player
    def run_player(self, backend: str, role: str) -> dict:
        import torch

        a = self.args
        record: dict[str, Any] = {"backend": backend, "player": role, "status": "ok", "steps": []}
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        trainer = self.make_trainer(backend, role, self.config, seed=a.seed + PLAYERS.index(role))
        trainer.start_outer_iteration()
        trainer.start_block()
        hook = drain_after_backward(trainer, self.cuda)
        engine = self.engine_for(trainer)
        self.warm_up(engine)
        record["setup_s"] = round(time.perf_counter() - t0, 3)
        prompts = render_prompts(self.tokenizer, role, a.prompts)
        record["prompt_tokens_mean"] = sum(len(self.tokenizer(p, add_special_tokens=False)["input_ids"])
                                           for p in prompts) / len(prompts)
        for step in range(a.steps):
            groups, gen_s = self.sample(engine, trainer, prompts, seed=a.seed * 1000 + step)
            tokens = sum(len(c.token_ids) for g in groups for c in g)
            box = self.run_sandbox(groups) if role == "execution" else {"seconds": 0.0, "programs": 0}
            batch = self.train_samples(groups)
            clock = Clock(self.device)
            with clock():
                m = trainer.update(batch)
            logprob_s = m["perf/time_ref"] + m["perf/time_forward"]
            update_s = m["perf/time_backward"] + m["perf/time_optimizer"] + m.get("perf/time_weight_sync", 0.0)
            record["steps"].append({
                "step": step + 1, "generated_tokens": tokens, "generation_s": gen_s,
                "tokens_per_s": tokens / gen_s if gen_s > 0 else 0.0,
                "sandbox_s": box["seconds"], "sandbox_programs": box["programs"],
                "logprob_s": logprob_s, "update_s": update_s, "update_wall_s": clock.seconds,
                "trained_tokens": sum(len(s.token_ids) for s in batch),
                **{k: m[k] for k in ("perf/time_ref", "perf/time_forward", "perf/time_backward",
                                     "perf/time_optimizer", "perf/time_weight_sync", "actor/loss",
                                     "actor/grad_norm", "actor/kl", "perf/update_tflop") if k in m},
            })
            print(f"  {backend}/{role} step {step + 1}: {tokens} tokens in {gen_s:.2f} s "
                  f"({tokens / max(gen_s, 1e-9):.0f} tok/s), log-prob passes {logprob_s:.2f} s, "
                  f"update {update_s:.2f} s (update wall {clock.seconds:.2f} s), loss {m['actor/loss']:+.4g}",
                  flush=True)
        record["peak_memory_bytes"] = (torch.cuda.max_memory_allocated(self.device) if self.cuda
                                       else peak_rss_bytes())
        hook.remove()
        release(trainer, engine)
        del trainer, engine
        release()
        if self.cuda:  # what a backend leaves behind would crowd the next player
            record["memory_after_release_bytes"] = torch.cuda.memory_allocated(self.device)
        return record

    # ------------------------------------------------------------------ exact resume
    def resume_layers(self) -> int:
        a = self.args
        if a.resume_layers:
            return a.resume_layers
        estimate = self.report["shape"]["parameters"] * 16  # fp32 weights + AdamW (8) + reference (<= 4)
        return self.config.num_hidden_layers if estimate <= RESUME_MAX_BYTES else 2

    def run_resume(self, backend: str, role: str) -> dict:
        a = self.args
        layers = self.resume_layers()
        config = qwen3_config(a.shape, num_layers=layers, tokenizer=self.tokenizer)
        k = max(1, a.resume_after)
        result: dict[str, Any] = {"backend": backend, "player": role, "layers": layers, "after_step": k,
                                  "parameters": count_parameters(config)}
        root = Path(a.ckpt_dir) if a.ckpt_dir else Path(tempfile.gettempdir())
        root.mkdir(parents=True, exist_ok=True)
        need = result["parameters"] * 16
        free = shutil.disk_usage(root).free
        if free < 1.5 * need:
            result.update(status="not run", reason=f"needs about {need / GIB:.1f} GiB under {root}, "
                                                   f"{free / GIB:.1f} GiB free (--ckpt-dir, --resume-layers)")
            return result
        directory = Path(tempfile.mkdtemp(prefix="gpu-check-resume-", dir=root))
        try:
            with deterministic(self.cuda) as caught:
                result.update(self._resume(backend, role, config, k, directory / "ckpt"))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        result["determinism_warnings"] = caught
        result["deterministic_algorithms"] = self.cuda
        return result

    def _resume(self, backend: str, role: str, config, k: int, path: Path) -> dict:
        a = self.args
        trainer = self.make_trainer(backend, role, config, seed=a.seed + 100)
        trainer.start_outer_iteration()
        engine = self.engine_for(trainer)
        prompts = render_prompts(self.tokenizer, role, a.prompts)
        for step in range(k):
            groups, _ = self.sample(engine, trainer, prompts, seed=a.seed * 1000 + 500 + step)
            trainer.update(self.train_samples(groups))
        groups, _ = self.sample(engine, trainer, prompts, seed=a.seed * 1000 + 500 + k)
        batch = self.train_samples(groups)
        t0 = time.perf_counter()
        trainer.save_checkpoint(path)
        save_s = time.perf_counter() - t0
        ckpt_bytes = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        before = weights_on_host(trainer)
        first = trainer.update(batch)
        after = weights_on_host(trainer)
        release(trainer, engine)
        del trainer, engine
        release()

        replay, again, load_s, loaded_equal = self._replay(backend, role, config, path, batch, before, seed=200)
        equal, max_diff = compare(after, replay)
        _, step_delta = compare(before, after)
        same_metrics = all(first[key] == again[key] for key in ("actor/loss", "actor/grad_norm"))
        passed = equal and same_metrics and loaded_equal and step_delta > 0
        result = {
            "status": "PASS" if passed else "FAIL",
            "bitwise_equal": equal, "max_abs_diff": max_diff, "loaded_weights_equal": loaded_equal,
            "step_changed_weights_by": step_delta,
            "loss": [first["actor/loss"], again["actor/loss"]],
            "grad_norm": [first["actor/grad_norm"], again["actor/grad_norm"]],
            "checksum": [checksum(after), checksum(replay)],
            "checkpoint_bytes": ckpt_bytes, "save_s": round(save_s, 3), "load_s": round(load_s, 3),
        }
        if not passed and loaded_equal:
            # Which is it: state missing from the checkpoint, or kernels that differ from run to run? A second
            # replay from the same checkpoint tells: equal to the first replay, the checkpoint lacks something.
            replay2, _, _, _ = self._replay(backend, role, config, path, batch, before, seed=300)
            repeatable, diff2 = compare(replay, replay2)
            result["replays_bitwise_equal"] = repeatable
            result["replays_max_abs_diff"] = diff2
            result["diagnosis"] = ("the replays agree with each other, not with the uninterrupted step: state is "
                                   "missing from the checkpoint" if repeatable else
                                   "the replays differ from each other too: non-deterministic kernels")
        return result

    def _replay(self, backend: str, role: str, config, path: Path, batch: list, before: dict, seed: int):
        """A fresh trainer on a differently seeded model loads ``path`` and takes the step on ``batch``."""
        fresh = self.make_trainer(backend, role, config, seed=self.args.seed + seed)
        t0 = time.perf_counter()
        fresh.load_checkpoint(path)
        load_s = time.perf_counter() - t0
        loaded_equal, _ = compare(weights_on_host(fresh), before)
        metrics = fresh.update(batch)
        weights = weights_on_host(fresh)
        release(fresh)
        del fresh
        release()
        return weights, metrics, load_s, loaded_equal

    # ------------------------------------------------------------------ everything
    def backend_unavailable(self, backend: str) -> Optional[str]:
        if not backend.startswith("deepspeed") and backend != PAPER_UNIT:
            return None
        try:
            import deepspeed  # noqa: F401
        except Exception as exc:  # noqa: BLE001
            return f"import deepspeed failed: {type(exc).__name__}: {exc}"
        self.report["deepspeed"] = {"status": "importable", "version": deepspeed.__version__}
        return None

    def guarded(self, what: str, fn: Callable[[], dict], base: dict) -> dict:
        if self.over_budget():
            return {**base, "status": "skipped", "reason": f"time budget of {self.args.budget_s} s spent"}
        print(f"{what} ...", flush=True)
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - report it and go on with the next unit
            traceback.print_exc()
            failed = {**base, "status": "error", "reason": f"{type(exc).__name__}: {exc}"[:2000]}
        release()  # out of the except block: the traceback's frames, and the memory they hold, are gone
        return failed

    def run(self) -> dict:
        a = self.args
        print(f"shape {a.shape}: {_count(self.report['shape']['parameters'])} parameters, device {a.device}, "
              f"compute dtype {self.dtype_name}, backends {','.join(a.backends)}, players {','.join(a.players)}, "
              f"{a.steps} steps of {a.prompts} x {a.samples} x {a.max_new_tokens} new tokens", flush=True)
        resume_role = "execution" if "execution" in a.players else a.players[0]
        for backend in a.backends:
            reason = self.backend_unavailable(backend)
            if backend == PAPER_UNIT:
                run_paper_unit(self, reason)
                continue
            if reason:
                self.report["deepspeed"] = {"status": "not run", "reason": reason}
                for role in a.players:
                    self.report["runs"].append({"backend": backend, "player": role, "status": "not run",
                                                "reason": reason})
                self.report["resume"][backend] = {"status": "not run", "reason": reason}
                self.save()
                continue
            for role in a.players:
                self.report["runs"].append(self.guarded(f"{backend}/{role}", lambda: self.run_player(backend, role),
                                                        {"backend": backend, "player": role}))
                self.save()
            if a.resume:
                self.report["resume"][backend] = self.guarded(
                    f"{backend}/{resume_role} exact resume", lambda: self.run_resume(backend, resume_role),
                    {"backend": backend, "player": resume_role})
                self.save()
            if backend.startswith("deepspeed"):
                ran = [r for r in self.report["runs"] if r["backend"] == backend]
                self.report["deepspeed"]["status"] = ("ran" if all(r["status"] == "ok" for r in ran)
                                                      else "errors: see runs")
        if self.sandbox is not None:
            self.sandbox.close()
        self.save()
        return self.report

    def summary(self) -> dict:
        """Totals over the runs that finished: tokens/s, the time split, peak memory, the resume verdict."""
        ok = [r for r in self.report["runs"] if r.get("status") == "ok"]
        steps = [s for r in ok for s in r["steps"]]
        gen_s = sum(s["generation_s"] for s in steps)
        tokens = sum(s["generated_tokens"] for s in steps)
        checks = [v["status"] for v in self.report["resume"].values()]
        ran = [c for c in checks if c in ("PASS", "FAIL")]
        return {
            "generation_tokens_per_s": tokens / gen_s if gen_s > 0 else 0.0,
            "time_split_s": {
                "generation": gen_s,
                "sandbox": sum(s["sandbox_s"] for s in steps),
                "logprob_passes": sum(s["logprob_s"] for s in steps),
                "update": sum(s["update_s"] for s in steps),
            },
            "peak_memory_bytes": max((r["peak_memory_bytes"] for r in ok), default=0),
            "peak_memory_kind": "torch.cuda.max_memory_allocated" if self.cuda else "ru_maxrss",
            "resume_check": ("PASS" if ran and all(c == "PASS" for c in ran) else "FAIL" if ran else "not run"),
            "paper_check": paper_verdict(self.report[PAPER_UNIT]),
        }


def run_paper_unit(check: Check, unavailable: Optional[str]) -> None:
    """The paper preset's trainer path (gpu_check_paper.py); its item lines are printed as it ends."""
    paper = paper_module()
    if unavailable:
        result = {"status": "not run", "reason": unavailable}
    else:
        result = check.guarded(f"{PAPER_UNIT} (the paper preset's trainer settings)", lambda: paper.run_unit(check), {})
    check.report[PAPER_UNIT] = result
    check.save()
    paper.print_items(result)


def sibling(name: str):
    """benchmarks/<name>.py, loaded from its path (this folder need not be on sys.path)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def paper_module():
    """benchmarks/gpu_check_paper.py (the paper unit)."""
    return sibling("gpu_check_paper")


def paper_verdict(unit: dict) -> str:
    """FAIL when an item failed or the unit stopped on an error; PASS when every item that ran passed."""
    if unit.get("status") == "error":
        return "FAIL"
    statuses = [item["status"] for item in unit.get("items", {}).values()]
    if "FAIL" in statuses:
        return "FAIL"
    return "PASS" if "PASS" in statuses else "not run"


def _count(n: int) -> str:
    return f"{n / 1e9:.3f}B" if n >= 1e8 else f"{n / 1e6:.3f}M"


def print_report(report: dict) -> None:
    if report["runs"]:
        print_runs(report)
    print_checks(report)


def print_runs(report: dict) -> None:
    """The player runs' table and the time split."""
    mem = "GPU GiB" if report["peak_memory_kind"].startswith("torch.cuda") else "RSS GiB"
    head = (f"{'backend':<16}{'player':<12}{'status':<8}{'gen tok/s':>10}{'gen s':>8}{'sandbox s':>10}"
            f"{'logprob s':>10}{'update s':>9}{'peak ' + mem:>14}")
    print("\n" + head + "\n" + "-" * len(head))
    for r in report["runs"]:
        if r.get("status") != "ok":
            print(f"{r['backend']:<16}{r['player']:<12}{r['status']:<8}  {r.get('reason', '')[:90]}")
            continue
        st = r["steps"]
        gen, tok = sum(s["generation_s"] for s in st), sum(s["generated_tokens"] for s in st)
        print(f"{r['backend']:<16}{r['player']:<12}{'ok':<8}{tok / max(gen, 1e-9):>10.1f}{gen:>8.2f}"
              f"{sum(s['sandbox_s'] for s in st):>10.2f}{sum(s['logprob_s'] for s in st):>10.2f}"
              f"{sum(s['update_s'] for s in st):>9.2f}{r['peak_memory_bytes'] / GIB:>14.2f}")
    split = report["time_split_s"]
    print("-" * len(head))
    print(f"{'all':<36}{report['generation_tokens_per_s']:>10.1f}{split['generation']:>8.2f}{split['sandbox']:>10.2f}"
          f"{split['logprob_passes']:>10.2f}{split['update']:>9.2f}{report['peak_memory_bytes'] / GIB:>14.2f}")
    print(f"\ngeneration: {report['generation_tokens_per_s']:.1f} tokens/s; time split (s): generation "
          f"{split['generation']:.2f}, sandbox {split['sandbox']:.2f}, log-prob passes {split['logprob_passes']:.2f}, "
          f"update {split['update']:.2f}; peak memory {report['peak_memory_bytes'] / GIB:.2f} GiB "
          f"({report['peak_memory_kind']})")


def print_checks(report: dict) -> None:
    """The sandbox, the exact-resume checks, DeepSpeed, vLLM and the paper unit's verdicts."""
    box = report["sandbox"]
    if box.get("status") == "ran":
        layers = {k: v for k, v in (box.get("isolation") or {}).items() if isinstance(v, bool)}
        print(f"sandbox: {box['programs']} programs (exit 0: {box['ok']}, failed: {box['failed']}, timed out: "
              f"{box['timed_out']}; random weights write no valid Python), start {box['start_s']:.2f} s, "
              f"isolation {layers}")
    else:
        print(f"sandbox: not run ({box.get('reason')})")
    for backend, r in report["resume"].items():
        if r.get("status") in ("PASS", "FAIL"):
            print(f"exact resume [{backend}/{r['player']}, {r['layers']} layers, {_count(r['parameters'])} parameters, "
                  f"checkpoint {r['checkpoint_bytes'] / 2**20:.1f} MiB, save {r['save_s']:.1f} s, "
                  f"load {r['load_s']:.1f} s]: "
                  f"{r['status']} (bitwise equal {r['bitwise_equal']}, max |diff| {r['max_abs_diff']:.3g}, "
                  f"loss {r['loss'][0]:+.6g} / {r['loss'][1]:+.6g}, checksum {r['checksum'][0]} / {r['checksum'][1]}, "
                  f"step moved weights by up to {r['step_changed_weights_by']:.3g})")
            if r.get("diagnosis"):
                print(f"  {r['diagnosis']} (replays: max |diff| {r['replays_max_abs_diff']:.3g})")
        else:
            print(f"exact resume [{backend}]: {r.get('status')} ({r.get('reason', '')[:200]})")
    ds = report["deepspeed"]
    print(f"DeepSpeed: {ds.get('status')}" + (f" ({ds['reason'][:200]})" if ds.get("reason") else "")
          + (f", version {ds['version']}" if ds.get("version") else ""))
    print(VLLM_NOTE)
    paper = report[PAPER_UNIT]
    if "items" in paper:
        counts = {s: sum(i["status"] == s for i in paper["items"].values()) for s in ("PASS", "FAIL", "NOT RUN")}
        print(f"{PAPER_UNIT}: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + " (the item lines above)")
    elif paper.get("status") != "not requested":
        print(f"{PAPER_UNIT}: {paper.get('status')} ({paper.get('reason', '')[:200]})")
    print(f"resume check: {report['resume_check']}; paper check: {report['paper_check']}; "
          f"wall {report['wall_s']:.1f} s")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3_4b")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps per player")
    p.add_argument("--players", default=",".join(PLAYERS), help="comma-separated, of " + ",".join(PLAYERS))
    p.add_argument("--backends", default="torch",
                   help=f"comma-separated: torch, deepspeed_zero2, deepspeed_zero3 (a player run each), {PAPER_UNIT} "
                        "(the paper preset's trainer path, gpu_check_paper.py)")
    p.add_argument("--dtype", choices=("bfloat16", "float32", "auto"), default="auto",
                   help="trainer.dtype (compute); auto: bfloat16 on a bf16 GPU, else float32")
    p.add_argument("--out", default="runs/gpu_check", help="folder of gpu_check.json")
    p.add_argument("--prompts", type=int, help="prompts per step (default: 4)")
    p.add_argument("--samples", type=int, help="samples per prompt, the group (default: 4)")
    p.add_argument("--max-new-tokens", type=int, help="tokens per sample (default: 128 for qwen3_4b, 24 for tiny)")
    p.add_argument("--micro-batch", type=int, help="trainer.micro_batch_size (default: 2 for qwen3_4b, 4 for tiny)")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--kl-coef", type=float, default=0.04)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch CPU threads (default: 1 for tiny, torch's own otherwise)")
    p.add_argument("--no-resume", dest="resume", action="store_false", help="skip the exact-resume check")
    p.add_argument("--resume-after", type=int, default=1, help="k: checkpoint after step k, compare step k+1")
    p.add_argument("--resume-layers", type=int, default=0,
                   help="layers of the resume check's model (0: the shape's own when its checkpoint is under "
                        f"{RESUME_MAX_BYTES // GIB} GiB, else 2)")
    p.add_argument("--ckpt-dir", help="where the resume check writes its checkpoint (default: the temp dir)")
    p.add_argument("--budget-s", type=float, default=0.0, help="skip units that would start after this (0: none)")
    args = p.parse_args(argv)
    args.players = [r for r in args.players.split(",") if r]
    args.backends = [b for b in args.backends.split(",") if b]
    unknown = set(args.players) - set(PLAYERS)
    if unknown:
        p.error(f"unknown players {sorted(unknown)}")
    prompts, samples, new_tokens, micro = SHAPE_DEFAULTS[args.shape]
    args.prompts = args.prompts or prompts
    args.samples = args.samples or samples
    args.max_new_tokens = args.max_new_tokens or new_tokens
    args.micro_batch = args.micro_batch or micro
    if args.threads is None:  # the toy's matrices are too small for threads; on shared cores they only wait
        args.threads = 1 if args.shape == "tiny" else 0
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        # Before CUDA starts: cuBLAS's deterministic workspace for the exact-resume check.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    check = Check(args)
    report = check.run()
    print_report(report)
    print(f"written: {check.out / 'gpu_check.json'}")
    return 1 if "FAIL" in (report["resume_check"], report["paper_check"]) else 0


if __name__ == "__main__":
    sys.exit(main())
