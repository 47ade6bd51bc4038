"""The GRPO algorithm's math, pure: functions and small dataclasses over numbers, arrays and tensors, no I/O.

`grpo` (group-relative advantages, the token-level clipped loss, policy drift), `reward` (the BAP-SQL reward and
its variants), `filter` (the online difficulty filter), `staleness` (policy versions and the staleness gate of
pipelined GRPO), `sampler` (which (task, budget) groups the next rollouts play), `logprobs` (memory-bounded token
logprobs under the sampler's distribution).

May import: `bapsql.errors` and the standard / numeric libraries; nothing else of `bapsql.train` (not even its
config: the config imports the sections defined here).
"""
