"""Studies built on the training recipe: Table 2 in miniature and GRPO's headroom.

`table2` (its config and rows), `stage_plan` (what each stage will do, from the run's files, and the ledger of what it
did), `table2_run` (`run_table2`: every seed's stages, then the report),
`table2_report` (the two analyses and ``table2.md``), `protocol` (the protocol-only adapter of the prompting rows, for
an instruct model that cannot act zero-shot), `mechanism` (the spread inside GRPO groups, where the full reward can
differ from correctness), `headroom` (what sampling solves that greedy decoding does not, on held-out questions).

May import: every other part of `bapsql.train`; nothing in `bapsql.train` imports this package.
"""
