"""What a rollout leaves for the update: the buffer and moving it to the update's device.

- `buffer`: `RolloutBuffer`, pre-allocated env-major storage of one rollout; it fills
  its advantages with `esper.gae.compute_gae`;
- `transfer`: a rollout's tensors to another device, one copy each or one flat copy;
- `staging`: a pre-allocated host buffer moved to the device in one copy;
- `device_spans`: device time of named code ranges on CUDA (the trainer's phases, the
  buffer's GAE).
"""
