"""M6 (vectorized-training review, "Lines 947-956"): "The conditional control flow with
dict access and method calls can cause graph breaks under torch.compile". Counted with
`torch._dynamo.explain`: on the quoted setup loop, as written and under the review's
`torch.compiler.disable`, and on our trainer's per-batch env step and policy forward."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import enum
import functools
import logging
import uuid
import warnings
from typing import Callable, Iterator

import torch
from torch import nn

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES, OP_INDEX
from esper.agent.policy import FactoredRecurrentActorCritic
from esper.env.config import EnvConfig
from esper.env.environment import OBS_DIM, MorphoEnv
from harness.findings import About, Case, Finding, Reading, Recording, register
from esper_review.findings.trainer_size import nearest_trainer_size

VARIANTS = ("setup_inline", "setup_disabled", "env_step", "policy_act")
#: the host stand-in's width, and the slots the quoted loop walks (2df957ed's 3 slots)
WIDTH, SLOTS = 16, ("r0c0", "r0c1", "r0c2")


# --- the reviewed code: 2df957ed src/esper/simic/training/vectorized.py:943-956, the
# --- slot's advance_stage as kasmina/slot.py:947-1035 writes it, with the gate check, the
# --- stage transition and the telemetry callback it calls (abridged to what G1 runs)

class SeedStage(enum.IntEnum):
    """The stages the quoted lines compare (leyline's SeedStage, abridged)."""

    DORMANT = 1
    GERMINATED = 2
    TRAINING = 3
    FOSSILIZED = 7


#: leyline's VALID_TRANSITIONS, abridged to the stages above
VALID_TRANSITIONS = {SeedStage.DORMANT: (SeedStage.GERMINATED,),
                     SeedStage.GERMINATED: (SeedStage.TRAINING,),
                     SeedStage.TRAINING: ()}


class GateLevel(enum.IntEnum):
    """leyline/schemas.py:46-53 @2df957ed."""

    G0 = 0
    G1 = 1


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@dataclasses.dataclass
class GateResult:
    """leyline/schemas.py:57-68 @2df957ed."""

    gate: GateLevel
    passed: bool
    score: float = 0.0
    checks_passed: list[str] = dataclasses.field(default_factory=list)
    checks_failed: list[str] = dataclasses.field(default_factory=list)
    message: str = ""
    timestamp: datetime.datetime = dataclasses.field(default_factory=_utc_now)


@dataclasses.dataclass
class SeedMetrics:
    """kasmina/slot.py:99-... @2df957ed: the fields advance_stage reads."""

    epochs_total: int = 0
    epochs_in_current_stage: int = 0
    current_val_accuracy: float = 0.0
    accuracy_at_stage_start: float = 0.0
    counterfactual_contribution: float | None = None
    total_improvement: float = 0.0
    blending_delta: float = 0.0

    def reset_stage_baseline(self) -> None:
        self.epochs_in_current_stage = 0
        self.accuracy_at_stage_start = self.current_val_accuracy


@dataclasses.dataclass
class SeedTelemetry:
    epoch: int = 0


@dataclasses.dataclass
class SeedState:
    """kasmina/slot.py:248-331 @2df957ed: what advance_stage and transition touch."""

    seed_id: str
    blueprint_id: str
    stage: SeedStage = SeedStage.DORMANT
    previous_stage: SeedStage = SeedStage.DORMANT
    previous_epochs_in_stage: int = 0
    stage_entered_at: datetime.datetime = dataclasses.field(default_factory=_utc_now)
    alpha: float = 0.0
    metrics: SeedMetrics = dataclasses.field(default_factory=SeedMetrics)
    stage_history: collections.deque = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=5))
    telemetry: SeedTelemetry = dataclasses.field(default_factory=SeedTelemetry)

    def transition(self, new_stage: SeedStage) -> bool:
        """slot.py:320-331: `can_transition_to`, then the stage change and its history."""
        if new_stage not in VALID_TRANSITIONS.get(self.stage, ()):
            return False
        self.previous_stage = self.stage
        self.previous_epochs_in_stage = self.metrics.epochs_in_current_stage
        self.stage = new_stage
        self.stage_entered_at = datetime.datetime.now(datetime.timezone.utc)
        self.stage_history.append((new_stage, self.stage_entered_at))
        self.metrics.reset_stage_baseline()
        return True


class QualityGates:
    """slot.py:419-516: `check_gate` by a match on the gate level; G1 as written."""

    def check_gate(self, state: SeedState, target_stage: SeedStage) -> GateResult:
        match self._get_gate_level(target_stage):
            case GateLevel.G1:
                return self._check_g1(state)
            case gate:
                return GateResult(gate=gate, passed=True, score=1.0)

    def _get_gate_level(self, target_stage: SeedStage) -> GateLevel:
        mapping = {SeedStage.GERMINATED: GateLevel.G0, SeedStage.TRAINING: GateLevel.G1}
        return mapping.get(target_stage, GateLevel.G0)

    def _check_g1(self, state: SeedState) -> GateResult:
        passed = state.stage == SeedStage.GERMINATED
        return GateResult(gate=GateLevel.G1, passed=passed, score=1.0 if passed else 0.0,
                          checks_passed=["germinated"] if passed else [],
                          checks_failed=[] if passed else ["not_germinated"],
                          message="Ready for training" if passed else "Not germinated")


@dataclasses.dataclass
class TelemetryEvent:
    """leyline/telemetry.py:88-104 @2df957ed."""

    event_id: str = dataclasses.field(default_factory=lambda: str(uuid.uuid4()))
    event_type: str = "EPOCH_COMPLETED"
    timestamp: datetime.datetime = dataclasses.field(default_factory=_utc_now)
    seed_id: str | None = None
    slot_id: str | None = None
    epoch: int | None = None
    message: str = ""
    data: dict = dataclasses.field(default_factory=dict)
    severity: str = "info"


def make_telemetry_callback(hub: list, env_idx: int, env_device: str):
    """vectorized.py:792-798 with emit_with_env_context (telemetry/emitters.py:25-34):
    a new event with the env's id and device added, emitted to the hub (a list here)."""

    def callback(event: TelemetryEvent) -> None:
        data = dict(event.data) if event.data else {}
        data["env_id"] = env_idx
        data["device"] = env_device
        hub.append(dataclasses.replace(event, data=data))

    return callback


class SeedSlot(nn.Module):
    """A slot: its seed's state (None when empty), `advance_stage` as reviewed, a residual
    seed; `on_telemetry` set as create_env_state sets it (vectorized.py:829-833,
    `fast_mode = False`)."""

    def __init__(self, slot_id: str, stage: SeedStage | None, hub: list) -> None:
        super().__init__()
        self.slot_id = slot_id
        self.seed = nn.Linear(WIDTH, WIDTH)
        self.state = SeedState("seed-0", "mlp", stage=stage) if stage is not None else None
        self.gates = QualityGates()
        self.on_telemetry = make_telemetry_callback(hub, 0, "cpu")
        self.fast_mode = False
        self.telemetry_lifecycle_only = False
        self.telemetry_inner_epoch: int | None = 1
        self.telemetry_global_epoch: int | None = 1
        self.isolate_gradients = False

    @property
    def is_active(self) -> bool:
        return self.seed is not None and self.state is not None

    def advance_stage(self, target_stage: SeedStage | None = None) -> GateResult:
        """kasmina/slot.py:947-1035 @2df957ed (the target given, as the setup loop gives
        it; FOSSILIZED's event left out: the loop only advances to TRAINING)."""
        if not self.is_active:
            return GateResult(gate=GateLevel.G0, passed=False, checks_failed=["no_active_seed"])
        gate_result = self.gates.check_gate(self.state, target_stage)
        self._emit_telemetry("SEED_GATE_EVALUATED", data={
            "gate": gate_result.gate.name, "passed": gate_result.passed,
            "target_stage": target_stage.name,
            "checks_passed": list(gate_result.checks_passed),
            "checks_failed": list(gate_result.checks_failed),
            "message": gate_result.message})
        if gate_result.passed:
            old_stage = self.state.stage
            metrics = self.state.metrics
            improvement = metrics.total_improvement  # noqa: F841 (read as reviewed)
            blending_delta = metrics.blending_delta  # noqa: F841
            counterfactual = metrics.counterfactual_contribution  # noqa: F841
            epochs_total = metrics.epochs_total  # noqa: F841
            epochs_in_stage = metrics.epochs_in_current_stage  # noqa: F841
            if self.state.transition(target_stage):
                self._on_enter_stage(target_stage, old_stage)
                self._emit_telemetry("SEED_STAGE_CHANGED",
                                     data={"from": old_stage.name, "to": target_stage.name})
            else:
                gate_result = GateResult(gate=gate_result.gate, passed=False,
                                         checks_failed=["transition_failed"])
        return gate_result

    def _on_enter_stage(self, new_stage: SeedStage, old_stage: SeedStage) -> None:
        """slot.py:1285-1292: entering TRAINING from GERMINATED isolates the gradients."""
        if new_stage == SeedStage.TRAINING and old_stage == SeedStage.GERMINATED:
            self.isolate_gradients = True

    def _emit_telemetry(self, event_type: str, data: dict | None = None) -> None:
        """slot.py:1503-1540 @2df957ed."""
        if self.on_telemetry is None:
            return
        if self.fast_mode and not self.telemetry_lifecycle_only:
            return
        payload = dict(data) if data else {}
        if self.state is not None:
            payload.setdefault("alpha", self.state.alpha)
        if self.telemetry_inner_epoch is not None:
            payload.setdefault("inner_epoch", self.telemetry_inner_epoch)
        if self.telemetry_global_epoch is not None:
            payload.setdefault("global_epoch", self.telemetry_global_epoch)
        if (self.state is not None and self.state.telemetry is not None
                and self.state.telemetry.epoch > 0):
            payload.setdefault("gradient_norm_ratio", 0.0)
        event = TelemetryEvent(event_type=event_type,
                               seed_id=self.state.seed_id if self.state else None,
                               slot_id=self.slot_id, data=payload)
        self.on_telemetry(event)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.seed(x)


class HostModel(nn.Module):
    """The host with its `seed_slots` ModuleDict: one germinated seed, one empty slot, one
    training seed (the branch of the quoted loop runs once, for the germinated one)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(WIDTH, WIDTH)
        self.telemetry: list[TelemetryEvent] = []  # the hub the slots' callbacks emit to
        self.seed_slots = nn.ModuleDict({
            SLOTS[0]: SeedSlot(SLOTS[0], SeedStage.GERMINATED, self.telemetry),
            SLOTS[1]: SeedSlot(SLOTS[1], None, self.telemetry),
            SLOTS[2]: SeedSlot(SLOTS[2], SeedStage.TRAINING, self.telemetry)})

    def has_active_seed_in_slot(self, slot_id: str) -> bool:
        return self.seed_slots[slot_id].state is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for slot in self.seed_slots.values():
            if slot.state is not None:
                x = slot(x)
        return x


def auto_advance(model: HostModel, slots: tuple[str, ...]) -> None:
    """vectorized.py:947-956 @2df957ed, verbatim."""
    for slot_id in slots:
        if not model.has_active_seed_in_slot(slot_id):
            continue
        slot_state = model.seed_slots[slot_id].state
        if slot_state and slot_state.stage == SeedStage.GERMINATED:
            gate_result = model.seed_slots[slot_id].advance_stage(SeedStage.TRAINING)
            if not gate_result.passed:
                raise RuntimeError(
                    f"G1 gate failed during TRAINING entry for slot '{slot_id}': {gate_result}"
                )


def train_batch_inline(model: HostModel, inputs: torch.Tensor, targets: torch.Tensor,
                       slots: tuple[str, ...]) -> torch.Tensor:
    """process_train_batch from its inputs to its loss (vectorized.py:935-994 @2df957ed),
    the setup as written: what 'whole-function compilation' of it would trace. Left
    out: the stream context and record_stream (no stream on the CPU), the seed optimizers'
    creation and zero_grad (958-985), the autocast (off by default), the correct-count."""
    inputs = inputs.to(inputs.device, non_blocking=True)  # 935-936: to the env's device
    targets = targets.to(targets.device, non_blocking=True)
    model.train()  # 943
    auto_advance(model, slots)  # 947-956
    outputs = model(inputs)  # 993
    return nn.functional.cross_entropy(outputs, targets)  # 994, the loss of loss_and_correct


@functools.cache
def auto_advance_disabled() -> Callable:
    """The review's fix: "marking this setup section with torch.compiler.disable" (made on
    first use: torch.compiler.disable imports torch's compiler, 2 s that every process
    loading the review would pay)."""
    return torch.compiler.disable(auto_advance)


def train_batch_disabled(model: HostModel, inputs: torch.Tensor, targets: torch.Tensor,
                         slots: tuple[str, ...]) -> torch.Tensor:
    """`train_batch_inline` with the setup loop under torch.compiler.disable."""
    inputs = inputs.to(inputs.device, non_blocking=True)
    targets = targets.to(targets.device, non_blocking=True)
    model.train()
    auto_advance_disabled()(model, slots)
    outputs = model(inputs)
    return nn.functional.cross_entropy(outputs, targets)


# --- ours ---------------------------------------------------------------------------

ENV = EnvConfig(num_envs=1, train_batches=1)


def germinated_env() -> MorphoEnv:
    """One env of the trainer's default config (one training batch per epoch), with a
    germinated seed (the host forward then walks a live slot, as the quoted loop's does)."""
    env = MorphoEnv(ENV, 0)
    action = {h: 0 for h in HEAD_NAMES}
    action.update(op=OP_INDEX["GERMINATE"], blueprint=2)
    env.apply_action(action)
    return env


def policy_inputs(num_envs: int) -> tuple:
    """The trainer's per-step policy call: the policy, observations [n, D], masks, hidden."""
    policy = FactoredRecurrentActorCritic(OBS_DIM)
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(num_envs, policy.state_dim, generator=g)
    masks = {h: torch.ones(num_envs, k, dtype=torch.bool) for h, k in HEAD_SIZES.items()}
    return policy, obs, masks, policy.initial_hidden(num_envs)


def _call(variant: str, num_envs: int) -> Callable[[], object]:
    """A fresh instance of the variant's code, as a zero-argument call."""
    if variant in ("setup_inline", "setup_disabled"):
        step = train_batch_inline if variant == "setup_inline" else train_batch_disabled
        g = torch.Generator().manual_seed(0)
        model = HostModel()
        inputs, targets = torch.randn(8, WIDTH, generator=g), torch.randint(0, WIDTH, (8,), generator=g)
        return lambda: step(model, inputs, targets, SLOTS)
    if variant == "env_step":
        env = germinated_env()
        return lambda: env.launch_train_batch(0)
    policy, obs, masks, hidden = policy_inputs(num_envs)
    return lambda: policy.act(obs, masks, hidden)


def _cases(quick: bool) -> list[Case]:
    return [Case.of(num_envs=4)]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """Each variant's eager call, for the timed region (the answer is counted apart)."""
    return {"num_envs": case["num_envs"],
            "calls": {v: _call(v, case["num_envs"]) for v in VARIANTS}}


def _make_call(variant: str, inputs: dict):
    return inputs["calls"][variant]


@contextlib.contextmanager
def _quiet_dynamo() -> Iterator[None]:
    """Dynamo logs (and warns) once per graph break; the counts say it."""
    loggers = [logging.getLogger(name) for name in ("torch._dynamo", "torch._logging")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def graph_breaks(call: Callable[[], object]) -> dict[str, object]:
    """`torch._dynamo.explain` of one call (it traces, with no backend compiler, and resets
    dynamo's caches before and after): graphs, graph breaks (graphs - 1) and the distinct
    first lines of the break reasons, from explain's list and from dynamo's own
    `graph_break` counter (which also holds those explain leaves out, such as a
    `backward()` call)."""
    from torch._dynamo.utils import counters as dynamo_counters  # torch's compiler: 2 s

    before = set(dynamo_counters["graph_break"])
    with _quiet_dynamo():
        explained = torch._dynamo.explain(call)()
    found = [str(r.reason) for r in explained.break_reasons]
    found += [reason for reason in dynamo_counters["graph_break"] if reason not in before]
    reasons = dict.fromkeys(reason.strip().splitlines()[0] for reason in found)
    return {"graphs": float(explained.graph_count), "breaks": float(explained.graph_break_count),
            "reasons": " | ".join(reasons)}


def _counts(variant: str, inputs: dict) -> dict[str, object]:
    counted = graph_breaks(_call(variant, inputs["num_envs"]))
    breaks = counted["breaks"]
    return {"graph_breaks": breaks, "graph_breaks_low": breaks, "graph_breaks_high": breaks,
            "graphs": counted["graphs"], "break_reasons": counted["reasons"]}


def _skip(variant: str, case: Case, device: torch.device) -> str | None:
    if not torch._dynamo.is_dynamo_supported():
        return "needs torch._dynamo (torch.compile's tracer), which this Python does not run"
    return None


register(Finding(
    id="M6-graph-breaks",
    title="Graph breaks under torch.compile: the reviewed per-batch setup, and ours",
    claim="The conditional control flow with dict access and method calls can cause graph "
          "breaks under torch.compile",
    variants=VARIANTS,
    baseline="setup_inline",
    proposed="setup_disabled",
    cases=_cases,
    build=_build,
    make_call=_make_call,
    skip=_skip,
    long=True,
    ours=("env_step", "policy_act"),
    about=About(
        ticket="vectorized-training-review.md",
        duration_s=(15.0, 15.0),
        reviewed="src/esper/simic/training/vectorized.py:947-956 @2df957ed (the auto-advance "
                 "loop of process_train_batch, before the host forward at 993)",
        fix="'Consider marking this setup section with torch.compiler.disable or ensuring the "
            "compiled boundary is at the model.forward call' (`setup_disabled`: the loop under "
            "torch.compiler.disable)",
        premise="'The process_train_batch function runs model.forward which IS compiled' does "
                "not hold at 2df957ed: the host model is never compiled. The only "
                "torch.compile calls in src/ are the policy network's (simic/agent/ppo.py:300) "
                "and training/helpers.py:85 (`_train_step_impl`, reached only through "
                "`_train_one_epoch`, helpers.py:123-177, which nothing calls); vectorized.py "
                "imports nothing from helpers and calls `model(inputs)` eagerly (993). "
                "(`git grep -n 'torch.compile(' 2df957ed -- src`.) The graph breaks the "
                "review fears would only arise if someone compiled process_train_batch.",
        notes=(
            "The answer is graph_breaks (graphs - 1, exact, so its interval is the value) "
            "from torch._dynamo.explain of one call per variant, with the distinct reasons in "
            "break_reasons; graphs is the graph count. The time rows are each variant's eager "
            "call and compare nothing across variants (the env step trains a host, the policy "
            "forward samples 8 heads): they are not the answer.",
            "setup_inline / setup_disabled: process_train_batch's setup and forward (2df957ed "
            "vectorized.py:943-993, the loop at 947-956 verbatim) on a host whose slots "
            "advance as kasmina/slot.py:947-1035 writes it: the G1 gate check "
            "(QualityGates.check_gate, a match on the gate level), the stage transition (a "
            "timestamp, the history), the stage-entry hook and two telemetry events built "
            "as _emit_telemetry builds them (a uuid4 id, a timestamp) and handed to the "
            "env's callback (emit_with_env_context, a hub that keeps them), with one "
            "germinated seed so the branch runs. Left out: the host is an MLP stand-in, "
            "and the leyline types are abridged to the fields these lines touch.",
            "env_step (ours): MorphoEnv.launch_train_batch, the trainer's per-batch env step "
            "and process_train_batch's counterpart (forward over the seed slots, backward, the "
            "host and seed SGD steps), a germinated seed in one slot. policy_act (ours): the "
            "trainer's per-step "
            "policy.act for 4 envs (LSTM, 8 masked heads, mask checks).",
            "explain resets dynamo's caches before and after: a compiled GAE method run later "
            "in the same process compiles again. It takes seconds: a long finding, run only "
            "when named (--findings M6-graph-breaks) or with --all.",
        ),
    ),
    recording=Recording(
        extra_metrics=_counts,
    ),
    reading=Reading(
        headline_case=nearest_trainer_size,
        answer=("graph_breaks",),
    ),
))
