"""bapsql.env — the budgeted episode environment (DESIGN §3).

Modules: `ledger` (budget accounting rules), `actions` (typed actions, tool-call parsing/rendering, tool schemas),
`evidence` (evidence blocks and their states), `scoring` (answer correctness), `evidence_score` (the evidence
score), `render` (every observation text), `transcript` (live-context measurement), `records` (options,
step/turn/episode records),
`outcome` (gold answers, failure kinds), `handles` (warm database handles), `episode` (`BudgetedSQLEnv`).
"""
