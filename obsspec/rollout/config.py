"""Recipe sections for rollouts: the policy, the world model, and the rollout itself."""

from __future__ import annotations

from dataclasses import dataclass

from obsspec.fields import doc
from obsspec.rollout.tools import EmulatedLatency


def check_engine(section: str, engine: str, server_url: str) -> None:
    if engine not in ("hf", "vllm"):
        raise ValueError(f"{section}.engine must be hf or vllm, got {engine!r}")
    if engine == "vllm" and not server_url:
        raise ValueError(f"{section}.engine=vllm needs {section}.server_url (the vLLM server, "
                         "e.g. http://localhost:8000; docs/ENGINES.md shows how to start one)")


@dataclass(frozen=True)
class PolicyConfig:
    model: str = doc("tiny", "'tiny' (the kit's warm-started policy, built on first use), a local "
                              "model folder, or a hub name (GPU recipes).")
    engine: str = doc("hf", "hf (transformers, in this process) or vllm (a vLLM server; "
                             "`obsspec serve` or servers.launch starts it).")
    server_url: str = doc("", "With engine=vllm: the vLLM server's base URL (http://host:port).")
    priority_scheduling: bool = doc(False, "With engine=vllm: the server runs with --scheduling-policy "
                                           "priority, and speculative generations are sent at a lower "
                                           "priority than committed ones (vLLM refuses a priority otherwise).")
    batch_invariant: bool = doc(True, "Per-request forward passes: results never depend on the "
                                       "batch (needed for bit-exact losslessness; slower).")
    max_batch_size: int = doc(32, "Requests decoded together.")
    device: str = doc("cpu", "cpu or cuda.")
    temperature: float = doc(1.0, "Sampling temperature (0 = greedy).")
    top_p: float = doc(1.0, "Nucleus sampling mass.")
    max_new_tokens: int = doc(192, "Longest action, in tokens.")
    max_context: int = doc(2048, "Longest trajectory, in tokens; the episode ends there (within "
                                  "the policy's positions: kit.max_length for 'tiny').")
    max_turns: int = doc(8, "Most policy turns per episode.")
    thinking: bool = doc(True, "Qwen3's thinking switch (its chat template's enable_thinking). on: every "
                               "turn's generation prompt is `<|im_start|>assistant\\n` and the model may open "
                               "its own <think> block, inside max_new_tokens (Qwen3's default; the tiny "
                               "kit's layout). off: it carries an empty think block `<think>\\n\\n</think>"
                               "\\n\\n`, as the template writes it (docs/CHAT.md).")
    tool_format: str = doc("xml", "The tool-call form the system prompt teaches: xml (Qwen3-Coder's "
                                  "<function=bash><parameter=command>; the tiny kit's and the published "
                                  "recipe's) or json (Qwen3's own {\"name\": ..., \"arguments\": {...}} in "
                                  "<tool_call>, with its template's tools block). Calls in either form are "
                                  "parsed and counted (calls/xml, calls/json, calls/malformed).")

    def __post_init__(self) -> None:
        check_engine("policy", self.engine, self.server_url)
        if self.tool_format not in ("xml", "json"):
            raise ValueError(f"policy.tool_format must be xml or json (got {self.tool_format!r})")
        if self.model == "tiny" and (self.tool_format != "xml" or not self.thinking):
            raise ValueError("the tiny kit's policy was trained with policy.tool_format xml and "
                             "policy.thinking on: set them so, or name another policy.model")
        if self.priority_scheduling and self.engine != "vllm":
            raise ValueError("policy.priority_scheduling is for engine vllm (the hf engine always runs "
                             "speculative work at a lower priority)")
        for name in ("max_batch_size", "max_new_tokens", "max_context", "max_turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"policy.{name} must be >= 1 (got {getattr(self, name)})")
        if self.engine == "vllm" and self.top_p < 1:
            # vLLM's processed logprobs are renormalised over the nucleus (the sampling mask that
            # would undo it is not in the completions API of the version this is tested with)
            raise ValueError(f"policy.top_p = {self.top_p} with engine vllm: the server's logprobs would be "
                             "renormalised over the top-p survivors, not the full distribution the trainer "
                             "computes, so the importance ratio would be off; use top_p: 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"policy.temperature must be >= 0 and policy.top_p in (0, 1] "
                             f"(got {self.temperature}, {self.top_p})")

    @property
    def chat_layout(self) -> dict:
        """The prompt's layout as `ChatFormat` keyword arguments: ChatFormat(tok, **policy.chat_layout)."""
        return {"thinking": self.thinking, "tool_format": self.tool_format}


@dataclass(frozen=True)
class WorldModelConfig:
    model: str = doc("tiny", "'tiny' (the kit's world-model base), a local folder or a hub name.")
    adapter: str = doc("", "A LoRA adapter to apply: a train-worldmodel run directory (its latest "
                           "version), DIR@N (version N), or an adapter folder; '' = none.")
    engine: str = doc("hf", "hf (transformers, in this process) or vllm (a vLLM server; "
                             "`obsspec serve` or servers.launch starts it).")
    server_url: str = doc("", "With engine=vllm: the vLLM server's base URL (http://host:port).")
    batch_invariant: bool = doc(True, "As policy.batch_invariant, for the world model.")
    device: str = doc("cpu", "cpu or cuda.")
    max_tokens: int = doc(4160, "Longest draft, in tokens; an unfinished draft cannot match. At "
                                "least sandbox.output_cap + 64, so an observation at the cap fits.")
    workspace_snapshot: bool = doc(False, "Put a snapshot of the task's initial workspace (`ls -lR` "
                                          "as the agent's terminal prints it, then small text files' contents) ahead "
                                          "of the world model's context, in rollouts, training rows "
                                          "and evaluation alike; drafts are still verified exactly.")
    snapshot_tokens: int = doc(512, "Token budget of the workspace snapshot (cut with a marker); "
                                    "the world model then reads up to this + policy.max_context.")
    hint_tokens: int = doc(0, "After each bash call in the world model's context, a system turn "
                              "with the spans of the task's initial workspace that the command "
                              "names (a folder's `ls -l` block, a file's contents), at most this "
                              "many tokens each; 0 = off. In rollouts, training rows and "
                              "evaluation alike; drafts are still verified exactly "
                              "(docs/WORLDMODEL.md, \"Workspace hints\").")
    prompt_lookup: int = doc(0, "hf engine: each decode pass of a greedy draft also verifies up to "
                                "this many tokens proposed from its own context (the tokens after "
                                "the latest earlier occurrence of its last 1-3 tokens: a listing "
                                "copied from the snapshot), keeping those the model agrees with. "
                                "Same greedy tokens, fewer passes; 0 = one token a pass.")
    prefix_cache_tokens: int = doc(0, "hf engine: keep the keys and values of up to this many "
                                      "prompt tokens, in 64-token blocks, and reuse them for any "
                                      "later draft prompt that begins with the same blocks (the "
                                      "episode's history, the group's snapshot). Prefill runs "
                                      "block by block either way, so a draft never depends on "
                                      "what was cached; 0 = off.")

    def __post_init__(self) -> None:
        check_engine("world_model", self.engine, self.server_url)
        if not 0 <= self.prompt_lookup <= 256:
            raise ValueError(f"world_model.prompt_lookup must be between 0 and 256 (got {self.prompt_lookup})")
        if self.prompt_lookup and self.engine != "hf":
            raise ValueError("world_model.prompt_lookup is the hf engine's; a vLLM server sets its own "
                             "speculative decoding (set prompt_lookup: 0)")
        if self.prefix_cache_tokens < 0 or (self.prefix_cache_tokens and self.engine != "hf"):
            raise ValueError("world_model.prefix_cache_tokens must be >= 0, and 0 with engine vllm "
                             f"(a vLLM server caches prefixes itself; got {self.prefix_cache_tokens})")
        if self.prefix_cache_tokens and self.prefix_cache_tokens < 64:
            raise ValueError(f"world_model.prefix_cache_tokens must be 0 or at least one 64-token block "
                             f"(got {self.prefix_cache_tokens})")
        if self.max_tokens < 1:
            raise ValueError("world_model.max_tokens must be >= 1")
        if not 64 <= self.snapshot_tokens <= 32768:
            raise ValueError(f"world_model.snapshot_tokens must be between 64 and 32768 "
                             f"(got {self.snapshot_tokens})")
        if self.hint_tokens and not 64 <= self.hint_tokens <= 32768:
            raise ValueError(f"world_model.hint_tokens must be 0 (off) or between 64 and 32768 "
                             f"(got {self.hint_tokens})")

    @property
    def snapshot_budget(self) -> int:
        """The snapshot's tokens ahead of the context (0 when off)."""
        return self.snapshot_tokens if self.workspace_snapshot else 0

    @property
    def reads_workspace(self) -> bool:
        """Whether the world model reads the task's initial workspace (a snapshot or hints)."""
        return self.workspace_snapshot or self.hint_tokens > 0

    def extra_tokens(self, calls: int) -> int:
        """Most tokens the snapshot and the hints add to a context of `calls` bash calls."""
        return self.snapshot_budget + calls * self.hint_tokens

    @property
    def hf_options(self) -> dict:
        """The hf engine's keyword arguments for drafting as this section says (rollout, training,
        evaluation alike)."""
        return {"prompt_lookup": self.prompt_lookup, "prefix_cache_tokens": self.prefix_cache_tokens}


@dataclass(frozen=True)
class RolloutConfig:
    mode: str = doc("both", "sequential | speculative | both (same tasks and seeds, side by side).")
    predictor: str = doc("tiered", "tiered (the history cache, then a sibling episode's result for the "
                                   "same command, then the world model) | world_model | history | "
                                   "oracle | none.")
    depth: int = doc(1, "Turns speculated ahead: a speculative action gets its own draft and "
                        "speculative next action, up to this many turns past the committed one.")
    breadth: int = doc(1, "Drafts per turn (world model: greedy + sampled).")
    split: str = doc("val", "Which split of the prepared suite to roll out on: train or val.")
    num_tasks: int = doc(8, "Tasks taken from the split, spread evenly over it (so over its families).")
    concurrency: int = doc(0, "Episodes running at once (0 = all).")
    pairs: int = doc(3, "With mode both: sequential/speculative pairs of the same episodes, the order "
                        "alternating (sequential first, then speculative first, ...), so that the "
                        "machine's drift and warm-up cancel; the reduction is reported with a 95 % "
                        "interval over the pairs, and as not resolvable when the interval includes 0.")
    busy_limit: int = doc(0, "Do not speculate on a command while this many committed policy "
                             "generations (or more) are in flight: a busy engine has no idle "
                             "compute for speculation, and world-model drafts would take compute "
                             "from committed work on a shared device. Timing only, never tokens; "
                             "0 = always speculate.")
    gate: bool = doc(True, "Start a draft's speculative action only when its expected gain is "
                           "positive: p(hit) x min(generation time, tool time left) > (1 - p) x "
                           "the committed delay a speculative generation causes, with p calibrated online per draft "
                           "source, command class and draft confidence (docs/ROLLOUT.md, \"The gate\"). "
                           "Timing only, never tokens.")
    gate_cost_share: float = doc(0.25, "Prior of the committed delay a speculative generation causes, as "
                                       "a share of a generation's time (0: free, as with preemption; 1: "
                                       "a whole generation lost). Worth 2 generations: where the policy "
                                       "engine measures its delays (hf engine) the measurement takes over.")
    tasks_dir: str = doc("", "A prepared suite; '' = RUN_DIR/tasks (prepared on first use).")
    kit_cache: str = doc(".cache/kit", "Where the tiny model kit is cached.")
    seed: int = doc(0, "Seed of the per-(episode, turn) sampling seeds.")
    latency: EmulatedLatency = doc(EmulatedLatency(), "Emulated remote-sandbox latency added to "
                                                      "every command (labelled as emulated).")

    def __post_init__(self) -> None:
        if self.mode not in ("sequential", "speculative", "both"):
            raise ValueError("rollout.mode must be sequential, speculative or both")
        if self.predictor not in ("tiered", "world_model", "history", "oracle", "none"):
            raise ValueError("rollout.predictor must be tiered, world_model, history, oracle or none")
        if not 0 <= self.gate_cost_share <= 10:
            raise ValueError(f"rollout.gate_cost_share must be between 0 and 10 (got {self.gate_cost_share})")
        for name in ("depth", "breadth", "num_tasks", "pairs"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1 (got {getattr(self, name)})")
        for name in ("concurrency", "busy_limit"):
            if getattr(self, name) < 0:
                raise ValueError(f"rollout.{name} must be >= 0 (0 = no limit; got {getattr(self, name)})")
        if self.split not in ("train", "val"):
            raise ValueError("rollout.split must be train or val")


def make_gate(rollout: RolloutConfig):
    """The recipe's speculation gate, its tool-time prior the emulated latency's median."""
    from obsspec.rollout.gate import Gate

    return Gate(enabled=rollout.gate, cost_share=rollout.gate_cost_share,
                prior_tool_s=rollout.latency.median_s + 0.05)


def sampling(policy: PolicyConfig, seed: int):
    """The scheduler's sampling settings from the recipe's policy section: one place for the
    temperature, budgets and turn limit of rollouts, evaluation and training alike."""
    from obsspec.rollout.scheduler import Sampling

    return Sampling(max_turns=policy.max_turns, max_new_tokens=policy.max_new_tokens,
                    max_context=policy.max_context, temperature=policy.temperature,
                    top_p=policy.top_p, seed=seed)
