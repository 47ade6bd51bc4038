"""The model-driven policy: one episode's conversation kept as token ids, turned into engine requests.

A model episode is a small state machine around one `BudgetedSQLEnv`, driven from outside so that the caller can
batch the requests of many concurrent episodes into one engine call (continuous batching across episodes)::

    agent = ModelAgent(env, template, config, episode_key=spec.episode_id, seed=spec.sample_seed)
    agent.reset(task, budget)                        # renders the first prompt ONCE with the model's chat template
    while not agent.done:
        req = agent.request()                        # GenerationRequest: prompt ids + SamplingParams
        gen = engine.generate([req.prompt_ids], [req.params])[0]
        agent.advance(gen)                           # completion ids appended as sampled → env.step → observation

`run_agents` plays many agents this way with the engine's continuous batching (`Engine.step`): an agent's next
request joins the running batch as soon as its observation is ready.

Token-in/token-out (`bapsql.policies.chat.TokenTrajectory`): the prompt of turn k+1 is the prompt of turn k + the
sampled completion ids (loss mask 1, sampling logprobs kept) + the template's text for the new observation only
(mask 0); past turns are never re-templated. When the env reports ``context_rewritten`` (evidence management
changed earlier messages) a new segment starts from a fresh rendering of the conversation as the env now shows it.

The env is told the completion *text* (the sampled ids decoded, the chat template's end-of-turn tokens dropped:
`bapsql.models.framing.ChatFraming.end_of_turn_ids`); it counts and parses that text with the policy's tokenizer and
charges the context with the same template's framing (the agent refuses an env whose counter charges another one).
``max_tokens`` of every request is capped by the env's headroom (``info["max_completion_tokens"]``), so a completion
never overflows the context budget by construction. Sampling seeds are fixed per (episode seed, turn): a rerun of an
episode samples the same completions whatever batch it lands in.

"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bapsql.errors import ConfigError, EnvStateError

if TYPE_CHECKING:  # pragma: no cover
    from bapsql.budgets import Budget
    from bapsql.models.chat_template import ChatTemplate
    from bapsql.models.framing import ChatFraming
    from bapsql.rollout.engines.base import Generation, SamplingParams
    from bapsql.rollout.groups import SegmentTokens
    from bapsql.types import Task

@dataclass(frozen=True)
class AgentConfig:
    """How a model policy samples. ``model_dir``: the model folder (its tokenizer.json and chat template render
    prompts and count the env's tokens); ``template_kwargs`` go to every rendering of the chat template.
    ``max_tokens`` caps each completion; the env's context headroom and, when set, the engine's ``max_model_len``
    (prompt + completion) cap it further."""

    model_dir: str
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    max_model_len: int | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # chat-template options, e.g. enable_thinking

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError(f"sampling.max_tokens: must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"sampling.temperature: must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"sampling.top_p: must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class GenerationRequest:
    """What one waiting episode asks the engine for."""

    episode_id: str
    prompt_ids: tuple[int, ...]
    params: "SamplingParams"


def window_budget(budget: "Budget", max_model_len: int | None) -> "Budget":
    """``budget`` with its live-context channel capped at what a model window of ``max_model_len`` tokens holds
    (less `bapsql.experiment.MODEL_LEN_MARGIN`, the template tokens the env's accounting may miss); unchanged when
    the window holds the budget's context or is unknown. The level keeps its name: a model whose window is below a
    level's context (SmolLM2's 8,192 positions at L's 11,000) plays that level with the context it can hold, and the
    dashboard shows that figure, never room the model does not have."""
    import dataclasses

    from bapsql.experiment import MODEL_LEN_MARGIN

    if max_model_len is None or budget.context_tokens + MODEL_LEN_MARGIN <= max_model_len:
        return budget
    return dataclasses.replace(budget, context_tokens=max(0, max_model_len - MODEL_LEN_MARGIN))


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of turn ``turn`` of an episode whose own seed is ``seed`` (31-bit)."""
    return (int(seed) * 1_000_003 + int(turn) * 7_919 + 1) & 0x7FFFFFFF


def completion_text(template: "ChatTemplate", completion_ids: tuple[int, ...] | list[int],
                    framing: "ChatFraming | None" = None) -> str:
    """The text the env is given: the sampled ids decoded, trailing end-of-turn tokens dropped (the ids of
    ``framing``, by default ``template.framing()``: the template's turn-closing token and the model's eos ids)."""
    ends = set((framing if framing is not None else template.framing()).end_of_turn_ids)
    ids = list(completion_ids)
    while ids and ids[-1] in ends:
        ids.pop()
    return template.decode(ids)


class ModelAgent:
    """One model-driven episode in one env (see the module docstring). Not thread-safe; one per episode."""

    def __init__(self, env: Any, template: "ChatTemplate", config: AgentConfig, *, episode_key: str, seed: int):
        self.env = env
        self.template = template
        self.config = config
        self.episode_key = episode_key
        self.seed = int(seed)
        self.framing = template.framing(**config.template_kwargs)  # ChatTemplateError now if it cannot frame
        charged = getattr(env, "framing", None)
        if charged is not None and hasattr(charged, "charges_like") and not charged.charges_like(self.framing):
            raise ConfigError(
                f"the env charges the context with the framing of {charged.template} ({charged.describe()}) but the "
                f"agent renders prompts with {template.name} under {config.template_kwargs} "
                f"({self.framing.describe()}); count with the model folder's tokenizer and the same template options: "
                "load_token_counter(model_dir, **template_kwargs)")
        self.trajectory = None
        self.info: dict = {}
        self.completions: list[str] = []
        self.generated_tokens = 0

    @property
    def done(self) -> bool:
        return bool(self.env.done)

    def reset(self, task: "Task", budget: "Budget") -> None:
        """Start the episode and render its first prompt (system + user messages) once. The live context is capped
        at the model's window: with ``max_model_len`` below the budget's context (+ `MODEL_LEN_MARGIN`), the env
        plays the budget with ``context_tokens`` = ``max_model_len - MODEL_LEN_MARGIN`` (`window_budget`)."""
        from bapsql.policies.chat import TokenTrajectory

        _obs, self.info = self.env.reset(task, window_budget(budget, self.config.max_model_len), seed=self.seed)
        self.trajectory = TokenTrajectory(self.template, self.env.messages, **self.config.template_kwargs)

    def request(self) -> GenerationRequest:
        """The next generation request: the current token sequence and this turn's sampling params."""
        from bapsql.rollout.engines.base import SamplingParams

        if self.trajectory is None or self.done:
            raise EnvStateError("request() needs a started, unfinished episode")
        headroom = int(self.info.get("max_completion_tokens", self.config.max_tokens))
        cap = min(self.config.max_tokens, headroom)
        prompt = tuple(self.trajectory.prompt_ids)
        if self.config.max_model_len is not None:
            cap = min(cap, self.config.max_model_len - len(prompt))
        params = SamplingParams(max_tokens=max(1, cap), temperature=self.config.temperature, top_p=self.config.top_p,
                                seed=turn_seed(self.seed, len(self.completions)), logprobs=True)
        return GenerationRequest(self.episode_key, prompt, params)

    def advance(self, generation: "Generation") -> str:
        """Feed the sampled completion: append its ids, step the env with its text, append the observation.
        Returns the completion text."""
        if self.trajectory is None or self.done:
            raise EnvStateError("advance() needs a started, unfinished episode")
        ids = tuple(generation.completion_ids)
        self.trajectory.add_completion(ids, generation.logprobs)
        self.generated_tokens += len(ids)
        text = completion_text(self.template, ids, self.framing)
        self.completions.append(text)
        n_before = len(self.env.messages)
        step = self.env.step(text)
        self.info = step.info
        if not self.env.done:
            messages = self.env.messages
            rewritten = bool(step.info.get("context_rewritten"))
            self.trajectory.add_observation(messages[n_before + 1:], context_rewritten=rewritten,
                                            conversation=messages if rewritten else None)
        return text

    def segments(self) -> tuple["SegmentTokens", ...]:
        """The episode's token sequences, frozen for training."""
        from bapsql.rollout.groups import SegmentTokens

        if self.trajectory is None:
            return ()
        out = []
        for seg in self.trajectory.segments:
            lp = seg.logprobs
            out.append(SegmentTokens(tuple(seg.input_ids), tuple(seg.loss_mask),
                                     None if lp is None else tuple(lp)))
        return tuple(out)


def load_template(model_dir: str | Path) -> "ChatTemplate":
    """The chat template + tokenizer of a model folder (`ChatTemplate.from_dir`)."""
    from bapsql.models.chat_template import ChatTemplate

    return ChatTemplate.from_dir(model_dir)


def run_agents(agents: list[ModelAgent], engine: Any, *, adapter: Any = None) -> int:
    """Play started agents to the end in this process with continuous batching: every agent's request goes to
    ``engine.step`` as soon as it is ready, and each agent whose completion comes back advances (env step, next
    request) while the others keep decoding. Agents need distinct ``episode_key`` s. Returns the generated tokens."""
    live = {a.episode_key: a for a in agents if not a.done}
    if len(live) != len([a for a in agents if not a.done]):
        raise ConfigError("run_agents: agents need distinct episode keys")
    new = [(r.episode_id, r.prompt_ids, r.params) for r in (a.request() for a in live.values())]
    generated = 0
    while live:
        finished = engine.step(new, adapter=adapter)
        if not finished and not engine.in_flight():
            raise EnvStateError(f"run_agents: the engine holds none of the {len(live)} unfinished episodes' requests")
        new = []
        for key, gen in finished:
            agent = live[key]
            agent.advance(gen)
            generated += len(gen.completion_ids)
            if agent.done:
                del live[key]
            else:
                r = agent.request()
                new.append((r.episode_id, r.prompt_ids, r.params))
    return generated
