"""The findings of the vectorized-training review and the buffer audit (H1, H2, H3, H4, H5,
C1, C3, L1, L2, AUDIT-1.3, TL-bootstrap): the esper axes they switch, their correctness
checks (each with a planted mismatch caught), and a quick run of each through
`harness.run`."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from esper.agent.heads import HEAD_NAMES, OP_INDEX
from esper.env.accumulators import EpochAccumulators
from esper.env.config import EnvConfig
from esper.env.environment import MorphoEnv
from esper.env.optimizers import amp_dtype
from esper.env.pool import EnvBatches
from esper.env.stream_guard import GUARDS
from esper.rollout.transfer import FlatTransfer, move_per_tensor
from esper.variants import AXES, Variants
from esper_review.findings.gae_methods import gae_min_bytes
from harness import findings as registry
from harness.findings import Case
from harness.measure.stats import wilson_interval
from harness.results import load_run
from harness.run import main
from harness.runner import CaseRun, RunOptions

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
NEW_AXES = ("env_pool", "bootstrap", "masks", "transfer", "scaler", "seed_clip",
            "stream_guard", "accumulators", "validation")
SMALL = EnvConfig(num_envs=2, train_batches=2, batch_size=32, val_size=64, seed=3)


def finding(finding_id: str):
    return registry.select([finding_id])[0]


def check_cell(finding_obj, case: Case, **replace) -> dict[str, dict]:
    """The rows of one cell after the correctness gate only (no timing, no profile)."""
    f = dataclasses.replace(finding_obj, **replace)
    cell = CaseRun(f, case, RunOptions(device=CPU, profile=False))
    cell.inputs = f.build(case, CPU, 0)
    cell._check(cell._first_calls())
    return {row["variant"]: row for row in cell.summary}


def germinate(env: MorphoEnv, **choices) -> None:
    action = {h: 0 for h in HEAD_NAMES}
    action.update(op=OP_INDEX["GERMINATE"], blueprint=2, **choices)
    env.apply_action(action)


# ----- the variants --------------------------------------------------------------------

def test_new_axes_keep_the_original_first_and_the_presets_say_which():
    original = Variants.original()
    for axis in NEW_AXES:
        assert axis in AXES and getattr(original, axis) == AXES[axis][0]
        assert getattr(Variants(), axis) == AXES[axis][0]
    with pytest.raises(ValueError, match="Variants.masks: expected one of stack, preallocated, packed"):
        Variants(masks="stacked")


# ----- H1: env pooling -----------------------------------------------------------------

def test_a_pooled_env_resets_to_exactly_the_state_of_a_new_one():
    used = MorphoEnv(SMALL, 1)
    germinate(used)
    used.observe(used.launch_epoch())
    used.reset()
    fresh = MorphoEnv(SMALL, 1)
    for (name, a), b in zip(used.host_network.named_parameters(), fresh.host_network.parameters()):
        assert torch.equal(a, b), name
    assert torch.equal(used.observation(), fresh.observation())
    assert [s.stage for s in used.slots] == [s.stage for s in fresh.slots]
    # the same seed generator state: the next seed is drawn identically
    germinate(used), germinate(fresh)
    for a, b in zip(used.slots[0].module.parameters(), fresh.slots[0].module.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(used.launch_epoch(), fresh.launch_epoch())


def test_env_batches_recreate_new_envs_and_pool_the_same_ones():
    batches = {mode: EnvBatches(SMALL, CPU, Variants(env_pool=mode)) for mode in AXES["env_pool"]}
    first = {mode: b.next_batch()[0] for mode, b in batches.items()}
    for mode in ("pool", "checkpoint"):  # a used env: its weights must come back
        germinate(first[mode].envs[0])
        first[mode].envs[0].observe(first[mode].envs[0].launch_epoch())
    second = {mode: b.next_batch() for mode, b in batches.items()}
    assert second["pool"][0] is first["pool"] and second["checkpoint"][0] is first["checkpoint"]
    assert second["recreate"][0] is not first["recreate"]
    # recreated envs share the data drawn once
    assert second["recreate"][0].envs[0].task[0] is first["recreate"].envs[0].task[0]
    assert torch.equal(second["pool"][1], second["recreate"][1])
    assert torch.equal(second["checkpoint"][1], second["recreate"][1])
    fresh = second["recreate"][0].envs[0].host_network.parameters()
    for mode in ("pool", "checkpoint"):  # trained weights back to the new env's
        kept = second[mode][0].envs[0].host_network.parameters()
        assert all(torch.equal(a, b) for a, b in zip(kept, fresh)), mode
        fresh = second["recreate"][0].envs[0].host_network.parameters()


def test_h1_check_compares_trajectories_and_catches_a_planted_difference():
    f = finding("H1-env-pooling")
    assert f.proposed == "checkpoint" and f.ours == ("pool",)
    case = Case.of(num_envs=2, measure="boundary")
    rows = check_cell(f, case)
    for variant in ("pool", "checkpoint"):
        assert rows[variant]["max_error"] == 0.0 and rows[variant]["status"] is None

    def leaky_pool(variant, inputs):
        call = f.make_call(variant, inputs)
        if variant != "pool":
            return call

        def boundary():
            envs = call()
            with torch.no_grad():  # a reset that forgets one host weight
                next(envs.envs[0].host_network.parameters()).view(-1)[0] += 1e-3
            return envs
        return boundary

    rows = check_cell(f, case, make_call=leaky_pool)
    assert rows["pool"]["status"] == "mismatch" and rows["pool"]["max_error"] > 0


# ----- H4, H5: the original paths, the review's fixes and ours ---------------------------
# (each variant against a transcription of the original's and the review's lines:
# tests/esper/env/test_bootstrap_states.py and tests/esper/env/test_mask_batch.py)

@pytest.mark.parametrize(("finding_id", "key"), [("H4-bootstrap-tensor", "features"),
                                                 ("H5-mask-stacking", "envs")])
def test_h4_h5_checks_catch_envs_in_the_wrong_order(finding_id, key):
    f = finding(finding_id)
    case = Case.of(num_envs=4)
    others = [v for v in f.variants if v != f.baseline]
    rows = check_cell(f, case)
    assert [rows[v]["status"] for v in others] == [None, None]
    assert rows[f.variants[1]]["max_error"] == 0.0  # the review's fix: exactly the original

    def reversed_envs(variant, inputs):
        if variant == f.baseline:
            return f.make_call(variant, inputs)
        return f.make_call(variant, {**inputs, key: inputs[key][::-1]})

    rows = check_cell(f, case, make_call=reversed_envs)
    for variant in others:
        assert rows[variant]["status"] == "mismatch" and rows[variant]["max_error"] > 0, variant


def test_h4_h5_declare_the_review_s_fix_and_ours():
    for finding_id in ("H4-bootstrap-tensor", "H5-mask-stacking"):
        f = finding(finding_id)
        assert f.proposed == f.variants[1] and f.ours == ("packed",)
        assert "@2df957ed" in f.about.reviewed and f.about.fix
    assert "8 transfers" not in " ".join(finding("H5-mask-stacking").about.notes)
    assert ".to(device)" in finding("H5-mask-stacking").about.premise  # moves nothing there


# ----- H3: the epoch boundary ------------------------------------------------------------

def test_h3_window_of_a_synthetic_trace():
    """Two steps (ns) on streams 1 and 2, the default stream 7. Step 1 (`stream`): training
    ends at 100 (stream 1) and 90 (stream 2); the host reads until 150, then validates
    on the env streams from 160 and 170: gaps 60 overall, (60 + 80) / 2 per stream, none
    before the read. Step 2 (`event`-like): training ends at 1100 and 1080, validation on
    the default stream from 1105 while the read ends at 2000: gaps 5, (5 + 25) / 2, and
    all 40 + 20 ns of validation before the read."""
    from esper_review.findings.stream_sync import Kernel, Span, boundary_windows

    ranges = [Span("env_train", 0, 50), Span("env_train_read", 90, 150),
              Span("env_val", 150, 155), Span("env_train", 1000, 1050),
              Span("env_val", 1050, 1060), Span("env_train_read", 1060, 2000)]
    kernels = [Kernel(10, 60, 5, 1), Kernel(60, 100, 40, 1), Kernel(20, 90, 30, 2),
               Kernel(160, 200, 152, 1), Kernel(170, 220, 154, 2),  # step 1 validation
               Kernel(1010, 1100, 1020, 1), Kernel(1010, 1080, 1021, 2),
               Kernel(1105, 1145, 1055, 7), Kernel(1145, 1165, 1056, 7),  # step 2 validation
               Kernel(120, 125, 100, 7)]  # a read's copy: in no range, not counted
    windows = boundary_windows(ranges, kernels, "env_train_read")
    assert windows == [
        pytest.approx({"train_val_gap_s": 60e-9, "stream_train_val_gap_s": 70e-9,
                       "val_before_train_read_s": 0.0}),
        pytest.approx({"train_val_gap_s": 5e-9, "stream_train_val_gap_s": 15e-9,
                       "val_before_train_read_s": 60e-9}),
    ]
    assert boundary_windows(ranges[:3], kernels[:3], "env_train_read") == []  # no val kernels


def test_h3_reads_its_ranges_from_a_profile():
    """On the CPU the profile has the host ranges and no device work: the window is empty,
    and the row carries no window fields rather than zeros (the finding needs CUDA)."""
    from torch.profiler import record_function

    from harness.measure.counters import profiling
    from esper_review.findings.stream_sync import _trace_spans, boundary_windows

    with profiling(CPU) as prof:
        for name in ("env_train", "env_train_read", "env_val", "env_val_read"):
            with record_function(name):
                torch.ones(3).sum()
    ranges, kernels = _trace_spans(prof)
    assert [r.name for r in sorted(ranges, key=lambda r: r.start_ns)] == [
        "env_train", "env_train_read", "env_val"]
    assert all(r.start_ns <= r.end_ns for r in ranges) and kernels == []
    assert boundary_windows(ranges, kernels, "env_train_read") == []


def test_h3_check_compares_both_epoch_boundaries_on_stand_in_streams(monkeypatch):
    """Both variants' env steps on stand-in streams (the stream-race checker's, no GPU
    here) give the same metrics, and the trainer's own CPU step agrees."""
    from esper.training.trainer import TrainConfig, VectorizedTrainer
    from tests.esper.training.test_stream_races import HostReads, StreamRaceChecker

    checker = StreamRaceChecker()
    checker.install(monkeypatch)
    config = dict(num_envs=2, seed=0, env=SMALL, hidden_dim=16)
    metrics = {}
    for sync in ("stream", "event", "cpu"):
        trainer = VectorizedTrainer(TrainConfig(variants=Variants(sync="stream" if sync == "cpu"
                                                                  else sync), **config))
        if sync != "cpu":
            trainer.streams = [checker.new_stream() for _ in range(2)]
        with HostReads(checker), checker:
            metrics[sync] = [trainer.env_phase() for _ in range(2)]
    assert checker.summary() == []
    for sync in ("event", "cpu"):
        assert all(torch.equal(a, b) for a, b in zip(metrics[sync], metrics["stream"])), sync


# ----- L1: inference_mode vs no_grad ------------------------------------------------------

def test_l1_check_agrees_and_catches_another_validation_set():
    f = finding("L1-inference-mode")
    assert f.baseline == "inference_mode" == Variants().validation
    assert f.variants == AXES["validation"]
    case = Case.of(val_size=64)
    rows = check_cell(f, case)
    assert rows["no_grad"]["max_error"] == 0.0 and rows["no_grad"]["status"] is None

    def other_seed(variant, inputs):
        if variant == "no_grad":
            return f.make_call(variant, f.build(case, CPU, 1))
        return f.make_call(variant, inputs)

    assert check_cell(f, case, make_call=other_seed)["no_grad"]["status"] == "mismatch"


# ----- AUDIT-1.3: the flat transfer ----------------------------------------------------

def test_flat_transfer_gives_the_values_of_one_copy_per_tensor():
    """On the CPU as the target the flat path still packs, copies and splits: every value,
    dtype and shape survives (bool, int64 and float32 at unaligned sizes)."""
    tensors = {"states": torch.randn(2, 3, 5), "dones": torch.rand(2, 3) < 0.5,
               "actions": torch.randint(0, 13, (2, 3)), "h": torch.randn(1, 2, 7)}
    moved = FlatTransfer(CPU)(tensors)
    again = FlatTransfer(CPU)(tensors)
    assert list(moved) == list(tensors)
    for name, tensor in tensors.items():
        assert moved[name].dtype == tensor.dtype and torch.equal(moved[name], tensor), name
    assert move_per_tensor(tensors, CPU)["states"] is tensors["states"]
    assert again["states"].data_ptr() != moved["states"].data_ptr()  # results stay valid


def test_audit_1_3_copies_one_tensor_per_field_or_one_flat_buffer():
    """Counted, not timed: to another device (`meta`, which holds no values, so only the
    copies are counted) the reviewed read copies each of its 33 fields, the flat one
    buffer; the finding itself times them on CUDA only (`needs CUDA` here)."""
    from harness.measure.counters import host_to_device_copies

    f = finding("AUDIT-1.3-batched-transfer")
    case = Case.of(num_envs=2, max_steps=3)
    assert f.skip("flat", case, CPU) == "needs CUDA"
    buffers = f.build(case, CPU, 0)["buffers"]
    meta = torch.device("meta")
    copies = {v: host_to_device_copies(lambda b=b: b.get_batched_sequences(meta), meta)
              for v, b in buffers.items()}
    assert copies == {"per_tensor": 33, "flat": 1}


def test_audit_check_catches_a_tensor_of_the_wrong_shape():
    f = finding("AUDIT-1.3-batched-transfer")
    case = Case.of(num_envs=2, max_steps=3)
    assert check_cell(f, case)["flat"]["max_error"] == 0.0

    def wrong(variant, inputs):
        call = f.make_call(variant, inputs)
        if variant == "per_tensor":
            return call
        return lambda: {**call(), "values": torch.empty(3, 2, device="meta")}

    row = check_cell(f, case, make_call=wrong)["flat"]
    assert row["status"] == "mismatch"


# ----- C1: the GradScaler arrangement --------------------------------------------------

#: a small env at 30x the original's seed lr: in 10 epochs some episodes overflow
OVERFLOWING = EnvConfig(num_envs=1, max_steps=10, train_batches=2, batch_size=32, val_size=64,
                        seed_lr=0.3)


def live_seed_steps(config: EnvConfig, env_seed: int) -> int:
    """Seed optimizer steps of `play_episode`'s episode, counted from the slots: each
    live seed steps once per training batch."""
    from esper_review.findings.random_play import random_masked_action

    env = MorphoEnv(dataclasses.replace(config, num_envs=1, seed=env_seed))
    gen = torch.Generator().manual_seed(env_seed)
    steps = 0
    for _ in range(config.max_steps):
        env.apply_action(random_masked_action(env, gen))
        steps += config.train_batches * sum(slot.module is not None for slot in env.slots)
        env.observe(env.launch_epoch())
    return steps


def test_overflow_counts_of_real_episodes_agree_with_the_steps_and_the_scales_history():
    """Nothing injected: what the scalers found in episodes of a real env. No growth
    happens within an episode (2000 clean steps), so the host's scale is 2**16 halved
    once per batch in which its scaler found an overflow."""
    from esper_review.findings.grad_scaler import overflow_episode

    overflowed = 0
    for env_seed in (1001, 1002, 1007):
        expected_seed_steps = live_seed_steps(OVERFLOWING, env_seed)
        for arrangement in ("shared", "per_optimizer"):
            e = overflow_episode(OVERFLOWING, env_seed, arrangement, CPU)
            assert e["host_steps"] == OVERFLOWING.max_steps * OVERFLOWING.train_batches
            assert e["seed_steps"] == expected_seed_steps
            assert 0 <= e["host_overflows"] <= e["host_steps"]
            assert 0 <= e["seed_overflows"] <= e["seed_steps"]
            halvings = e["host_overflows"] + (e["seed_only_overflows"] if arrangement == "shared"
                                              else 0)
            assert e["final_scale_log2"] == 16 - halvings
            overflowed += e["host_overflows"] > 0
    assert overflowed >= 2  # the case is real: these episodes do overflow


def test_c1_answer_is_over_episodes_with_t_intervals_and_paired_differences():
    from harness.measure.stats import t_mean_ci
    from esper_review.findings import grad_scaler

    case = Case.of(amp="cpu", seed_lr=0.3, episodes=4)
    inputs = grad_scaler._build(case, CPU, 0)
    inputs["config"] = dataclasses.replace(OVERFLOWING, seed=0)
    inputs["case"] = case
    shared = grad_scaler._stability("shared", inputs)
    separate = grad_scaler._stability("per_optimizer", inputs)
    episodes = inputs["episodes"]
    assert shared["episodes"] == 4 and len(episodes["shared"]) == 4
    rates = [e["host_overflows"] / e["host_steps"] for e in episodes["shared"]]
    mean, low, high = t_mean_ci(rates)  # one value per episode: the unit is the episode
    assert shared["host_overflow_rate"] == mean
    assert (shared["host_overflow_rate_low"], shared["host_overflow_rate_high"]) == (
        max(low, 0.0), min(high, 1.0))
    diffs = [e["final_scale_log2"] - b["final_scale_log2"]
             for e, b in zip(episodes["per_optimizer"], episodes["shared"])]
    assert separate["final_scale_log2_diff"] == pytest.approx(sum(diffs) / 4)
    hits = sum(e["seed_overflows"] > 0 for e in episodes["shared"])
    assert shared["episodes_with_seed_overflow_rate_high"] == wilson_interval(hits, 4)[1]
    assert "final_scale_log2_diff" not in shared


def test_c1_cuda_rows_need_cuda_and_cpu_rows_are_the_stand_in():
    f = finding("C1-grad-scaler")
    for case in f.cases(False):
        assert (f.skip("shared", case, CPU) == "needs CUDA") == (case["amp"] == "cuda")
    assert {c["amp"] for c in f.cases(True)} == {"cuda", "cpu"}
    assert all(c["episodes"] >= 5 for c in f.cases(True))
    assert any("stand-in" in note for note in f.about.notes)


def test_amp_env_runs_on_the_cpu_with_the_dtype_said_and_scalers_agree_without_overflow():
    assert amp_dtype(CPU) in (torch.float16, torch.bfloat16)
    assert amp_dtype(torch.device("cuda")) == torch.float16
    config = dataclasses.replace(SMALL, num_envs=1, amp=True)
    envs = {}
    for arrangement in ("shared", "per_optimizer"):
        env = MorphoEnv(config, 0, CPU, Variants(scaler=arrangement))
        germinate(env)
        envs[arrangement] = env
    assert set(envs["shared"].scalers) == {"shared"}
    assert set(envs["per_optimizer"].scalers) == {"host", "slot0"}
    for _ in range(2):
        assert torch.equal(envs["shared"].launch_epoch(), envs["per_optimizer"].launch_epoch())


def test_c1_check_catches_a_planted_difference():
    from esper_review.findings.grad_scaler import germinated_env

    f = finding("C1-grad-scaler")
    case = Case.of(amp="cpu", seed_lr=0.01, episodes=5)

    def other_lr(variant, inputs):
        if variant == "per_optimizer":  # an env that learns at twice the rate
            config = dataclasses.replace(inputs["config"], lr=2 * inputs["config"].lr)
            inputs["envs"][variant] = germinated_env(config, variant, CPU)
        return f.make_call(variant, inputs)

    row = check_cell(f, case, make_call=other_lr)["per_optimizer"]
    assert row["status"] == "mismatch"


# ----- C3: seed gradient clipping ------------------------------------------------------

def test_clipping_changes_nothing_below_the_limit_and_caps_the_norm_above_it():
    def epoch_and_norms(clip: str, limit: float):
        env = MorphoEnv(dataclasses.replace(SMALL, num_envs=1, seed_clip_norm=limit), 0, CPU,
                        Variants(seed_clip=clip))
        germinate(env, style=3)
        env.seed_grad_norms = []
        metrics = env.launch_epoch()
        clipped = torch.nn.utils.get_total_norm(
            [p.grad for p in env.slots[0].module.parameters()])  # after the last step
        return metrics, [float(n) for _, n in env.seed_grad_norms], float(clipped)

    none, norms, _ = epoch_and_norms("none", 1e9)
    same, same_norms, _ = epoch_and_norms("clip", 1e9)
    assert torch.equal(none, same) and norms == same_norms and len(norms) == 2
    limit = min(norms) / 2
    changed, before_clip, after_clip = epoch_and_norms("clip", limit)
    assert before_clip[0] == pytest.approx(norms[0])  # recorded before clipping
    assert after_clip == pytest.approx(limit, rel=1e-4)
    assert not torch.equal(changed, none)


def test_c3_answer_counts_episodes_with_wilson_intervals_over_episodes():
    """Small real episodes at 30x the original's seed lr, where seeds do explode: the
    counts are of episodes (not steps), each rate's interval a Wilson interval over them."""
    from harness.measure.stats import t_mean_ci
    from esper_review.findings import seed_grad_clip as c3

    inputs = c3._build(Case.of(seed_lr=0.3, episodes=8), CPU, 0)
    inputs["config"] = dataclasses.replace(OVERFLOWING, amp=False)
    out = {v: c3._stability(v, inputs) for v in c3.VARIANTS}
    for variant in c3.VARIANTS:
        episodes = inputs["results"][variant]
        assert out[variant]["episodes"] == 8 == len(episodes)
        for e, env_seed in zip(episodes, range(c3.FIRST_EPISODE_SEED, c3.FIRST_EPISODE_SEED + 8)):
            assert len(e["norms"]) == live_seed_steps(OVERFLOWING, env_seed)  # one per seed step
        exploded = sum(any(not n <= c3.EXPLOSION_NORM for n in e["norms"]) for e in episodes)
        assert out[variant]["exploded_episodes"] == exploded
        assert (out[variant]["exploded_episodes_rate_low"],
                out[variant]["exploded_episodes_rate_high"]) == wilson_interval(exploded, 8)
        diverged = sum(e["diverged"] for e in episodes)
        assert out[variant]["diverged_episodes_rate_high"] == wilson_interval(diverged, 8)[1]
    assert out["none"]["exploded_episodes"] >= 2  # the case is real
    diffs = [c["final_val_acc"] - n["final_val_acc"]
             for c, n in zip(inputs["results"]["clip"], inputs["results"]["none"])]
    assert (out["clip"]["final_val_acc_diff"], out["clip"]["final_val_acc_diff_low"],
            out["clip"]["final_val_acc_diff_high"]) == t_mean_ci(diffs)


# ----- H2, L2: the small claims -----------------------------------------------------------

def test_stream_guards_decide_alike_wherever_an_env_has_a_stream():
    """A CUDA-typed fake tensor stands in for the env's inputs on a GPU (no GPU here)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        cuda_inputs = torch.empty(4, 32, device="cuda")
    stream = object()  # the guards only test the stream for None
    assert all(guard(stream, cuda_inputs) for guard in GUARDS.values())
    assert not any(guard(None, torch.zeros(2)) for guard in GUARDS.values())


def test_accumulators_agree_and_l2_check_catches_a_double_add():
    sums = {}
    for mode in ("separate", "stacked"):
        acc = EpochAccumulators(CPU, mode)
        for loss, correct in ((0.5, 3.0), (0.25, 7.0)):
            acc.add_(torch.tensor(loss), torch.tensor(correct))
        sums[mode] = acc.sums()
        acc.zero_()
        assert torch.equal(acc.sums(), torch.zeros(2))
    assert torch.equal(sums["separate"], sums["stacked"])
    assert sums["stacked"].tolist() == [0.75, 10.0]

    f = finding("L2-fused-accumulators")

    def twice(variant, inputs):
        call = f.make_call(variant, inputs)
        if variant == "separate":
            return call
        return lambda: (call(), call())[1]

    assert check_cell(f, Case.of(values="0-d"), make_call=twice)["stacked"]["status"] == "mismatch"


# ----- the intervals ---------------------------------------------------------------------

def test_wilson_interval():
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(5, 10)
    assert (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    with pytest.raises(ValueError, match="0 <= successes <= trials"):
        wilson_interval(3, 2)


def test_t_interval_of_a_mean_over_a_few_independent_outcomes():
    from harness.measure.stats import t_mean_ci

    # s = 1.2910, t(0.975, 3 df) = 3.1824: half width 3.1824 * 1.2910 / 2 = 2.0543
    assert t_mean_ci([1.0, 2.0, 3.0, 4.0]) == pytest.approx((2.5, 0.4457, 4.5543), abs=1e-4)
    assert t_mean_ci([0.0, 0.0, 0.0]) == (0.0, 0.0, 0.0)  # all equal: a point
    with pytest.raises(ValueError, match="at least 2 finite numbers"):
        t_mean_ci([1.0])


# ----- TL-bootstrap: its check ---------------------------------------------------------

def test_tl_check_compares_the_first_rollout_and_catches_another_seed():
    f = finding("TL-bootstrap")
    case = Case.of(num_envs=2, max_steps=3, iterations=1, train_seeds=1, eval_seeds=2)
    assert check_cell(f, case)["terminal"]["max_error"] == 0.0

    def other_seed(variant, inputs):
        if variant == "terminal":
            return f.make_call(variant, f.build(case, CPU, 1))
        return f.make_call(variant, inputs)

    assert check_cell(f, case, make_call=other_seed)["terminal"]["status"] == "mismatch"


def test_tl_cannot_decide_when_the_trained_policies_do_not_beat_always_wait():
    """Real runs: policies trained one iteration on 2-step episodes do not beat
    always-WAIT on the held-out seeds, and the answer says it cannot decide."""
    from harness.measure.stats import t_mean_ci
    from esper_review.findings import time_limit as tl

    case = Case.of(num_envs=2, max_steps=2, iterations=1, train_seeds=5, eval_seeds=4)
    inputs = tl._build(case, CPU, 0)
    rows = {v: tl._learning(v, inputs) for v in ("truncated", "terminal")}
    wait = rows["terminal"]["always_wait_return"]
    for variant, row in rows.items():
        returns = [row[f"return_seed{i}"] for i in range(5)]
        assert row["train_seeds"] == 5  # the interval is over training seeds
        assert (row["return_vs_wait"], row["return_vs_wait_low"], row["return_vs_wait_high"]) \
            == t_mean_ci([r - wait for r in returns])
        assert not row["return_vs_wait_low"] > 0 and row["beats_always_wait"] == 0.0
    assert rows["terminal"]["decision"].startswith(tl.CANNOT_DECIDE + ": ")
    assert "not beat always-WAIT" in rows["terminal"]["decision"]
    assert rows["terminal"]["warning"].endswith(rows["terminal"]["decision"])
    assert "decision" not in rows["truncated"]


def test_tl_decision_words_follow_the_intervals():
    from esper_review.findings.time_limit import CANNOT_DECIDE, decision

    both = {"truncated": (2.0, 1.0, 3.0), "terminal": (2.5, 1.5, 3.5)}
    assert decision(both, (0.5, 0.1, 0.9)) == "terminal's held-out return is higher"
    assert decision(both, (-0.5, -0.9, -0.1)) == "truncated's held-out return is higher"
    assert decision(both, (0.5, -0.1, 1.1)).startswith(CANNOT_DECIDE)
    one_fails = {**both, "terminal": (0.5, -0.5, 1.5)}
    assert decision(one_fails, (5.0, 4.0, 6.0)) == (
        f"{CANNOT_DECIDE}: terminal does not beat always-WAIT (the interval of return - "
        "always-WAIT's is not above 0)")


def test_tl_runs_at_least_ten_training_seeds_per_arm_at_every_size():
    f = finding("TL-bootstrap")
    assert all(c["train_seeds"] >= 10 for quick in (True, False) for c in f.cases(quick))


# ----- every finding through harness.run -------------------------------------------------

NEW_FINDINGS = ("AUDIT-1.3-batched-transfer", "L1-inference-mode", "H1-env-pooling",
                "H2-redundant-is-cuda", "H4-bootstrap-tensor", "H5-mask-stacking",
                "C1-grad-scaler", "C3-seed-grad-clip", "L2-fused-accumulators", "TL-bootstrap")


@pytest.mark.integration
def test_quick_run_of_every_new_finding(tmp_path):
    assert main(["--quick", "--findings", *NEW_FINDINGS, "--budget", "1", "--every-cell",
                 "--precision", "0", "--no-report", "--out", str(tmp_path),
                 "--device", "cpu"]) == 0
    rows = load_run(None, tmp_path).summary.set_index(["finding", "variant"])
    assert set(rows.index.get_level_values(0)) == set(NEW_FINDINGS)
    cuda_only = (rows["case"].str.contains("fragmentation|amp=cuda")
                 | (rows.index.get_level_values(0) == "AUDIT-1.3-batched-transfer"))
    assert (rows.loc[cuda_only, "verdict"] == "needs_cuda").all()
    timed = rows[~cuda_only]
    assert timed["median_s"].notna().all(), timed[timed["median_s"].isna()]
    c1 = timed.loc["C1-grad-scaler"].loc[["shared", "per_optimizer"]]  # not the placebo
    assert (c1["episodes"] == 5).all() and (c1["host_overflow_rate_low"] >= 0).all()
    assert "final_scale_log2_diff" in c1.columns
    assert rows.loc[("C3-seed-grad-clip", "clip"), "episodes"] == 8
    assert "final_val_acc_diff" in rows.columns
    assert rows.loc[("TL-bootstrap", "terminal"), "heldout_return_diff_low"] <= \
        rows.loc[("TL-bootstrap", "terminal"), "heldout_return_diff"]
    for variant, forwards in (("tensor", 4), ("copy", 4), ("packed", 1)):
        row = rows.loc[("H4-bootstrap-tensor", variant)]
        assert row["policy_forwards"] == forwards
        assert row["host_syncs"] == (4 if forwards == 4 else 0)  # .item()s; .cpu() is CUDA's
    h5 = {v: rows.loc[("H5-mask-stacking", v)] for v in ("stack", "preallocated")}
    assert h5["preallocated"]["allocations"] < h5["stack"]["allocations"]  # no stacks
    assert h5["preallocated"]["op_calls"] > h5["stack"]["op_calls"]  # 32 row copies for 8
    assert rows.loc[("L1-inference-mode", "no_grad"), "max_error"] == 0
    assert isinstance(rows.loc[("TL-bootstrap", "terminal"), "decision"], str)
    assert "needs CUDA" in rows.loc[("AUDIT-1.3-batched-transfer", "flat"), "reason"]
