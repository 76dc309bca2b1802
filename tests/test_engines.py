"""Tests of the hf generation engine on a tiny Qwen3 built from config (no downloads, CPU).

Run: .venv/bin/python -m pytest -q tests/test_engines.py
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from obsspec.engines import Engine, EngineClosedError, GenerationRequest, HFEngine

VOCAB = 300


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=2048,
    )
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def run(coro):
    return asyncio.run(coro)


def prompt(n: int, start: int = 1) -> list[int]:
    return [(start + 7 * i) % VOCAB for i in range(n)]


async def until(condition, what: str, timeout: float = 10.0) -> None:
    """Poll `condition` until it holds; fail (rather than hang) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.001)


def reference_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def recomputed_logprobs(model, prompt_ids, token_ids, temperature: float) -> torch.Tensor:
    """Logprob of each generated token from one full forward pass over prompt + generation."""
    with torch.inference_mode():
        ids = torch.tensor([list(prompt_ids) + list(token_ids)])
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
        if temperature > 0:
            logits = logits / temperature
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(token_ids)[:, None])[:, 0]


# --------------------------------------------------------------------------------------------
# Correctness of one request


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_greedy_equals_model_generate(model, batch_invariant):
    p = prompt(9)
    expected = reference_greedy(model, p, 24)

    async def main():
        async with HFEngine(model, batch_invariant=batch_invariant) as engine:
            return await engine.generate(GenerationRequest(p, max_new_tokens=24, temperature=0))

    gen = run(main())
    assert list(gen.token_ids) == expected
    assert gen.finish_reason == "length" and len(gen.logprobs) == 24
    assert gen.queue_sec >= 0 and gen.compute_sec > 0


def test_load_model_reads_a_local_folder(model, tmp_path):
    from obsspec.engines import load_model

    model.save_pretrained(tmp_path / "tiny")
    loaded = load_model(tmp_path / "tiny", dtype=torch.float32)
    assert not loaded.training
    ids = torch.tensor([prompt(6)])
    with torch.inference_mode():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_engine_satisfies_protocol(model):
    engine = HFEngine(model)
    try:
        assert isinstance(engine, Engine)
    finally:
        engine.close()


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_logprobs_match_a_full_forward_pass(model, temperature, top_p):
    # Run 6 requests of different lengths concurrently in batched mode, so the check also covers
    # left padding, masks and position ids of the shared cache.
    requests = [GenerationRequest(prompt(3 + 4 * i, start=i), max_new_tokens=16,
                                  temperature=temperature, top_p=top_p, seed=i) for i in range(6)]

    async def main():
        async with HFEngine(model) as engine:
            return await asyncio.gather(*(engine.generate(r) for r in requests))

    for request, gen in zip(requests, run(main())):
        expected = recomputed_logprobs(model, request.prompt_ids, gen.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(gen.logprobs), expected, atol=1e-4, rtol=0,
                                   msg=f"logprobs of {request.request_id} are not the sampled ones")


def test_seeded_sampling_is_reproducible_and_seed_dependent(model):
    def request(seed):
        return GenerationRequest(prompt(5), max_new_tokens=30, temperature=1.0, seed=seed)

    async def main():
        async with HFEngine(model) as engine:
            a = await engine.generate(request(11))
            b = await engine.generate(request(11))
            c = await engine.generate(request(12))
            return a, b, c

    a, b, c = run(main())
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert a.token_ids != c.token_ids


def test_top_p_restricts_the_draw_to_the_nucleus(model):
    # With a tiny top_p only the most likely token survives, so sampling turns greedy.
    p = prompt(6)

    async def main():
        async with HFEngine(model) as engine:
            greedy = await engine.generate(GenerationRequest(p, max_new_tokens=20, temperature=0))
            nucleus = await engine.generate(
                GenerationRequest(p, max_new_tokens=20, temperature=1.0, top_p=1e-6, seed=3))
            return greedy, nucleus

    greedy, nucleus = run(main())
    assert nucleus.token_ids == greedy.token_ids


# --------------------------------------------------------------------------------------------
# Concurrency: batching, batch invariance


def test_concurrent_requests_are_batched(model):
    requests = [GenerationRequest(prompt(4 + i), max_new_tokens=12, temperature=0)
                for i in range(8)]

    async def main(batch_invariant):
        async with HFEngine(model, batch_invariant=batch_invariant) as engine:
            await asyncio.gather(*(engine.generate(r) for r in requests))
            return engine.stats

    batched, invariant = run(main(False)), run(main(True))
    assert batched.largest_batch > 1, "8 requests submitted together were never batched"
    assert invariant.largest_batch == 1, "batch-invariant mode shared a forward pass"
    # Batched: the 8 requests share their ~11 steps (in one or two admission waves); invariant
    # mode takes 8 x 11 separate ones.
    assert invariant.decode_steps == 8 * 11
    assert batched.decode_steps * 2 < invariant.decode_steps


def staggered_run(engine, target, others, delays):
    """Run `target` alongside `others`, each started after its delay (seconds)."""

    async def later(request, delay):
        await asyncio.sleep(delay)
        return await engine.generate(request)

    async def main():
        tasks = [asyncio.create_task(later(r, d)) for r, d in zip(others, delays)]
        await asyncio.sleep(0.003)
        result = await engine.generate(target)
        await asyncio.gather(*tasks)
        return result

    return main()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batch_invariant_mode_is_bit_identical(model, temperature):
    """Invariant: in batch-invariant mode a request's tokens and logprobs do not depend on what
    else runs (the losslessness tests of the rollout rest on this)."""
    target = GenerationRequest(prompt(10), max_new_tokens=40, temperature=temperature, seed=5)
    others = [GenerationRequest(prompt(3 + 5 * i, start=50 + i), max_new_tokens=10 + 7 * i,
                                temperature=0.9, seed=100 + i) for i in range(7)]
    delays = [0.0, 0.0, 0.002, 0.004, 0.006, 0.01, 0.02]

    async def alone():
        async with HFEngine(model, batch_invariant=True) as engine:
            return await engine.generate(target)

    async def crowded():
        async with HFEngine(model, batch_invariant=True) as engine:
            return await staggered_run(engine, target, others, delays), engine.stats

    solo = run(alone())
    together, stats = run(crowded())
    assert stats.finished == 8 and stats.decode_steps > 40
    # the counters bench/rollout_speedup.py records (prefill alone vs decode forward time)
    assert stats.prefills == 8 and stats.prefill_tokens == len(target.prompt_ids) + sum(len(r.prompt_ids) for r in others)
    assert stats.prefill_sec > 0 and stats.decode_sec > 0
    assert together.token_ids == solo.token_ids, "batch invariance broken: tokens differ"
    assert together.logprobs == solo.logprobs, "batch invariance broken: logprobs not bit-equal"


def test_batched_mode_seeded_requests_agree_with_solo_runs(model):
    # Batched mode is not bit-exact (padding changes float sums by ~1e-7), but a seeded request
    # must still follow the same random stream: tokens agree unless a near-tie flips, and
    # logprobs agree to float noise.
    target = GenerationRequest(prompt(10), max_new_tokens=40, temperature=1.0, seed=5)
    others = [GenerationRequest(prompt(3 + 5 * i, start=50 + i), max_new_tokens=30,
                                temperature=0.9, seed=100 + i) for i in range(7)]

    async def main():
        async with HFEngine(model) as engine:
            solo = await engine.generate(target)
            together = await staggered_run(engine, target, others, [0.0] * 7)
            return solo, together, engine.stats

    solo, together, stats = run(main())
    assert stats.largest_batch > 1
    assert together.token_ids == solo.token_ids
    torch.testing.assert_close(torch.tensor(together.logprobs), torch.tensor(solo.logprobs),
                               atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------------
# Finishing: stop tokens, stop strings, length


def test_stop_token_ends_the_generation_and_is_kept(model):
    p = prompt(8)
    free = reference_greedy(model, p, 30)
    k = next(i for i in range(3, 30) if free[i] not in free[:i])  # first fresh token after 3

    async def main():
        async with HFEngine(model) as engine:
            return await engine.generate(GenerationRequest(
                p, max_new_tokens=30, temperature=0, stop_token_ids=(free[k], VOCAB - 1)))

    gen = run(main())
    assert list(gen.token_ids) == free[: k + 1]
    assert gen.finish_reason == "stop" and gen.stop_reason == free[k]


def word_tokenizer():
    """A word-level tokenizer over the tiny vocabulary: token i decodes to "<i>"."""
    from tokenizers import Tokenizer, models

    return Tokenizer(models.WordLevel({f"<{i}>": i for i in range(VOCAB)}, unk_token="<0>"))


def test_stop_string_ends_the_generation(model):
    p = prompt(8, start=3)
    free = reference_greedy(model, p, 40)
    stop = f"<{free[4]}> <{free[5]}>"  # a two-token string; find where it first completes
    end = next(j for j in range(1, 40) if (free[j - 1], free[j]) == (free[4], free[5]))

    async def main():
        async with HFEngine(model, word_tokenizer()) as engine:
            return await engine.generate(GenerationRequest(
                p, max_new_tokens=40, temperature=0, stop_strings=("never", stop)))

    gen = run(main())
    assert list(gen.token_ids) == free[: end + 1]
    assert gen.finish_reason == "stop" and gen.stop_reason == stop


def test_a_failing_request_does_not_stop_the_engine(model):
    class BrokenTokenizer:  # fails on its third call: in a decode step shared with `fine`
        calls = 0

        def decode(self, ids, skip_special_tokens=False):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("decoder exploded")
            return "abc"

    async def main():
        async with HFEngine(model, BrokenTokenizer()) as engine:
            broken = engine.generate(
                GenerationRequest([1, 2], max_new_tokens=5, stop_strings=("x",)))
            fine = engine.generate(GenerationRequest([1, 2], max_new_tokens=9))
            results = await asyncio.gather(broken, fine, return_exceptions=True)
            after = await engine.generate(GenerationRequest([3, 4], max_new_tokens=5))
            return results, after

    (broken, fine), after = run(main())
    assert isinstance(broken, RuntimeError) and "exploded" in str(broken)
    assert fine.finish_reason == after.finish_reason == "length" and len(fine.token_ids) == 9


def test_stop_strings_need_a_tokenizer(model):
    async def main():
        async with HFEngine(model) as engine:
            await engine.generate(GenerationRequest([1, 2], stop_strings=("x",)))

    with pytest.raises(ValueError, match="tokenizer"):
        run(main())


def test_length_limit_and_single_token_requests(model):
    async def main():
        async with HFEngine(model) as engine:
            one = await engine.generate(GenerationRequest([1, 2, 3], max_new_tokens=1))
            seven = await engine.generate(GenerationRequest([1, 2, 3], max_new_tokens=7))
            return one, seven

    one, seven = run(main())
    assert (len(one.token_ids), one.finish_reason) == (1, "length")
    assert (len(seven.token_ids), seven.finish_reason) == (7, "length")


# --------------------------------------------------------------------------------------------
# Cancellation


def test_task_cancellation_stops_compute(model):
    long = GenerationRequest(prompt(5), max_new_tokens=1500, temperature=0)
    short = GenerationRequest(prompt(6), max_new_tokens=30, temperature=0)

    async def main():
        async with HFEngine(model) as engine:
            task = asyncio.create_task(engine.generate(long))
            while (engine.decode_steps(long.request_id) or 0) < 5:
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            at_cancel = engine.decode_steps(long.request_id)
            await engine.generate(short)  # 30 more decode steps of the engine
            return at_cancel, engine.decode_steps(long.request_id), engine.stats

    at_cancel, later, stats = run(main())
    assert later <= at_cancel + 1, f"cancelled request kept decoding: {at_cancel} -> {later} steps"
    assert stats.cancelled == 1 and stats.decode_steps >= 30


def test_engine_cancel_returns_partial_generation(model):
    long = GenerationRequest(prompt(5), max_new_tokens=1500, temperature=0.8, seed=1)

    async def main():
        async with HFEngine(model) as engine:
            task = asyncio.create_task(engine.generate(long))
            while (engine.decode_steps(long.request_id) or 0) < 5:
                await asyncio.sleep(0.001)
            assert engine.cancel(long.request_id)
            gen = await task
            return gen, engine.cancel(long.request_id), engine.cancel("no-such-request")

    gen, again, unknown = run(main())
    assert gen.finish_reason == "cancelled" and 5 < len(gen.token_ids) < 1500
    assert len(gen.logprobs) == len(gen.token_ids)
    assert again is False and unknown is False


def test_cancelled_queued_request_is_never_computed(model):
    first = GenerationRequest(prompt(5), max_new_tokens=400, temperature=0)
    queued = GenerationRequest(prompt(7), max_new_tokens=40, temperature=0)

    async def main():
        async with HFEngine(model, max_batch_size=1) as engine:
            running = asyncio.create_task(engine.generate(first))
            waiting = asyncio.create_task(engine.generate(queued))
            while (engine.decode_steps(first.request_id) or 0) < 3:
                await asyncio.sleep(0.001)
            waiting.cancel()
            # A few more steps let the worker see it; then free the slot it was waiting for.
            target = engine.decode_steps(first.request_id) + 3
            while engine.decode_steps(first.request_id) < target:
                await asyncio.sleep(0.001)
            engine.cancel(first.request_id)
            await running
            await asyncio.sleep(0.05)  # were it still queued, it would be admitted now
            return engine.stats, engine.decode_steps(queued.request_id)

    stats, steps = run(main())
    assert stats.prefills == 1 and steps == 0


# --------------------------------------------------------------------------------------------
# LoRA adapters


def save_adapter(base, path, seed: int):
    """A real PEFT LoRA adapter with random lora_B (so it changes the outputs), and the PEFT
    model that produced it (the reference for what the adapter should generate)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    peft_model = get_peft_model(copy.deepcopy(base), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    peft_model.save_pretrained(path)
    return peft_model.eval()


def test_adapters_load_replace_unload(model, tmp_path):
    v1 = save_adapter(model, tmp_path / "v1", seed=1)
    v2 = save_adapter(model, tmp_path / "v2", seed=2)
    p = prompt(9, start=4)
    base_ref, v1_ref, v2_ref = (reference_greedy(m, p, 20) for m in (model, v1, v2))
    assert len({tuple(base_ref), tuple(v1_ref), tuple(v2_ref)}) == 3, "adapters do not matter"

    def request(adapter):
        return GenerationRequest(p, max_new_tokens=20, temperature=0, adapter=adapter)

    async def main():
        async with HFEngine(copy.deepcopy(model)) as engine:
            before = await engine.generate(request(None))
            await engine.load_adapter("wm-v1", tmp_path / "v1")
            await engine.load_adapter("wm-v2", tmp_path / "v2")
            # Base and both adapters at once: each batch step only mixes one adapter.
            mixed = await asyncio.gather(*(engine.generate(request(a))
                                           for a in (None, "wm-v1", "wm-v2", "wm-v1")))
            await engine.load_adapter("wm-v1", tmp_path / "v2")  # replace by version name
            replaced = await engine.generate(request("wm-v1"))
            await engine.unload_adapter("wm-v2")
            with pytest.raises(KeyError, match="wm-v2"):
                await engine.generate(request("wm-v2"))
            return before, mixed, replaced

    before, mixed, replaced = run(main())
    assert list(before.token_ids) == base_ref
    assert [list(g.token_ids) for g in mixed] == [base_ref, v1_ref, v2_ref, v1_ref]
    assert mixed[0].logprobs == before.logprobs, "loading adapters changed the base model"
    assert list(replaced.token_ids) == v2_ref


def test_adapters_that_cannot_be_served_merged_are_refused_and_the_engine_keeps_serving(model, tmp_path):
    """The engine serves each version as merged weights: a DoRA adapter or one with trained
    biases would be served wrong, so it is refused (one clear error), and what was served stays."""
    from peft import LoraConfig, get_peft_model

    from obsspec.engines.lora import AdapterLoadError

    good = save_adapter(model, tmp_path / "good", seed=1)
    for name, config in (("dora", LoraConfig(r=4, target_modules=["q_proj"], use_dora=True)),
                         ("bias", LoraConfig(r=4, target_modules=["q_proj"], bias="lora_only"))):
        get_peft_model(copy.deepcopy(model), config).save_pretrained(tmp_path / name)
    p = prompt(9, start=4)
    good_ref = reference_greedy(good, p, 20)

    async def main():
        async with HFEngine(copy.deepcopy(model)) as engine:
            await engine.load_adapter("wm", tmp_path / "good")
            errors = []
            for name in ("dora", "bias"):
                with pytest.raises(AdapterLoadError) as e:
                    await engine.load_adapter("wm", tmp_path / name)
                errors.append(str(e.value))
            after = await engine.generate(GenerationRequest(p, max_new_tokens=20, temperature=0, adapter="wm"))
            return errors, after

    errors, after = run(main())
    assert "use_dora=True cannot be served merged" in errors[0]
    assert "bias='lora_only' cannot be served merged" in errors[1]
    assert list(after.token_ids) == good_ref, "a refused adapter replaced the version served"


def test_unknown_adapter_fails_only_that_request(model):
    async def main():
        async with HFEngine(model) as engine:
            bad = engine.generate(GenerationRequest([1, 2], max_new_tokens=3, adapter="nope"))
            good = engine.generate(GenerationRequest([1, 2], max_new_tokens=3))
            return await asyncio.gather(bad, good, return_exceptions=True)

    bad, good = run(main())
    assert isinstance(bad, KeyError) and good.finish_reason == "length"


# --------------------------------------------------------------------------------------------
# Lifecycle and validation


def test_close_fails_pending_requests_and_rejects_new_ones(model):
    async def main():
        engine = HFEngine(model)
        task = asyncio.create_task(engine.generate(GenerationRequest([1], max_new_tokens=1500)))
        await asyncio.sleep(0.02)
        await asyncio.to_thread(engine.close)
        with pytest.raises(EngineClosedError):
            await task
        with pytest.raises(EngineClosedError):
            await engine.generate(GenerationRequest([1]))

    run(main())


def test_duplicate_request_ids_are_rejected(model):
    async def main():
        async with HFEngine(model) as engine:
            request = GenerationRequest([1, 2], max_new_tokens=200, request_id="r1")
            first = asyncio.create_task(engine.generate(request))
            await asyncio.sleep(0)
            with pytest.raises(ValueError, match="already running"):
                await engine.generate(request)
            await first

    run(main())


@pytest.mark.parametrize("kwargs,match", [
    ({"prompt_ids": []}, "empty"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"stop_strings": "</tool_response>"}, "sequence"),
])
def test_request_validation(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        GenerationRequest(**{"prompt_ids": [1], **kwargs})


# --------------------------------------------------------------------------------------------
# Priority and preemption, scheduling stats


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_low_priority_work_waits_for_normal_work_or_rides_in_its_pass(model, batch_invariant):
    """Batch-invariant: a speculative request waits while committed work runs. Batched: it rides
    in the committed request's passes. Either way scheduling never changes what is sampled, and
    `promote` makes it committed work."""
    async def go():
        engine = HFEngine(model, batch_invariant=batch_invariant)
        try:
            normal = asyncio.ensure_future(engine.generate(GenerationRequest(prompt(8), max_new_tokens=600, seed=1, request_id="n")))
            low = asyncio.ensure_future(engine.generate(GenerationRequest(prompt(8, 5), max_new_tokens=40, seed=2, request_id="s", priority=1)))
            await until(lambda: (engine.decode_steps("n") or 0) >= 5, "the normal request decodes")
            steps_while_busy = engine.decode_steps("s") or 0
            assert not normal.done(), "the normal request finished too soon for this test to mean anything"
            await normal
            solo = await low
            # the same request alone: scheduling never changes what is sampled
            again = await engine.generate(GenerationRequest(prompt(8, 5), max_new_tokens=40, seed=2))
            late = asyncio.ensure_future(engine.generate(GenerationRequest(prompt(8), max_new_tokens=200, seed=3, request_id="n2")))
            low2 = asyncio.ensure_future(engine.generate(GenerationRequest(prompt(8, 5), max_new_tokens=60, seed=2, request_id="s2", priority=1)))
            await until(lambda: (engine.decode_steps("n2") or 0) >= 2, "the second normal request decodes")
            assert engine.promote("s2")  # (batched: it rides, still well short of its 60 tokens)
            await low2
            promoted_done_first = not late.done()
            await late
            return steps_while_busy, solo.token_ids == again.token_ids, promoted_done_first
        finally:
            engine.close()

    steps_while_busy, same, promoted_first = run(go())
    if batch_invariant:
        assert steps_while_busy == 0, "a low-priority request decoded while normal work was running"
    else:
        assert steps_while_busy > 0, "a low-priority request did not ride in the committed request's passes"
    assert same and promoted_first


def passes_seen(engine, *request_ids):
    """Record, at the start of every forward pass of `engine`'s model (in the worker thread, so
    race-free), the decode steps each request has taken so far (None: not in the engine)."""
    log: list[tuple[int | None, ...]] = []
    engine.model.register_forward_pre_hook(
        lambda module, args: log.append(tuple(engine.decode_steps(i) for i in request_ids)))
    return log


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_committed_work_never_queues_behind_speculative_work(model, batch_invariant):
    """Invariant: with every slot taken by speculative rows, a committed request is admitted at
    once (speculative rows hold no slot of committed work) and samples what it samples alone.
    Batch-invariant: no speculative decode step starts from its arrival to its end, the
    speculative rows resume after it, and its logprobs are bit-identical. Batched: the
    speculative rows ride in its passes, its logprobs within float noise."""
    committed = GenerationRequest(prompt(9), max_new_tokens=30, temperature=0.8, seed=4)
    specs = [GenerationRequest(prompt(6, start=40 + i), max_new_tokens=500, temperature=0,
                               priority=1, request_id=f"s{i}") for i in range(2)]

    async def main():
        async with HFEngine(copy.deepcopy(model), batch_invariant=batch_invariant,
                            max_batch_size=2) as engine:
            solo = await engine.generate(committed)
            log = passes_seen(engine, "c", "s0", "s1")
            tasks = [asyncio.create_task(engine.generate(r)) for r in specs]
            await until(lambda: min(engine.decode_steps(r.request_id) or 0 for r in specs) >= 3,
                        "both speculative requests decode")
            together = await engine.generate(dataclasses.replace(committed, request_id="c"))
            blocked = any(t.done() for t in tasks)
            if not blocked:
                resumed = len(log)
                await until(lambda: len(log) > resumed + 2, "speculative rows resume")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return solo, together, log, blocked

    solo, together, log, blocked = run(main())
    assert not blocked, "the committed request waited for speculative work to finish"
    last = len(together.token_ids) - 1  # its decode steps: the first token comes from prefill
    inside = [s0 + s1 for c, s0, s1 in log if c is not None and c < last]
    assert together.token_ids == solo.token_ids
    if not batch_invariant:  # the speculative rows ride in the committed row's passes
        assert len(set(inside)) > 2, "speculative rows did not decode beside committed work"
        torch.testing.assert_close(torch.tensor(together.logprobs), torch.tensor(solo.logprobs),
                                   atol=1e-5, rtol=0)
        return
    # The first pass logged with the committed request in the engine may be a speculative one
    # the engine chose just before the request arrived (the log is written when a pass starts,
    # on a loaded machine well after the choice): no pass after it may be speculative.
    spec_steps = set(inside[1:])
    assert len(spec_steps) == 1, "speculative rows decoded while committed work was in the engine"
    assert log[-1][1] + log[-1][2] > spec_steps.pop(), "speculative rows never resumed"
    assert together.logprobs == solo.logprobs, "a committed row shared a pass with speculative rows"


def test_a_promoted_row_decodes_on_and_the_speculative_row_beside_it_rides(model):
    """Batched mode: two speculative requests share a batch; promoting one makes it committed
    work in place (its KV cache stays), and the other rides in its passes instead of pausing.
    Both end with the greedy tokens they would have had unpromoted."""
    a = GenerationRequest(prompt(7, start=3), max_new_tokens=40, temperature=0, priority=1,
                          request_id="a")
    b = GenerationRequest(prompt(12, start=9), max_new_tokens=60, temperature=0, priority=1,
                          request_id="b")

    async def main():
        async with HFEngine(copy.deepcopy(model)) as engine:
            log = passes_seen(engine, "a", "b")
            ta, tb = asyncio.create_task(engine.generate(a)), asyncio.create_task(engine.generate(b))
            await until(lambda: (engine.decode_steps("a") or 0) >= 5, "a decodes")
            assert engine.promote("a")
            at_promote = engine.decode_steps("a")
            return await asyncio.wait_for(ta, 10), await tb, at_promote, log, engine.stats

    gen_a, gen_b, at_promote, log, stats = run(main())
    assert stats.largest_batch == 2, "the two requests never shared a batch"
    b_steps = {b for a_, b in log if a_ is not None and at_promote < a_ < len(gen_a.token_ids) - 1}
    assert len(b_steps) > 2, "the speculative row paused beside promoted work instead of riding"
    assert list(gen_a.token_ids) == reference_greedy(model, list(a.prompt_ids), 40)
    assert list(gen_b.token_ids) == reference_greedy(model, list(b.prompt_ids), 60)
    torch.testing.assert_close(torch.tensor(gen_a.logprobs),
                               recomputed_logprobs(model, a.prompt_ids, gen_a.token_ids, 0),
                               atol=1e-5, rtol=0)


def test_a_riding_row_is_charged_the_passs_marginal_time():
    """The slope of pass time against rows, over passes of several sizes; the linear share
    (an upper bound) until sizes vary; never more than the linear share, never negative."""
    from obsspec.engines.hf import PassCost

    cost = PassCost()
    for _ in range(5):
        cost.add(8, 0.018)
    assert cost.marginal(8, 0.018) == pytest.approx(0.018 / 8), "one size seen: the linear share"
    for n in [1, 4, 8, 12, 16] * 10:
        cost.add(n, 0.010 + 0.001 * n)
    assert cost.marginal(12, 0.022) == pytest.approx(0.001, rel=0.05)
    falling = PassCost()
    for n in [1, 4, 8, 12, 16] * 10:
        falling.add(n, 0.020 - 0.0005 * n)
    assert falling.marginal(8, 0.016) == 0.0


def test_scheduling_stats_charge_a_speculative_pass_in_flight_to_committed_work(model):
    """Committed work on an idle engine is delayed by nothing; committed work arriving while a
    speculative prefill runs (held at a hook until it has arrived, then 20 ms more) is charged
    the rest of that pass, and the pass counts as speculative compute."""
    long_prompt = prompt(300, start=2)
    started, arrived = threading.Event(), threading.Event()

    def hold_the_long_prefill(module, args, kwargs):
        if kwargs["input_ids"].shape[1] == len(long_prompt):
            started.set()
            arrived.wait(5)
            time.sleep(0.02)

    def committed():
        return GenerationRequest(prompt(5), max_new_tokens=8, temperature=0)

    async def main():
        async with HFEngine(copy.deepcopy(model)) as engine:
            start = engine.scheduling_stats()
            await engine.generate(committed())
            idle = engine.scheduling_stats() - start
            engine.model.register_forward_pre_hook(hold_the_long_prefill, with_kwargs=True)
            spec = asyncio.create_task(engine.generate(
                GenerationRequest(long_prompt, max_new_tokens=4, temperature=0, priority=1)))
            await asyncio.to_thread(started.wait, 5)
            start = engine.scheduling_stats()
            task = asyncio.create_task(engine.generate(committed()))
            await asyncio.sleep(0)  # it has reached the engine
            arrived.set()
            await asyncio.gather(task, spec)
            return idle, engine.scheduling_stats() - start

    idle, busy = run(main())
    assert idle.measured and idle.committed == 1 and idle.committed_sec > 0
    assert idle.committed_delay_sec == 0 and idle.delay_frac == 0.0
    assert idle.speculative_compute_sec == 0
    assert busy.committed == 1, "the speculative request is not committed work"
    assert 0.02 <= busy.committed_delay_sec < busy.committed_sec
    assert busy.speculative_compute_sec >= busy.committed_delay_sec
    assert busy.delay_frac == pytest.approx(busy.committed_delay_sec / busy.committed_sec)


def test_scheduling_stats_diff_and_delay_fraction():
    from obsspec.engines.base import SchedulingStats

    total = SchedulingStats(committed=3, committed_sec=4.0, committed_delay_sec=1.0,
                            speculative_compute_sec=2.0)
    earlier = SchedulingStats(committed=1, committed_sec=2.0, committed_delay_sec=0.5,
                              speculative_compute_sec=0.5)
    assert total - earlier == SchedulingStats(2, 2.0, 0.5, 1.5)
    assert (total - earlier).delay_frac == 0.25
    assert SchedulingStats().delay_frac is None, "no committed time: nothing to divide"
    assert (total - SchedulingStats(measured=False)).delay_frac is None


@pytest.mark.parametrize("priority_scheduling", [False, True])
def test_vllm_client_sends_priority_only_to_a_priority_scheduling_server(model, priority_scheduling):
    """The vLLM client forwards `priority` only when told the server schedules by it (vLLM
    refuses a non-zero one otherwise); the fake server passes it on to an hf engine."""
    from fakes import VLLMProtocolServer

    from obsspec.engines import VLLMEngine

    request = GenerationRequest(prompt(6), max_new_tokens=5, temperature=0, priority=1)

    async def main(url):
        async with VLLMEngine(url, "tiny", priority_scheduling=priority_scheduling) as client:
            return await client.generate(request), client.promote("x"), client.scheduling_stats()

    with contextlib.closing(HFEngine(model)) as engine:
        with VLLMProtocolServer(engine, "tiny", priority_scheduling=True) as server:
            gen, promoted, stats = run(main(server.url))
    assert server.priorities == [1 if priority_scheduling else 0]
    assert list(gen.token_ids) == reference_greedy(model, list(request.prompt_ids), 5)
    assert promoted is False and not stats.measured and stats.delay_frac is None


# --------------------------------------------------------------------------------------------
# Prompt lookup


def test_propose_continues_the_latest_earlier_occurrence_of_the_tail():
    from obsspec.engines.kv_batch import propose

    assert propose([1, 2, 3, 9, 8, 1, 2, 3], 4) == [9, 8, 1, 2]
    assert propose([5, 2, 3, 7, 6, 2, 3, 4, 1, 2, 3], 2) == [4, 1]  # the latest of two
    assert propose([4, 4, 9, 7, 1, 9], 3) == [7, 1, 9]  # falls back to a shorter tail
    assert propose([1, 2, 3], 4) == [] and propose([7], 4) == []


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_prompt_lookup_keeps_greedy_output_and_takes_fewer_passes(model, batch_invariant):
    """Verifying proposed tokens in one pass gives the tokens of one-at-a-time greedy decoding
    (here: exactly `generate`'s), in fewer decode passes; sampled requests get no proposals."""
    prompts = [prompt(30, s) * 2 for s in (1, 5, 9, 13)]

    async def go(lookup):
        async with HFEngine(model, batch_invariant=batch_invariant, prompt_lookup=lookup) as engine:
            greedy = [engine.generate(GenerationRequest(prompt_ids=p, temperature=0, max_new_tokens=40,
                                                        request_id=f"g{i}")) for i, p in enumerate(prompts)]
            sampled = engine.generate(GenerationRequest(prompt_ids=prompts[0], temperature=1.0, seed=3,
                                                        max_new_tokens=40))
            out = await asyncio.gather(*greedy, sampled)
            passes = sum(engine.stats.steps_by_request[f"g{i}"] for i in range(len(prompts)))
            return [list(g.token_ids) for g in out], engine.stats, passes

    plain, plain_stats, plain_passes = run(go(0))
    looked, stats, passes = run(go(8))
    assert looked[:4] == plain[:4] == [reference_greedy(model, p, 40) for p in prompts]
    assert stats.proposed_accepted > 0 and plain_stats.proposed_tokens == 0
    assert passes < plain_passes
    if batch_invariant:  # its own passes, one token each: bit-identical draws
        assert looked[4] == plain[4]
    with pytest.raises(ValueError, match="prompt_lookup"):
        HFEngine(model, prompt_lookup=-1)


# --------------------------------------------------------------------------------------------
# Prefix cache


def test_prefix_cache_prefill_is_bit_identical_cold_and_warm(model):
    """A prompt's logits and keys/values do not depend on what was cached before it: block by
    block, the same operations on the same tensors, whether earlier blocks came from the cache."""
    from obsspec.engines.prefix_cache import PrefixCache

    shared = prompt(40, start=3)
    a, b = shared + prompt(13, start=5), shared + prompt(21, start=11)

    def prefill(cache, ids):
        with torch.inference_mode():
            logits, kv = cache.prefill(model, ids, None, torch.device("cpu"))
        return logits, [(layer.keys, layer.values) for layer in kv.layers]

    cold_logits, cold_kv = prefill(PrefixCache(block=16, max_tokens=256), b)
    warm = PrefixCache(block=16, max_tokens=256)
    prefill(warm, a)  # caches blocks 0-1 (32 shared tokens) and block 2 (a's own)
    warm_logits, warm_kv = prefill(warm, b)
    assert warm.hit_tokens == 32, "b should reuse the two blocks it shares with a"
    assert torch.equal(cold_logits, warm_logits)
    assert all(torch.equal(k1, k2) and torch.equal(v1, v2) for (k1, v1), (k2, v2) in zip(cold_kv, warm_kv))
    assert cold_kv[0][0].shape[-2] == len(b)
    # the one-pass prefill agrees to float noise (same arithmetic, other shapes)
    with torch.inference_mode():
        one_pass = model(torch.tensor([b])).logits[0, -1]
    assert torch.allclose(one_pass, cold_logits, atol=1e-5)


def test_prefix_cache_keeps_the_last_token_fresh_and_its_token_budget(model):
    from obsspec.engines.prefix_cache import PrefixCache

    cache = PrefixCache(block=8, max_tokens=24)  # three blocks at most
    with torch.inference_mode():
        cache.prefill(model, prompt(16), None, torch.device("cpu"))  # 16 tokens: one block, 8 fresh
        assert len(cache) == 1
        cache.prefill(model, prompt(16), None, torch.device("cpu"))
        assert cache.hit_tokens == 8 and cache.computed_tokens == 16 + 8
        cache.prefill(model, prompt(60, start=2), None, torch.device("cpu"))  # 7 new blocks
    assert len(cache) == 3, "the least recently used blocks are dropped past max_tokens"
    with pytest.raises(ValueError, match="block"):
        PrefixCache(block=64, max_tokens=32)


def test_engine_with_a_prefix_cache_drafts_exactly_as_without(model, tmp_path):
    """Greedy drafts of prompts that share a history are generate()'s tokens with or without the
    cache; later prompts reuse earlier ones' blocks; loading an adapter empties the cache (its
    keys and values belong to the old weights), and the adapter's drafts are still exact."""
    v1 = save_adapter(model, tmp_path / "v1", seed=1)
    history = prompt(70, start=2)
    prompts = [history[:n] + prompt(5, start=n) for n in (20, 45, 70)]

    async def main(tokens):
        async with HFEngine(copy.deepcopy(model), prefix_cache_tokens=tokens, prefix_block=16) as engine:
            base = [list((await engine.generate(GenerationRequest(p, max_new_tokens=12, temperature=0))).token_ids)
                    for p in prompts]
            reused = engine.prefix_cache.hit_tokens if engine.prefix_cache else 0
            await engine.load_adapter("v1", tmp_path / "v1")
            held = len(engine.prefix_cache) if engine.prefix_cache else 0
            adapted = [list((await engine.generate(GenerationRequest(p, max_new_tokens=12, temperature=0,
                                                                     adapter="v1"))).token_ids)
                       for p in prompts]
            return base, adapted, reused, held

    cached = run(main(1024))
    plain = run(main(0))
    assert cached[:2] == plain[:2]
    assert cached[0] == [reference_greedy(model, p, 12) for p in prompts]
    assert cached[1] == [reference_greedy(v1, p, 12) for p in prompts]
    assert cached[0] != cached[1], "the adapter does not matter"
    assert cached[2] == 16 + 32, "the 2nd and 3rd prompts reuse the blocks of the history before them"
    assert cached[3] == 0
