"""The review of esper: its findings, as a plug-in of the harness.

Everything the harness knows of esper lives here: the review tickets' findings
(`esper_review.findings`: one module per claim, and the peers B4-CR-03 times beside
ours), the GAE tools (`esper_review.gae_tools`: crossovers, targets, the dispatch
floor), and what the gate needs to test itself on esper (the invariants of check b and
where `harness.gate.quality` plants its regressions). It plugs in through the public API
a user's findings module uses (`harness.register`, `harness.set_defaults`) and is the
default findings module: the harness names it, never imports it.

Importing this package registers the findings, in report order: the buffer-level
tickets, the vectorized-training review, end to end.
"""

from esper_review.findings import (  # noqa: F401 (imported for their register calls)
    gae_methods, reset_alloc, step_counts, add_checks, buffer_layout, graph_breaks,
    batched_transfer, stream_sync, inference_mode, env_pooling,
    redundant_is_cuda, bootstrap_tensor, mask_stacking, grad_scaler, seed_grad_clip,
    fused_accumulators, time_limit, resume_state, e2e,
)

from pathlib import Path  # noqa: E402 (after the findings: report order first)

from harness import Defaults, PlantTarget, set_defaults  # noqa: E402

set_defaults(Defaults(
    invariants=Path(__file__).with_name("invariants.json"),
    ab_findings=("B4-CR-03",),
    plant=PlantTarget("esper.gae.methods", "METHODS", "scan"),
    flamegraph=("-m", "esper.train", "--iterations", "3", "--envs", "4", "--steps", "10",
                "--device", "cpu"),
    commands=(("train", "esper.train"),
              ("crossovers", "esper_review.gae_tools.crossovers"),
              ("floor", "esper_review.gae_tools.floor"),
              ("targets", "esper_review.gae_tools.targets")),
))
