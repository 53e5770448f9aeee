"""`EnvConfig`: the sizes and training settings of the synthetic environment."""

from __future__ import annotations

from dataclasses import dataclass

from esper.checks import check_bool, check_int, check_number


@dataclass(frozen=True)
class EnvConfig:
    """Size and training settings of the synthetic environment (defaults: a few ms/epoch on CPU)."""

    num_envs: int = 4
    """Number of parallel environments (`VectorizedMorphoEnv`)."""
    max_steps: int = 25
    """Episode length in epochs; used to normalise the epoch counter in observations."""
    input_dim: int = 32
    """Features per synthetic input sample."""
    num_classes: int = 10
    """Classes of the synthetic task (the teacher's outputs)."""
    host_hidden: int = 64
    """Width H of the host MLP's three hidden layers (and of every seed's input/output)."""
    train_batches: int = 4
    """Minibatches per epoch; the training set is exactly `train_batches * batch_size` samples."""
    batch_size: int = 128
    """Samples per training minibatch."""
    val_size: int = 512
    """Validation samples, evaluated in one forward at the end of each epoch."""
    lr: float = 0.01
    """SGD learning rate of the host. Original: `0.01`, src/esper/leyline/__init__.py:218
    @2df957ed (DEFAULT_HOST_LR, `task_spec.host_lr`, the host's SGD at
    src/esper/simic/training/vectorized.py:844-846)."""
    seed_lr: float = 0.01
    """SGD learning rate of each seed, times `STYLE_LR_SCALES[style]` of the style head's
    choice (this project's: the original's seeds all train at `seed_lr`). Original:
    `0.01`, src/esper/leyline/__init__.py:222 @2df957ed (DEFAULT_SEED_LR,
    `task_spec.seed_lr`, each seed's SGD at src/esper/simic/training/vectorized.py:979-981)."""
    momentum: float = 0.9
    """SGD momentum of the host and of every seed; each optimizer, and so its momentum,
    lives as long as what it trains (`esper.env.optimizers`). Original: `0.9`,
    src/esper/simic/training/vectorized.py:845 @2df957ed (the host's; the seeds' at 980)."""
    weight_decay: float = 5e-4
    """L2 weight decay of the host's SGD (the seeds have none, as there). Original:
    `5e-4`, src/esper/simic/training/vectorized.py:845 @2df957ed."""
    param_rent: float = 0.01
    """Reward penalty per epoch per unit of (seed parameters / host parameters)."""
    seed: int = 0
    """Root seed; data, host init and seed init derive from (seed, env_index)."""
    amp: bool = False
    """Mixed precision for the host's training batches, as the reviewed system's `use_amp`:
    autocast (`esper.env.optimizers.amp_dtype`: float16 on CUDA) with GradScaler(s) arranged
    by `Variants.scaler`. Off by default, as there. The original runs it on CUDA only
    (src/esper/simic/training/vectorized.py:725,853,987-990 @2df957ed); on the CPU this is
    a stand-in the original never runs (CPU autocast and `GradScaler('cpu')`)."""
    seed_clip_norm: float = 1.0
    """Gradient-norm limit of each seed's parameters when `Variants.seed_clip` is `clip`
    (the review's suggested max_norm=1.0)."""
    terminal_bonus: bool = True
    """Pay esper-lite's terminal reward at an episode's last step, on top of that step's
    reward: `TERMINAL_ACC_WEIGHT` (0.05) per percentage point of validation accuracy (up
    to +5), plus `FOSSILIZE_TERMINAL_SCALE` (3) per seed fossilized this episode whose
    host's validation accuracy had risen by at least `MIN_FOSSILIZE_CONTRIBUTION` (1)
    point from the seed's first epoch (`esper.env.environment`). False: the plain
    accuracy-gain reward throughout. Original: `True`,
    src/esper/simic/rewards/rewards.py:660 @2df957ed (paid whenever epoch == max_epochs,
    lines 657-669; no switch)."""

    def __post_init__(self) -> None:
        minimums = {"num_envs": 1, "max_steps": 1, "input_dim": 1, "num_classes": 2,
                    "host_hidden": 1, "train_batches": 1, "batch_size": 1, "val_size": 1,
                    "seed": 0}
        for name, minimum in minimums.items():
            check_int(f"EnvConfig.{name}", getattr(self, name), minimum)
        check_bool("EnvConfig.amp", self.amp)
        check_number("EnvConfig.lr", self.lr, positive=True)
        check_number("EnvConfig.seed_lr", self.seed_lr, positive=True)
        check_number("EnvConfig.momentum", self.momentum, minimum=0, maximum=1)
        check_number("EnvConfig.weight_decay", self.weight_decay, minimum=0)
        check_number("EnvConfig.param_rent", self.param_rent, minimum=0)
        check_number("EnvConfig.seed_clip_norm", self.seed_clip_norm, positive=True)
        check_bool("EnvConfig.terminal_bonus", self.terminal_bonus)
