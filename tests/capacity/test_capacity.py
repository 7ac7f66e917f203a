"""The capacity and compute plan (unifiedplayers.capacity): its arithmetic against hand-worked figures, the
paper presets on the paper's node, the start-up refusal, and the command line."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from unifiedplayers import capacity
from unifiedplayers.capacity import (GiB, TB, CapacityError, Hardware, check_fits, checkpoint_disk, count, model_arch,
                                     plan, workload)
from unifiedplayers.capacity.report import format_plan
from unifiedplayers.config import compose, resolve_player_config

ROOT = Path(__file__).resolve().parents[2]
QWEN_N = 4_022_468_096
MIMO_N = 7_833_409_536
PAPER_NODE = Hardware()  # 8 x 80 GiB GPUs, 512 GiB of host RAM, 2 TB of disk


def item(items, prefix):
    found = [i for i in items if i.name.startswith(prefix)]
    assert len(found) == 1, [i.name for i in items]
    return found[0]


def test_qwen3_4b_parameters_from_the_arch_file():
    arch = model_arch(compose(["experiment=paper_qwen3_4b"]).model)
    assert arch.source == "conf/model/arch/qwen3_4b_base.json"
    # Per layer: q 2560x4096, k and v 2560x1024, o 4096x2560, q/k norms 2x128, MLP 3x2560x9728, two norms 2x2560.
    assert arch.layer_parameters == 100_930_816
    # 151936 x 2560 tied embeddings + 36 layers + the final norm (tests/benchmarks/test_gpu_check.py).
    assert arch.parameters == 151936 * 2560 + 36 * 100_930_816 + 2560 == QWEN_N
    assert arch.kv_bytes_per_token(2) == 2 * 36 * 8 * 128 * 2


def test_mimo_7b_parameters_from_the_arch_file():
    arch = model_arch(compose(["experiment=paper_mimo_7b"]).model)
    # Per layer: q 4096x4096 + bias, k and v 4096x1024 + biases, o 4096x4096, MLP 3x4096x11008, two norms.
    layer = (4096 * 4096 + 4096) + 2 * (4096 * 1024 + 1024) + 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096
    assert arch.layer_parameters == layer == 177_223_680
    mtp = layer + 2 * 4096 * 4096 + 3 * 4096  # the MTP layer: a decoder layer, its input projection, three norms
    assert arch.parameters == 2 * 151680 * 4096 + 36 * layer + 4096 + mtp == MIMO_N  # the preset's "N = 7.8e9"
    assert arch.sampled_parameters == MIMO_N - mtp  # vLLM loads no MTP layer


def test_the_other_backbones_count_what_their_modules_hold():
    smol = model_arch(compose(["experiment=smoke"]).model)
    layer = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536 + 2 * 576
    assert smol.parameters == 49152 * 576 + 30 * layer + 576 == 134_515_008
    from unifiedplayers.models import build_tiny_random

    cfg = compose(["experiment=tiny"])
    model, _ = build_tiny_random(cfg.model)
    assert model_arch(cfg.model).parameters == sum(p.numel() for p in model.parameters())


def test_a_local_config_json_wins(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, '
                                          '"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,'
                                          ' "head_dim": 16, "vocab_size": 100, "tie_word_embeddings": true}')
    arch = model_arch(compose(["experiment=paper_qwen3_4b", f"model.path={tmp_path}"]).model)
    assert arch.source == str(tmp_path / "config.json") and arch.hidden_size == 64 and arch.qk_norm


def test_zero3_shards_and_offload_of_the_optimizer_state():
    on_gpus = plan(compose(["experiment=paper_qwen3_4b", "trainer.offload_optimizer=false"]), PAPER_NODE)
    shard = item(on_gpus.gpu_peak.items, "optimizer state")
    assert shard.bytes == 18 * QWEN_N / 8 and "trainer.offload_optimizer" in shard.setting
    offloaded = plan(compose(["experiment=paper_qwen3_4b"]), PAPER_NODE)
    assert not [i for i in offloaded.gpu_peak.items if i.name.startswith("optimizer state")]
    assert item(offloaded.host_peak.items, "active player's ZeRO-Offload").bytes == 18 * QWEN_N  # 72.4 GB a node
    weights = item(offloaded.gpu_peak.items, "3 players' weights")
    assert weights.bytes == 3 * 2 * QWEN_N / 8  # bf16, each player 1/8 per GPU


def test_lm_head_logits_block():
    whole = plan(compose(["experiment=paper_qwen3_4b"]), PAPER_NODE)
    # micro-batch 2 rows x 4 turns x 1024 generated tokens, each scored over the 151,936-token vocabulary in float32.
    forward = next(i for i in whole.gpu if i.name.startswith("forward"))
    assert item(forward.items, "LM-head float32 block").bytes == 2 * 4 * 1024 * 151936 * 4
    chunked = plan(compose(["experiment=paper_qwen3_4b", "trainer.logprob_chunk_rows=1024"]), PAPER_NODE)
    forward = next(i for i in chunked.gpu if i.name.startswith("forward"))
    assert item(forward.items, "LM-head float32 block").bytes == 1024 * 151936 * 4


@pytest.mark.parametrize("kl_coef, recompute, no_grad", [(0.04, False, True), (0.0, True, True), (0.0, False, False)])
def test_a_no_grad_pass_runs_for_pi_ref_or_a_recomputed_pi_old(kl_coef, recompute, no_grad):
    """The no-grad instant is the π_ref pass (β_p ≠ 0, Eq. 20) or π_old's recomputation (Eq. 18): either one alone
    has it, neither has none."""
    cfg = compose(["experiment=paper_qwen3_4b", f"trainer.kl_coef={kl_coef}",
                   f"trainer.recompute_old_logprobs={str(recompute).lower()}"])
    names = [i.name for i in plan(cfg, PAPER_NODE).gpu]
    assert sum(n.startswith("no-grad") for n in names) == (1 if no_grad else 0), names
    assert any(n.startswith("forward") for n in names) and any(n.startswith("backward") for n in names)


def test_micro_batch_rows_under_a_token_budget():
    """trainer.max_tokens_per_micro_batch: as many rows at their budget as it holds (at least one, at most the
    batch); the LM-head block and checkpointed inputs follow those rows."""
    cfg = compose(["experiment=paper_qwen3_4b", "trainer.max_tokens_per_micro_batch=null"])
    loads = capacity.role_loads(cfg)
    ex, pl = loads["execution"], loads["planning"]
    assert [capacity.micro_rows(cfg, load) for load in (ex, pl)] == [2, 2]  # micro_batch_size
    budget = compose(["experiment=paper_qwen3_4b"])  # the preset's: two of Execution's longest rows
    assert budget.trainer.max_tokens_per_micro_batch == 2 * ex.length
    assert capacity.micro_rows(budget, ex) == 2  # 2 x 6824 tokens: the same as micro_batch_size 2 there
    assert capacity.micro_rows(budget, pl) == min(pl.rows, 2 * ex.length // pl.length) == pl.rows  # all 8 rows
    small = compose(["experiment=paper_qwen3_4b", "trainer.max_tokens_per_micro_batch=100"])
    assert capacity.micro_rows(small, ex) == 1  # a row over the budget is a micro-batch of its own
    whole = plan(budget, PAPER_NODE)
    backward = next(i for i in whole.gpu if i.name.startswith("backward"))
    assert item(backward.items, "checkpointed layer inputs").name.startswith(f"checkpointed layer inputs (2 x {ex.length}")


def test_busiest_rank_rows_by_hand():
    """8 Planning rows over 8 ranks: micro-batches of 2 round-robin leave 4 ranks idle and the busiest runs 2; a token
    budget spreads the rows first (1 each). 16 Execution rows: 2 on every rank either way; 9 rows over 8: 2 and 2."""
    cfg = compose(["experiment=paper_qwen3_4b"])
    fixed = compose(["experiment=paper_qwen3_4b", "trainer.max_tokens_per_micro_batch=null"])
    loads = capacity.role_loads(cfg)
    pl, ex = loads["planning"], loads["execution"]
    assert (pl.rows, ex.rows) == (8, 16)
    assert capacity.busiest_rank_rows(fixed, pl, 8) == 2 and capacity.busiest_rank_rows(cfg, pl, 8) == 1
    assert capacity.busiest_rank_rows(fixed, ex, 8) == 2 == capacity.busiest_rank_rows(cfg, ex, 8)
    nine = replace(ex, rows=9)
    assert capacity.busiest_rank_rows(fixed, nine, 8) == 2 and capacity.busiest_rank_rows(cfg, nine, 8) == 2


@pytest.mark.parametrize("every, block, scorings", [(0, 200, 2), (1, 4, 5), (2, 5, 4), (2, 4, 3), (0, 1, 2)])
def test_entropy_bank_scorings_by_hand(every, block, scorings):
    """The block's start and end, and after every n-th update (the end not twice): 0 over 200 updates, 2; 1 over 4,
    the start and 4; 2 over 5, the start, 2, 4 and the end; 2 over 4, the start, 2 and 4."""
    cfg = compose(["experiment=paper_qwen3_4b", f"trainer.entropy_every={every}", f"schedule.planning_updates={block}"])
    assert capacity.bank_scorings_per_update(cfg, "planning") == pytest.approx(scorings / block, abs=1e-15)


def test_the_bank_and_the_pool_are_split_over_the_ranks():
    """Both diagnostics run on every rank, each its share: the plan's seconds fall with the ranks."""
    cfg = compose(["experiment=paper_qwen3_4b", "trainer.entropy_every=1"])
    one, eight = (plan(cfg, replace(PAPER_NODE, gpus=g)) for g in (1, 8))
    for role in ("planning", "execution", "evaluation"):
        assert eight.roles[role].seconds["entropy bank"] == pytest.approx(one.roles[role].seconds["entropy bank"] / 8)
    assert 0 < eight.pool_seconds < one.pool_seconds / 4
    default = plan(compose(["experiment=paper_qwen3_4b"]), PAPER_NODE)
    bank = sum(default.updates[r] * c.seconds["entropy bank"] for r, c in default.roles.items())
    assert bank < 0.05 * default.wall_seconds and default.pool_seconds < 0.05 * default.wall_seconds


def test_what_the_plan_leaves_out_is_estimated_apart():
    """Checkpoint writes (the bytes of every save at 1 GB/s), the weight copies into vLLM per optimizer step, and
    the prefill the prefix cache saves (K - 1 of K per prompt), none of them in wall_seconds."""
    whole = plan(compose(["experiment=paper_qwen3_4b"]), PAPER_NODE)
    omitted = dict(whole.omitted)
    written = item(whole.disk, "written by").bytes
    writes = next(v for k, v in omitted.items() if k.startswith("checkpoint writes"))
    assert writes == pytest.approx(written / capacity.DISK_WRITE_BYTES_PER_S)
    copies = next(v for k, v in omitted.items() if k.startswith("weight copies into vLLM"))
    weights = 2 * whole.arch.sampled_parameters
    assert copies == pytest.approx(sum(whole.updates.values()) * (weights * 7 / 8 / capacity.GPU_LINK_BYTES_PER_S
                                                                  + weights / PAPER_NODE.gpu_bandwidth))
    saved = next(v for k, v in omitted.items() if k.startswith("prefill saved"))
    assert saved < 0
    off = dict(plan(compose(["experiment=paper_qwen3_4b", "rollout.enable_prefix_caching=false"]), PAPER_NODE).omitted)
    assert not any(k.startswith("prefill saved") for k in off)
    assert plan(compose(["experiment=smoke"]), Hardware(gpus=0)).omitted == ()


def test_the_plan_reads_the_sampling_shapes_from_the_sampler(monkeypatch):
    """role_loads and phase_stages take a phase's calls from schedule.phase_calls (what PhaseSampler samples),
    not from a copy: a change there moves the plan."""
    from unifiedplayers import schedule

    cfg = compose(["experiment=paper_qwen3_4b"])
    p = resolve_player_config(cfg)
    calls = schedule.phase_calls(p, "execution", 1, True, True)
    loads = capacity.role_loads(cfg)
    assert [c.name for c in calls] == ["tasks", "trajectories", "verifiers"]
    assert loads["execution"].rows == calls[1].prompts * calls[1].samples == p.tasks_per_update * p.num_trajectories
    assert loads["execution"].response == calls[1].turns * calls[1].max_new_tokens
    stages = capacity.phase_stages(cfg, "planning", loads)
    s = int(cfg.schedule.steps_per_generation)
    assert [(st.prompts, st.samples) for st in stages] == [(c.prompts, c.samples) for c in
                                                            schedule.phase_calls(p, "planning", s, True, True)]
    original = schedule.phase_calls

    def doubled(*args):
        return [schedule.SamplingCall(c.name, c.prompts, 2 * c.samples, c.max_new_tokens, c.turns) for c in original(*args)]

    assert workload.phase_calls is schedule.phase_calls  # not a copy (tests/test_roles.py: the sampler makes them)
    monkeypatch.setattr(workload, "phase_calls", doubled)
    assert capacity.role_loads(cfg)["execution"].rows == 2 * loads["execution"].rows
    assert [st.samples for st in capacity.phase_stages(cfg, "planning", loads)] == [2 * st.samples for st in stages]
    no_tools = schedule.phase_calls(p, "execution", 1, False, False)
    assert [c.name for c in no_tools] == ["tasks", "trajectories"] and no_tools[1].turns == 1


def test_tokens_and_sandbox_calls_per_update():
    roles = plan(compose(["experiment=paper_qwen3_4b"]), PAPER_NODE).roles
    # Execution: 8 tasks drawn (1 prompt x G_T 8, 512 tokens), 2 tasks x K 8 x 4 turns x 1024, 2 x M 4 x 768.
    assert roles["execution"].generated == 8 * 512 + 2 * 8 * 4 * 1024 + 2 * 4 * 768 == 75_776
    # Planning plays all of its G_T = 8 tasks: 8 x (8 trajectories + 4 verifiers).
    assert roles["planning"].generated == 8 * 512 + 8 * 8 * 4 * 1024 + 8 * 4 * 768 == 290_816
    # Per task: K x max_turns tool calls, K arg_mutation re-runs, M x K x (1 + P) checks.
    assert roles["execution"].sandbox_calls == 2 * (8 * 4 + 8 + 4 * 8 * (1 + 5)) == 464
    assert roles["execution"].trained == 16 * 4096


def test_training_flops_follow_the_trainer_conventions():
    p = plan(compose(["experiment=paper_qwen3_4b"]), PAPER_NODE)
    a, load = p.arch, p.loads["execution"]
    p_lin = 36 * (2 * 2560 * 4096 + 2 * 2560 * 1024 + 3 * 2560 * 9728)
    length = load.length
    forward = 2 * p_lin * length + 4 * 32 * 128 * 36 * length * (length + 1) // 2 + 2 * 2560 * 151936 * load.response
    assert a.forward_flops(length, load.response) == forward
    assert p.roles["execution"].training_flops == 3 * 16 * forward


def test_checkpoint_disk_replays_the_save_cadence():
    cfg = compose(["experiment=paper_qwen3_4b"])
    # 14 saves an iteration: Planning 52/100/152 + end, Execution 52/100/152/200/252 + end, Evaluation as Planning.
    peak, end, kept, saves = checkpoint_disk(cfg, 1.0, 0.25)
    assert saves == 42
    # The last block: 8 named checkpoints and three resume copies at once (named, being replaced, new).
    assert (peak, end, kept) == (11.0, 9.0, 9.0)
    thinned = compose(["experiment=paper_qwen3_4b", "schedule.checkpoint_retention=weights"])
    peak, end, kept, _ = checkpoint_disk(thinned, 1.0, 0.25)
    # Whole: the newest of each role and the three resume copies; the 5 older named ones hold their weights only.
    assert (peak, end, kept) == (6 + 5 * 0.25, 3 + 6 * 0.25, 9 * 0.25)


@pytest.mark.parametrize("experiment", ["paper_qwen3_4b", "paper_mimo_7b"])
def test_the_paper_presets_fit_the_paper_node(experiment):
    p = plan(compose([f"experiment={experiment}"]), PAPER_NODE)
    assert p.world == 8 and p.on_gpu
    assert p.gpu_peak.total <= 80 * GiB
    assert p.host_peak.total <= 512 * GiB
    assert p.run_disk + p.parked.bytes <= 2 * TB  # checkpoints and the idle players' parked state on one disk
    assert p.vllm_kv[0] >= p.vllm_kv[1]  # vLLM holds at least one sequence of its full context
    check_fits(p, PAPER_NODE)
    assert 0 < p.gpu_hours < 432 * 2


def test_a_run_that_cannot_fit_is_refused_naming_the_item_and_setting():
    small = Hardware(gpus=1, gpu_memory=24 * GiB, host_ram=64 * GiB, disk=0.1 * TB, name="1 x 24 GiB (fake)")
    with pytest.raises(CapacityError) as refused:
        check_fits(plan(compose(["experiment=paper_qwen3_4b"]), small), small)
    message = str(refused.value)
    assert "GPU memory per GPU" in message and "> 24.0 GiB" in message
    assert "3 players' weights" in message and "model.dtype" in message
    assert "vLLM KV cache" in message and "rollout.gpu_memory_utilization" in message
    assert "host RAM per node" in message and "trainer.offload_optimizer" in message
    assert "disk at the run directory" in message and "schedule.save_every" in message
    assert "capacity.check=false" in message


def test_the_start_up_check_uses_this_machine_and_can_be_turned_off(monkeypatch):
    from unifiedplayers.checks import check_capacity

    tiny = compose(["experiment=tiny"])
    check_capacity(tiny)  # this CPU machine: the tiny preset fits
    monkeypatch.setattr(capacity, "hardware_here", lambda cfg, world, run_dir=None: Hardware(
        gpus=world, gpu_memory=0, host_ram=256 * 2**20, cpu_ranks=world, name="a 256 MiB machine"))
    with pytest.raises(CapacityError, match="host RAM per node"):
        check_capacity(tiny)
    check_capacity(compose(["experiment=tiny", "capacity.check=false"]))
    monkeypatch.setattr(capacity, "hardware_here", lambda cfg, world, run_dir=None: Hardware(
        gpus=world, gpu_memory=24 * GiB, name="one 24 GiB GPU"))
    with pytest.raises(CapacityError, match=r"GPU memory per GPU .* > 24.0 GiB"):
        check_capacity(compose(["experiment=paper_qwen3_4b"]))


def test_the_smoke_preset_fits_a_24_gib_cpu_machine():
    machine = Hardware(gpus=0, gpu_memory=0, host_ram=24 * GiB, disk=50e9, name="a 24 GiB CPU machine")
    p = plan(compose(["experiment=smoke"]), machine)
    assert not p.on_gpu and not p.gpu and p.gpu_hours is None
    assert p.host_peak.total < 12 * GiB  # float32 at the token budgets: an upper bound of `make run`
    check_fits(p, machine)


def test_the_command_line_prints_the_table():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "unifiedplayers.capacity", "experiment=tiny", "--host-ram-gb", "16"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    for text in ("Capacity plan: experiment=tiny", "Host RAM per node, GiB", "backward", "total",
                 "Disk: one checkpoint", "Compute per optimizer step", "tokens generated", "Assumptions:"):
        assert text in out, text


def test_one_number_formatter_for_the_item_names_and_the_printout():
    """``capacity.count`` is the plan's only number formatter: three significant figures and a decimal prefix, B for a
    billion, in the items' names (the parameters) and in the printed compute table alike; a value that rounds up to
    the next prefix takes it (999.6k is 1M, not 1e+03k)."""
    assert [count(x) for x in (QWEN_N, 134_515_008, 290_816, 2048, 768, 999_600, 999.6)] == [
        "4.02B", "135M", "291k", "2.05k", "768", "1M", "1k"]
    p = plan(compose(["experiment=paper_qwen3_4b"]), PAPER_NODE)
    assert item(p.gpu_peak.items, "3 players' weights").name.startswith(f"3 players' weights ({count(QWEN_N)} x ")
    text = format_plan(p)
    rows = {line[:40].strip(): line[40:].split() for line in text.splitlines() if line.startswith("  ")}
    assert rows["tokens generated"] == [count(p.roles[r].generated) for r in p.roles] == ["291k", "75.8k", "75.8k"]
    assert rows["sandbox calls (tools, re-runs, checks)"] == [count(p.roles[r].sandbox_calls) for r in p.roles]
    total = sum(p.updates[r] * p.roles[r].generated for r in p.roles)
    assert f"Run: {count(total)} tokens generated" in text


def test_parked_state_counts_on_the_run_disk_unless_offload_dir_has_its_own() -> None:
    """The idle players' parked state lies in trainer.offload_dir: on the run directory's disk when that is the same
    file system (``Hardware.offload_disk`` None), judged against its own free space alone when it is not."""
    p = plan(compose(["experiment=paper_qwen3_4b"]), PAPER_NODE)
    # By hand (N = QWEN_N; ZeRO-3, trainer.dtype bf16, KL on, ref_mode precompute, fresh feedback, export_at_end):
    # one checkpoint = model.pt 2N + deepspeed/ 12N + reference.pt 2N = 16N; the save replay's peak is 11 of them
    # (test_checkpoint_disk_replays_the_save_cadence), the end 9 + the export of 3 players x 2N, so the run's peak is
    # max(11 x 16N, 9 x 16N + 6N) = 176N. Parked: max(3 players x 18N optimizer state,
    # 2 idle x (18N + pi_ref on 1 holder x 2N)) = max(54N, 40N) = 54N.
    assert p.run_disk == 176 * QWEN_N and p.parked.bytes == 54 * QWEN_N
    exact = replace(PAPER_NODE, disk=176 * QWEN_N, name="run disk just big enough for the checkpoints")
    # No separate offload disk: 176N + 54N = 230N must fit in 176N; it does not.
    with pytest.raises(CapacityError) as refused:
        check_fits(p, exact)
    message = str(refused.value)
    assert "disk at the run directory" in message and "idle players' parked state" in message
    assert "disk in trainer.offload_dir" not in message
    # An offload disk of exactly 54N: the run disk holds 176N of 176N, the offload disk 54N of 54N; both fit.
    check_fits(p, replace(exact, offload_disk=54 * QWEN_N))
    # One byte short on the offload disk: refused there, and only there (the run disk is not charged the 54N).
    with pytest.raises(CapacityError) as refused:
        check_fits(p, replace(exact, offload_disk=54 * QWEN_N - 1))
    message = str(refused.value)
    assert "disk in trainer.offload_dir" in message and "disk at the run directory" not in message


def test_a_resumed_runs_checkpoints_count_as_free_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hardware_here``: the disk a run can use is the free space plus its own checkpoints/ (a resumed run replaces
    and thins them, so their bytes are its to reuse); other files of the run directory are not counted."""
    free = 7_000_000_000
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(total=2 * free, used=free,
                                                                                    free=free))
    run = tmp_path / "run"
    (run / "checkpoints" / "iter1" / "execution").mkdir(parents=True)
    (run / "checkpoints" / "resume" / "planning-a").mkdir(parents=True)
    (run / "checkpoints" / "iter1" / "execution" / "model.pt").write_bytes(b"w" * 1000)
    (run / "checkpoints" / "resume" / "planning-a" / "optimizer.pt").write_bytes(b"o" * 234)
    (run / "state.pt").write_bytes(b"s" * 50)  # beside checkpoints/: not counted
    cfg = compose(["experiment=tiny", f"trainer.offload_dir={tmp_path / 'offload'}"])
    # 7e9 free + 1000 + 234 bytes under checkpoints/ = 7_000_001_234; offload_dir on the same file system: None.
    machine = capacity.hardware_here(cfg, 1, str(run))
    assert machine.disk == 7_000_001_234 and machine.offload_disk is None
    # A fresh run directory (not made yet): the free space of its nearest existing parent, nothing added.
    assert capacity.hardware_here(cfg, 1, str(tmp_path / "new")).disk == free


def test_a_frozen_players_weights_are_held_whole_under_zero3() -> None:
    """A frozen player (Table 3's schedule.train_evaluation=false) has no trainer: ``Team.setup`` casts its module to
    model.dtype on every rank (loop/team.py), so ZeRO-3 shards only the trained players' weights."""
    p = plan(compose(["experiment=paper_qwen3_4b", "schedule.train_evaluation=false"]), PAPER_NODE)
    weights = item(p.gpu_peak.items, "3 players' weights")
    # bf16 (2 bytes): Planning and Execution 1/8 each on 8 GPUs, Evaluation whole: 2N x (2/8 + 1) = 2.5N per GPU
    # (= 10_056_170_240 bytes), against 3 x 2N / 8 = 0.75N when all three train.
    assert weights.bytes == 2 * QWEN_N * (2 / 8 + 1) == 10_056_170_240


def test_the_plan_counts_the_cpu_kv_cache_the_vllm_engine_asks_for():
    from unifiedplayers.capacity import memory
    from unifiedplayers.rollout import vllm_engine

    assert memory.VLLM_CPU_KV == vllm_engine.CPU_KV_CACHE_BYTES
