"""Tests of `obsspec train` pieces that need no sandbox: rows for TRL, infra-failure exclusion,
the recipe section and the plan.

Run: .venv/bin/python -m pytest -q tests/test_training.py
"""

import math
from types import SimpleNamespace

import pytest
import torch

from obsspec import chat

from obsspec.config import ConfigError, load_recipe
from obsspec.models import tiny
from obsspec.models.config import TinyModelConfig
from obsspec.models.tokenizer import train_tokenizer
from obsspec.rollout.predictors import Base, HistoryCache, PredictRequest, WithHistory
from obsspec.rollout.trajectory import Trajectory, Turn
from obsspec.tokens import ChatFormat
from obsspec.training.config import TrainConfig
from obsspec.training.grpo import TrainError, grpo_args, training_plan
from obsspec.training.rollouts import (RolloutSettings, Rollouts, StepRollouts, class_hits, merge_steps,
                                      outcome_counts, outcome_metrics)


@pytest.fixture(scope="module")
def tokenizer():
    texts = ["ls -l data", "cat data/a.txt | wc -l > answer.txt", "How many files are in /app/data?"] * 20
    return train_tokenizer(texts, vocab_size=400)


@pytest.fixture(scope="module")
def fmt(tokenizer):
    return ChatFormat(tokenizer)


def episode(fmt, i: int, reward, infra: str = "", close_with_eos: bool = True) -> Trajectory:
    """prompt, `ls` + <|im_end|>, its observation, then (optionally) a last <|im_end|>."""
    tr = Trajectory.start(i, "t0", fmt.prompt_ids("How many files are in /app/data?"))
    action = fmt.action_ids(chat.render_bash("ls"))
    tr.append_action(action, [-0.5] * len(action))
    ids, body = fmt.observation_ids("a.txt\n(exit_code=0)")
    tr.append_observation(ids, body, len(fmt.obs_close_ids))
    tr.turns.append(Turn("ls", "bash", command="ls", observation="a.txt\n(exit_code=0)", spec="match"))
    if close_with_eos:
        tr.append_action([fmt.tokenizer.eos_token_id], [-0.1])
    tr.reward, tr.infra_error = reward, infra
    return tr


def rollouts_for(fmt, trajectories) -> Rollouts:
    settings = RolloutSettings(sampling=None, cap=0, speculative=False, depth=1,
                               episodes_per_step=len(trajectories), make_tool=None)
    r = Rollouts({"t0": None}, settings, policy=None, fmt=fmt, predictor=None, out_dir="")
    r.run = lambda tasks, step, first, label="": _stash(r, StepRollouts(step, trajectories, {"spec/exact_frac": 0.5}))
    return r


def _stash(r, result):
    r.last = result
    return result


# ---------------------------------------------------------------------------------------------
# Rows


def test_rows_mask_observations_and_end_with_eos(fmt):
    ok, open_end = episode(fmt, 0, 1.0), episode(fmt, 1, 0.0, close_with_eos=False)
    rows = rollouts_for(fmt, [ok, open_end]).rows([ok, open_end])
    eos = fmt.tokenizer.eos_token_id
    for i, tr in enumerate([ok, open_end]):
        comp = rows["completion_ids"][i]
        assert rows["prompt_ids"][i] == tr.ids[:tr.prompt_len]
        assert comp[-1] == eos, "TRL drops rows that do not end with EOS when masking truncation"
        assert len(comp) == len(rows["logprobs"][i]) == len(rows["env_mask"][i])
        # env_mask is the policy mask: observation tokens are never trained on
        assert rows["env_mask"][i] == tr.policy_mask[tr.prompt_len:tr.prompt_len + len(comp)]
    assert rows["completion_ids"][0] == ok.ids[ok.prompt_len:]
    # the observation after the last action trains nothing and is not sent (it can be huge)
    last_action = max(i for i, m in enumerate(open_end.policy_mask) if m)
    assert rows["completion_ids"][1] == open_end.ids[open_end.prompt_len:last_action + 1]
    assert rows["verifier_reward"] == [1.0, 0.0]
    cut = episode(fmt, 2, 0.0, close_with_eos=False)  # a last turn cut at max_new_tokens
    cut.append_action([5, 6], [-0.2, -0.3])
    row = rollouts_for(fmt, [cut]).rows([cut])
    assert row["completion_ids"][0] == cut.ids[cut.prompt_len:] + [eos] and row["env_mask"][0][-1] == 0, \
        "the EOS appended to a cut turn is not the policy's token"


def test_a_steps_metrics_over_processes_are_those_of_all_their_episodes(fmt):
    ours = [episode(fmt, 0, 1.0), episode(fmt, 1, 0.0)]
    theirs = [episode(fmt, 2, None, infra="SandboxError: died"), episode(fmt, 3, 1.0)]
    parts = [StepRollouts(5, trs, {}, class_hits(trs), 1.0, {"dir-stats/files": [won, 2]}, None, outcome_counts(trs))
             for trs, won in ((ours, 1), (theirs, 1))]
    merged = merge_steps(parts)
    assert merged.metrics["infra_failures"] == 1, "another process's infra failure went uncounted"
    assert merged.metrics["success_frac"] == outcome_metrics(ours + theirs)["success_frac"] == 2 / 3
    assert merged.metrics["processes"] == 2 and merged.by_kind == {"dir-stats/files": [2, 4]}
    assert merged.class_hits == class_hits(ours + theirs)


def test_an_infra_failure_has_no_reward_and_no_trainable_token(fmt):
    broken = episode(fmt, 0, None, infra="SandboxError: the sandbox died")
    rows = rollouts_for(fmt, [broken]).rows([broken])
    assert rows["verifier_reward"] == [None]
    assert set(rows["env_mask"][0]) == {0}
    assert rows["infra_error"] == ["SandboxError: the sandbox died"]
    assert outcome_metrics([broken, episode(fmt, 1, 1.0)])["infra_failures"] == 1
    assert outcome_metrics([broken, episode(fmt, 1, 1.0)])["success_frac"] == 1.0, \
        "an infra failure is neither a success nor a failure of the agent"


def test_trl_leaves_an_infra_failure_out_of_its_groups_baseline(fmt, tokenizer, tmp_path, monkeypatch):
    """Through the real GRPOTrainer: rewards [1, 0, None, 1] in one group. The None row gets zero
    advantage and no loss mask; the others are normalised by the mean/std of [1, 0, 1] only
    (TRL's nansum would have scored it 0 and moved the baseline to 0.5)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    rewards = [1.0, 0.0, None, 1.0]
    trajs = [episode(fmt, i, r, infra="" if r is not None else "SandboxError: died") for i, r in enumerate(rewards)]
    rollouts = rollouts_for(fmt, trajs)
    model = tiny.build_model(TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                             head_dim=8, intermediate_size=32), tokenizer, 512)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_steps=1, report_to=[], disable_tqdm=True,
                      remove_unused_columns=False, activation_checkpointing=False)
    trainer = GRPOTrainer(model=model, reward_funcs=[rollouts.reward], args=args,
                          train_dataset=Dataset.from_list([{"prompt": "t0"}]), processing_class=tokenizer,
                          rollout_func=rollouts)
    out = trainer._generate_and_score_completions([{"prompt": "t0"} for _ in rewards])
    adv = out["advantages"].tolist()
    kept = torch.tensor([1.0, 0.0, 1.0])
    mean, std = kept.mean().item(), kept.std().item()
    for i, r in enumerate(rewards):
        if r is None:
            assert adv[i] == 0.0, "an infra failure must get zero advantage"
        else:
            assert math.isclose(adv[i], (r - mean) / (std + 1e-4), rel_tol=1e-4), \
                f"row {i}: advantage {adv[i]} is not against the baseline of the scored rows only"
    loss_mask = out["completion_mask"] * out["tool_mask"]
    assert loss_mask[2].sum().item() == 0, "an infra failure must add no gradient"
    assert loss_mask[0].sum().item() > 0


def tiny_policy(tokenizer, seed=0):
    torch.manual_seed(seed)
    model = tiny.build_model(TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                             head_dim=8, intermediate_size=32), tokenizer, 512)
    with torch.no_grad():  # sharp logits, as a trained model's: the temperature then matters
        model.get_output_embeddings().weight.mul_(30)
    return model


def sampler_trainer(tokenizer, tmp_path, monkeypatch, logprobs_of, correction, peft_config=None, model=None,
                    tolerance=0.05):
    """The real GRPOTrainer obsspec runs, on a tiny model, whose one group of 4 rows carries the
    logprobs `logprobs_of(model, prompt, completion)` reports for its sampled tokens."""
    from datasets import Dataset
    from trl import GRPOConfig

    from obsspec.training.sampler import SamplerAwareGRPOTrainer, SamplerCheck

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model = model or tiny_policy(tokenizer)
    prompt, completion = [5, 6, 7, 8], [9, 10, 11, 12, tokenizer.eos_token_id]
    mask = [1, 1, 0, 1, 1]  # token 11 is an observation's: never compared, never weighted

    def rollout(prompts, trainer):
        lps = logprobs_of(trainer.accelerator.unwrap_model(trainer.model), prompt, completion)
        return {"prompt_ids": [prompt] * 4, "completion_ids": [completion] * 4, "logprobs": [lps] * 4,
                "env_mask": [mask] * 4, "verifier_reward": [1.0, 0.0, 0.0, 1.0]}

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_steps=1, report_to=[], disable_tqdm=True, temperature=0.7,
                      remove_unused_columns=False, activation_checkpointing=False)
    trainer = SamplerAwareGRPOTrainer(
        model=model, reward_funcs=[lambda verifier_reward, **_: verifier_reward], args=args,
        train_dataset=Dataset.from_list([{"prompt": "t0"}]), processing_class=tokenizer, rollout_func=rollout,
        peft_config=peft_config, sampler=SamplerCheck(correction, 2.0, "vllm", tolerance))
    return trainer, [{"prompt": "t0"} for _ in range(4)]  # (TRL writes each row's fields into its dict)


def logprobs_at(temperature, shift=0.0):
    """The logprobs of the sampled tokens under `model` at `temperature`, plus `shift` nats."""
    def of(model, prompt, completion):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
        lps = torch.log_softmax(logits / temperature, -1).gather(-1, ids[0, len(prompt):, None])[:, 0]
        return (lps + shift).tolist()
    return of


def test_importance_weights_are_truncated_ratios_on_policy_tokens_only():
    from obsspec.training.sampler import importance_weights, logprob_gap

    trainer = torch.tensor([[-1.0, -2.0, -3.0, -0.5]])
    sampler = torch.tensor([[-1.0, -2.5, -1.0, float("nan")]])
    mask = torch.tensor([[1, 1, 0, 1]])
    w, stats = importance_weights(trainer, sampler, mask, cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.0, 1.5, 1.0, 1.0]])), \
        "exp(0.5) = 1.65 is truncated to the cap; an observation token and an unscored token weigh 1"
    assert stats["sampler/weight_clipped_frac"] == pytest.approx(1 / 3)
    assert logprob_gap(trainer, sampler, mask) == (pytest.approx(0.5), pytest.approx(0.5), 2)


def test_the_trainers_own_logprobs_pass_and_give_weights_of_one(fmt, tokenizer, tmp_path, monkeypatch):
    trainer, prompts = sampler_trainer(tokenizer, tmp_path, monkeypatch, logprobs_at(0.7), correction=True)
    out = trainer._generate_and_score_completions(prompts)
    assert out["advantages"].shape == out["completion_ids"].shape, "per-token advantages carry the weights"
    plain = (torch.tensor([1.0, 0.0, 0.0, 1.0]) - 0.5) / (torch.tensor([1.0, 0.0, 0.0, 1.0]).std() + 1e-4)
    assert torch.allclose(out["advantages"], plain[:, None].expand_as(out["advantages"]), atol=1e-4)
    metrics = trainer._metrics["train"]
    assert metrics["sampler/logp_diff_mean"][-1] < 1e-5 and metrics["sampler/weight_clipped_frac"][-1] == 0.0
    assert trainer.sampler.summary()["tokens"] == 16


def test_a_sampler_that_differs_is_weighted_token_by_token(fmt, tokenizer, tmp_path, monkeypatch):
    """Sampler logprobs 0.3 nats below the trainer's: every policy token's advantage is scaled by
    exp(0.3) = 1.35; the observation token keeps its weight of 1 (it has no loss anyway)."""
    trainer, prompts = sampler_trainer(tokenizer, tmp_path, monkeypatch, logprobs_at(0.7, shift=-0.3),
                                       correction=True)
    trainer.sampler.first = {}  # (past the first step's check: a 0.3-nat gap is not a misconfiguration here)
    out = trainer._generate_and_score_completions(prompts)
    ratio = out["advantages"][0] / out["advantages"][0, 2]
    assert torch.allclose(ratio[:5], torch.tensor([1.35, 1.35, 1.0, 1.35, 1.35]), atol=0.01)
    assert trainer._metrics["train"]["sampler/logp_diff_mean"][-1] == pytest.approx(0.3, abs=1e-4)
    assert trainer._metrics["train"]["sampler/weight_mean"][-1] == pytest.approx(1.35, abs=0.01)


def test_the_first_batchs_logprobs_must_be_the_trainers(fmt, tokenizer, tmp_path, monkeypatch):
    """A server reporting the raw model's logprobs at T 0.7 (not processed ones) stops the run at
    its first step, with the likely cause, with or without the correction."""
    from obsspec.training.sampler import LogprobMismatch

    for correction in (False, True):
        trainer, prompts = sampler_trainer(tokenizer, tmp_path, monkeypatch, logprobs_at(1.0), correction)
        with pytest.raises(LogprobMismatch, match="processed_logprobs"):
            trainer._generate_and_score_completions(prompts)


def test_the_first_steps_tolerance_is_the_recipes_and_the_check_reports_p99(fmt, tokenizer, tmp_path, monkeypatch):
    """A uniform 0.08-nat gap (a dtype's rounding, say): over the default tolerance it stops the run
    naming the key to change, with mean and p99; with train.logprob_tolerance 0.1 it passes, and
    the check's figures are kept."""
    from obsspec.config import load_recipe
    from obsspec.training.sampler import LogprobMismatch
    from obsspec.training.setup import sampler_check

    trainer, prompts = sampler_trainer(tokenizer, tmp_path, monkeypatch, logprobs_at(0.7, shift=-0.08), False)
    with pytest.raises(LogprobMismatch, match=r"0\.080 nats per token on average \(p99 0\.080.*train\.logprob_tolerance"):
        trainer._generate_and_score_completions(prompts)
    trainer, prompts = sampler_trainer(tokenizer, tmp_path, monkeypatch, logprobs_at(0.7, shift=-0.08), False,
                                       tolerance=0.1)
    trainer._generate_and_score_completions(prompts)
    first = trainer.sampler.summary()
    assert first["mean_abs"] == pytest.approx(0.08, abs=1e-4) and first["p99_abs"] == pytest.approx(0.08, abs=1e-4)
    assert first["tolerance"] == 0.1
    assert sampler_check(load_recipe("recipes/tiny-cpu.yaml", ["train.logprob_tolerance=0.2"])).tolerance == 0.2
    with pytest.raises(ConfigError, match="logprob_tolerance"):
        load_recipe("recipes/tiny-cpu.yaml", ["train.logprob_tolerance=0"])


def test_a_policy_adapter_the_server_ignores_stops_the_run(fmt, tokenizer, tmp_path, monkeypatch):
    """After a push, a trained LoRA that moves the logprobs past the tolerance must show in the
    rollouts' logprobs: a server still sampling from the adapter-less policy stops the run, one
    that applies it passes."""
    from peft import LoraConfig

    from obsspec.training.sampler import LogprobMismatch

    def without_adapter(model, prompt, completion):
        with model.disable_adapter():
            return logprobs_at(0.7)(model, prompt, completion)

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    for served, logprobs_of in ((False, without_adapter), (True, logprobs_at(0.7))):
        trainer, prompts = sampler_trainer(tokenizer, tmp_path, monkeypatch, logprobs_of, correction=False,
                                           peft_config=lora)
        with torch.no_grad():  # a trained adapter: far from zero
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)
        trainer.sampler.first = {}  # past the first step
        trainer.sampler.note_push()
        if served:
            trainer._generate_and_score_completions(prompts)
            assert trainer._metrics["train"]["sampler/adapter_effect"][-1] > 0.05
            assert trainer.sampler.adapter_checked_at == 1
        else:
            with pytest.raises(LogprobMismatch, match="without its LoRA"):
                trainer._generate_and_score_completions(prompts)


# ---------------------------------------------------------------------------------------------
# Predictors, per-class hits


def test_history_cache_answers_first_and_its_state_round_trips():
    class Never(Base):
        name = "never"
        asked = 0

        async def predict(self, request):
            Never.asked += 1
            return []

        def learn(self, request, body):
            pass

    import asyncio

    p = WithHistory(Never(), siblings=False)  # (with siblings, an unanswered prediction waits for one)
    req = PredictRequest("k", "t", 0, 0, ("ls",), (1, 2))
    assert asyncio.run(p.predict(req)) == [] and Never.asked == 1
    p.learn(req, "a\n(exit_code=0)")
    assert asyncio.run(p.predict(req))[0].body == "a\n(exit_code=0)" and Never.asked == 1
    assert (p.lookups, p.hits) == (2, 1)
    again = HistoryCache()
    again.load_state(p.cache.state())
    assert asyncio.run(again.predict(req))[0].body == "a\n(exit_code=0)"
    old_checkpoint = HistoryCache()  # rows written before histories were hashed
    old_checkpoint.load_state([["k", ["ls"], "a\n(exit_code=0)"]])
    assert asyncio.run(old_checkpoint.predict(req))[0].body == "a\n(exit_code=0)"


def test_the_history_cache_is_bounded_and_keeps_what_was_used_last():
    """The policy decides how long and how many observations are, and the cache lives through the
    run and into every checkpoint (it was unbounded, each row repeating its whole command
    history)."""
    import asyncio

    cache = HistoryCache(max_chars=30)
    reqs = [PredictRequest("k", "t", 0, i, ("x" * 1000,) * (i + 1), ()) for i in range(4)]
    for r in reqs[:3]:
        cache.learn(r, "o" * 10)
    asyncio.run(cache.predict(reqs[0]))  # used: now the most recent
    cache.learn(reqs[3], "p" * 10)       # 40 characters: the least recently used goes
    assert [bool(asyncio.run(cache.predict(r))) for r in reqs] == [True, False, True, True]
    assert max(len(str(row)) for row in cache.state()) < 200, "a checkpoint row holds the whole history"


def test_class_hits_count_matches_over_verified_drafts(fmt):
    a, b = episode(fmt, 0, 1.0), episode(fmt, 1, 0.0)
    b.turns[0].spec = "rollback"
    assert class_hits([a, b]) == {"ls": [1, 2]}


# ---------------------------------------------------------------------------------------------
# Recipe section and plan


def test_train_section_checks_say_what_to_change():
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        TrainConfig(group_size=1)
    with pytest.raises(ValueError, match="loss_type"):
        TrainConfig(loss_type="ppo")
    with pytest.raises(ValueError, match="split evenly"):
        TrainConfig(tasks_per_step=3, group_size=2, micro_batch_size=4).accumulation(1)
    assert TrainConfig(tasks_per_step=16, group_size=16, micro_batch_size=4).accumulation(2) == 32
    with pytest.raises(ConfigError, match="train.bogus"):
        load_recipe("recipes/tiny-cpu.yaml", ["train.bogus=1"])
    assert load_recipe(None, ["train.learning_rate=1e-3"]).train.learning_rate == 1e-3


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_warmup_steps_reach_the_trainers_learning_rate(schedule, tmp_path):
    """transformers' 'constant' schedule ignores warm-up steps: the recipe's warm-up must still
    ramp the rate the optimizer uses (first step 0, the peak at the end of the warm-up)."""
    from transformers.optimization import get_scheduler

    recipe = load_recipe("recipes/tiny-cpu.yaml", ["train.warmup_steps=4", f"train.lr_scheduler={schedule}",
                                                   "train.learning_rate=1e-3"])
    args = grpo_args(recipe.train, recipe, str(tmp_path), 1)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
    sched = get_scheduler(args.lr_scheduler_type, opt, num_warmup_steps=args.get_warmup_steps(32),
                          num_training_steps=32)
    rates = []
    for _ in range(6):
        rates.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert rates[0] == 0.0 and 0 < rates[2] < rates[3] < 1e-3
    assert math.isclose(rates[4], 1e-3) if schedule == "constant" else rates[4] <= 1e-3


@pytest.mark.parametrize("name", ["tiny-cpu", "terminal-8b", "terminal-32b"])
def test_every_training_recipe_has_a_plan(name):
    plan = training_plan(load_recipe(f"recipes/{name}.yaml"))
    per = plan["per_step"]
    assert per["micro_batch"] * per["accumulation"] * plan["processes"] == per["episodes"]
    assert plan["episodes_total"] == plan["steps"] * per["episodes"]


def test_a_vllm_policy_needs_a_policy_lora():
    r = load_recipe("recipes/tiny-cpu.yaml", ["policy.engine=vllm", "policy.server_url=http://127.0.0.1:1"])
    with pytest.raises(TrainError, match="policy_lora_rank > 0"):
        training_plan(r)
    plan = training_plan(load_recipe("recipes/terminal-8b.yaml"))
    assert plan["policy"]["engine"] == "vllm" and plan["policy"]["trained"] == "LoRA rank 64"
    with pytest.raises(ConfigError, match="policy_lora_rank"):
        load_recipe("recipes/tiny-cpu.yaml", ["train.policy_lora_rank=-1"])


def test_published_settings_in_the_gpu_recipes():
    r = load_recipe("recipes/terminal-8b.yaml")
    assert (r.train.tasks_per_step, r.train.group_size) == (16, 16)
    assert r.train.learning_rate == 1e-5, "a LoRA's rate: 10x the published full fine-tuning's 1e-6"
    assert (r.policy.max_turns, r.sandbox.timeout_s, r.sandbox.output_cap) == (32, 30, 10000)
    assert r.policy.model == "Qwen/Qwen3-8B" and r.world_model.model == "Qwen/Qwen3-0.6B"
    assert load_recipe("recipes/terminal-32b.yaml").policy.model == "Qwen/Qwen3-32B"
    with pytest.raises(TrainError, match="split evenly"):
        training_plan(r, num_processes=3)


# ---------------------------------------------------------------------------------------------
# Co-training


class _Recorder:
    def __init__(self):
        self.lines = []

    def log(self, message):
        self.lines.append(message)


class _Engine:
    def __init__(self):
        self.loaded, self.unloaded = [], []

    async def load_adapter(self, name, path):
        self.loaded.append(name)

    async def unload_adapter(self, name):
        self.unloaded.append(name)


class _Predictor:
    adapter = "wm-v3"


def test_a_dead_cotraining_worker_is_loud_restarted_and_the_engine_keeps_its_version(tmp_path):
    from obsspec.training.cotrain import CoTrainer

    recipe = load_recipe("recipes/tiny-cpu.yaml")
    display, engine = _Recorder(), _Engine()
    # a base that does not exist: the real worker process dies while loading it
    co = CoTrainer(recipe.wm_train, recipe.train, str(tmp_path / "no-such-model"), engine, _Predictor(), str(tmp_path), display)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("")
    co.start(4, str(rows))
    first = co._worker
    co.before_rollouts(5)
    assert co.failures == 1 and co.version is None and engine.loaded == []
    assert "FAILED" in display.lines[0] and "exited" in display.lines[0] and "no-such-model" in display.lines[0]
    assert co.metrics()["wm/cotrain_failures"] == 1 and _Predictor.adapter == "wm-v3"
    co.start(5, str(rows))               # the next job gets a new worker
    assert co._worker is not first
    co.close()
    assert first.proc.poll() is not None


def test_one_cotraining_worker_trains_every_version_and_a_failed_job_keeps_it_alive(tokenizer, tmp_path):
    import json

    from obsspec.training.cotrain import CoTrainer

    cfg = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                          intermediate_size=64)
    base = str(tmp_path / "world_model")
    tiny.save(tiny.build_model(cfg, tokenizer, 256), tokenizer, base)
    recipe = load_recipe("recipes/tiny-cpu.yaml")
    display, engine = _Recorder(), _Engine()
    co = CoTrainer(recipe.wm_train, recipe.train, base, engine, _Predictor(), str(tmp_path / "run"), display)
    good = tmp_path / "rows.jsonl"
    good.write_text("".join(json.dumps({"input_ids": [5, 6, 7, 8, 9, 10], "completion_mask": [0, 0, 0, 1, 1, 1]}) + "\n"
                            for _ in range(4)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    co.start(1, str(good))
    worker = co._worker
    co.finish()
    co.start(2, str(bad))
    co.finish()
    co.start(3, str(good))
    co.finish()
    assert co._worker is worker and worker.proc.poll() is None, "one process for every job"
    assert co.failures == 1 and "JSONDecodeError" in display.lines[0]
    assert co.version == 2 and engine.loaded == ["wm-v1", "wm-v2"]
    assert engine.unloaded == ["wm-v3", "wm-v1"], "the version it replaces is unloaded"
    assert co.store.get(2).meta()["step"] == 3          # step 2's job failed: version 2 is step 3's
    co.close()
    assert worker.proc.poll() is not None


def test_cotraining_rows_carry_the_workspace_snapshot_the_predictor_uses(fmt, tmp_path):
    """world_model.workspace_snapshot: the rows co-training trains on start with the same prefix
    the predictor puts ahead of the world model's context (and without it, they do not)."""
    import json

    from obsspec.training.cotrain import CoTrainer

    class Snapshots:
        def prefixes(self, trajectories):
            return [[7, 8, 9] for _ in trajectories]

    class Predictor:
        adapter = None
        snapshots = None

    recipe = load_recipe("recipes/tiny-cpu.yaml", ["train.cotrain_every=1"])  # step 1 trains
    result = StepRollouts(1, [episode(fmt, 0, 1.0)], {})
    firsts = {}
    for on in (False, True):
        predictor = Predictor()
        predictor.snapshots = Snapshots() if on else None
        co = CoTrainer(recipe.wm_train, recipe.train, "unused", None, predictor, str(tmp_path / str(on)), None)
        co.start = lambda step, rows_path: firsts.__setitem__(on, json.loads(open(rows_path).readline()))
        co.after_rollouts(result)
    assert firsts[True]["input_ids"][:3] == [7, 8, 9]
    assert firsts[True]["input_ids"][3:] == firsts[False]["input_ids"]
    assert firsts[True]["completion_mask"][3:] == firsts[False]["completion_mask"]


def test_a_step_with_no_observation_to_learn_trains_no_version_and_says_so(fmt, tmp_path):
    """Every call of the step malformed: no rows, no job, the adapter in use stays, one log line."""
    from obsspec.training.cotrain import CoTrainer

    recipe = load_recipe("recipes/tiny-cpu.yaml", ["train.cotrain_every=1"])
    display = _Recorder()
    co = CoTrainer(recipe.wm_train, recipe.train, "unused", None, _Predictor(), str(tmp_path), display)
    started = []
    co.start = lambda step, rows_path: started.append(step)
    silent = Trajectory.start(0, "t0", fmt.prompt_ids("How many files are in /app/data?"))
    silent.append_action([fmt.tokenizer.eos_token_id], [-0.1])
    co.after_rollouts(StepRollouts(4, [silent], {}))
    assert started == [] and co.version is None
    assert display.lines == ["world model: step 4 has no observation to train on; the adapter in use stays the one loaded"]
    co.after_rollouts(StepRollouts(5, [episode(fmt, 0, 1.0)], {}))
    assert started == [5] and len(display.lines) == 1


def test_cotraining_continues_from_the_adapter_the_run_started_with(tmp_path):
    """world_model.adapter: the first co-trained version continues from the user's adapter (not
    a fresh one on the base); later versions continue from the version in use."""
    from obsspec.training.cotrain import CoTrainer

    class Worker:
        jobs: list = []

        def submit(self, job):
            self.jobs.append(job)

    recipe = load_recipe("recipes/tiny-cpu.yaml")
    for initial in (None, str(tmp_path / "given" / "v3")):
        co = CoTrainer(recipe.wm_train, recipe.train, "unused", None, _Predictor(), str(tmp_path / str(bool(initial))), None,
                       initial=initial)
        co._worker = Worker()
        co.start(1, "rows.jsonl")
        assert Worker.jobs[-1]["init"] == initial
        co.version = 1  # the first job's adapter is published and serving
        co.store.get = lambda version: SimpleNamespace(path=f"/published/v{version}")
        co.start(2, "rows.jsonl")
        assert Worker.jobs[-1]["init"] == "/published/v1"


def test_the_training_table_shows_val_success_per_family_and_the_world_models_hits_per_class(capsys):
    from obsspec.ui.tables import print_training_table

    summary = {"steps": 2, "wm_class_hits": {"cat": [3, 4], "ls": [1, 5]},
               "eval": {"before": {"success_frac": 0.25, "success_by_kind": {"dir-stats/lines": [1, 2],
                                                                             "dir-stats/words": [0, 2],
                                                                             "count-lines": [1, 4]}},
                        "after": {"success_frac": 0.5, "success_by_kind": {"dir-stats/lines": [2, 2],
                                                                           "dir-stats/words": [1, 2],
                                                                           "count-lines": [1, 4]}}}}
    print_training_table(summary, None)
    out = capsys.readouterr().out
    assert "val success by family, before → after" in out
    assert any("dir-stats" in line and "25.0% → 75.0%" in line for line in out.splitlines())
    assert any("count-lines" in line and "25.0% → 25.0%" in line for line in out.splitlines())
    assert "cat:3/4, ls:1/5" in out


def test_a_micro_batch_runs_at_its_own_longest_row_with_the_padded_loss(fmt, tokenizer, tmp_path, monkeypatch):
    """TRL pads a generation batch to its longest row before splitting it into micro-batches: a
    micro-batch padded 3 prompt columns on the left and 5 completion columns on the right (as a
    longer row elsewhere in the batch would make it) runs at its own width, with the loss of the
    padded path up to float rounding."""
    from trl import GRPOTrainer

    from obsspec.training.sampler import trimmed

    trainer, prompts = sampler_trainer(tokenizer, tmp_path, monkeypatch, logprobs_at(0.7), correction=True)
    out = trainer._generate_and_score_completions(prompts)
    rows, width = out["completion_mask"].shape
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    padded = dict(out)
    padded["prompt_ids"] = torch.cat([torch.full((rows, 3), pad), out["prompt_ids"]], 1)
    padded["prompt_mask"] = torch.cat([torch.zeros(rows, 3, dtype=out["prompt_mask"].dtype), out["prompt_mask"]], 1)
    for key, value in out.items():
        if not key.startswith("prompt") and torch.is_tensor(value) and value.shape == (rows, width):
            fill = pad if key == "completion_ids" else 0
            padded[key] = torch.cat([value, torch.full((rows, 5), fill, dtype=value.dtype)], 1)
    widths = []
    real = trainer._get_per_token_logps_and_entropies

    def spy(model, input_ids, *args, **kwargs):
        widths.append(input_ids.shape[1])
        return real(model, input_ids, *args, **kwargs)

    monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies", spy)
    trainer.current_gradient_accumulation_steps = 1  # (set by the training loop)
    ours = trainer._compute_loss(trainer.model, padded)
    theirs = GRPOTrainer._compute_loss(trainer, trainer.model, padded)
    assert widths == [out["prompt_ids"].shape[1] + width, out["prompt_ids"].shape[1] + width + 8], widths
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-4), (float(ours), float(theirs))
    assert trimmed(out) is out, "an unpadded micro-batch is left as it is"
